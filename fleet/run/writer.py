"""Committing shards on threads beside the dispatch loop: file writes and fsync release the GIL,
so dispatch goes on meanwhile. A run ends only when every write has. A shard's actor encoded it
(fleet/results/packed.py: its bytes are stored) or stored it itself (fleet/results/direct.py: its
files are moved into the tables); the rows the driver holds as tables, a candidate's left unscored,
are summarised and encoded here. Every way, the shards row is written last."""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from fleet.results import prompt_rows
from fleet.results.packed import WHOLE, Packed

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleet.results.store import RunStore
    from fleet.run.progress import Progress
    from fleet.run.work import ShardFiles, ShardRows

# Shards handed to the writer threads and not yet on disk: their rows are held in the driver.
MAX_PENDING_WRITES = 16
# glibc's mallopt parameters, and what the writer sets them to (keep_freed_memory).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_FREED = {_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 256 << 20}  # 32 MiB: the most glibc takes


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory this process frees, for its next allocation, rather than
    hand it back to the kernel: summarising a shard makes and drops dozens of numpy arrays of 0.25-1.3 MB,
    and by default each comes from a fresh mmap whose pages fault in one by one (2,800 faults a
    shard of 32,000 rows, a third of the step's CPU on this VM; docs/measurements.md). Arrays
    above 32 MiB are still mapped and unmapped. Process-wide, once; no effect but on glibc;
    returns whether it took."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
    except (ValueError, OSError):  # not glibc (macOS, musl)
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return all(mallopt(param, value) == 1 for param, value in _KEEP_FREED.items())


class ShardWriter:
    """Writes each shard's tables on a pool of threads, holding at most MAX_PENDING_WRITES."""

    def __init__(self, store: RunStore, bar: Progress) -> None:
        self.store, self.bar = store, bar
        keep_freed_memory()
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleet-write")
        self.pending: list[Future[None]] = []

    def write(self, shard: ShardRows) -> None:
        gen, tokens = shard.gen, shard.tokens
        shard_id = gen.shard.column("shard_id")[0].as_py()

        def write() -> None:
            # The shards row goes last: its presence marks the shard complete (resume relies on that).
            self.store.write("requests", shard_id, gen.requests)
            self.store.write("tokens", shard_id, tokens)
            self.store.write("prompt_stats", shard_id, prompt_rows.summarize(tokens))  # what the report reads
            self.store.write("shards", shard_id, gen.shard)
            if shard.then is not None:
                shard.then()
            self.bar.update(1, model=gen.shard.column("model")[0].as_py(), tokens=tokens.num_rows)

        self._submit(write)

    def commit(self, files: ShardFiles) -> None:
        """Commit a shard an actor stored or encoded: its files into the tables, then its shards
        row, which marks it complete exactly as `write` does (a driver killed before it: --resume redoes it)."""
        written = files.written

        def commit() -> None:
            if isinstance(written, Packed):
                for table in WHOLE:
                    self.store.put_encoded(table, written.shard_id, *written.files[table])
            else:
                for ready in written.files:
                    self.store.move_in(ready)
            self.store.write("shards", written.shard_id, written.shard)
            if files.then is not None:
                files.then()
            self.bar.update(1, model=written.shard.column("model")[0].as_py(), tokens=written.tokens)

        self._submit(commit)

    def _submit(self, task: Callable[[], None]) -> None:
        # Finished writes are checked and let go: a million-prompt run must not keep every future.
        pending = []
        for done in self.pending:
            if done.done():
                done.result()
            else:
                pending.append(done)
        while len(pending) >= MAX_PENDING_WRITES:  # the disk is behind: dispatch waits for it
            pending.pop(0).result()
        self.pending = [*pending, self.pool.submit(task)]

    def wait(self) -> None:
        """Every shard handed over so far is on disk; a failed write (disk full, bucket gone)
        raises here, failing the run rather than passing silently."""
        for done in self.pending:
            done.result()
        self.pending = []

    def stop(self) -> None:
        """Let the writes in flight finish and the threads go."""
        self.pool.shutdown(wait=True)
