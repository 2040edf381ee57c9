"""Shards the actors encode and the driver stores (the driver path, `run.write: driver`): each
actor hands back its shard's tables as the Parquet files' bytes, ready to store, instead of Arrow
tables for the driver to summarise and encode. One driver then only moves bytes to disk, which keeps
it from being the run's bottleneck when many actors feed it (docs/measurements.md, issue 23), and
what crosses the network to it is zstd-compressed Parquet rather than Arrow buffers.

- A reference's shard comes back whole: requests, tokens and prompt_stats, encoded.
- A candidate's shard comes back as generated (requests and tokens) and goes, bytes and all, to the
  reference's actor, which reads it, scores it, joins the scores and summarises it there
  (`PackSink.scored`), and hands it back whole.

The driver stores a whole shard as `ShardWriter.write` stores rows (fleet/run/writer.py): each
table's file whole or not at all, its `shards` row last. The files are the ones the driver would
have written itself (fleet/results/store.py `stamped` and `encoded`), so readers and `--resume`
cannot tell the paths apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.contracts.engine import Generation
from fleet.results import prompt_rows
from fleet.results.scores import join_scores, non_finite
from fleet.results.store import encoded, stamped, stored_under

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

# A whole shard's tables, stored in this order before its shards row.
WHOLE = ("requests", "tokens", "prompt_stats")


@dataclass(frozen=True)
class Packed:
    """One shard's tables as Parquet files' bytes: table -> (the weights it is stored under, bytes)."""

    shard_id: str
    shard: pa.Table  # its one `shards` row, which the driver writes last
    files: dict[str, tuple[str, bytes]]
    tokens: int  # token rows, for the progress bar
    non_finite: bool  # some logprob is NaN or infinite: the target fails

    @property
    def whole(self) -> bool:
        """Ready to store: a reference's shard, or a candidate's once scored."""
        return set(self.files) == set(WHOLE)

    def generation(self) -> Generation:
        """The rows again, as tables (a candidate's, to score or to store unscored)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        requests, tokens = (pq.read_table(pa.BufferReader(self.files[t][1])) for t in ("requests", "tokens"))
        return Generation(requests, tokens, self.shard)


@dataclass(frozen=True)
class PackSink:
    """The `RowSink` of a run whose driver stores the rows: the actor encodes them (its run's id
    goes into every row), a candidate's shard as generated, a reference's or a scored one whole."""

    run_id: str
    reference: str

    def generated(self, gen: Generation) -> Packed:
        rows = {"requests": gen.requests, "tokens": gen.tokens}
        if gen.shard.column("target")[0].as_py() == self.reference:  # whole: its prompt_stats too
            rows["prompt_stats"] = prompt_rows.summarize(gen.tokens)
        return self._packed(gen.shard, gen.tokens, self._encoded(rows))

    def scored(self, stored: Packed, score: Callable[[pa.Table], pa.Table]) -> Packed:
        """A candidate's shard, scored here by the reference's engine (`score`: requests -> SCORES
        rows), whole; its requests file as the candidate's actor encoded it."""
        gen = stored.generation()
        tokens = join_scores(gen.tokens, score(gen.requests))
        files = self._encoded({"tokens": tokens, "prompt_stats": prompt_rows.summarize(tokens)})
        return self._packed(gen.shard, tokens, {"requests": stored.files["requests"], **files})

    def _encoded(self, rows: dict[str, pa.Table]) -> dict[str, tuple[str, bytes]]:
        """Each table as stored (its run id in every row) and encoded, with the weights it goes under."""
        files = {}
        for table, data in rows.items():
            data = stamped(table, data, self.run_id)
            files[table] = (stored_under(data), encoded(data).to_pybytes())
        return files

    @staticmethod
    def _packed(shard: pa.Table, tokens: pa.Table, files: dict[str, tuple[str, bytes]]) -> Packed:
        shard_id = shard.column("shard_id")[0].as_py()
        return Packed(shard_id, shard, files, tokens.num_rows, non_finite(tokens))
