"""What every verb does with text a user hands it: bounded reads, a strict YAML loader, names that
may become path components, URLs without secrets, and values quoted at a readable length.

Everything here raises UserError (or ValueError inside pydantic validators, which the manifest
loader turns into one), so a bad file, a hostile name or a YAML bomb is one short message, never a
traceback, and never a path outside the run directory or cache.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from fleet.contracts.errors import UserError

MAX_NAME = 128  # a name is one path component; with a prefix and suffix it stays under 255 bytes
MAX_FILE_BYTES = 16 << 20  # a manifest or gates file; prompt sets this large belong in a JSONL file
MAX_YAML_NODES = 500_000  # after aliases are expanded: an alias bomb is refused before anything walks it
MAX_YAML_DEPTH = 64
MAX_PATH = 4096
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_NAME = re.compile(NAME_PATTERN)
# Query parameters and environment names that carry credentials (S3 URIs accept access_key=...).
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "credentials", "signature", "sig")


def cut(text: str, limit: int = 160) -> str:
    """`text` cut to about `limit` characters, on one line: a 200 kB value is not echoed."""
    indent = text[: len(text) - len(text.lstrip(" "))]
    text = indent + " ".join(text.split())
    return text if len(text) <= limit else f"{text[: limit - 16]}...({len(text)} chars)"


def clip(value: object, limit: int = 80) -> str:
    """`value` quoted (repr) for a message, cut to about `limit` characters."""
    return cut(repr(value), limit)


def check_name(value: Any, *, what: str) -> str:
    """A user string that becomes one path component (run id, target or model name)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > MAX_NAME:
        msg = f"{what}: {clip(value, 60)} is not a name: use letters, digits and . _ - "
        msg += f"(not first: . _ -), at most {MAX_NAME} characters"
        raise UserError(msg)
    return value


def check_path_text(value: Any) -> Any:
    """A path a user wrote (pydantic BeforeValidator): a string, no NUL or control characters, bounded."""
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str) or not value:
        msg = "expected a non-empty path string"
        raise ValueError(msg)
    if len(value) > MAX_PATH or any(ord(c) < 32 for c in value):
        msg = f"not a usable path (control characters or over {MAX_PATH} characters)"
        raise ValueError(msg)
    return value


def inside(root: str | Path, path: str | Path, *, what: str) -> None:
    """Refuse to write `path` unless it resolves inside `root` (a run directory or a cache)."""
    root_s, path_s = str(root), str(path)
    if "://" in root_s:  # object store keys: no resolution, but no `..` component either
        ok = path_s.startswith(root_s.rstrip("/") + "/") and ".." not in path_s[len(root_s) :].split("/")
    else:
        ok = Path(path_s).resolve().is_relative_to(Path(root_s).resolve()) and ".." not in Path(path_s).parts
    if not ok:
        msg = f"{what}: {clip(path_s)} is outside {clip(root_s)}; refusing to write there"
        raise UserError(msg)


def check_url(url: str, *, what: str) -> str:
    """A URL that is recorded (run.json, logs): no user:password@ and no secret query parameters.
    The message never repeats the secret."""
    try:
        parts = urlsplit(url)
        has_userinfo = "@" in parts.netloc
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        msg = f"{what}: not a valid URL"
        raise UserError(msg) from None
    if has_userinfo:
        msg = f"{what}: credentials in the URL (user:password@host) are not accepted, they would be recorded; "
        msg += "put the key in an environment variable (api_key_env, or AWS_* for S3)"
        raise UserError(msg)
    leaked = sorted({k for k, _ in query if is_secret_name(k)})
    if leaked:
        msg = f"{what}: query parameter(s) {', '.join(clip(k, 30) for k in leaked)} look like credentials and "
        msg += "would be recorded; pass them through the environment instead"
        raise UserError(msg)
    return url


def is_secret_name(name: str) -> bool:
    """An environment variable or parameter whose name says it holds a credential."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return any(w in _SECRET_WORDS or w.endswith(("key", "token", "secret", "password")) for w in words)


def read_text(path: Path, *, what: str) -> str:
    """A small UTF-8 text file a user named: every way it can be unreadable is one UserError."""
    try:
        if path.is_dir():
            msg = f"{path}: {what} is a directory, expected a file"
            raise UserError(msg)
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        msg = f"{path}: {what} file not found"
        raise UserError(msg) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        msg = f"{clip(str(path))}: cannot read the {what}: {getattr(e, 'strerror', None) or e}"
        raise UserError(msg) from None
    if len(data) > MAX_FILE_BYTES:
        msg = f"{path}: {what} is over {MAX_FILE_BYTES >> 20} MiB"
        raise UserError(msg)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        msg = f"{path}: {what} is not UTF-8 text (byte {e.start})"
        raise UserError(msg) from None


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, and reads dates as strings (an id 2024-13-45 is text,
    not a crash in the date constructor)."""

    yaml_implicit_resolvers = {  # noqa: RUF012  (PyYAML's own class attribute, replaced whole)
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key that is not a plain value", key_node.start_mark
                ) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {clip(key, 40)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node) -> int:
    """Nodes after alias expansion (an alias is the same node object again), without recursion."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(node, 0, False)]
    while stack:
        current, depth, done = stack.pop()
        if depth > MAX_YAML_DEPTH:
            msg = f"nested deeper than {MAX_YAML_DEPTH} levels"
            raise ValueError(msg)
        children = _children(current)
        if done:
            sizes[id(current)] = min(1 + sum(sizes[id(c)] for c in children), MAX_YAML_NODES + 1)
            continue
        if id(current) in sizes:
            continue
        stack.append((current, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)
    return sizes[id(node)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml(text: str, *, source: str) -> Any:
    """One YAML document, safely: duplicate keys, alias bombs, deep nesting and bad scalars are a
    one-line UserError naming `source` and the line."""
    try:  # the reader checks the text is printable as it opens
        loader = _Loader(text)
    except yaml.YAMLError as e:
        msg = f"{source}: not valid YAML: {cut(str(e), 120)}"
        raise UserError(msg) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_YAML_NODES:
            msg = f"{source}: more than {MAX_YAML_NODES} values once aliases are expanded (an alias bomb?)"
            raise UserError(msg)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        msg = f"{source}: not valid YAML{where}: {cut(str(e.problem or e.context or 'syntax error'), 120)}"
        raise UserError(msg) from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:
        # ValueError etc.: a scalar PyYAML's own constructors reject (!!timestamp 2024-13-45, !!int x)
        msg = f"{source}: not valid YAML: {cut(str(e), 120)}"
        raise UserError(msg) from None
    finally:
        loader.dispose()
