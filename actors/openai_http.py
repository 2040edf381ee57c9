"""HTTP to one OpenAI-compatible server: JSON requests, SSE token streams, and the API key kept
out of every text.

The key lives only in the request headers. Every response body or error text that leaves this
module goes through `redact`, and so must every text an engine builds from a response (a row, an
exception), so a server echoing the key cannot leak it. Requests go out in parallel through one
aiohttp session capped at `max_concurrency`; perf streams use a session with no connection cap
(aiohttp's default of 100 would silently queue requests past that level).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    import aiohttp

    from fleet.contracts.engine import Chunk


class EndpointError(RuntimeError):
    """The server answered with an error or with something fleet-eval cannot use."""


def redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def seconds(metrics: dict[str, Any], key: str) -> float | None:
    """Seconds from one of vLLM's per-request metrics in ms (queue, TTFT from scheduled, ITL)."""
    value = metrics.get(key)
    return None if value is None else float(value) / 1000


class OpenAIHttp:
    """The `/v1` API of one server: `base_url` ends in "/v1"; `model`, once known, goes with every request."""

    def __init__(self, base_url: str, *, api_key: str | None, request_timeout_s: float, max_concurrency: int) -> None:
        self.base_url, self._key = base_url.rstrip("/"), api_key
        self.request_timeout_s, self.max_concurrency = request_timeout_s, max_concurrency
        self.model = ""

    def redact(self, text: str) -> str:
        return redact(text, self._key)

    def error(self, route: str, status: int | None, body: str) -> EndpointError:
        return self._error(f"{self.base_url}/{route}", status, body)

    def _error(self, url: str, status: int | None, body: str) -> EndpointError:
        return EndpointError(self.redact(f"{url}: HTTP {status}: {body[:1000]}"))

    def session(self, limit: int) -> aiohttp.ClientSession:
        """A session sending the key, with at most `limit` connections (0: no cap)."""
        import aiohttp

        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.request_timeout_s)
        return aiohttp.ClientSession(headers=headers, timeout=timeout, connector=aiohttp.TCPConnector(limit=limit))

    def get(self, route: str) -> Any:
        """GET `route` under the base URL and parse the JSON answer."""
        return self.get_url(f"{self.base_url}/{route}")

    def get_url(self, url: str) -> Any:
        async def get() -> Any:
            async with self.session(1) as session, session.get(url) as resp:
                body = await resp.text()
                if resp.status != 200:
                    raise self._error(url, resp.status, body)
                return json.loads(body)

        return asyncio.run(get())

    async def send(self, session: aiohttp.ClientSession, route: str, body: dict[str, Any] | None) -> tuple[int, str]:
        """POST `body` (and the model) to `route`, or GET it when `body` is None: the HTTP status and
        the raw response text."""
        url = f"{self.base_url}/{route}"
        call = session.get(url) if body is None else session.post(url, json={"model": self.model} | body)
        async with call as resp:
            return resp.status, await resp.text()

    async def post(self, session: aiohttp.ClientSession, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """`send`, then the parsed JSON answer; an error status raises EndpointError."""
        status, text = await self.send(session, route, body)
        if status != 200:
            raise self.error(route, status, text)
        out: dict[str, Any] = json.loads(text)
        return out

    def post_many(self, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """POST (route, body) pairs, at most max_concurrency at once; responses in order."""
        return [body for body, _ in self.post_many_timed(requests)]

    def post_many_timed(self, requests: list[tuple[str, dict[str, Any]]]) -> list[tuple[dict[str, Any], float]]:
        """`post_many`, each response with the seconds from its send to its full answer (client clock)."""
        limit = asyncio.Semaphore(self.max_concurrency)

        async def one(session: aiohttp.ClientSession, route: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
            async with limit:
                t0 = time.perf_counter()
                answer = await self.post(session, route, body)
                return answer, time.perf_counter() - t0

        async def run() -> list[tuple[dict[str, Any], float]]:
            async with self.session(self.max_concurrency) as session:
                return list(await asyncio.gather(*(one(session, route, body) for route, body in requests)))

        return asyncio.run(run())

    async def prefix_cache(self, session: aiohttp.ClientSession) -> tuple[int, int] | None:
        """The server's prefix-cache counters from GET /metrics beside /v1 (actors/cache_stats.py);
        None when it has no such endpoint or no such counters."""
        import aiohttp

        from actors.cache_stats import from_prometheus

        root = self.base_url.removesuffix("/v1")
        try:
            async with session.get(f"{root}/metrics") as resp:
                if resp.status != 200:
                    return None
                return from_prometheus(await resp.text(), model=self.model or None)
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def stream(
        self,
        session: aiohttp.ClientSession,
        ids: list[int],
        max_tokens: int,
        *,
        ignore_eos: bool = True,
        text: str | None = None,
        messages: list[dict[str, str]] | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        """Greedy completion of prompt `ids` over SSE, `max_tokens` tokens whatever the EOS (with
        `ignore_eos`; else at most): one Chunk per event that carries tokens; the engine's own figures
        and its count of the prompt when the server sends them. With `text` the prompt goes as that
        text; with `messages` to chat/completions (actors/exact_text.py built both to `ids`' length)."""
        from fleet.contracts.engine import Chunk, EngineStats

        route = "chat/completions" if messages is not None else "completions"
        prompt: dict[str, Any] = {"messages": messages} if messages is not None else {"prompt": text or ids}
        body = {"model": self.model, **prompt, "max_tokens": max_tokens, "temperature": 0}
        body |= {"ignore_eos": ignore_eos, "stream": True, "return_token_ids": True}
        body |= {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with session.post(f"{self.base_url}/{route}", json=body) as resp:
            if resp.status != 200:
                raise self.error(route, resp.status, await resp.text())
            counted = 0
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                msg = json.loads(line[5:])
                if "error" in msg:
                    raise self.error(route, resp.status, json.dumps(msg))
                choices, usage = msg.get("choices") or [], msg.get("usage") or {}
                # Count tokens per chunk: token ids when the server sends them, else running usage.
                if choices and choices[0].get("token_ids") is not None:
                    n = len(choices[0]["token_ids"])
                elif "completion_tokens" in usage:
                    n = usage["completion_tokens"] - counted
                elif choices and _has_text(choices[0]):
                    raise self.error(route, 200, "stream chunks carry neither token_ids nor usage")
                else:
                    n = 0
                counted += n
                m = msg.get("metrics") or {}
                stats = None
                if m:  # vLLM's --enable-per-request-metrics, on the final usage chunk
                    stats = EngineStats(
                        seconds(m, "queue_time_ms"), seconds(m, "time_to_first_token_ms"), seconds(m, "mean_itl_ms")
                    )
                prompt_tokens = usage.get("prompt_tokens") if not choices else None
                if n or stats or prompt_tokens is not None:
                    yield Chunk(n, stats, prompt_tokens)


def _has_text(choice: dict[str, Any]) -> bool:
    """Whether a stream choice carries generated text (a chat stream's first chunk carries only the role)."""
    delta = choice.get("delta")
    return bool(choice.get("text") or (delta or {}).get("content"))
