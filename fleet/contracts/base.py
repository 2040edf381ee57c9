"""The config base and the small value types every other contract uses."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Device = Literal["cpu", "cuda", "npu"]
DType = Literal["float32", "bfloat16", "float16"]
# A name that becomes a path component in the results: letters, digits, . _ - (no leading dot).
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class Strict(BaseModel):
    """Config base: unknown keys are errors, values are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)
