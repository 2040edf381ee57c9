"""Engines that write their own rows (`run.write`, docs/cluster.md): where the results store is
shared, each actor stores its shard's Parquet itself and hands the driver only where the files wait
and the shard's one `shards` row; the driver commits the shard. No token row passes through it.

The driver hands every actor a `DirectSink` as a call's argument (the engine side imports nothing
of the driver's, fleet/contracts/engine.py `RowSink`); the actor calls it on the rows it produced.
What an actor writes waits under <run_dir>/.staging, which no reader lists (fleet/results/staging.py):

- a reference's shard, and a candidate's once scored, under .staging/ready/<table>/<layout>: its
  requests, tokens and prompt_stats, each whole (fleet/results/atomic.py). The driver commits it by
  moving each file to the same place in its table (a rename on a file system; on S3 a server-side
  copy: docs/measurements.md) and writing its shards row last, the marker of a complete shard on
  either path: a retried shard lands on the same names, so nothing is counted twice;
- a candidate's shard as generated, as `Staging.put` stores it (its shards marker last): the
  reference reads it from there to score it, and `--resume` scores a whole one without generating it again.

A killed actor leaves files only under .staging; `--resume` removes them (`Staging.recover`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.contracts.engine import Generation
from fleet.results import prompt_rows
from fleet.results.scores import join_scores, non_finite
from fleet.results.staging import Staging
from fleet.results.store import READY, S3_ENDPOINT_VARS, RunStore

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

# Settings an actor's S3 client needs, forwarded from the driver's environment when they are set
# there: a local Ray's workers do not see variables the driver set after Ray started, and a
# remote node has its own. Credentials not set here come from the node (instance profile, ~/.aws).
S3_ENV = (
    *S3_ENDPOINT_VARS,
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)
# File systems a directory is shared on between nodes (/proc/mounts types).
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "fuse.")
# A shard stored by an actor and committed by the driver: these tables, moved in this order.
READY_TABLES = ("requests", "tokens", "prompt_stats")


@dataclass(frozen=True)
class Written:
    """What an actor hands back for a shard it stored: all the driver gets."""

    shard_id: str
    weights: str  # the weights the shard's rows are stored under
    shard: pa.Table  # its one `shards` row, which the driver writes to commit it
    files: tuple[str, ...]  # paths under READY on the store's file system; none: staged (a candidate)
    tokens: int  # token rows, for the progress bar
    non_finite: bool  # some logprob is NaN or infinite: the target fails, as on the driver path


@dataclass(frozen=True)
class DirectSink:
    """The `RowSink` of one run: where its actors store shards, and which target is the reference
    (whose shards are stored ready to commit; a candidate's are staged for it to score)."""

    run_dir: str
    run_id: str
    reference: str

    def generated(self, gen: Generation) -> Written:
        shard_id = gen.shard.column("shard_id")[0].as_py()
        if gen.shard.column("target")[0].as_py() == self.reference:
            return self._ready(gen, gen.tokens)
        weights = Staging(self._store()).put(gen)
        return Written(shard_id, weights, gen.shard, (), gen.tokens.num_rows, non_finite(gen.tokens))

    def scored(self, stored: tuple[str, str], score: Callable[[pa.Table], pa.Table]) -> Written:
        """A staged candidate shard, `stored` = (its shard id, its weights), scored and stored ready."""
        gen = Staging(self._store()).get(*stored)
        return self._ready(gen, join_scores(gen.tokens, score(gen.requests)))

    def _ready(self, gen: Generation, tokens: pa.Table) -> Written:
        store, shard_id = self._store(), gen.shard.column("shard_id")[0].as_py()
        rows = (gen.requests, tokens, prompt_rows.summarize(tokens))
        files = tuple(str(store.write(t, shard_id, r, area=READY)) for t, r in zip(READY_TABLES, rows, strict=True))
        weights = str(gen.shard.column("model_weights")[0].as_py())
        return Written(shard_id, weights, gen.shard, files, tokens.num_rows, non_finite(tokens))

    def _store(self) -> RunStore:
        return _open(self.run_dir, self.run_id)


@functools.cache
def _open(run_dir: str, run_id: str) -> RunStore:
    """One RunStore per run in an actor's process (its file system client reused across shards)."""
    store = RunStore(run_dir)
    store._run_id = run_id  # known: no read of run.json per actor
    return store


def actors_write(write: str, store: RunStore, *, nodes: int) -> bool:
    """Whether this run's actors write their own rows (`run.write`; auto: see RunOptions.write)."""
    if write != "auto":
        return write == "actors"
    return not store.local or (nodes > 1 and network_fs(store.root))


def network_fs(path: str) -> bool:
    """Whether local `path` is on a file system other nodes can mount too (NFS, Lustre...)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:  # not Linux: say no, the driver path is always safe
        return False
    found = [(point, kind) for point, kind in mounts if path == point or path.startswith(point.rstrip("/") + "/")]
    if not found:
        return False
    kind = max(found, key=lambda m: len(m[0]))[1]  # the innermost mount holds it
    return kind.startswith(NETWORK_FS)


def actor_env(store: RunStore) -> dict[str, str]:
    """The driver's S3 settings, for actors writing to an object store (S3_ENV says why)."""
    if store.local:
        return {}
    return {name: os.environ[name] for name in S3_ENV if os.environ.get(name)}
