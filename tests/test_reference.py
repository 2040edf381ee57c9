"""docs/manifest.md is the manifest reference generated from the models (fleet/run/reference.py):
current, and covering every key the validator accepts."""

from __future__ import annotations

from pathlib import Path

from fleet.contracts.messages import known_keys
from fleet.run import reference
from fleet.run.manifest import Manifest

DOC = Path(__file__).parents[1] / "docs" / "manifest.md"


def test_the_manifest_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == reference.markdown(), "stale: run `make docs`"


def test_every_key_the_validator_accepts_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    places = [("bogus",), ("targets", 0, "vllm", "bogus"), ("targets", 0, "hf", "bogus"), ("sampling", "bogus")]
    places += [("models", 0, "source", "synthetic", "bogus"), ("gates", 0, "bogus"), ("perf", 0, "bogus")]
    for loc in places:
        keys = known_keys(Manifest, loc)
        assert keys, loc
        for key in keys:
            assert f"| `{key}` |" in text, (loc, key)
    assert "## WeightNoise" in text and "## SyntheticSource" in text
