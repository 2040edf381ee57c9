"""Perf workloads with real tokenizers (no engine): exact token counts as the model sees them (ids,
text, chat after the template), seeded length distributions, shared-prefix and multi-turn prompt
structure, trace files and their errors, and trace replay against a stub OpenAI server."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import random
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from actors import workloads
from actors.exact_text import pools
from actors.sources import resolver
from fleet.contracts.errors import UserError
from fleet.contracts.scenario import Scenario
from fleet.contracts.sources import SyntheticSource
from fleet.contracts.workload import Lengths, read_trace

# The engine tests' tiny llama (tests/test_perf_engine.py): its tokenizer is built once per session.
SYNTHETIC = {"seed": 7, "hidden_size": 128, "intermediate_size": 256, "num_layers": 2, "num_heads": 4}
# Above SmolLM2's chat template (its default system prompt alone is 30 tokens).
NORMAL = {"distribution": "normal", "mean": 72, "std": 20, "min": 40, "max": 130}


@pytest.fixture(scope="module")
def plain(fleet_cache: Path) -> Any:
    """A plain (non-instruct) tokenizer: the synthetic model's byte-level BPE, BOS added to text."""
    from transformers import AutoTokenizer

    path = resolver(SyntheticSource(**SYNTHETIC, num_kv_heads=2, init_std=0.1)).local_dir()
    return AutoTokenizer.from_pretrained(path)


def scenario(**kw: Any) -> Scenario:
    base = {"name": "s", "concurrency": [1], "input_tokens": 40, "output_tokens": 8, "num_requests": 12}
    return Scenario(**(base | kw))


def as_seen(tok: Any, r: workloads.Request) -> int:
    """A request's prompt tokens counted afresh, from what is sent, as a server would count them."""
    if r.messages is not None:
        text = tok.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False)
        return len(tok(text, add_special_tokens=False).input_ids)
    return len(tok(r.text).input_ids) if r.text is not None else len(r.ids)


def check_exact(tok: Any, send: str) -> list[workloads.Request]:
    sc = scenario(input_tokens=NORMAL, num_requests=40, send=send)
    measured, warm = workloads.level_requests(sc, tok, level=1)
    assert [as_seen(tok, r) for r in measured] == [r.requested_input for r in measured]
    assert [len(r.ids) for r in measured] == [r.requested_input for r in measured]
    assert len({r.requested_input for r in measured}) > 10  # drawn, not fixed
    assert [as_seen(tok, r) for r in warm] == [len(r.ids) for r in warm]
    return measured


def naive_misses(tok: Any, n: int, count: int) -> int:
    """How many of `count` prompts built the naive way (decode random ids, send the text) miss `n`."""
    rng, pool = random.Random(0), pools(tok)[0]
    return sum(len(tok(tok.decode([rng.choice(pool) for _ in range(n)])).input_ids) != n for _ in range(count))


def test_plain_tokenizer_text_and_chat_prompts_have_exact_lengths(plain: Any) -> None:
    assert naive_misses(plain, 64, 40) > 20  # the bug being fixed is real for this tokenizer
    texts = check_exact(plain, "text")
    assert all(r.text and r.messages is None for r in texts)
    chats = check_exact(plain, "chat")
    assert all(r.messages and r.messages[0]["role"] == "user" and len(r.messages) == 1 for r in chats)


