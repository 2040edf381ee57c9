"""Weight mutants (actors/weight_noise.py): a seeded, node-independent noisy copy of a checkpoint,
and a report that says when a target loaded other weights than the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.contracts.errors import UserError


def _checkpoint(path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path.mkdir()
    gen = torch.Generator().manual_seed(1)
    tensors = {
        "embed.weight": torch.randn(64, 32, generator=gen) * 0.1,
        "norm.weight": torch.ones(32),
        "half.weight": (torch.randn(16, 16, generator=gen) * 3).to(torch.bfloat16),
        "position_ids": torch.arange(10),
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def test_the_noisy_copy_is_seeded_sized_and_leaves_the_rest_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import load_file

    from actors.sources import weights_digest
    from actors.weight_noise import noisy_copy
    from fleet.contracts.backend_args import WeightNoise

    src = _checkpoint(tmp_path / "model")
    digest = weights_digest(src)
    noise = WeightNoise(seed=3, relative=0.01)
    copies = []
    for node in ("node-a", "node-b"):  # two nodes' caches: the same bytes
        monkeypatch.setenv("FLEET_CACHE", str(tmp_path / node))
        copies.append(noisy_copy(src, digest, noise))
    assert copies[0] != copies[1]
    assert weights_digest(copies[0]) == weights_digest(copies[1]) != digest
    assert json.loads((copies[0] / "config.json").read_text()) == {"model_type": "llama"}
    before, after = load_file(str(src / "model.safetensors")), load_file(str(copies[0] / "model.safetensors"))
    assert torch.equal(before["position_ids"], after["position_ids"])  # integers are no weights
    for name in ("embed.weight", "norm.weight", "half.weight"):
        w, v = before[name].float(), after[name].float()
        assert after[name].dtype == before[name].dtype
        ratio = float((v - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt())
        assert 0.005 < ratio < 0.02, (name, ratio)  # bfloat16 rounding adds its own ~0.4 %
    other = noisy_copy(src, digest, WeightNoise(seed=4, relative=0.01))
    assert weights_digest(other) != weights_digest(copies[0])


def test_weight_noise_needs_safetensors_and_a_sane_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from actors.weight_noise import noisy_copy
    from fleet.contracts.backend_args import VllmArgs, WeightNoise

    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "cache"))
    (tmp_path / "bin").mkdir()
    with pytest.raises(UserError, match="needs safetensors weights"):
        noisy_copy(tmp_path / "bin", "0" * 16, WeightNoise(seed=0, relative=0.1))
    assert not (tmp_path / "cache" / "weight-noise").exists() or not any(
        (tmp_path / "cache" / "weight-noise").iterdir()
    )
    for bad in ({"seed": 0, "relative": 0}, {"seed": 0, "relative": 2}, {"seed": -1, "relative": 0.1}, {"seed": 0}):
        with pytest.raises(ValidationError):
            VllmArgs(name="v", weight_noise=bad)


def test_the_report_names_targets_that_loaded_other_weights() -> None:
    from fleet.report.parity_lines import weights_lines
    from fleet.results.info import RunInfo

    info = {
        "provenance": {
            "m/ref": {"weights_sha256": "aaaa"},
            "m/same": {"weights_sha256": "aaaa"},
            "m/mutant": {"weights_sha256": "bbbb"},
            "m/endpoint": {},  # a remote server: no weights to compare
            "n/other-model": {"weights_sha256": "cccc"},  # no reference row for this model
        }
    }
    [lines] = weights_lines(RunInfo.of(info | {"reference": "ref"}), "ref")
    assert lines[1:] == ["m/mutant: weights bbbb, not the reference's aaaa"]
    only_ref = {"reference": "ref", "provenance": {"m/ref": {"weights_sha256": "aaaa"}}}
    assert weights_lines(RunInfo.of(only_ref), "ref") == []


def test_a_tensor_pattern_breaks_only_the_tensors_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tensors`: one part of one layer broken on purpose (what the drill-down must then name)."""
    import torch
    from safetensors.torch import load_file

    from actors.sources import weights_digest
    from actors.weight_noise import noisy_copy
    from fleet.contracts.backend_args import HFArgs, WeightNoise

    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "cache"))
    src = _checkpoint(tmp_path / "model")
    digest = weights_digest(src)
    only = noisy_copy(src, digest, WeightNoise(seed=3, relative=0.01, tensors="embed.*"))
    before, after = load_file(str(src / "model.safetensors")), load_file(str(only / "model.safetensors"))
    assert not torch.equal(before["embed.weight"], after["embed.weight"])
    assert all(torch.equal(before[n], after[n]) for n in ("norm.weight", "half.weight", "position_ids"))
    # Another pattern is another copy, not the first one from the cache.
    assert weights_digest(noisy_copy(src, digest, WeightNoise(seed=3, relative=0.01, tensors="norm.*"))) not in {
        digest,
        weights_digest(only),
    }
    with pytest.raises(UserError, match=r"'model\.layers\.9\.\*' matches no floating-point tensor"):
        noisy_copy(src, digest, WeightNoise(seed=3, relative=0.01, tensors="model.layers.9.*"))
    assert HFArgs(name="h", weight_noise={"seed": 0, "relative": 0.1, "tensors": "a.*"}).weight_noise is not None
