"""A TEST DOUBLE backend (`kind: test-double`): deterministic pseudo-logprobs, no model at all.

It exists to exercise the harness itself — scheduling at fleet scale, faults, resume, storage,
perf levels and gates against baseline runs — where a real engine would cost minutes per case. Its
numbers mean nothing about any model and the report labels its targets as test doubles. It can be
told to be slow (`seconds_per_token`, which also sets its perf levels' pace), to hang, to die or
to emit NaN, on chosen shards, once (a marker file makes the retry behave).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import zlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.tables import dense_generation
from fleet.contracts.backend_args import TestDoubleArgs
from fleet.contracts.engine import Chunk, Completion, Engine, Generation

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.contracts.engine import PerfResult
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import Shard


_STEP = 0x9E3779B1  # positions spread over the 32-bit hash space (Fibonacci hashing)


def _pseudo(prompt_ids: list[str], n: int, vocab: int, k: int) -> tuple[Any, Any]:
    """Deterministic top-k ids and logprobs at positions 0..n-1 of each prompt, the same on every
    host: arrays [prompts, n, k], computed at once (numpy), so the double costs the harness little."""
    import numpy as np

    base = np.array([zlib.crc32(p.encode()) for p in prompt_ids], dtype=np.uint64)
    h = (base[:, None] + np.arange(n, dtype=np.uint64)[None, :] * np.uint64(_STEP)) % np.uint64(1 << 32)
    j = np.arange(k, dtype=np.uint64)
    ids = ((h[..., None] + np.uint64(7919) * j) % np.uint64(vocab)).astype(np.int32)
    values = -0.5 - j.astype(np.float64) - (h % np.uint64(97)).astype(np.float64)[..., None] / 1000
    return ids, values


class TestDoubleEngine(Engine):
    __test__ = False

    def __init__(self, args: TestDoubleArgs, *rest: Any, **kw: Any) -> None:
        super().__init__(args, *rest, **kw)
        self.args: TestDoubleArgs = args
        # Not a once-only fault: a load that fails in a kept actor is retried in a new one (scheduler).
        if args.fail_to_load or (args.fail_to_load_while is not None and args.fail_to_load_while.exists()):
            msg = f"test double {args.name!r} told to fail to load"
            raise RuntimeError(msg)

    def _once(self, shard_id: str, fault: str) -> bool:
        """True the first time a fault is asked for this shard (then the marker exists)."""
        if self.args.fault_dir is None:
            return False
        marker = self.args.fault_dir / f"{fault}-{shard_id.replace('/', '_')}"
        if marker.exists():
            return False
        marker.write_text(str(os.getpid()))
        return True

    def generate(self, shard: Shard) -> Generation:
        started, t0 = time.time(), time.perf_counter()
        if shard.shard_id in self.args.hang_shards and self._once(shard.shard_id, "hang"):
            time.sleep(3600)
        if shard.shard_id in self.args.die_shards and self._once(shard.shard_id, "die"):
            time.sleep(0.5)  # mid-shard, as a SIGKILL would find it
            os.kill(os.getpid(), 9)
        nan = shard.shard_id in self.args.nan_shards
        k, n = self.sampling.logprobs, self.sampling.max_tokens
        ids, values = _pseudo([p.id for p in shard.prompts], n, self.args.vocab_size, k)
        values = values + self.args.logprob_shift
        logprob = np.full(ids.shape[:2], np.nan) if nan else values[..., 0]
        if self.args.seconds_per_token:
            time.sleep(self.args.seconds_per_token * n * len(shard.prompts))
        completions = [self._complete(p, out) for p, out in zip(shard.prompts, ids[..., 0].tolist(), strict=True)]
        arrays = {"token_id": ids[..., 0], "logprob": logprob, "rank": np.ones(ids.shape[:2]), "topk_ids": ids}
        return dense_generation(
            shard,
            self.model,
            completions,
            arrays | {"topk_logprobs": values},
            started_at=started,
            wall_s=time.perf_counter() - t0,
        )

    def _complete(self, prompt: Any, out: list[int]) -> Completion:
        """The request's row; its per-token columns come as arrays (dense_generation)."""
        n, spt = len(out), self.args.seconds_per_token
        prompt_ids = [zlib.crc32(w.encode()) % self.args.vocab_size for w in (prompt.prompt or prompt.id).split()]
        return Completion(
            prompt=prompt,
            rendered=prompt.prompt or "",
            prompt_token_ids=prompt_ids,
            output_token_ids=out,
            output_text=" ".join(map(str, out)),
            finish_reason="length",
            logprobs=[],
            ranks=[],
            topk_ids=[],
            topk_logprobs=[],
            queue_s=0.0,
            ttft_s=spt,
            tpot_s=spt if n > 1 else None,
            e2e_s=spt * n,
        )

    def score(self, requests: pa.Table, *, k: int, twin: str | None = None) -> pa.Table:
        import pyarrow as pa
        import pyarrow.compute as pc

        from fleet.contracts import schema

        outputs = requests.column("output_token_ids").combine_chunks()
        counts = pc.list_value_length(outputs).fill_null(0).to_numpy(zero_copy_only=False)
        if not counts.sum():
            return schema.SCORES.empty_table()
        n = int(counts.max())
        prompt_ids = requests.column("prompt_id").to_pylist()
        ids, values = _pseudo(prompt_ids, n, self.args.vocab_size, k)
        present = np.arange(n)[None, :] < counts[:, None]  # [prompts, n]: positions each request has
        toks = np.zeros(present.shape, dtype=np.int64)
        toks[present] = pc.list_flatten(outputs).to_numpy()
        hit = ids == toks[..., None]
        rank = np.where(hit.any(axis=2), hit.argmax(axis=2) + 1, k + 1)
        picked = np.take_along_axis(values, np.minimum(rank, k)[..., None] - 1, axis=2)[..., 0]
        ref_logprob = np.where(rank <= k, picked, values[..., -1] - 1)
        rows = np.nonzero(present)

        def lists(a: Any, dtype: Any) -> pa.Array:
            flat = pa.array(np.ascontiguousarray(a[rows], dtype=dtype).reshape(-1))
            return pa.ListArray.from_arrays(pa.array(np.arange(0, len(rows[0]) * k + 1, k, dtype=np.int32)), flat)

        table = pa.table(
            {
                "prompt_id": pa.array(np.array(prompt_ids, dtype=object)[rows[0]], pa.string()),
                "position": pa.array(rows[1].astype(np.int32)),
                "ref_logprob": pa.array(ref_logprob[rows].astype(np.float32)),
                "ref_rank": pa.array(rank[rows].astype(np.int32)),
                "ref_topk_ids": lists(ids, np.int32),
                "ref_topk_logprobs": lists(values, np.float32),
            }
        )
        return schema.conform(table, schema.SCORES)

    def perf(
        self,
        scenario: Scenario,
        level: int,
        prompts: list[Prompt] | None,
        parity_prompts: list[Prompt] | None = None,
    ) -> PerfResult:
        """One level of a perf scenario through the real load generator (actors/loadgen.py), with
        no model behind the stream: see `_stream`. It has no greedy path to send under load."""
        if parity_prompts:
            msg = "the test double runs perf levels without parity under load (no model gives it tokens)"
            raise ValueError(msg)
        from actors.loadgen import PreparedLevel
        from actors.workloads import level_seed

        rng = random.Random(level_seed(scenario, level))
        vocab = self.args.vocab_size
        if scenario.input_tokens is not None:
            if not isinstance(scenario.input_tokens, int):
                msg = "the test double sends prompts of one fixed length (input_tokens: N), not a distribution"
                raise ValueError(msg)
            length = scenario.input_tokens
            measured = [[rng.randrange(vocab) for _ in range(length)] for _ in range(scenario.num_requests)]
        else:
            words = [(p.prompt or p.id).split() for p in prompts or []]
            encoded = [[zlib.crc32(w.encode()) % vocab for w in ws] for ws in words] or [[0]]
            measured = [encoded[i % len(encoded)] for i in range(scenario.num_requests)]
        warmup = [[rng.randrange(vocab) for _ in range(len(measured[0]))] for _ in range(scenario.warmup_requests)]
        return asyncio.run(PreparedLevel(self, scenario, level, measured, warmup).measure(self._stream))

    async def _stream(self, prompt_ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        """One token at a time, token k due `seconds_per_token` x (k + 1) after the request starts.
        Sleeping to each deadline (not for a fixed gap) keeps a late wake-up on a busy host from
        pushing every later token back: the pace, and so the throughput, is what the manifest set."""
        start, step = time.perf_counter(), self.args.seconds_per_token
        for k in range(max_tokens):
            await asyncio.sleep(max(0.0, start + (k + 1) * step - time.perf_counter()))
            yield Chunk(1)

    def describe(self) -> dict[str, str]:
        import os
        import platform
        import socket

        # The cards this process was given, as a real engine records them: placement tests read it.
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
        facts = {"hostname": socket.gethostname(), "device": "test-double", "python": platform.python_version()}
        return facts | {"visible_devices": visible}

    def shutdown(self) -> None:
        pass
