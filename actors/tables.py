"""Building the declared Arrow tables from engine-neutral results: every engine's last step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleet.contracts.engine import Completion, Generation, ResolvedModel

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.contracts.spec import Shard


def to_generation(
    shard: Shard,
    model: ResolvedModel,
    completions: list[Completion],
    *,
    started_at: float,
    wall_s: float,
    tokens: pa.Table | None = None,
) -> Generation:
    """Build the requests, tokens and shards rows of one shard (ref_* columns left null);
    `tokens` given: the tokens rows already built (dense_generation)."""
    import datetime as dt
    import socket

    import pyarrow as pa

    from fleet.contracts import schema

    keys: dict[str, object] = {
        "model": shard.model,
        "model_weights": model.weights,
        "target": shard.target,
        "prompt_set": shard.prompt_set,
    }
    requests = pa.Table.from_pylist(
        [
            keys
            | {
                "prompt_id": c.prompt.id,
                "shard_id": shard.shard_id,
                "prompt": c.rendered,
                "messages": c.prompt.messages_json(),
                "expected": c.prompt.expected.rule() if c.prompt.expected else None,
                "prompt_token_ids": c.prompt_token_ids,
                "output_text": c.output_text,
                "output_token_ids": c.output_token_ids,
                "n_prompt_tokens": len(c.prompt_token_ids),
                "n_output_tokens": len(c.output_token_ids),
                "finish_reason": c.finish_reason,
                "queue_s": c.queue_s,
                "ttft_s": c.ttft_s,
                "tpot_s": c.tpot_s,
                "e2e_s": c.e2e_s,
            }
            for c in completions
        ]
    )
    n = [len(c.output_token_ids) for c in completions]
    tokens = (
        tokens
        if tokens is not None
        else pa.table(
            {
                **{key: [value] * sum(n) for key, value in keys.items()},
                "prompt_id": [c.prompt.id for c in completions for _ in c.output_token_ids],
                "position": [i for c in completions for i in range(len(c.output_token_ids))],
                "token_id": [t for c in completions for t in c.output_token_ids],
                "logprob": [x for c in completions for x in c.logprobs],
                "rank": [x for c in completions for x in c.ranks],
                "topk_ids": [x for c in completions for x in c.topk_ids],
                "topk_logprobs": [x for c in completions for x in c.topk_logprobs],
            }
        )
    )
    shard_row = pa.Table.from_pylist(
        [
            keys
            | {
                "shard_id": shard.shard_id,
                "n_requests": len(completions),
                "n_output_tokens": sum(n),
                "started_at": dt.datetime.fromtimestamp(started_at, tz=dt.UTC),
                "wall_s": wall_s,
                "hostname": socket.gethostname(),
            }
        ]
    )
    return Generation(
        schema.conform(requests, schema.REQUESTS),
        schema.conform(tokens, schema.TOKENS),
        schema.conform(shard_row, schema.SHARDS),
    )


def dense_generation(
    shard: Shard,
    model: ResolvedModel,
    completions: list[Completion],
    arrays: Mapping[str, Any],
    *,
    started_at: float,
    wall_s: float,
) -> Generation:
    """`to_generation` for a shard whose prompts all generated the same number of tokens, with the
    per-token columns given as numpy arrays (token_id, logprob, rank: [n, T]; topk_ids,
    topk_logprobs: [n, T, k]) instead of lists in each Completion (whose per-token lists are then
    ignored): the test double's path, so a benchmark measures the driver and not list building."""
    import numpy as np
    import pyarrow as pa

    from fleet.contracts import schema

    n, t = arrays["token_id"].shape
    k = arrays["topk_ids"].shape[2]

    def per_token(name: str, dtype: Any) -> pa.Array:
        return pa.array(np.ascontiguousarray(arrays[name], dtype=dtype).reshape(-1))

    def lists(name: str, dtype: Any) -> pa.Array:
        flat = pa.array(np.ascontiguousarray(arrays[name], dtype=dtype).reshape(-1))
        return pa.ListArray.from_arrays(pa.array(np.arange(0, n * t * k + 1, k, dtype=np.int32)), flat)

    ids = np.array([c.prompt.id for c in completions], dtype=object)
    keys = {
        "model": shard.model,
        "model_weights": model.weights,
        "target": shard.target,
        "prompt_set": shard.prompt_set,
    }
    tokens = pa.table(
        {
            **{c: pa.array([v] * (n * t), pa.string()) for c, v in keys.items()},
            "prompt_id": pa.array(np.repeat(ids, t), pa.string()),
            "position": pa.array(np.tile(np.arange(t, dtype=np.int32), n)),
            "token_id": per_token("token_id", np.int32),
            "logprob": per_token("logprob", np.float32),
            "rank": per_token("rank", np.int32),
            "topk_ids": lists("topk_ids", np.int32),
            "topk_logprobs": lists("topk_logprobs", np.float32),
        }
    )
    tokens = schema.conform(tokens, schema.TOKENS)
    return to_generation(shard, model, completions, started_at=started_at, wall_s=wall_s, tokens=tokens)


def scores_table(rows: list[dict[str, object]]) -> pa.Table:
    """SCORES rows (prompt_id, position, ref_*) as a table of the declared schema."""
    import pyarrow as pa

    from fleet.contracts import schema

    return schema.conform(pa.Table.from_pylist(rows), schema.SCORES) if rows else schema.SCORES.empty_table()


# One position's logprob entries as an engine reports them: token id -> (rank, logprob).
Step = Mapping[int, tuple[int, float]]


def top_k(step: Step, k: int) -> tuple[list[int], list[float]]:
    """Ids and logprobs of the entries ranked 1..k, best first. An engine may add the chosen token
    to a step when it ranks below k (vLLM does): it is left out here."""
    top = sorted((rank, t, lp) for t, (rank, lp) in step.items() if rank <= k)
    return [t for _, t, _ in top], [lp for _, _, lp in top]


def teacher_forced(requests: pa.Table) -> list[dict[str, Any]]:
    """The rows a scorer teacher-forces: prompt_id, prompt_token_ids, output_token_ids of each
    request that generated something."""
    columns = requests.select(["prompt_id", "prompt_token_ids", "output_token_ids"]).to_pylist()
    return [r for r in columns if r["output_token_ids"]]


def score_rows(
    prompt_id: str, output_token_ids: Sequence[int], steps: Sequence[Step], *, k: int
) -> list[dict[str, object]]:
    """SCORES rows of one request: `steps[j]` is the entries at output position j, which must
    include the output token itself."""
    rows: list[dict[str, object]] = []
    for j, (tok, step) in enumerate(zip(output_token_ids, steps, strict=True)):
        ids, logprobs = top_k(step, k)
        rank, logprob = step[tok]
        rows.append(
            {
                "prompt_id": prompt_id,
                "position": j,
                "ref_logprob": logprob,
                "ref_rank": rank,
                "ref_topk_ids": ids,
                "ref_topk_logprobs": logprobs,
            }
        )
    return rows
