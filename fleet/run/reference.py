"""docs/manifest.md, the manifest reference, generated from the pydantic models that validate a
manifest: every key a user can write, its type, default and description, reached from `Manifest`
through its fields. Generated, so the docs cannot drift from the code: `make docs` writes it and
tests/test_reference.py fails when it is stale.

    python -m fleet.run.reference docs/manifest.md
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from fleet.run.manifest import Manifest

HEADER = """# Manifest reference

Generated from the pydantic models by `make docs` (`fleet/run/reference.py`); do not edit by hand.
Every key of a manifest, section by section, starting from the top level. A section's keys are
all the keys that place accepts: any other key is an error (with the closest allowed one named).
Types: `a | b` is either; `list[X]`, `dict[K, X]` hold X; a linked name is the section below.
Two target keys are not here because they are expanded before validation: `matrix:` (variants
over settings) and `repeat: N` (copies): the [manifest guide](manifest-guide.md). Keys described as "Filled ..."
are written by fleet-eval into run.json's resolved manifest, not by you.
"""


def models() -> list[type[BaseModel]]:
    """Every model reachable from Manifest through field annotations, breadth first."""
    seen: list[type[BaseModel]] = [Manifest]
    for model in seen:
        for field in model.model_fields.values():
            for found in _models_in(field.annotation):
                if found not in seen:
                    seen.append(found)
    return seen


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in get_args(tp) for m in _models_in(arg)]


def type_name(tp: Any) -> str:
    """A type as the manifest's author reads it."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{a!r}`".replace("'", '"') for a in args)
    if origin in (Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    return getattr(tp, "__name__", str(tp))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default is PydanticUndefined else field.default
    if isinstance(value, BaseModel):
        return "(its defaults)"
    return f"`{json.dumps(value, default=str)}`"  # as YAML reads it: null, false, {}


def markdown() -> str:
    out = [HEADER]
    for model in models():
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += [f"## {model.__name__}", "", doc, ""] if doc else [f"## {model.__name__}", ""]
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{field.alias or name}` | {type_name(field.annotation)} | {_default(field)} | {desc} |")
        for key, desc in getattr(model, "expanded_keys", {}).items():  # expanded before validation
            out.append(f"| `{key}` | (expanded) | none | {desc} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    Path(sys.argv[1] if len(sys.argv) > 1 else "docs/manifest.md").write_text(markdown(), encoding="utf-8")
