"""Every manifest shipped under manifests/ validates, and the Atlas 800 examples reserve what the
docs (docs/atlas-800.md) say they do (fast: no Ray, no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.run.manifest_file import load
from fleet.run.placement import bundles, check_fits, footprint, places

MANIFESTS = sorted((Path(__file__).resolve().parents[1] / "manifests").glob("*.yaml"))
ATLAS_NODE = {"CPU": 192.0, "NPU": 8.0}  # an Atlas 800: 8 cards (CPU count: any ample figure)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path: Path) -> None:
    load(path)


def test_the_atlas_manifests_are_shipped() -> None:
    assert {"atlas-tp8.yaml", "atlas-2node.yaml"} <= {p.name for p in MANIFESTS}


def test_tp8_fits_one_atlas_node_and_uses_the_mp_executor() -> None:
    m = load(MANIFESTS[0].parent / "atlas-tp8.yaml")
    for name in ("vllm-npu-tp8", "vllm-server-npu-tp8"):
        t = m.target(name)
        assert (t.executor, t.spans_nodes, footprint(t)["NPU"]) == ("mp", False, 8.0)
    check_fits(m, ATLAS_NODE, [ATLAS_NODE])  # candidates take turns on the one node's 8 cards


def test_the_two_node_model_needs_two_atlas_nodes() -> None:
    m = load(MANIFESTS[0].parent / "atlas-2node.yaml")
    t = m.target("vllm-npu-tp8-pp2")
    assert (t.executor, t.cards, len(bundles(t))) == ("ray", 16, 16)
    assert not places(t, [ATLAS_NODE])
    two = [ATLAS_NODE, ATLAS_NODE]
    assert places(t, two)
    check_fits(m, {"CPU": 384.0, "NPU": 16.0}, two)
    # 16 cards, but as 8 + 4 + 4: the second stage's 8 cards are on no one node.
    halves = {"CPU": 192.0, "NPU": 4.0}
    with pytest.raises(RuntimeError, match="needs 2 stages of 8 cards, each stage on one node"):
        check_fits(m, {"CPU": 576.0, "NPU": 16.0}, [ATLAS_NODE, halves, halves])


def test_the_card_check_says_what_it_needs_and_skips_without_a_card() -> None:
    import subprocess
    import sys

    root = MANIFESTS[0].parents[1]
    for device, needs in (("npu", "vllm-ascend, torch, torch-npu"), ("cuda", "vllm, torch, transformers")):
        proc = subprocess.run(
            [sys.executable, str(root / "scripts" / "card_check.py"), "--device", device],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert needs in proc.stdout and f"skipped: no {device} card on this machine" in proc.stdout
    m = load(root / "manifests" / "card.yaml", overrides=["targets.1.device=cuda"])
    assert m.target("vllm-card-bf16").device == "cuda"
