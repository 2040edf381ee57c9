"""How a wrong input is told to the user: the field as they wrote it, and for a wrong name the
closest known one and a list that is never cut mid-way.

Every place that turns a pydantic ValidationError into a UserError goes through `error_line`
(manifests, gates files, prompt files), so none of them can leak pydantic's own location segments:
the union member it tried (`list[function-after[_text_or_chat(), Prompt]]`, `PromptFile`, `str`)
and the discriminator value (`targets.0.vllm.dtype`) are not names the user ever typed.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from fleet.contracts.inputs import clip

LIST_BUDGET = 240  # a list of names longer than this is not shown whole (a message line is at most 400)
# A location segment that is a pydantic schema tag, never a key: brackets, parentheses, commas or
# dashes (`function-after[...]`, `constrained-str`), a class name (field names are snake_case), or
# a core type name. Keys the user wrote (a prompt set `smollm-six`) are recognised as keys first.
_TAG = re.compile(r"[\[\](),-]|^[A-Z]|^(str|int|float|bool|bytes|none)$")
_KEYED = ("extra_forbidden", "missing")  # errors whose location ends with a key, never a tag
_LOST = object()  # the raw data could not be followed this far


def field_path(raw: Any, loc: Sequence[int | str]) -> str:
    """`prompts.p[0].answer`: pydantic's location as the user wrote it, read alongside the raw data."""
    out, node = "", raw
    for part in loc:
        if isinstance(part, str) and not (isinstance(node, dict) and part in node):
            if isinstance(node, dict) and node.get("kind") == part:
                continue  # the discriminator value pydantic inserts, not a field the user wrote
            if _TAG.search(part) or (node is not _LOST and not isinstance(node, dict)):
                continue  # a union member's tag: lists and scalars have no string keys
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = _LOST
    return out


def relevant(errors: Sequence[Any]) -> list[Any]:
    """The errors as the user would list them. A union member's "wrong type" is dropped when another
    member got deeper (for a list of prompts with a typo: the typo, not "Input should be a valid
    dictionary" from the file form), and the members' "wrong type"s at one place are one error."""
    out: list[Any] = []
    merged: dict[tuple[Any, ...], Any] = {}
    for err in errors:
        loc = tuple(err["loc"])
        # An unknown or missing key ends its location with the key itself (a prompt set `smollm-six`
        # looks like a tag): only a "wrong type" error ends with a union member's tag.
        if not loc or not isinstance(loc[-1], str) or err["type"] in _KEYED or not _TAG.search(loc[-1]):
            out.append(err)
            continue
        prefix = loc[:-1]
        if any(len(o["loc"]) > len(loc) and tuple(o["loc"][: len(prefix)]) == prefix for o in errors):
            continue
        wanted = re.sub(r" or instance of \w+", "", str(err["msg"])).removeprefix("Input should be ")
        if prefix in merged:  # the same place, another member: "a valid list or a valid dictionary"
            merged[prefix]["msg"] += f", or {wanted}"
            continue
        merged[prefix] = {**err, "loc": prefix, "msg": f"Input should be {wanted}"}
        out.append(merged[prefix])
    return out


def plural(word: str) -> str:
    return word if word.endswith("s") else f"{word}es" if word.endswith(("x", "ch", "sh")) else f"{word}s"


def unknown(what: str, value: Any, known: Collection[str], *, listed: str = "") -> str:
    """`unknown metric 'x'; did you mean 'y'? ...`: the closest known names (difflib), then every
    known name when the list fits on the line, else how many there are and where they are `listed`.
    A list is never cut mid-way: a reader cannot tell a cut list from a complete one."""
    known = list(known)
    msg = f"unknown {what} {clip(value, 60)}"
    close = difflib.get_close_matches(str(value), known, n=2, cutoff=0.6) if isinstance(value, str) else []
    if close:
        msg += f"; did you mean {' or '.join(repr(c) for c in close)}?"
    names = ", ".join(known)
    if len(names) <= LIST_BUDGET or not listed:
        return f"{msg} (known {plural(what)}: {names})"
    return f"{msg} ({len(known)} known {plural(what)}, all listed in {listed})"


def known_keys(root: Any, loc: Sequence[int | str]) -> list[str]:
    """The keys allowed where pydantic found the extra key `loc[-1]`: the fields (as written, i.e.
    aliases) of every model `root` can hold at `loc[:-1]`, following lists, dicts and unions (a
    union member's tag in `loc` keeps the candidates as they are; a `kind` value picks its member)."""
    candidates = _members(root)
    for part in loc[:-1]:
        step: list[Any] = []
        for tp in candidates:
            origin, args = get_origin(tp), get_args(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                if isinstance(part, str) and part in _fields(tp):
                    step += _members(_fields(tp)[part])
                elif isinstance(part, str) and (_TAG.search(part) or _kind(tp) == part):
                    step.append(tp)  # a union member's tag, or the discriminator value
            elif isinstance(part, int) and origin in (list, tuple, Sequence) and args:
                step += _members(args[0])
            elif isinstance(part, str) and origin in (dict, Mapping) and len(args) == 2:
                step += _members(args[1])
            elif isinstance(part, str) and _TAG.search(part):
                step.append(tp)
        candidates = step
    models = [tp for tp in candidates if isinstance(tp, type) and issubclass(tp, BaseModel)]
    return sorted({key for tp in models for key in _fields(tp)})


def _members(tp: Any) -> list[Any]:
    """`tp` without Annotated and Optional, a union as its members."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _members(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in get_args(tp) for m in _members(arg)]
    return [tp]


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    expanded = dict.fromkeys(getattr(model, "expanded_keys", ()))  # written, but expanded before validation
    return {f.alias or name: f.annotation for name, f in model.model_fields.items()} | expanded


def _kind(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("kind")
    return None if field is None else field.default


def error_line(err: Any, raw: Any, *, hidden: Collection[str] = (), model: Any = None) -> str:
    """One pydantic error as `field: what is wrong`, the field as written. `hidden`: fields whose
    value may be a credential; their value is never repeated. `model`: the type `raw` was
    validated as, for the keys an unknown key could have meant."""
    loc, msg = field_path(raw, err["loc"]), str(err["msg"]).removeprefix("Value error, ")
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "union_tag_invalid":
        tag = err["input"].get("kind") if isinstance(err["input"], dict) else None
        loc, msg = f"{loc}.kind" if loc else "kind", unknown("kind", tag, _quoted(ctx.get("expected_tags", "")))
    elif kind == "extra_forbidden":
        key = str(err["loc"][-1]) if err["loc"] else ""
        keys = known_keys(model, err["loc"]) if model is not None and err["loc"] else []
        msg = unknown("key", key, keys) if keys else f"unknown key {clip(key, 40)} (a typo? extra keys are not allowed)"
    elif kind == "literal_error":
        field = next((str(p) for p in reversed(err["loc"]) if isinstance(p, str) and not _TAG.search(p)), "value")
        msg = unknown(field, err["input"], _quoted(str(ctx.get("expected", ""))))
    elif kind not in ("missing", "value_error") and not set(hidden) & {str(p) for p in err["loc"]}:
        msg += f" (got {clip(err['input'], 60)})"
    return f"{loc}: {msg}" if loc else msg


def _quoted(text: str) -> list[str]:
    """The names in pydantic's "'a', 'b' or 'c'" (its ctx for literals and union tags)."""
    return re.findall(r"'([^']*)'", text)
