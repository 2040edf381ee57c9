"""The requests of one perf level, built before anything is sent: synthetic prompts whose token
counts come from the scenario's distributions (exact as the model sees them, actors/exact_text.py),
shared-prefix groups, multi-turn conversations, a replayed trace, or a prompt set.

Every `Request` carries what it asks for (`requested_input`, `requested_output`) beside what it
sends, so the level's rows can show requested against actual counts (fleet/analysis/workload.py).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.exact_text import Rendered, content, fit
from fleet.contracts.workload import Lengths, read_trace

if TYPE_CHECKING:
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario


@dataclass(frozen=True)
class Request:
    """One request of a level: the prompt as the model sees it (`ids`) and, for HTTP targets that
    take text, as sent (`text` or chat `messages`); when it is due and after which request."""

    ids: list[int]
    max_tokens: int
    requested_input: int | None = None  # null: a prompt set's or a trace's text, which asks for no count
    requested_output: int | None = None  # null: free output (ignore_eos off), max_tokens is only a cap
    text: str | None = None
    messages: list[dict[str, str]] | None = None
    offset_s: float | None = None  # trace replay: due this long after the level's start
    after: int | None = None  # multi-turn: the index of the previous turn, which must be answered first

    @property
    def ignore_eos(self) -> bool:
        return self.requested_output is not None

    def send_options(self) -> dict[str, Any]:
        """Keyword arguments for a stream beyond (ids, max_tokens); none when the defaults hold, so a
        stream that knows only ids and max_tokens still runs a plain scenario."""
        out: dict[str, Any] = {} if self.ignore_eos else {"ignore_eos": False}
        if self.messages is not None:
            out["messages"] = self.messages
        elif self.text is not None:
            out["text"] = self.text
        return out


def level_seed(scenario: Scenario, level: int) -> int:
    """The seed of one level's synthetic prompts: each level sends fresh prompts, so a later level
    never finds an earlier level's prompts in the prefix cache."""
    return scenario.seed + 7919 * level


def synthetic_prompts(tokenizer: Any, *, n: int, length: int, seed: int) -> list[list[int]]:
    """`n` prompts of exactly `length` token ids, the same for the same tokenizer and seed.

    Ids are drawn uniformly from the non-special vocabulary after the BOS token the tokenizer
    would add itself, so prompts look like tokenized text to the engine and share no prefix
    beyond BOS (prefix caching cannot turn prefill into a cache hit).
    """
    special = set(tokenizer.all_special_ids)
    pool = [i for i in range(len(tokenizer)) if i not in special]
    bos = tokenizer.bos_token_id
    head = [bos] if bos is not None and tokenizer("a").input_ids[:1] == [bos] else []
    rng = random.Random(seed)
    return [(head + [rng.choice(pool) for _ in range(length)])[:length] for _ in range(n)]


def encode(tokenizer: Any, prompt: str | Prompt) -> list[int]:
    """Token ids of a text prompt, or of chat messages through the model's chat template."""
    if isinstance(prompt, str) or prompt.messages is None:
        text = prompt if isinstance(prompt, str) else prompt.prompt
        return list(tokenizer(text).input_ids)
    messages = [m.model_dump() for m in prompt.messages]
    # As the HF reference renders chat: the template's text, tokenized without adding specials again.
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def draw(lengths: int | Lengths, n: int, rng: random.Random) -> list[int]:
    """`n` token counts: a fixed count, or seeded draws from the distribution."""
    if isinstance(lengths, int):
        return [lengths] * n
    if lengths.distribution == "fixed" and lengths.mean is not None:
        return [lengths.mean] * n
    low, high = lengths.min, lengths.upper
    if lengths.distribution == "uniform":
        return [rng.randint(low, high) for _ in range(n)]
    mean, std = float(lengths.mean or 0), float(lengths.std or 0)
    return [min(high, max(low, round(rng.gauss(mean, std)))) for _ in range(n)]


def fixed_output(scenario: Scenario) -> int:
    """The output cap of requests given as bare ids: the scenario's count, or its distribution's upper bound."""
    out = scenario.output_tokens
    return out if isinstance(out, int) else out.upper


def measured_count(scenario: Scenario) -> int:
    """Measured requests of one level: num_requests per run, a sweep's runs each with fresh prompts."""
    return scenario.num_requests * (scenario.sweep.runs if scenario.sweep else 1)


