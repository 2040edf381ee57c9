"""A TEST DOUBLE backend (`kind: test-double`): deterministic pseudo-logprobs, no model at all.

It exists to exercise the harness itself — scheduling at fleet scale, faults, resume, storage —
where a real engine would cost minutes per case. Its numbers mean nothing about any model and
the report labels its targets as test doubles. It can be told to be slow, to hang, to die or to
emit NaN, on chosen shards, once (a marker file makes the retry behave).
"""

from __future__ import annotations

import math
import os
import time
import zlib
from typing import TYPE_CHECKING, Any

from actors.tables import scores_table, to_generation
from fleet.contracts.engine import Completion, Engine, Generation
from fleet.contracts.targets import TestDoubleArgs

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.contracts.spec import Shard


def _pseudo(seed: str, vocab: int, k: int) -> tuple[list[int], list[float]]:
    """Deterministic top-k ids and logprobs for a context, the same on every host."""
    h = zlib.crc32(seed.encode())
    ids = [(h + 7919 * i) % vocab for i in range(k)]
    return ids, [-0.5 - i - (h % 97) / 1000 for i in range(k)]


class TestDoubleEngine(Engine):
    __test__ = False

    def __init__(self, args: TestDoubleArgs, *rest: Any, **kw: Any) -> None:
        super().__init__(args, *rest, **kw)
        self.args: TestDoubleArgs = args
        if args.fail_to_load:
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
        completions = [self._complete(p, nan=nan) for p in shard.prompts]
        return to_generation(shard, self.model, completions, started_at=started, wall_s=time.perf_counter() - t0)

    def _complete(self, prompt: Any, *, nan: bool) -> Completion:
        k, n = self.sampling.logprobs, self.sampling.max_tokens
        prompt_ids = [zlib.crc32(w.encode()) % self.args.vocab_size for w in (prompt.prompt or prompt.id).split()]
        out, lps, tops, top_lps = [], [], [], []
        for pos in range(n):
            ids, values = _pseudo(f"{prompt.id}:{pos}", self.args.vocab_size, k)
            out.append(ids[0])
            lps.append(math.nan if nan else values[0] + self.args.logprob_shift)
            tops.append(ids)
            top_lps.append([v + self.args.logprob_shift for v in values])
        if self.args.seconds_per_token:
            time.sleep(self.args.seconds_per_token * n)
        return Completion(
            prompt=prompt,
            rendered=prompt.prompt or "",
            prompt_token_ids=prompt_ids,
            output_token_ids=out,
            output_text=" ".join(map(str, out)),
            finish_reason="length",
            logprobs=lps,
            ranks=[1] * n,
            topk_ids=tops,
            topk_logprobs=top_lps,
            queue_s=0.0,
            ttft_s=self.args.seconds_per_token,
            tpot_s=self.args.seconds_per_token if n > 1 else None,
            e2e_s=self.args.seconds_per_token * n,
        )

    def score(self, requests: pa.Table, *, k: int) -> pa.Table:
        rows: list[dict[str, object]] = []
        for r in requests.select(["prompt_id", "output_token_ids"]).to_pylist():
            for pos, tok in enumerate(r["output_token_ids"]):
                ids, values = _pseudo(f"{r['prompt_id']}:{pos}", self.args.vocab_size, k)
                rank = ids.index(tok) + 1 if tok in ids else k + 1
                rows.append(
                    {
                        "prompt_id": r["prompt_id"],
                        "position": pos,
                        "ref_logprob": values[rank - 1] if rank <= k else values[-1] - 1,
                        "ref_rank": rank,
                        "ref_topk_ids": ids,
                        "ref_topk_logprobs": values,
                    }
                )
        return scores_table(rows)

    def describe(self) -> dict[str, str]:
        import platform
        import socket

        return {"hostname": socket.gethostname(), "device": "test-double", "python": platform.python_version()}

    def shutdown(self) -> None:
        pass
