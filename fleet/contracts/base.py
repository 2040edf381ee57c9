"""The config base and the small value types every other contract uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from fleet.contracts.inputs import MAX_NAME, NAME_PATTERN, check_path_text

Device = Literal["cpu", "cuda", "npu"]
DType = Literal["float32", "bfloat16", "float16"]
# A name that becomes a path component in the results: letters, digits, . _ - (no leading dot).
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=MAX_NAME)]
# A path a user wrote: a string without NUL or control characters (pathlib would take either).
UserPath = Annotated[Path, BeforeValidator(check_path_text)]
# Upper bounds: a count or a timeout past these is a typo, and would overflow or hang downstream.
MAX_COUNT = 1_000_000
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_SEED = 2**32 - 1  # numpy and torch seeds


class Strict(BaseModel):
    """Config base: unknown keys are errors, values are immutable once validated, no inf or NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
