"""The OpenAI-compatible client side without an engine: a stub server that misbehaves on purpose.

The stub echoes the request's Authorization header in its error bodies, the worst case for a
key: nothing fleet-eval returns (rows, exceptions) may contain it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from actors.endpoint import EndpointEngine
from actors.openai_http import EndpointError
from actors.vllm_server import _flags
from fleet.contracts.backend_args import EndpointArgs
from fleet.contracts.engine import ResolvedModel
from fleet.contracts.sources import PathSource
from fleet.contracts.spec import ModelSpec, Sampling

SECRET = "sk-stub-secret-0123456789"


class Stub(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {"data": [{"id": "stub-model", "max_model_len": 64}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(500, {"error": f"bad key {self.headers.get('Authorization')}"})


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def endpoint(base_url: str, **kw: Any) -> EndpointEngine:
    args = EndpointArgs(name="ep", base_url=base_url, api_key_env="FLEET_STUB_KEY", **kw)
    model = ResolvedModel(ModelSpec(name="m", source=PathSource(path=Path("/nonexistent"))), Path("/x"), "w", None)
    return EndpointEngine(args, model, sampling=Sampling())


def test_the_key_never_appears_in_rows_or_errors(stub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Shard

    monkeypatch.setenv("FLEET_STUB_KEY", SECRET)
    engine = endpoint(stub)
    assert engine.served_model == "stub-model" and engine.max_model_len == 64
    rows = engine.smoke().to_pylist()
    # Readiness (GET /v1/models) answers; both POST routes echo the header back in their errors.
    assert [r["passed"] for r in rows] == [True, False, False] and [r["status"] for r in rows] == [200, 500, 500]
    assert all("Bearer ***" in r["response"] for r in rows[1:])
    with pytest.raises(EndpointError) as failed:
        engine.generate(Shard("m", "ep", "p", 0, (Prompt(id="a", prompt="hi"),)))
    assert "HTTP 500" in str(failed.value) and "Bearer ***" in str(failed.value)
    assert SECRET not in json.dumps(rows, default=str) + str(failed.value) + repr(failed.value)


def test_missing_key_variable_and_unknown_model_are_named(stub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_STUB_KEY", raising=False)
    with pytest.raises(RuntimeError, match="FLEET_STUB_KEY \\(api_key_env\\) is not set"):
        endpoint(stub)
    monkeypatch.setenv("FLEET_STUB_KEY", SECRET)
    with pytest.raises(EndpointError, match="serves \\['stub-model'\\], not 'other'"):
        endpoint(stub, served_model="other")


def test_manifest_fields_are_checked() -> None:
    for url in ("localhost:8000", "http://user:secret@host:8000/v1"):
        with pytest.raises(ValueError, match="base_url"):
            EndpointArgs(name="ep", base_url=url)
    with pytest.raises(ValueError, match="api_key_env"):
        EndpointArgs(name="ep", base_url="http://h/v1", api_key_env="sk-not-a-name")


def test_engine_args_become_server_flags() -> None:
    flags = _flags({"max_num_seqs": 8, "enable_prefix_caching": False, "enable_chunked_prefill": True})
    assert flags == ["--max-num-seqs", "8", "--no-enable-prefix-caching", "--enable-chunked-prefill"]
    assert _flags({"load_format": "dummy", "hf_overrides": {"a": 1}}) == [
        "--load-format",
        "dummy",
        "--hf-overrides",
        '{"a": 1}',
    ]
