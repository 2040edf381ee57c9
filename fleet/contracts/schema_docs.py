"""The docs generated from the schemas: each table's columns in docs/results.md and the names a user
types in docs/metrics.md, rewritten by `make docs` (python -m fleet.contracts.schema_docs).
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from fleet.contracts.gates import METRICS
from fleet.contracts.perf_schema import PERF_LENGTHS, PERF_SUMMARY
from fleet.contracts.stored_tables import all_tables

# The pages `make docs` keeps in sync with the code: the tables' columns (between <!-- schema:NAME -->
# and <!-- /schema -->) and the names a user types (between <!-- names:KEY --> and <!-- /names -->;
# an error for a wrong gate metric id points there, fleet/contracts/gates.py). Paths are from the
# repository's top; tests/test_store.py and tests/test_messages.py fail when a page is stale.
TABLES_PAGE = "docs/results.md"
NAMES_PAGE = "docs/metrics.md"


def documented_tables() -> dict[str, pa.Schema]:
    """Every table the docs document: the stored ones and the perf summary computed from them."""
    return all_tables() | {"perf": PERF_SUMMARY, "perf_lengths": PERF_LENGTHS}


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{_type_name(t.value_type)}>"
    return {"float": "float32", "double": "float64"}.get(str(t), str(t))


def markdown(schema: pa.Schema) -> str:
    """The schema as a Markdown table, for TABLES_PAGE (kept in sync by a test)."""
    rows = ["| column | type | meaning |", "|---|---|---|"]
    for field in schema:
        doc = (field.metadata or {}).get(b"doc", b"").decode()
        rows.append(f"| `{field.name}` | {_type_name(field.type)} | {doc} |")
    return "\n".join(rows)


def documented_names() -> dict[str, str]:
    """Names a user types that NAMES_PAGE lists whole (between <!-- names:KEY --> markers): an
    error for a wrong one points there when the list is too long for the message."""
    return {"gate-metrics": ", ".join(f"`{name}`" for name in METRICS)}


def sync_docs(root: str = ".") -> None:
    """Rewrite the schema tables in TABLES_PAGE and the name lists in NAMES_PAGE (under `root`)
    from the code. A page that lacks a table's or a list's markers is an error, so that nothing
    documented is dropped silently."""
    tables = Path(root) / TABLES_PAGE
    text = tables.read_text(encoding="utf-8")
    for name, declared in documented_tables().items():
        text = _between(text, f"<!-- schema:{name} -->", "<!-- /schema -->", markdown(declared), page=tables)
    tables.write_text(text, encoding="utf-8")
    names_page = Path(root) / NAMES_PAGE
    text = names_page.read_text(encoding="utf-8")
    for key, names in documented_names().items():
        text = _between(text, f"<!-- names:{key} -->", "<!-- /names -->", names, page=names_page)
    names_page.write_text(text, encoding="utf-8")


def _between(text: str, start: str, end: str, body: str, *, page: object) -> str:
    """`text` with what lies between the marker lines `start` and `end` replaced by `body` (as is:
    a function replacement, so a backslash in it is not a group reference); `page` names the
    file in the error when the markers are missing."""
    block = re.compile(rf"({re.escape(start)}\n).*?({re.escape(end)})", re.S)
    text, found = block.subn(lambda m: f"{m.group(1)}{body}\n{m.group(2)}", text)
    if not found:
        msg = f"{page}: no {start} ... {end} markers to write into"
        raise ValueError(msg)
    return text


if __name__ == "__main__":
    sync_docs()
