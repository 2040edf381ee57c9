"""actors.synthetic: tiny seeded models must be byte-identical, loadable and built once."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from actors.synthetic import MARKER, build
from fleet.contracts.sources import SyntheticSource

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is"


def _hashes(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[SyntheticSource, Path]:
    spec = SyntheticSource()
    return spec, build(spec, tmp_path_factory.mktemp("llama") / spec.digest())


def _build_elsewhere(spec: SyntheticSource, out: Path, code: str = "") -> None:
    """build() in a fresh interpreter: another process, another hash seed, no torch loaded yet."""
    script = (
        "import sys; from pathlib import Path\n"
        "from fleet.contracts.sources import SyntheticSource; from actors.synthetic import build\n"
        "build(SyntheticSource.model_validate_json(sys.argv[1]), Path(sys.argv[2]))\n" + code
    )
    subprocess.run([sys.executable, "-c", script, spec.model_dump_json(), str(out)], cwd=ROOT, check=True, timeout=120)


def test_two_builds_are_byte_identical(llama: tuple[SyntheticSource, Path], tmp_path: Path) -> None:
    spec, first = llama
    _build_elsewhere(spec, tmp_path / "again")
    assert _hashes(first) == _hashes(tmp_path / "again")
    expected = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", MARKER}
    assert expected <= set(_hashes(first))


def test_seed_changes_weights_only(llama: tuple[SyntheticSource, Path], tmp_path: Path) -> None:
    spec, first = llama
    other = _hashes(build(spec.model_copy(update={"seed": 1}), tmp_path / "seed1"))
    ref = _hashes(first)
    assert other["model.safetensors"] != ref["model.safetensors"]
    assert other["tokenizer.json"] == ref["tokenizer.json"]


def test_tokenizer_has_exact_vocab_and_prepends_bos(llama: tuple[SyntheticSource, Path]) -> None:
    from transformers import AutoTokenizer

    spec, d = llama
    tok = AutoTokenizer.from_pretrained(d)
    config = json.loads((d / "config.json").read_text())
    assert len(tok) == spec.vocab_size == config["vocab_size"]
    ids = tok(PROMPT)["input_ids"]
    assert ids[0] == tok.bos_token_id == config["bos_token_id"]
    assert ids.count(tok.bos_token_id) == 1
    assert tok.eos_token_id == config["eos_token_id"]
    assert tok.pad_token_id == config["pad_token_id"]
    assert tok.decode(ids, skip_special_tokens=True) == PROMPT


def test_hf_loads_model_with_spec_dims(llama: tuple[SyntheticSource, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    spec, d = llama
    model = AutoModelForCausalLM.from_pretrained(d)
    c = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (
        spec.hidden_size,
        spec.intermediate_size,
        spec.num_layers,
    )
    assert (c.num_attention_heads, c.num_key_value_heads) == (spec.num_heads, spec.num_kv_heads)
    assert c.max_position_embeddings == spec.max_position_embeddings
    assert model.dtype == torch.float32
    weight = model.get_input_embeddings().weight
    assert weight.shape == (spec.vocab_size, spec.hidden_size)
    assert abs(weight.std().item() - spec.init_std) < 0.1 * spec.init_std
    with torch.no_grad():
        logits = model(torch.tensor([[0, 5, 6, 7]])).logits
    assert logits.shape == (1, 4, spec.vocab_size)


def test_cached_build_returns_without_torch(llama: tuple[SyntheticSource, Path]) -> None:
    spec, d = llama
    before = _hashes(d)
    _build_elsewhere(spec, d, "assert 'torch' not in sys.modules, 'cache hit imported torch'\n")
    assert build(spec, d) == d
    assert _hashes(d) == before


def test_concurrent_builds_share_one_directory(tmp_path: Path) -> None:
    spec = SyntheticSource(seed=7)
    out = tmp_path / "shared"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(build(spec, out))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [out, out]
    assert (out / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared", "shared.lock"]  # no temp dirs left


def test_qwen2_builds_and_tokenizes_like_llama(llama: tuple[SyntheticSource, Path], tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    spec, llama_dir = llama
    d = build(spec.model_copy(update={"family": "qwen2"}), tmp_path / "qwen2")
    assert AutoConfig.from_pretrained(d).architectures == ["Qwen2ForCausalLM"]
    # transformers loads a qwen2 directory with Qwen2Tokenizer, not the generic class.
    tok, ref = AutoTokenizer.from_pretrained(d), AutoTokenizer.from_pretrained(llama_dir)
    assert len(tok) == spec.vocab_size
    text = "Quantum computing is 12345 years old.\n\n  Héllo"
    assert tok(text)["input_ids"] == ref(text)["input_ids"]


def test_large_vocab_is_padded_exactly(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    spec = SyntheticSource(vocab_size=4096, num_layers=1)
    tok = Tokenizer.from_file(str(build(spec, tmp_path / "big") / "tokenizer.json"))
    assert tok.get_vocab_size() == 4096


def test_rejects_heads_that_do_not_divide(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        build(SyntheticSource(num_heads=4, num_kv_heads=3), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
