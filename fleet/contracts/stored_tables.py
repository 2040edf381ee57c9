"""Every table a run directory may hold, by its stored name: what the store writes and the reader,
catalog and query read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.contracts.perf_schema import LOAD_TABLES, PERF_TABLES
from fleet.contracts.probe_schema import DRILLDOWN_TABLES, PROBE_TABLES
from fleet.contracts.schema import TABLES

if TYPE_CHECKING:
    import pyarrow as pa


def all_tables() -> dict[str, pa.Schema]:
    """Every table a run directory may hold: parity (TABLES), perf, parity under load, probe and drill-down tables."""
    return TABLES | PERF_TABLES | LOAD_TABLES | PROBE_TABLES | DRILLDOWN_TABLES
