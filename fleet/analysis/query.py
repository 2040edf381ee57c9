"""SQL for analysts over one run directory, or over every run of a results root at once:
`fleet query RUN_DIR|RESULTS_ROOT "SELECT ..."` (a root's tables are stacked on `run_id`, and
a `runs` table lists the runs: fleet/results/catalog.py).

Every table directory of the run is registered under its name: requests, tokens and shards (typed
and empty when absent, so a query never fails just because a run produced no rows), plus any other
directory of Parquet files (probe tables such as layers or logits). The metrics of fleet.analysis
are registered too, as parity, first_step, sequences, kl_topk, divergences, throughput, perf and
perf_lengths; they are computed only when the query names them, since on a big run they cost a full
pass over the tokens.
Polars SQL is the dialect (https://docs.pola.rs/api/python/stable/reference/sql/).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import polars as pl
import pyarrow.fs as pafs

from fleet.analysis import divergence, perf, throughput, workload
from fleet.analysis import parity as analysis
from fleet.analysis.noise_model import NoiseSpec
from fleet.contracts.errors import UserError
from fleet.contracts.inputs import cut
from fleet.contracts.messages import unknown
from fleet.results import catalog, reader, store
from fleet.results.store import RUN_JSON

Tables = dict[str, pl.LazyFrame]


class Settings(NamedTuple):
    """What a derived table needs from run.json: the reference target, and the noise model's
    settings (each candidate's dtype, `parity.allowance`, `parity.near_tie_nats`), so a view says
    what the report says."""

    reference: str
    noise: NoiseSpec = NoiseSpec()


# name -> how to compute it from the stored tables and the run's settings
DERIVED: dict[str, Callable[[Tables, Settings], pl.DataFrame]] = {
    "parity": lambda t, s: analysis.parity(t["requests"], t["tokens"], s.reference).join(
        divergence.summary(t["requests"], t["tokens"], s.reference, spec=s.noise),
        on=analysis.RUN,
        how="left",
    ),
    "first_step": lambda t, s: analysis.first_step(t["tokens"], s.reference),
    "sequences": lambda t, s: analysis.sequences(t["requests"], s.reference),
    "kl_topk": lambda t, s: analysis.kl_topk(t["tokens"], s.reference),
    "throughput": lambda t, _: throughput.throughput(t["requests"], t["shards"]),
    "perf": lambda t, _: perf.summary(t["perf_requests"], t["perf_levels"]),
    "perf_lengths": lambda t, _: workload.lengths(t["perf_requests"], t["perf_levels"]),
    "divergences": lambda t, s: divergence.divergences(t["requests"], t["tokens"], s.reference, spec=s.noise),
}

# Three queries docs/recipes.md shows; tests run them against a real run directory.
EXAMPLES = {
    "worst teacher-forced positions": (
        "SELECT target, prompt_id, position, token_id, logprob, ref_logprob, "
        "ABS(logprob - ref_logprob) AS abs_dlogp, ref_rank "
        "FROM tokens WHERE ref_logprob IS NOT NULL ORDER BY abs_dlogp DESC LIMIT 10"
    ),
    # At the first divergence: how close the reference's own top-1 was to the candidate's token.
    "where each prompt diverges": (
        "SELECT s.target, s.prompt_id, s.first_divergence, s.tokens_matched, s.tokens_total, "
        "t.token_id AS cand_token, t.ref_logprob AS ref_lp_of_cand, "
        "ARRAY_GET(t.ref_topk_ids, 1) AS ref_top1, ARRAY_GET(t.ref_topk_logprobs, 1) AS ref_top1_lp "
        "FROM sequences s LEFT JOIN tokens t ON t.model = s.model AND t.target = s.target "
        "AND t.prompt_set = s.prompt_set AND t.prompt_id = s.prompt_id AND t.position = s.first_divergence "
        "WHERE NOT s.exact_match ORDER BY s.target, s.first_divergence"
    ),
    "latency by target": (
        "SELECT target, COUNT(*) AS requests, MEDIAN(ttft_s) * 1000 AS ttft_p50_ms, "
        "MEDIAN(tpot_s) * 1000 AS tpot_p50_ms, QUANTILE_CONT(e2e_s, 0.9) * 1000 AS e2e_p90_ms "
        "FROM requests GROUP BY target ORDER BY target"
    ),
}


def tables(run_dir: str | Path) -> Tables:
    """The stored tables of run_dir (a local directory or a URI) by name: the three of fleet/contracts/schema.py
    plus any other Parquet directory; of a results root, every run's, stacked."""
    if not catalog.is_run(run_dir) and catalog.is_root(run_dir):
        return catalog.stacked(run_dir)
    fs, root = store.locate(run_dir)
    try:
        kind = fs.get_file_info(root).type
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        msg = f"{cut(str(run_dir), 200)}: cannot read it: {cut(str(e), 120)}"
        raise UserError(msg) from None
    if kind != pafs.FileType.Directory:
        msg = f"{cut(str(run_dir), 200)}: no such run directory"
        raise UserError(msg)
    found = reader.load(run_dir)
    subdirs = fs.get_file_info(pafs.FileSelector(root))
    for sub in sorted(d.base_name for d in subdirs if d.type == pafs.FileType.Directory and d.base_name not in found):
        files = store.parquet_files(fs, f"{root}/{sub}")
        if files and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", sub):  # a name SQL can say unquoted
            found[sub] = reader.scan(fs, files)
    return found


def _settings(run_dir: str | Path) -> Settings | None:
    """The run's reference and parity settings; None when there is no run.json (a copied table directory)."""
    fs, root = store.locate(run_dir)
    if fs.get_file_info(f"{root}/{RUN_JSON}").type == pafs.FileType.NotFound:
        return None
    info = reader.read_info(run_dir)
    return Settings(info.reference, NoiseSpec.from_info(info))


def context(run_dir: str | Path, *, sql: str = "") -> pl.SQLContext[pl.LazyFrame]:
    """A SQLContext with the run's tables, and those DERIVED tables that `sql` mentions."""
    stored = tables(run_dir)
    ctx: pl.SQLContext[pl.LazyFrame] = pl.SQLContext(stored)
    wanted = [n for n in DERIVED if n not in stored and re.search(rf"\b{n}\b", sql, flags=re.IGNORECASE)]
    if "runs" in stored:  # a results root: each run's metrics, computed per run and stacked
        per_run = [(d, tables(d), _settings(d)) for d in catalog.run_dirs(run_dir)] if wanted else []
        for name in wanted:
            parts = [_derived(name, t, s, d).with_columns(run_id=pl.lit(_run_id(d))) for d, t, s in per_run]
            ctx.register(name, pl.concat(parts, how="diagonal_relaxed").lazy())
        return ctx
    for name in wanted:
        ctx.register(name, _derived(name, stored, _settings(run_dir), run_dir).lazy())
    return ctx


def _derived(name: str, stored: Tables, settings: Settings | None, run_dir: str | Path) -> pl.DataFrame:
    if settings is None and name not in ("throughput", "perf", "perf_lengths"):
        msg = f"{run_dir}: table {name!r} needs the reference target, and there is no {RUN_JSON}"
        raise UserError(msg)
    return DERIVED[name](stored, settings or Settings(""))


def _run_id(run_dir: str | Path) -> str:
    return reader.read_info(run_dir).run_id


def query(run_dir: str | Path, sql: str) -> pl.DataFrame:
    """Run one SQL statement over the run's tables; errors name the tables and columns there are."""
    with reader.decoding(run_dir):  # the derived tables read every stored row
        ctx = context(run_dir, sql=sql)
    with reader.decoding(run_dir):  # what Polars' errors do not cover: garbled strings, panics
        try:
            return ctx.execute(sql).collect()
        except pl.exceptions.PolarsError as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            # The computed tables are registered only when named, so list them too: a typo in
            # `parity` must not read as if the run had no such table.
            known = sorted({*ctx.tables(), *DERIVED})
            raise UserError(_failure(first_line, known)) from None


def _failure(first_line: str, tables: list[str]) -> str:
    """Polars' error, with a closest-match hint for a wrong table or column name; a list of names
    is shown whole or not at all (`fleet query RUN_DIR --tables` lists every column)."""
    listed = "fleet query RUN_DIR --tables"
    if table := re.search(r"relation '([^']*)' was not found", first_line):
        return f"query failed: {unknown('table', table.group(1), tables)}; their columns: {listed}"
    if column := re.search(r'unable to find column "([^"]*)"; valid columns: \[(.*)\]', first_line):
        columns = re.findall(r'"([^"]*)"', column.group(2))
        return f"query failed: {unknown('column', column.group(1), columns, listed=listed)}"
    return f"query failed: {cut(first_line, 200)}\ntables: {', '.join(tables)} (their columns: {listed})"


def describe(run_dir: str | Path) -> str:
    """Each queryable table and its columns, one line each."""
    lines = ["tables:"]
    with reader.decoding(run_dir):  # Polars re-reads each footer: a garbled one fails here
        for name, frame in tables(run_dir).items():
            lines.append(f"  {name}: {', '.join(frame.collect_schema().names())}")
    lines.append(f"  computed on demand: {', '.join(DERIVED)}")
    return "\n".join(lines)


def render(frame: pl.DataFrame, *, fmt: str = "table") -> str:
    """The result as an aligned text table (all rows), CSV, or JSON lines."""
    if fmt == "csv":
        # CSV has no list type: nested columns are written as JSON arrays.
        nested = [c for c, t in frame.schema.items() if isinstance(t, pl.List | pl.Array | pl.Struct)]
        return frame.with_columns(pl.col(c).map_elements(_json, return_dtype=pl.String) for c in nested).write_csv()
    if fmt == "json":
        return frame.write_ndjson()
    if fmt != "table":
        msg = f"unknown format {fmt!r}; choose table, csv or json"
        raise ValueError(msg)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=400, fmt_str_lengths=80, tbl_hide_dataframe_shape=True):
        return str(frame)


def _json(value: object) -> str:
    return json.dumps(value.to_list() if isinstance(value, pl.Series) else value)
