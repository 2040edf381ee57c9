"""Candidate rows that wait for their reference, when a model's targets take turns
(fleet/run/placement.py, takes_turns): a candidate's shard is stored here as generated, durably,
before its actor is released; the reference, started later, scores it from these rows, and the
shard is then committed like any other (its `shards` row written last, fleet/run/writer.py), after
which its staged files go.

They live in `<run_dir>/.staging/<table>/...` (the tables' own layout), beside the tables and in
none of them: the readers (fleet/results/reader.py, `fleet query`, which takes only directory
names SQL can say) and a glob such as results/*/tokens/** never see them, and Spark and Hive skip
dot directories. Like a committed shard, a staged one is whole once its `shards` file is there
(written last), so a driver killed mid-way leaves either a whole staged shard, which `--resume`
scores without generating it again, or files that `--resume` removes. `--resume` also stages here
again a candidate's shard committed unscored (no reference was left to score it), to be scored.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import polars as pl
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from fleet.contracts.engine import Generation
from fleet.results import reader
from fleet.results.packed import Packed
from fleet.results.prompt_stats import PROMPT
from fleet.results.store import STAGING, parquet_files

if TYPE_CHECKING:
    from collections.abc import Collection

    from fleet.results.store import RunStore

# Written in this order; the `shards` file, last, marks a staged shard whole.
TABLES = ("requests", "tokens", "shards")


class Staging:
    """A run's staged candidate shards, each found by its shard id and the weights it ran on."""

    def __init__(self, store: RunStore) -> None:
        self.store, self.fs = store, store.fs
        self.root = f"{store.root}/{STAGING}"

    def put(self, gen: Generation | Packed) -> str:
        """Store a candidate shard's rows as generated (as tables, or as its actor encoded them);
        returns the weights they are stored under."""
        shard_id = gen.shard.column("shard_id")[0].as_py()
        if isinstance(gen, Packed):
            for table in TABLES[:-1]:
                self.store.put_encoded(table, shard_id, *gen.files[table], staged=True)
        else:
            for table, rows in zip(TABLES[:-1], (gen.requests, gen.tokens), strict=True):
                self.store.write(table, shard_id, rows, staged=True)
        self.store.write("shards", shard_id, gen.shard, staged=True)  # last: the shard is whole
        return str(gen.shard.column("model_weights")[0].as_py())

    def get(self, shard_id: str, weights: str) -> Generation:
        """A staged shard's rows, as its candidate generated them."""
        files = self._files(shard_id, weights)
        return Generation(*(pq.read_table(files[t], filesystem=self.fs) for t in TABLES))

    def packed(self, shard_id: str, weights: str) -> Packed:
        """A staged shard as its files' bytes, for the reference's actor to read (fleet/results/packed.py)."""
        files = self._files(shard_id, weights)
        encoded = {}
        for table in TABLES[:-1]:
            under = weights if files[table] == self.store.path(table, shard_id, weights, staged=True) else "none"
            with self.fs.open_input_file(files[table]) as f:
                encoded[table] = (under, f.read())
        shard = pq.read_table(files["shards"], filesystem=self.fs)
        return Packed(shard_id, shard, encoded, tokens=0, non_finite=False)  # counted when generated

    def drop(self, shard_id: str, weights: str) -> None:
        """Remove a staged shard once it is committed; its marker first, so it never looks whole
        with a file missing."""
        for file in reversed(self._files(shard_id, weights).values()):
            with contextlib.suppress(FileNotFoundError):  # a retried drop: gone already
                self.fs.delete_file(file)

    def recover(self, uncommitted: Collection[str]) -> dict[str, str]:
        """On resume: the whole staged shards among `uncommitted` (shard id -> weights), to be
        scored, not generated again. Every other staged file goes: a committed shard's leftovers
        (the driver died before dropping them), or a shard the driver died while staging."""
        whole: dict[str, str] = {}
        markers = parquet_files(self.fs, f"{self.root}/shards")
        if markers:
            rows = ds.dataset(markers, filesystem=self.fs, format="parquet").to_table(
                columns=["shard_id", "model_weights"]
            )
            whole = {r["shard_id"]: r["model_weights"] for r in rows.to_pylist() if r["shard_id"] in uncommitted}
        keep = {f for s, w in whole.items() for f in self._files(s, w).values()}
        for file in self._every_file():
            if file not in keep:
                self.fs.delete_file(file)
        return whole

    def unscored(self, reference: str, committed: Collection[str]) -> dict[str, str]:
        """The `committed` candidate shards without the reference's scores (shard id -> weights):
        written unscored because no reference was left to score them (it could not start, or
        its node went and no other could hold it), or left so by a driver killed while it
        replaced such a shard's files with scored ones. `--resume` stages them to be scored.
        Read from `prompt_stats`, the last of a shard's files a commit writes: token rows, and
        not one with a reference logprob. The tables are read as a report reads them (each
        file's footer checked first: a damaged file is bad input, not a crash)."""
        scans = reader.load(self.store.run_dir)
        keys = [*PROMPT[:-1], "prompt_id"]
        ours = pl.col("target") != reference
        stats = scans["prompt_stats"].filter(ours).select(*keys, "n_positions", "tf_positions")
        per_shard = (
            scans["requests"]
            .filter(ours)
            .select(*keys, "shard_id")
            .join(stats, on=keys)
            .group_by("shard_id", "model_weights")
            .agg(pl.col("n_positions").sum(), pl.col("tf_positions").fill_null(0).sum())
            .filter((pl.col("n_positions") > 0) & (pl.col("tf_positions") == 0))
            .collect()
        )
        return {shard_id: weights for shard_id, weights, *_ in per_shard.iter_rows() if shard_id in committed}

    def restage(self, shard_id: str, weights: str) -> None:
        """Stage a committed shard's rows again, as generated, for the reference to score; its
        scored rows then replace them under the same names (exactly once, as any commit)."""
        read = {t: pq.read_table(self.store.path(t, shard_id, weights), filesystem=self.fs) for t in TABLES}
        self.put(Generation(read["requests"], read["tokens"], read["shards"]))

    def tidy(self) -> None:
        """Remove the staging directory once nothing is staged: every shard of it committed."""
        if self.store.local and not self._every_file() and self.fs.get_file_info(self.root).type != _MISSING:
            self.fs.delete_dir(self.root)  # empty partition directories only

    def _files(self, shard_id: str, weights: str) -> dict[str, str]:
        """Each table's file of a staged shard. An empty table is stored under weights "none"
        (RunStore.write: no row to take them from), e.g. tokens when no request produced a token."""
        found = {}
        for table in TABLES:
            paths = [self.store.path(table, shard_id, w, staged=True) for w in (weights, "none")]
            info = self.fs.get_file_info(paths)
            found[table] = next((p for p, i in zip(paths, info, strict=True) if i.type == pafs.FileType.File), paths[0])
        return found

    def _every_file(self) -> list[str]:
        """Every file in the staging area, temp files of an interrupted write included."""
        selector = pafs.FileSelector(self.root, recursive=True, allow_not_found=True)
        return [f.path for f in self.fs.get_file_info(selector) if f.type == pafs.FileType.File]


_MISSING = pafs.FileType.NotFound
