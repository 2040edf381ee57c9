"""Synthetic prompts of an exact token count as the model sees them: token ids, text, or chat.

Token ids sent as ids are exact by construction. Text is not: decoding random ids and encoding the
text again changes the count (token boundaries merge or split), the bug vLLM's random dataset was
fixed for three times (PRs #10524, #17408, #24937) and that left 92 % of SGLang's bench prompts at
the wrong length (PR #15732). Chat adds the template's own tokens. So a text or chat prompt here is
built the way a server will see it (text: the tokenizer with its specials; chat: the chat template,
then the tokenizer without specials, as vLLM's chat route and the HF reference render it), its
tokens counted, and its last user message lengthened or cut until the count is exact.

Content is drawn from word-like tokens (a space then letters, as one token both alone and
re-encoded), so that neighbouring words rarely merge and the fit converges in a step or two.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

Send = Literal["ids", "text", "chat"]
MAX_STEPS = 64  # fit attempts per prompt; measured convergence is 1-3 steps (tests/test_workloads.py)
_POOLS: dict[int, tuple[list[int], list[int]]] = {}  # id(tokenizer) -> (any non-special ids, word-like ids)


@dataclass(frozen=True)
class Rendered:
    """A prompt as sent and as the model sees it."""

    ids: list[int]  # the token ids the model sees (chat: after the template)
    text: str | None = None  # send: text
    messages: list[dict[str, str]] | None = None  # send: chat


def pools(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(every non-special id, the word-like ids that survive decode -> encode alone), once per tokenizer."""
    key = id(tokenizer)
    if key not in _POOLS:
        special = set(tokenizer.all_special_ids)
        ids = [i for i in range(len(tokenizer)) if i not in special]
        texts = tokenizer.batch_decode([[i] for i in ids])
        candidates = [(i, t) for i, t in zip(ids, texts, strict=True) if _wordlike(t)]
        encoded = tokenizer([t for _, t in candidates], add_special_tokens=False).input_ids if candidates else []
        words = [i for (i, _), e in zip(candidates, encoded, strict=True) if list(e) == [i]]
        # A tokenizer with too few such tokens (a tiny synthetic vocabulary) still fits, in more steps.
        _POOLS[key] = (ids, words if len(words) >= 64 else ids)
    return _POOLS[key]


def _wordlike(text: str) -> bool:
    return len(text) >= 3 and text[0] == " " and text[1:].isascii() and text[1:].isalpha() and text[1:].islower()


def render(tokenizer: Any, send: Send, turns: list[list[int]]) -> Rendered:
    """The prompt of a conversation whose turns (user, assistant, user, ...; ending with a user turn)
    hold these content ids. ids: BOS (if the tokenizer adds one) and the ids themselves."""
    content = [i for t in turns for i in t]
    if send == "ids":
        return Rendered(_bos(tokenizer) + content)
    if send == "text":
        text = tokenizer.decode(content)
        return Rendered(list(tokenizer(text).input_ids), text=text)
    roles = ("user", "assistant")
    messages = [{"role": roles[k % 2], "content": tokenizer.decode(t)} for k, t in enumerate(turns)]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return Rendered(list(tokenizer(text, add_special_tokens=False).input_ids), messages=messages)


def _bos(tokenizer: Any) -> list[int]:
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and tokenizer("a").input_ids[:1] == [bos] else []


def fit(
    tokenizer: Any, send: Send, history: list[list[int]], head: list[int], n: int, *, rng: random.Random, where: str
) -> tuple[list[int], Rendered]:
    """The last user turn's content ids (starting with `head`, e.g. a shared prefix) such that the
    conversation `history + [turn]` renders to exactly `n` tokens, and that rendering."""
    any_id, words = pools(tokenizer)
    pool = any_id if send == "ids" else words
    floor = len(render(tokenizer, send, [*history, head]).ids)
    if floor >= n:
        what = "the chat template and the fixed parts" if send == "chat" else "the fixed parts"
        msg = f"{where}: {n} tokens asked, but {what} alone take {floor}: ask for more input tokens"
        raise ValueError(msg)
    tail = [rng.choice(pool) for _ in range(n - floor)]
    for step in range(MAX_STEPS):
        out = render(tokenizer, send, [*history, head + tail])
        miss = n - len(out.ids)
        if miss == 0:
            return head + tail, out
        if miss > 0:
            tail += [rng.choice(pool) for _ in range(miss)]
        else:
            tail = tail[: max(1, len(tail) + miss)]
        if step >= 8:  # stuck between two counts at one boundary: draw the last tokens again
            tail[-2:] = [rng.choice(pool) for _ in tail[-2:]]
    msg = f"{where}: no prompt of exactly {n} tokens after {MAX_STEPS} attempts (tokenizer {type(tokenizer).__name__})"
    raise RuntimeError(msg)


def content(tokenizer: Any, n: int, *, rng: random.Random) -> list[int]:
    """`n` content ids for a reply or a prefix (word-like where the tokenizer has enough of them)."""
    pool = pools(tokenizer)[1]
    return [rng.choice(pool) for _ in range(n)]
