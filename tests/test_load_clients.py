"""A perf level spread over two client actors (real Ray, the session's local cluster) against a stub
OpenAI-compatible server that streams at once: the merged rows are the one-process schedule."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_perf import FakeTokenizer

from actors import arrivals
from actors.endpoint import EndpointEngine
from fleet.contracts.backend_args import EndpointArgs
from fleet.contracts.engine import ResolvedModel
from fleet.contracts.scenario import Scenario
from fleet.contracts.sources import PathSource
from fleet.contracts.spec import ModelSpec, Sampling
from fleet.run.manifest import Manifest


class Streaming(BaseHTTPRequestHandler):
    """GET: one served model. POST completions: max_tokens one-token SSE events, then [DONE]."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "stub", "max_model_len": 256}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        n = int(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["max_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": "x", "token_ids": [5 + i]}]}).encode())
            self.wfile.write(b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Streaming)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


@pytest.mark.engine  # it starts Ray actors
def test_two_client_actors_send_one_schedule_and_their_rows_merge(
    local_ray: Any, session_actors: Any, server: str
) -> None:
    session_actors.clear()  # actors the session's runs keep hold its Ray's slots; these clients need one
    model = ResolvedModel(ModelSpec(name="m", source=PathSource(path=Path("/nonexistent"))), Path("/x"), "w", None)
    engine = EndpointEngine(EndpointArgs(name="ep", base_url=server), model, sampling=Sampling())
    engine._tokenizer = FakeTokenizer()  # a tokenizer double: these prompts only need ids
    sc = Scenario(
        name="s", concurrency=[4], input_tokens=8, output_tokens=3, num_requests=14, warmup_requests=2,
        request_rate=200.0, arrival="constant", seed=4, clients=2, client_cpus=0.5,
    )  # fmt: skip
    result = engine.perf(sc, 4)
    rows = sorted(result.requests.to_pylist(), key=lambda r: r["request_index"])
    assert [r["request_index"] for r in rows] == list(range(14))
    assert [r["client"] for r in rows] == [i % 2 for i in range(14)]  # every other arrival
    assert all(r["error"] is None and r["n_output_tokens"] == 3 and r["n_prompt_tokens"] == 8 for r in rows)
    # The merged due times are the one-process schedule: both clients measure from one shared start.
    assert [r["scheduled_s"] for r in rows] == pytest.approx(arrivals.scenario_schedule(sc, 14))
    [level] = result.level.to_pylist()
    assert (level["clients"], level["n_requests"], level["n_errors"], level["level"]) == (2, 14, 0, 4)
    assert level["wall_s"] >= max(r["sent_s"] + r["e2e_s"] for r in rows) - 1e-9
    assert level["hostname"] and level["client_cpu_s"] > 0


def _manifest(**level: Any) -> dict[str, Any]:
    """A model with an in-process vLLM reference and an endpoint target, and one perf scenario."""
    return {
        "models": [{"name": "m", "source": {"kind": "path", "path": "/nonexistent"}}],
        "targets": [{"name": "v", "kind": "vllm"}, {"name": "ep", "kind": "endpoint", "base_url": "http://h/v1"}],
        "reference": "v",
        "prompts": {"p": [{"id": "a", "prompt": "x"}]},
        "perf": [{"name": "s", "input_tokens": 4, "output_tokens": 2} | level],
    }


def test_clients_need_a_target_other_processes_reach() -> None:
    manifest = _manifest(concurrency=[2], num_requests=2, clients=2)
    with pytest.raises(ValueError, match=r"perf\[0\].clients: 2 client processes need .* 'v' serve"):
        Manifest.model_validate(manifest)
    manifest["perf"][0]["targets"] = ["ep"]
    Manifest.model_validate(manifest)


def test_clients_that_cannot_fit_beside_their_target_are_refused_before_the_run() -> None:
    """A level's client actors hold their CPUs beside the target's own, and beside the reference's,
    which is up while its candidates run: where the cluster has fewer in all, the run is refused
    before anything starts (not 120 s into the level). Taking turns, the reference is down meanwhile."""
    from fleet.run.placement import check_fits, footprint

    manifest = _manifest(concurrency=[4], num_requests=4, clients=3, client_cpus=1, targets=["ep"])
    m = Manifest.model_validate(manifest)
    need = footprint(m.target("ep"))["CPU"] + footprint(m.target("v"))["CPU"] + 3
    said = (
        rf"perf\[0\] 's': target 'ep' beside the reference 'v' and its 3 client actors of 1 CPUs need "
        rf"\{{'CPU': {need:g}\}} at once; the cluster has \{{'CPU': {need - 1:g}\}}"
    )
    with pytest.raises(RuntimeError, match=said):
        check_fits(m, {"CPU": need - 1})
    check_fits(m, {"CPU": need})
    manifest["perf"][0]["client_cpus"] = 0
    check_fits(Manifest.model_validate(manifest), {"CPU": need - 1})
    manifest["perf"][0]["client_cpus"] = 1
    ep = footprint(m.target("ep"))["CPU"]
    manifest["targets"][0]["num_cpus"] = ep + 3  # the reference does not fit beside ep: they take turns
    check_fits(Manifest.model_validate(manifest), {"CPU": ep + 3})  # ep and its clients, the reference down
    manifest["targets"][0]["num_cpus"] = ep + 2
    with pytest.raises(RuntimeError, match=r"target 'ep' and its 3 client actors"):
        check_fits(Manifest.model_validate(manifest), {"CPU": ep + 2.5})