@pytest.mark.engine  # converts the GGUF once (~25 s, cached)
def test_smollm2_chat_prompts_have_exact_lengths(smollm2: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    assert naive_misses(tok, 64, 40) > 0
    chats = check_exact(tok, "chat")
    assert "<|im_start|>" in tok.apply_chat_template(chats[0].messages, tokenize=False)  # the real template
    check_exact(tok, "text")


def test_distributions_are_seeded_and_have_their_statistics() -> None:
    uniform = Lengths(distribution="uniform", min=10, max=50)
    draws = workloads.draw(uniform, 20_000, random.Random(1))
    assert (min(draws), max(draws)) == (10, 50)
    assert statistics.mean(draws) == pytest.approx(30, abs=0.3)
    assert statistics.pstdev(draws) == pytest.approx(((41**2 - 1) / 12) ** 0.5, rel=0.02)
    normal = Lengths(**NORMAL)
    draws = workloads.draw(normal, 20_000, random.Random(1))
    assert (min(draws), max(draws)) == (40, 130)
    # The exact law of round(N(72, 20)) clipped to [40, 130]: the clip at 40 (1.6 sd) lifts the mean.
    law, p = statistics.NormalDist(72, 20), {}
    for k in range(40, 131):
        p[k] = law.cdf(k + 0.5 if k < 130 else math.inf) - law.cdf(k - 0.5 if k > 40 else -math.inf)
    mean = sum(k * q for k, q in p.items())
    sd = sum((k - mean) ** 2 * q for k, q in p.items()) ** 0.5
    assert mean > 72.3 and statistics.mean(draws) == pytest.approx(mean, abs=0.4)  # 3 standard errors
    assert statistics.pstdev(draws) == pytest.approx(sd, abs=0.4)
    assert draws == workloads.draw(normal, 20_000, random.Random(1))
    assert draws != workloads.draw(normal, 20_000, random.Random(2))
    assert workloads.draw(Lengths(distribution="fixed", mean=7), 3, random.Random(0)) == [7, 7, 7]
    assert workloads.draw(9, 2, random.Random(0)) == [9, 9]


def test_bad_distributions_and_scenarios_are_named() -> None:
    for bad, words in [
        ({"distribution": "normal", "mean": 5}, "needs std and max"),
        ({"distribution": "uniform", "min": 9, "max": 3}, "max (3) is below min (9)"),
        ({"distribution": "fixed", "mean": 3, "std": 1}, "std is for the normal distribution"),
        ({"distribution": "poisson", "mean": 3}, "'fixed', 'uniform' or 'normal'"),
    ]:
        with pytest.raises(ValidationError, match=re.escape(words)):
            Lengths(**bad)
    with pytest.raises(ValidationError, match=r"exactly one of input_tokens .* and trace \(got input_tokens, prompt"):
        scenario(prompt_set="x")
    with pytest.raises(ValidationError, match=r"multiple of shared_prefix.groups \(5\)"):
        scenario(shared_prefix={"groups": 5, "prefix_tokens": 8})
    with pytest.raises(ValidationError, match="multi_turn builds synthetic prompts"):
        scenario(input_tokens=None, prompt_set="x", multi_turn={"turns": 2})
    with pytest.raises(ValidationError, match="at most one of shared_prefix and multi_turn"):
        scenario(shared_prefix={"groups": 2, "prefix_tokens": 8}, multi_turn={"turns": 2})
    with pytest.raises(ValidationError, match="a prompt set goes as ids"):
        scenario(input_tokens=None, prompt_set="x", send="chat")
    sc = scenario(input_tokens=NORMAL, output_tokens={"distribution": "uniform", "max": 30}, multi_turn={"turns": 3})
    assert sc.longest_request == 3 * 130 + 2 * 30 + 30
    # With the load patterns (docs/metrics.md): a turn waits for the previous one within one client's run.
    sweep = {"sweep": {"floor_rps": 1, "steps": 1}, "slo": {"ttft_s": 1}}
    for combined in ({"clients": 2, "concurrency": [2]}, sweep):
        with pytest.raises(ValidationError, match=r"multi_turn sends each turn after the previous one .* clients: 1"):
            scenario(multi_turn={"turns": 2}, **combined)
    swept = scenario(shared_prefix={"groups": 2, "prefix_tokens": 8}, **sweep)  # fresh requests for every probe
    assert workloads.measured_count(swept) == 12 * swept.sweep.runs


def test_too_short_for_the_chat_template_is_one_clear_error(plain: Any) -> None:
    with pytest.raises(ValueError, match=r"request 0: 8 tokens asked, but the chat template .* take \d+"):
        workloads.level_requests(scenario(input_tokens=8, send="chat"), plain, level=1)


@pytest.mark.parametrize("send", ["ids", "text", "chat"])
def test_shared_prefix_groups_share_their_prefix(plain: Any, send: str) -> None:
    sc = scenario(input_tokens=30, shared_prefix={"groups": 3, "prefix_tokens": 32}, send=send)
    measured, warm = workloads.level_requests(sc, plain, level=1)
    assert [len(r.ids) for r in measured] == [r.requested_input for r in measured] == [62] * 12
    heads = collections.Counter(tuple(r.ids[:32]) for r in measured)
    assert sorted(heads.values()) == [4, 4, 4]  # 3 prefixes, num_requests / groups prompts each
    assert len({tuple(r.ids) for r in measured}) == 12  # the suffixes differ
    order = [list(heads).index(tuple(r.ids[:32])) for r in measured]
    assert order != sorted(order)  # shuffled, as vLLM's dataset is
    assert not {tuple(w.ids[:32]) for w in warm} & set(heads)  # warm-up never fills the cache for them


@pytest.mark.parametrize("send", ["ids", "text", "chat"])
def test_multi_turn_resends_the_growing_history(plain: Any, send: str) -> None:
    sc = scenario(input_tokens=40, output_tokens=6, num_requests=8, multi_turn={"turns": 4}, send=send)
    measured, _ = workloads.level_requests(sc, plain, level=1)
    assert [r.after for r in measured] == [None, None, 0, 1, 2, 3, 4, 5]  # 2 conversations, in rounds
    for r in measured:
        assert len(r.ids) == r.requested_input == as_seen(plain, r)
        if r.after is not None:
            before = measured[r.after]
            assert r.requested_input == len(before.ids) + before.max_tokens + 40
            assert r.ids[: len(before.ids) - 2] == before.ids[:-2]  # its history, as sent before
            if send == "chat":
                assert r.messages and before.messages and r.messages[: len(before.messages)] == before.messages
                assert [m["role"] for m in r.messages] == ["user", "assistant"] * (len(r.messages) // 2) + ["user"]


def test_trace_rows_and_errors_name_file_line_and_field(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 100.5, "input_tokens": 30}\n\n{"timestamp": 100.0, "prompt": "hi", "output_tokens": 4}\n'
    )
    rows = read_trace(trace)
    assert [(r.offset_s, r.prompt, r.input_tokens, r.output_tokens) for r in rows] == [
        (0.0, "hi", None, 4),
        (0.5, None, 30, None),
    ]
    cases = {
        '{"offset": 1, "input_tokens": 3}\n{"offset": 2, "input_tokens": 0}': "line 2: field 'input_tokens': expected",
        '{"offset": -1, "input_tokens": 3}': "line 1: field 'offset': expected a number of seconds >= 0",
        '{"offset": 1}': "line 1: set exactly one of prompt",
        '{"offset": 1, "input_tokens": 3, "tokens": 3}': "line 1: unknown field 'tokens'",
        '{"offset": 1, "input_tokens": 3}\n{"offset": 1': "line 2: not valid JSON",
        '{"offset": 1, "input_tokens": 3}\n{"timestamp": 1, "input_tokens": 3}': "mixes timestamp and offset",
        "": "no requests in it",
    }
    for text, words in cases.items():
        trace.write_text(text)
        with pytest.raises(UserError, match=f"^trace {re.escape(str(trace))}.*{re.escape(words)}"):
            read_trace(trace)
    with pytest.raises(UserError, match="no such file"):
        read_trace(tmp_path / "absent.jsonl")
    trace.write_text('{"offset": 1, "input_tokens": 3}\n')
    with pytest.raises(ValidationError, match="holds 1 requests, fewer than num_requests \\(2\\)"):
        Scenario.model_validate(
            {"name": "t", "concurrency": [1], "trace": "t.jsonl", "output_tokens": 4, "num_requests": 2},
            context={"base_dir": tmp_path},
        )
    for pattern in ({"request_rate": 2.0}, {"ramp": {"strategy": "linear", "start_rps": 1, "end_rps": 2}}):
        with pytest.raises(ValidationError, match="a trace's requests are due at the trace's own offsets"):
            Scenario.model_validate(
                {"name": "t", "concurrency": [1], "trace": "t.jsonl", "output_tokens": 4, "num_requests": 1} | pattern,
                context={"base_dir": tmp_path},
            )
    # Gaps asked of a schedule that has none: refused, not ignored.
    traced = {"trace": "t.jsonl", "output_tokens": 4}
    for source, sends in ((traced, "at the trace's own offsets"), ({"input_tokens": 8}, "closed loop")):
        for gaps in ({"arrival": "constant"}, {"burstiness": 0.5}, {"arrival": "random", "burstiness": 2.0}):
            with pytest.raises(ValidationError, match=f"shape the gaps of request_rate, ramp or sweep; .*{sends}"):
                Scenario.model_validate(
                    {"name": "t", "concurrency": [1], "num_requests": 1, "output_tokens": 4} | source | gaps,
                    context={"base_dir": tmp_path},
                )
        # Their defaults spelled out, as run.json's resolved manifest has them for --resume: accepted.
        Scenario.model_validate(
            {"name": "t", "concurrency": [1], "num_requests": 1, "output_tokens": 4, "arrival": "random"}
            | {"burstiness": 1.0}
            | source,
            context={"base_dir": tmp_path},
        )


class StubServer:
    """An OpenAI-compatible server in the test's own event loop: streams `max_tokens` one-token
    events, reports usage (prompt_tokens: ids sent, or words of a text or chat prompt), records
    every request's body and arrival order. `metrics`: a /metrics text, or None for no such route."""

    def __init__(self, metrics: str | None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.metrics = metrics

    async def completions(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        prompt = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(body["max_tokens"]):
            event = {"choices": [{"index": 0, "text": "x", "token_ids": [5 + i]}]}
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        usage = {"prompt_tokens": n_prompt, "completion_tokens": body["max_tokens"]}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    async def metrics_route(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=self.metrics or "")

    async def run(self, work: Any) -> Any:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        if self.metrics is not None:
            app.router.add_get("/metrics", self.metrics_route)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await work(f"http://127.0.0.1:{port}/v1")
        finally:
            await runner.cleanup()


@pytest.fixture
def trace(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"offset": 0.30, "input_tokens": 40, "output_tokens": 3},
        {"offset": 0.0, "prompt": "three words here", "output_tokens": 5},
        {"offset": 0.15, "input_tokens": 50},
        {"offset": 0.15, "prompt": "two words"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    yield path


def replay(plain: Any, sc: Scenario, metrics: str | None) -> tuple[Any, StubServer]:
    from actors.loadgen import measure_level
    from actors.openai_http import OpenAIHttp

    server = StubServer(metrics)
    measured, warm = workloads.level_requests(sc, plain, level=2)

    async def work(base_url: str) -> Any:
        http = OpenAIHttp(base_url, api_key=None, request_timeout_s=30, max_concurrency=8)
        http.model = "stub"
        async with http.session(0) as session:
            stream = lambda *a, **kw: http.stream(session, *a, **kw)  # noqa: E731
            cache = lambda: http.prefix_cache(session)  # noqa: E731
            return await measure_level(
                stream, sc, 2, prompts=measured, warmup=warm, model="m", model_weights="w", target="t", cache=cache
            )

    return asyncio.run(server.run(work)), server


def test_trace_replay_on_a_stub_server(plain: Any, trace: Path) -> None:
    sc = Scenario.model_validate(
        {"name": "t", "concurrency": [2], "trace": str(trace), "output_tokens": 7, "num_requests": 4},
        context={"base_dir": trace.parent},
    )
    metrics = (
        '# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{engine="0",model_name="stub"} 120\n'
    )
    result, server = replay(plain, sc.model_copy(update={"warmup_requests": 0, "send": "text"}), metrics)
    rows = result.requests.to_pylist()
    assert [r["scheduled_s"] for r in rows] == pytest.approx([0.0, 0.15, 0.15, 0.30])  # the trace's, in order
    assert all(r["sent_s"] >= r["scheduled_s"] for r in rows)
    sent = [b["prompt"] for b in server.bodies]
    assert sent[0] == "three words here" and sent[2] == "two words"  # texts as written, in the trace's order
    assert [b["max_tokens"] for b in server.bodies] == [5, 7, 7, 3]  # the trace's output_tokens, else the scenario's
    assert [r["n_output_tokens"] for r in rows] == [5, 7, 7, 3]
    # Counts as the server reported them: 3 and 2 words for the texts (nothing asked), the stub's
    # word count for the synthetic ones (asked 50 and 40), which the level then shows as a miss.
    assert [r["requested_prompt_tokens"] for r in rows] == [None, 50, None, 40]
    assert rows[0]["n_prompt_tokens"] == 3 and rows[2]["n_prompt_tokens"] == 2
    level = result.level.to_pylist()[0]
    assert (level["prefix_cache_queries"], level["prefix_cache_hits"]) == (0, 0)  # reported, unchanged: 0


def test_a_server_without_metrics_reports_no_cache_figures(plain: Any) -> None:
    sc = scenario(num_requests=4, warmup_requests=1, send="chat", input_tokens=30, ignore_eos=False)
    result, server = replay(plain, sc, None)
    level = result.level.to_pylist()[0]
    assert level["prefix_cache_queries"] is None and level["prefix_cache_hits"] is None
    assert all("messages" in b and b["ignore_eos"] is False for b in server.bodies)
    assert {r["requested_output_tokens"] for r in result.requests.to_pylist()} == {None}  # free output
