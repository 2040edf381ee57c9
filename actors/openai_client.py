"""Targets behind an OpenAI-compatible HTTP API: what `vllm-server` and `endpoint` share.

Generation is greedy with top-k logprobs through vLLM's extensions: `return_tokens_as_token_ids`
keys every logprob by `token_id:N` (text keys are ambiguous: several ids can decode alike) and
`return_token_ids` returns the prompt token ids the server itself used. Teacher-forced scoring
uses the completions `prompt_logprobs` extension. Perf streams SSE over aiohttp with no
connection cap (aiohttp's default of 100 would silently queue requests past that level).

The API key lives only in the request headers: every response body or error text this module
puts into a row or an exception goes through `redact`, so a server echoing the key cannot leak it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from actors.tables import scores_table, to_generation
from fleet.contracts.engine import Completion, Engine, Generation

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Coroutine, Sequence

    import aiohttp
    import pyarrow as pa

    from fleet.contracts.engine import Chunk, PerfResult
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Scenario, Shard

SMOKE_CHECKS = {
    "completions": {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
    "chat/completions": {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0},
}


class EndpointError(RuntimeError):
    """The server answered with an error or with something fleet-eval cannot use."""


def redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


class OpenAIEngine(Engine):
    """An engine that is a client: subclasses call `connect` once the server answers."""

    base_url = ""
    served_model = ""
    max_model_len: int | None = None
    send_token_ids = False  # send locally tokenized ids instead of text (servers without return_token_ids)
    request_timeout_s = 600.0
    max_concurrency = 64
    _key: str | None = None

    def connect(self, base_url: str, *, api_key: str | None, served_model: str | None = None) -> None:
        """Set the base URL (".../v1") and key, and learn the served model's name and context length."""
        self.base_url, self._key = base_url.rstrip("/"), api_key
        models = self._run(self._get("models"))["data"]
        entry = next((m for m in models if m["id"] == served_model), None) if served_model else models[0]
        if entry is None:
            msg = f"{self.base_url}: serves {[m['id'] for m in models]}, not {served_model!r}"
            raise EndpointError(msg)
        self.served_model, self.max_model_len = entry["id"], entry.get("max_model_len")

    # -- HTTP -------------------------------------------------------------------------------

    def _session(self, limit: int) -> aiohttp.ClientSession:
        import aiohttp

        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.request_timeout_s)
        return aiohttp.ClientSession(headers=headers, timeout=timeout, connector=aiohttp.TCPConnector(limit=limit))

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run(coro)

    def _fail(self, route: str, status: int | None, body: str) -> EndpointError:
        return EndpointError(redact(f"{self.base_url}/{route}: HTTP {status}: {body[:1000]}", self._key))

    async def _get(self, route: str) -> Any:
        return await self._get_url(f"{self.base_url}/{route}")

    async def _get_url(self, url: str) -> Any:
        async with self._session(1) as session, session.get(url) as resp:
            body = await resp.text()
            if resp.status != 200:
                raise EndpointError(redact(f"{url}: HTTP {resp.status}: {body[:1000]}", self._key))
            return json.loads(body)

    async def _post(self, session: aiohttp.ClientSession, route: str, body: dict[str, Any]) -> dict[str, Any]:
        async with session.post(f"{self.base_url}/{route}", json={"model": self.served_model} | body) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise self._fail(route, resp.status, text)
            out: dict[str, Any] = json.loads(text)
            return out

    async def _post_many(self, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """POST (route, body) pairs, at most max_concurrency at once; responses in order."""
        limit = asyncio.Semaphore(self.max_concurrency)

        async def one(session: aiohttp.ClientSession, route: str, body: dict[str, Any]) -> dict[str, Any]:
            async with limit:
                return await self._post(session, route, body)

        async with self._session(self.max_concurrency) as session:
            return list(await asyncio.gather(*(one(session, route, body) for route, body in requests)))

    # -- generate and score -----------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        if getattr(self, "_tokenizer", None) is None:
            from transformers import AutoTokenizer

            trust = self.model.spec.trust_remote_code
            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, trust_remote_code=trust)
        return self._tokenizer

    def _request(self, prompt: Prompt) -> tuple[str, dict[str, Any], list[int] | None]:
        """(route, body, ids sent or None): chat prompts go to chat/completions unless sending ids."""
        from actors.loadgen import encode

        s = self.sampling
        body: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature, "seed": s.seed}
        body |= {"return_tokens_as_token_ids": True, "return_token_ids": True}
        if self.send_token_ids:
            ids = encode(self.tokenizer, prompt)
            return "completions", body | {"prompt": ids, "logprobs": s.logprobs}, ids
        if prompt.messages is not None:
            messages = [m.model_dump() for m in prompt.messages]
            return "chat/completions", body | {"messages": messages, "logprobs": True, "top_logprobs": s.logprobs}, None
        return "completions", body | {"prompt": prompt.prompt, "logprobs": s.logprobs}, None

    def generate(self, shard: Shard) -> Generation:
        requests = [self._request(p) for p in shard.prompts]
        started, t0 = time.time(), time.perf_counter()
        responses = self._run(self._post_many([(route, body) for route, body, _ in requests]))
        wall = time.perf_counter() - t0
        completions = [
            self._completion(p, route, sent, resp)
            for p, (route, _, sent), resp in zip(shard.prompts, requests, responses, strict=True)
        ]
        return to_generation(shard, self.model, completions, started_at=started, wall_s=wall)

    def _completion(self, prompt: Prompt, route: str, sent: list[int] | None, resp: dict[str, Any]) -> Completion:
        k = self.sampling.logprobs
        choice = resp["choices"][0]
        chat = route == "chat/completions"
        prompt_ids = resp.get("prompt_token_ids") if chat else choice.get("prompt_token_ids")
        if prompt_ids is None and sent is None:
            raise self._fail(route, 200, "no prompt_token_ids in the response: set send_token_ids: true")
        if sent is not None and prompt_ids is not None and list(prompt_ids) != sent:
            raise self._fail(route, 200, f"server used prompt ids {prompt_ids}, not the ids sent {sent}")
        steps = self._steps(route, choice)
        ids = [tok for tok, _, _ in steps]
        if choice.get("token_ids") is not None and list(choice["token_ids"]) != ids:
            raise self._fail(route, 200, "token_ids and logprob tokens disagree")
        tops = [sorted(top, key=lambda t: -t[1])[:k] for _, _, top in steps]
        # The API gives no rank: it is known only when the token is in the top k (greedy: always);
        # otherwise null (the requests table's rank column is nullable).
        ranks: list[Any] = [_rank(tok, lp, top) for (tok, lp, _), top in zip(steps, tops, strict=True)]
        m = resp.get("metrics") or {}
        parts = [_s(m, "queue_time_ms"), _s(m, "time_to_first_token_ms"), _s(m, "generation_time_ms")]
        prompt_ids = list(prompt_ids if prompt_ids is not None else sent or [])
        return Completion(
            prompt=prompt,
            rendered=prompt.prompt if prompt.prompt is not None else self.tokenizer.decode(prompt_ids),
            prompt_token_ids=prompt_ids,
            output_token_ids=ids,
            output_text=(choice["message"]["content"] or "") if chat else choice["text"],
            finish_reason=choice.get("finish_reason") or "length",
            logprobs=[lp for _, lp, _ in steps],
            ranks=ranks,
            topk_ids=[[t for t, _ in top] for top in tops],
            topk_logprobs=[[lp for _, lp in top] for top in tops],
            queue_s=parts[0],
            ttft_s=parts[1],
            tpot_s=_s(m, "mean_itl_ms"),
            e2e_s=sum(p for p in parts if p is not None) if None not in parts else None,
        )

    def _steps(self, route: str, choice: dict[str, Any]) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """(chosen id, its logprob, [(id, logprob)] of the top entries) per generated token."""
        lp = choice.get("logprobs") or {}
        try:
            if route == "chat/completions":
                return [
                    (_tid(e["token"]), e["logprob"], [(_tid(t["token"]), t["logprob"]) for t in e["top_logprobs"]])
                    for e in lp.get("content") or []
                ]
            return [
                (_tid(tok), value, [(_tid(t), v) for t, v in top.items()])
                for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True)
            ]
        except (KeyError, ValueError) as e:
            raise self._fail(route, 200, f"logprobs not keyed token_id:N ({e}): {json.dumps(lp)[:300]}") from None

    def score(self, requests: pa.Table, *, k: int) -> pa.Table:
        """Teacher forcing through `prompt_logprobs`: prompt + output as one prompt, one token generated."""
        columns = requests.select(["prompt_id", "prompt_token_ids", "output_token_ids"]).to_pylist()
        rows = [r for r in columns if r["output_token_ids"]]
        bodies = [
            {"prompt": r["prompt_token_ids"] + r["output_token_ids"], "max_tokens": 1, "temperature": 0}
            | {"prompt_logprobs": k}
            for r in rows
        ]
        responses = self._run(self._post_many([("completions", b) for b in bodies]))
        out: list[dict[str, object]] = []
        for r, resp in zip(rows, responses, strict=True):
            steps = resp["choices"][0].get("prompt_logprobs")
            if not steps:
                msg = f"{self.base_url} returns no prompt_logprobs: this target cannot score (be the reference)"
                raise EndpointError(msg)
            n_prompt = len(r["prompt_token_ids"])
            for j, tok in enumerate(r["output_token_ids"]):
                step = {int(t): e for t, e in steps[n_prompt + j].items()}
                top = sorted((e["rank"], t, e["logprob"]) for t, e in step.items() if e["rank"] <= k)
                out.append(
                    {
                        "prompt_id": r["prompt_id"],
                        "position": j,
                        "ref_logprob": step[tok]["logprob"],
                        "ref_rank": step[tok]["rank"],
                        "ref_topk_ids": [t for _, t, _ in top],
                        "ref_topk_logprobs": [lp for _, _, lp in top],
                    }
                )
        return scores_table(out)

    # -- smoke and perf ---------------------------------------------------------------------

    def smoke(self) -> pa.Table:
        """fleet.schema.SMOKE rows: one request each to completions and chat/completions."""
        import pyarrow as pa

        from fleet.contracts import schema

        async def check(session: aiohttp.ClientSession, route: str, body: dict[str, Any]) -> dict[str, Any]:
            row: dict[str, Any] = {"model": self.model.name, "model_weights": self.model.weights}
            row |= {"target": self.args.name, "check": route}
            t0 = time.perf_counter()
            try:
                async with session.post(f"{self.base_url}/{route}", json={"model": self.served_model} | body) as r:
                    text, row["status"] = await r.text(), r.status
                row["latency_s"] = time.perf_counter() - t0
                row["response"] = redact(text[:4000], self._key)
                tokens = json.loads(text).get("usage", {}).get("completion_tokens", 0) if r.status == 200 else 0
                row["passed"] = r.status == 200 and tokens > 0
                row["error"] = None if row["passed"] else f"HTTP {r.status}, {tokens} completion tokens"
            except Exception as e:  # noqa: BLE001  (a failed check is a row, not an exception)
                row |= {"passed": False, "error": redact(f"{type(e).__name__}: {e}", self._key)[:1000]}
            return row

        async def run() -> list[dict[str, Any]]:
            async with self._session(2) as session:
                return [await check(session, route, body) for route, body in SMOKE_CHECKS.items()]

        return pa.Table.from_pylist(self._run(run()), schema=schema.SMOKE)

    def perf(self, scenario: Scenario, level: int, prompts: Sequence[str | Prompt] | None = None) -> PerfResult:
        """One level of a perf scenario over streaming HTTP (SSE); see actors/perf.py."""
        from actors import loadgen as perf

        measured, warmup = perf.prompt_ids(scenario, self.tokenizer, prompts)
        if self.max_model_len:
            perf.check_fits(scenario, measured + warmup, self.max_model_len)

        async def run() -> PerfResult:
            async with self._session(0) as session:  # 0: no connection cap, the level is the cap

                def stream(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
                    return self._stream(session, ids, max_tokens)

                return await perf.measure_level(
                    stream,
                    scenario,
                    level,
                    prompts=measured,
                    warmup=warmup,
                    model=self.model.name,
                    model_weights=self.model.weights,
                    target=self.args.name,
                )

        result: PerfResult = self._run(run())
        return result

    async def _stream(
        self, session: aiohttp.ClientSession, ids: list[int], max_tokens: int
    ) -> AsyncGenerator[Chunk, None]:
        from fleet.contracts.engine import Chunk, EngineStats

        body = {"model": self.served_model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0}
        body |= {"ignore_eos": True, "stream": True, "return_token_ids": True}
        body |= {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with session.post(f"{self.base_url}/completions", json=body) as resp:
            if resp.status != 200:
                raise self._fail("completions", resp.status, await resp.text())
            counted = 0
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                msg = json.loads(line[5:])
                if "error" in msg:
                    raise self._fail("completions", resp.status, json.dumps(msg))
                choices, usage = msg.get("choices") or [], msg.get("usage") or {}
                # Count tokens per chunk: token ids when the server sends them, else running usage.
                if choices and choices[0].get("token_ids") is not None:
                    n = len(choices[0]["token_ids"])
                elif "completion_tokens" in usage:
                    n = usage["completion_tokens"] - counted
                elif choices:
                    raise self._fail("completions", 200, "stream chunks carry neither token_ids nor usage")
                else:
                    n = 0
                counted += n
                m = msg.get("metrics") or {}
                stats = None
                if m:  # vLLM's --enable-per-request-metrics, on the final usage chunk
                    stats = EngineStats(_s(m, "queue_time_ms"), _s(m, "time_to_first_token_ms"), _s(m, "mean_itl_ms"))
                if n or stats:
                    yield Chunk(n, stats)

    def describe(self) -> dict[str, str]:
        from actors.provenance import describe

        info = describe(self.args.device) | {"base_url": self.base_url, "served_model": self.served_model}
        try:  # vLLM answers GET /version beside /v1; other servers may not
            root, _, _ = self.base_url.rpartition("/")
            info["server_version"] = str(self._run(self._get_url(f"{root}/version")).get("version", ""))
        except Exception:  # noqa: BLE001
            pass
        return info


def _s(metrics: dict[str, Any], key: str) -> float | None:
    """Seconds from one of vLLM's per-request metrics in ms (queue, TTFT from scheduled, ITL)."""
    value = metrics.get(key)
    return None if value is None else float(value) / 1000


def _tid(token: str) -> int:
    if not token.startswith("token_id:"):
        msg = f"token {token!r} is not 'token_id:N' (does the server support return_tokens_as_token_ids?)"
        raise ValueError(msg)
    return int(token.removeprefix("token_id:"))


def _rank(token: int, logprob: float, top: list[tuple[int, float]]) -> int | None:
    if token not in {t for t, _ in top}:
        return None
    return 1 + sum(lp > logprob for _, lp in top)