def trace_offsets(requests: Sequence[list[int] | Request]) -> list[float] | None:
    """A trace's own due times (seconds from the level's start), None when the requests are not a trace's."""
    if not any(isinstance(r, Request) and r.offset_s is not None for r in requests):
        return None
    return [(r.offset_s or 0.0) if isinstance(r, Request) else 0.0 for r in requests]


def as_request(prompt: list[int] | Request, max_tokens: int) -> Request:
    """A bare list of prompt ids as a request for exactly `max_tokens` tokens."""
    return prompt if isinstance(prompt, Request) else Request(prompt, max_tokens, len(prompt), max_tokens)


def prompt_ids(
    scenario: Scenario, tokenizer: Any, prompts: Sequence[str | Prompt] | None = None, *, level: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(measured, warm-up) prompt token ids of one level, as the model sees them (`level_requests`)."""
    measured, warmup = level_requests(scenario, tokenizer, prompts, level=level)
    return [r.ids for r in measured], [r.ids for r in warmup]


def check_fits(scenario: Scenario, prompts: Sequence[list[int] | Request], max_model_len: int) -> None:
    """Fail before sending anything when a request cannot fit the engine's context."""
    requests = [as_request(p, fixed_output(scenario)) for p in prompts]
    longest = max((len(r.ids) + r.max_tokens for r in requests), default=0)
    if longest > max_model_len:
        msg = (
            f"scenario {scenario.name!r}: prompt + output reach {longest} tokens, "
            f"more than the target's max_model_len {max_model_len}"
        )
        raise ValueError(msg)


def level_requests(
    scenario: Scenario, tokenizer: Any, prompts: Sequence[str | Prompt] | None = None, *, level: int
) -> tuple[list[Request], list[Request]]:
    """(measured, warm-up) requests of one level. Warm-up requests are single synthetic prompts of
    the measured median length in the same send mode, from another seed: they share no prefix with
    the measured ones, so they warm the engine without filling its prefix cache for them."""
    seed = level_seed(scenario, level)
    rng, n = random.Random(seed), measured_count(scenario)
    outputs = draw(scenario.output_tokens, n, rng)
    if scenario.trace is not None:
        measured = _trace(scenario, tokenizer, outputs, rng)
    elif scenario.prompt_set is not None:
        if not prompts:
            msg = f"scenario {scenario.name!r} uses prompt set {scenario.prompt_set!r}: pass its prompts"
            raise ValueError(msg)
        encoded = [encode(tokenizer, p) for p in prompts]
        measured = [_request(scenario, Rendered(encoded[i % len(encoded)]), None, outputs[i]) for i in range(n)]
        return measured, _warmup(scenario, tokenizer, encoded, measured[0].max_tokens, seed + 1_000_003)
    elif isinstance(scenario.input_tokens, int) and scenario.send == "ids" and not _structured(scenario):
        ids = synthetic_prompts(tokenizer, n=n, length=scenario.input_tokens, seed=seed)  # as before: seeds keep
        measured = [_request(scenario, Rendered(p), len(p), out) for p, out in zip(ids, outputs, strict=True)]
    else:
        inputs = draw(scenario.input_tokens or 1, n, rng)
        if scenario.shared_prefix is not None:
            measured = _shared_prefix(scenario, tokenizer, inputs, outputs, rng)
        elif scenario.multi_turn is not None:
            measured = _multi_turn(scenario, tokenizer, inputs, outputs, rng)
        else:
            pairs = enumerate(zip(inputs, outputs, strict=True))
            measured = [_single(scenario, tokenizer, k, out, rng, i) for i, (k, out) in pairs]
    ids = [r.ids for r in measured]
    return measured, _warmup(scenario, tokenizer, ids, measured[0].max_tokens, seed + 1_000_003)


def _structured(scenario: Scenario) -> bool:
    return scenario.shared_prefix is not None or scenario.multi_turn is not None


def _request(scenario: Scenario, r: Rendered, requested: int | None, out: int, **kw: Any) -> Request:
    wanted = out if scenario.ignore_eos else None
    return Request(r.ids, out, requested, wanted, text=r.text, messages=r.messages, **kw)


def _single(scenario: Scenario, tokenizer: Any, n: int, out: int, rng: random.Random, i: int) -> Request:
    where = f"scenario {scenario.name!r} request {i}"
    _, rendered = fit(tokenizer, scenario.send, [], [], n, rng=rng, where=where)
    return _request(scenario, rendered, n, out)


def _shared_prefix(
    scenario: Scenario, tokenizer: Any, inputs: list[int], outputs: list[int], rng: random.Random
) -> list[Request]:
    """vLLM's PrefixRepetitionRandomDataset.sample: per group one prefix, then num_requests / groups
    prompts of prefix + suffix, all shuffled. Here each prompt is prefix_tokens + its input_tokens
    tokens as the model sees them (vLLM counts the ids before decoding and re-encoding)."""
    spec = scenario.shared_prefix
    assert spec is not None
    per, out = len(inputs) // spec.groups, []
    for g in range(spec.groups):
        prefix = content(tokenizer, spec.prefix_tokens, rng=rng)
        for i in range(g * per, (g + 1) * per):
            n = spec.prefix_tokens + inputs[i]
            where = f"scenario {scenario.name!r} group {g}"
            _, rendered = fit(tokenizer, scenario.send, [], prefix, n, rng=rng, where=where)
            out.append(_request(scenario, rendered, n, outputs[i]))
    rng.shuffle(out)
    return out


def _multi_turn(
    scenario: Scenario, tokenizer: Any, inputs: list[int], outputs: list[int], rng: random.Random
) -> list[Request]:
    """Conversations of `turns` user turns, in rounds (every conversation's turn 1, then turn 2, ...),
    turn k depending on turn k-1. Turn k's prompt is turn k-1's, its reply (synthetic, of turn k-1's
    output length) and input_tokens new tokens, so it asks for len(turn k-1) + output + input tokens;
    with chat the new user message also absorbs the template's tokens around the two messages."""
    spec = scenario.multi_turn
    assert spec is not None
    conversations = len(inputs) // spec.turns
    history: list[list[list[int]]] = [[] for _ in range(conversations)]
    last: list[tuple[int, int] | None] = [None] * conversations  # (request index, its prompt length)
    out: list[Request] = []
    for turn in range(spec.turns):
        for c in range(conversations):
            i = turn * conversations + c
            before = last[c]
            n = inputs[i] if before is None else before[1] + outputs[before[0]] + inputs[i]
            where = f"scenario {scenario.name!r} conversation {c} turn {turn + 1}"
            message, rendered = fit(tokenizer, scenario.send, history[c], [], n, rng=rng, where=where)
            out.append(_request(scenario, rendered, n, outputs[i], after=None if before is None else before[0]))
            history[c] = [*history[c], message, content(tokenizer, outputs[i], rng=rng)]
            last[c] = (i, len(rendered.ids))
    return out


def _trace(scenario: Scenario, tokenizer: Any, outputs: list[int], rng: random.Random) -> list[Request]:
    assert scenario.trace is not None
    rows = read_trace(scenario.trace)[: scenario.num_requests]
    out = []
    for i, row in enumerate(rows):
        max_tokens = row.output_tokens or outputs[i]
        if row.input_tokens is not None:
            where = f"trace {scenario.trace} request {i}"
            _, rendered = fit(tokenizer, scenario.send, [], [], row.input_tokens, rng=rng, where=where)
        else:
            rendered = _as_sent(tokenizer, scenario.send, row.prompt or "")
        out.append(_request(scenario, rendered, row.input_tokens, max_tokens, offset_s=row.offset_s))
    return out


def _as_sent(tokenizer: Any, send: str, text: str) -> Rendered:
    """A trace's prompt text as the model will see it in each send mode."""
    if send == "chat":
        messages = [{"role": "user", "content": text}]
        templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return Rendered(list(tokenizer(templated, add_special_tokens=False).input_ids), messages=messages)
    ids = list(tokenizer(text).input_ids)
    return Rendered(ids, text=text if send == "text" else None)


def _warmup(scenario: Scenario, tokenizer: Any, prompts: list[list[int]], out: int, seed: int) -> list[Request]:
    """Synthetic single prompts of the median length of `prompts` (a set's own, each once)."""
    if not scenario.warmup_requests:
        return []
    length = int(statistics.median(len(p) for p in prompts))
    if scenario.send == "ids":
        ids = synthetic_prompts(tokenizer, n=scenario.warmup_requests, length=length, seed=seed)
        return [Request(p, out, len(p), out) for p in ids]
    rng = random.Random(seed)
    return [_single(scenario, tokenizer, length, out, rng, i) for i in range(scenario.warmup_requests)]
