"""VllmEngine.perf on a real vLLM CPU engine: one engine for the module, built in this process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors import reaper
from actors.sources import resolver
from fleet.contracts.engine import Chunk
from fleet.contracts.scenario import Scenario

pytestmark = pytest.mark.engine

SYNTHETIC = {"seed": 7, "hidden_size": 128, "intermediate_size": 256, "num_layers": 2, "num_heads": 4}


@pytest.fixture(scope="module")
def engine(fleet_cache: Path) -> Iterator[Any]:
    from actors.vllm_engine import VllmEngine
    from fleet.contracts.backend_args import CPU_ENV, VllmArgs
    from fleet.contracts.engine import ResolvedModel
    from fleet.contracts.sources import SyntheticSource
    from fleet.contracts.spec import ModelSpec, Sampling

    spec = ModelSpec(name="tiny", source=SyntheticSource(**SYNTHETIC, num_kv_heads=2, init_std=0.1))
    args = VllmArgs(name="vllm-fp32", dtype="float32", max_model_len=256)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in CPU_ENV.items():
            mp.setenv(key, value)
        mp.delenv(reaper.SOCKETS, raising=False)  # the engine sets it in this process: unset after
        path = resolver(spec.source).local_dir()
        eng = VllmEngine(args, ResolvedModel(spec, path, "test", None), sampling=Sampling(max_tokens=8))
        try:
            yield eng
        finally:
            eng.shutdown()
            assert not Path(eng.sockets).exists()  # its sockets directory went with it


def scenario(**kw: Any) -> Scenario:
    base = {"name": "s", "concurrency": [1, 4], "input_tokens": 24, "output_tokens": 12, "num_requests": 8}
    return Scenario(**(base | {"warmup_requests": 2} | kw))


def generate(engine: Any) -> list[list[int]]:
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Shard

    shard = Shard("tiny", "vllm-fp32", "p", 0, (Prompt(id="a", prompt="The capital of France is"),))
    return [r["output_token_ids"] for r in engine.generate(shard).requests.to_pylist()]


def test_levels_give_exact_token_counts_and_engine_figures(engine: Any) -> None:
    before = generate(engine)
    sc = scenario()
    for level in sc.concurrency:
        result = engine.perf(sc, level)
        rows = result.requests.to_pylist()
        assert len(rows) == 8 and all(r["error"] is None for r in rows)
        for r in rows:
            assert (r["n_prompt_tokens"], r["n_output_tokens"]) == (24, 12)  # ignore_eos: exactly 12
            assert len(r["itl_s"]) == 11
            assert sum(r["itl_s"]) == pytest.approx(r["tpot_s"] * 11)
            assert r["e2e_s"] >= r["ttft_s"] > 0
            assert r["engine_ttft_s"] > 0 and r["engine_tpot_s"] > 0 and r["engine_queue_s"] >= 0
            # The engine's interval (scheduled to first token) lies within the client's.
            assert r["ttft_s"] >= r["engine_ttft_s"] - 1e-3
        spans = sorted((r["sent_s"], r["sent_s"] + r["e2e_s"]) for r in rows)
        overlapping = any(b[0] < a[1] for a, b in itertools.pairwise(spans))
        assert overlapping == (level > 1)
        [lv] = result.level.to_pylist()
        assert (lv["model"], lv["target"], lv["level"], lv["n_requests"]) == ("tiny", "vllm-fp32", level, 8)
        # The client's own figures: its event-loop thread's CPU (not the engine's, in this process) and
        # every request's lag behind the moment it could go.
        assert 0 < lv["client_cpu_s"] < lv["wall_s"] and (lv["probe"], lv["clients"]) == (0, 1)
        assert all(r["send_lag_s"] >= 0 and r["probe"] == 0 and r["client"] == 0 for r in rows)
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert generate(engine) == before  # perf left the engine as generate expects it


def test_prompt_set_with_chat_prompts_and_open_loop(engine: Any) -> None:
    from fleet.contracts.prompts import Message, Prompt

    prompts = [
        Prompt(id="t", prompt="Two plus two equals"),
        Prompt(id="c", messages=[Message(role="user", content="hi")]),
    ]
    sc = scenario(input_tokens=None, prompt_set="p", num_requests=4, request_rate=200.0, concurrency=[2])
    rows = engine.perf(sc, 2, prompts).requests.to_pylist()
    tok = engine.llm.get_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    lengths = [len(tok("Two plus two equals").input_ids), len(tok(chat, add_special_tokens=False).input_ids)]
    assert [r["n_prompt_tokens"] for r in rows] == lengths * 2
    scheduled = [r["scheduled_s"] for r in rows]
    assert scheduled == sorted(scheduled) and scheduled[0] > 0  # Poisson arrivals, not all at once


def test_a_sweep_runs_its_probes_on_the_engine(engine: Any) -> None:
    """An SLO nothing meets: the closed loop fails, then the floor fails, and the search stops there."""
    sc = scenario(concurrency=[4], num_requests=4, slo={"e2e_s": 1e-6}, sweep={"floor_rps": 50.0, "steps": 2})
    result = engine.perf(sc, 4)
    levels = result.level.to_pylist()
    assert [(lv["probe"], lv["request_rate"]) for lv in levels] == [(0, None), (1, 50.0)]
    rows = result.requests.to_pylist()
    assert [r["probe"] for r in rows] == [0] * 4 + [1] * 4 and all(r["error"] is None for r in rows)
    assert not engine.llm.llm_engine.has_unfinished_requests()


def test_too_long_for_the_context_fails_before_sending(engine: Any) -> None:
    with pytest.raises(ValueError, match="max_model_len 256"):
        engine.perf(scenario(input_tokens=250), 1)


def test_a_stream_left_early_is_aborted_in_the_engine(engine: Any) -> None:
    from actors.vllm_stream import StepBridge

    async def first_chunk_only(stream: Any) -> Any:
        gen: AsyncGenerator[Chunk, None] = stream([0, 5, 6, 7], 50)
        async with contextlib.aclosing(gen):
            return await anext(gen)

    chunk = StepBridge(engine.llm.llm_engine).run(lambda stream: asyncio.run(first_chunk_only(stream)))
    assert chunk.n_tokens >= 1
    assert not engine.llm.llm_engine.has_unfinished_requests()


def test_shared_prefix_hits_the_prefix_cache_and_turns_wait_for_their_answers(engine: Any) -> None:
    """The engine's own prefix-cache counters per level: hits on a shared-prefix workload and on a
    conversation's history, an honest 0 on prompts that share nothing."""
    plain = engine.perf(scenario(concurrency=[1], warmup_requests=1), 1).level.to_pylist()[0]
    assert plain["prefix_cache_queries"] >= 8 * 24 and plain["prefix_cache_hits"] == 0
    # vLLM CPU caches whole blocks of 128 tokens (vllm/platforms/cpu.py): prefixes must span one.
    shared = scenario(input_tokens=16, output_tokens=4, shared_prefix={"groups": 2, "prefix_tokens": 136})
    [lv] = engine.perf(shared, 1).level.to_pylist()
    # 2 groups x 4 prompts: all but the first of each group find the prefix's first block cached.
    assert lv["prefix_cache_hits"] >= 6 * 128 and lv["prefix_cache_queries"] >= 8 * 152
    chat = scenario(input_tokens=64, output_tokens=8, num_requests=6, multi_turn={"turns": 3}, send="chat")
    result = engine.perf(chat, 4)
    rows = result.requests.to_pylist()
    assert [r["n_prompt_tokens"] for r in rows] == [r["requested_prompt_tokens"] for r in rows]
    assert [r["requested_prompt_tokens"] for r in rows] == [64, 64, 136, 136, 208, 208]
    for r, before in zip(rows[2:], rows, strict=False):  # turn k is sent once turn k-1 has its answer
        assert r["sent_s"] >= before["sent_s"] + before["e2e_s"]
    assert result.level.to_pylist()[0]["prefix_cache_hits"] >= 2 * 128  # turn 3 finds turn 2's first block
