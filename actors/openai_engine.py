"""Targets behind an OpenAI-compatible HTTP API: the engine that `vllm-server` and `endpoint` share.

Generation is greedy with top-k logprobs through vLLM's extensions: `return_tokens_as_token_ids`
keys every logprob by `token_id:N` (text keys are ambiguous: several ids can decode alike) and
`return_token_ids` returns the prompt token ids the server itself used. Teacher-forced scoring
uses the completions `prompt_logprobs` extension. Perf streams SSE (actors/openai_http.py, which
also keeps the API key out of every text it returns; rows built here go through its `redact`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from typing import TYPE_CHECKING, Any

from actors.openai_http import EndpointError, OpenAIHttp, seconds
from actors.tables import score_rows, scores_table, teacher_forced, to_generation
from fleet.contracts.engine import Completion, Engine, Generation

if TYPE_CHECKING:
    from collections.abc import Sequence

    import aiohttp
    import pyarrow as pa

    from fleet.contracts.engine import PerfResult
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import Shard

# Route -> request body; None: a GET. `models` is the playbook's readiness check: the server lists the model.
SMOKE_CHECKS: dict[str, dict[str, Any] | None] = {
    "models": None,
    "completions": {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
    "chat/completions": {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0},
}


class OpenAIEngine(Engine):
    """An engine that is a client: subclasses call `connect` once the server answers."""

    max_model_len: int | None = None
    send_token_ids = False  # send locally tokenized ids instead of text (servers without return_token_ids)
    request_timeout_s = 600.0
    max_concurrency = 64
    http: OpenAIHttp

    def connect(self, base_url: str, *, api_key: str | None, served_model: str | None = None) -> None:
        """Set the base URL (".../v1") and key, and learn the served model's name and context length."""
        self.http = http = OpenAIHttp(
            base_url, api_key=api_key, request_timeout_s=self.request_timeout_s, max_concurrency=self.max_concurrency
        )
        models = http.get("models")["data"]
        entry = next((m for m in models if m["id"] == served_model), None) if served_model else models[0]
        if entry is None:
            msg = f"{http.base_url}: serves {[m['id'] for m in models]}, not {served_model!r}"
            raise EndpointError(msg)
        http.model, self.max_model_len = entry["id"], entry.get("max_model_len")

    @property
    def served_model(self) -> str:
        return self.http.model

    def key_from_env(self, variable: str | None) -> str | None:
        """The API key in the environment variable the manifest names (`api_key_env`), read here
        in the actor so that only the name is ever recorded; None when it names none."""
        if variable is None:
            return None
        if not (key := os.environ.get(variable)):
            msg = f"target {self.args.name!r}: environment variable {variable} (api_key_env) is not set"
            raise RuntimeError(msg)
        return key

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
        from actors.workloads import encode

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
        responses = self.http.post_many_timed([(route, body) for route, body, _ in requests])
        wall = time.perf_counter() - t0
        completions = [
            self._completion(p, route, sent, resp, elapsed)
            for p, (route, _, sent), (resp, elapsed) in zip(shard.prompts, requests, responses, strict=True)
        ]
        return to_generation(shard, self.model, completions, started_at=started, wall_s=wall)

    def _completion(
        self, prompt: Prompt, route: str, sent: list[int] | None, resp: dict[str, Any], elapsed_s: float
    ) -> Completion:
        """One response as a Completion. Latencies come from vLLM's per-request metrics; a server
        without them (vLLM < 0.32: no --enable-per-request-metrics) gives only the end-to-end time,
        from client timestamps (the fallback run.json names), and null queue/TTFT/TPOT."""
        k = self.sampling.logprobs
        choice = resp["choices"][0]
        chat = route == "chat/completions"
        prompt_ids = resp.get("prompt_token_ids") if chat else choice.get("prompt_token_ids")
        if prompt_ids is None and sent is None:
            raise self.http.error(route, 200, "no prompt_token_ids in the response: set send_token_ids: true")
        if sent is not None and prompt_ids is not None and list(prompt_ids) != sent:
            raise self.http.error(route, 200, f"server used prompt ids {prompt_ids}, not the ids sent {sent}")
        steps = self._steps(route, choice)
        ids = [tok for tok, _, _ in steps]
        if choice.get("token_ids") is not None and list(choice["token_ids"]) != ids:
            raise self.http.error(route, 200, "token_ids and logprob tokens disagree")
        tops = [sorted(top, key=lambda t: -t[1])[:k] for _, _, top in steps]
        # The API gives no rank: it is known only when the token is in the top k (greedy: always);
        # otherwise null (the requests table's rank column is nullable).
        ranks: list[Any] = [_rank(tok, lp, top) for (tok, lp, _), top in zip(steps, tops, strict=True)]
        m = resp.get("metrics") or {}
        parts = [seconds(m, "queue_time_ms"), seconds(m, "time_to_first_token_ms"), seconds(m, "generation_time_ms")]
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
            tpot_s=seconds(m, "mean_itl_ms"),
            e2e_s=sum(p for p in parts if p is not None) if None not in parts else None if m else elapsed_s,
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
            raise self.http.error(route, 200, f"logprobs not keyed token_id:N ({e}): {json.dumps(lp)[:300]}") from None

    def score(self, requests: pa.Table, *, k: int, twin: str | None = None) -> pa.Table:
        """Teacher forcing through `prompt_logprobs`: prompt + output as one prompt, one token generated."""
        rows = teacher_forced(requests)
        bodies = [
            {"prompt": r["prompt_token_ids"] + r["output_token_ids"], "max_tokens": 1, "temperature": 0}
            | {"prompt_logprobs": k}
            for r in rows
        ]
        responses = self.http.post_many([("completions", b) for b in bodies])
        out: list[dict[str, object]] = []
        for r, resp in zip(rows, responses, strict=True):
            steps = resp["choices"][0].get("prompt_logprobs")
            if not steps:
                msg = f"{self.http.base_url} returns no prompt_logprobs: this target cannot score (be the reference)"
                raise EndpointError(msg)
            n_prompt = len(r["prompt_token_ids"])
            output_steps = [
                {int(t): (e["rank"], e["logprob"]) for t, e in step.items()}
                for step in steps[n_prompt : n_prompt + len(r["output_token_ids"])]
            ]
            out += score_rows(r["prompt_id"], r["output_token_ids"], output_steps, k=k)
        return scores_table(out)

    # -- smoke and perf ---------------------------------------------------------------------

    def smoke(self) -> pa.Table:
        """fleet.contracts.perf_schema.SMOKE rows: one request each to completions and chat/completions."""
        import pyarrow as pa

        from fleet.contracts import perf_schema

        async def check(session: aiohttp.ClientSession, route: str, body: dict[str, Any] | None) -> dict[str, Any]:
            row: dict[str, Any] = {"model": self.model.name, "model_weights": self.model.weights}
            row |= {"target": self.args.name, "check": route}
            t0 = time.perf_counter()
            try:
                status, text = await self.http.send(session, route, body)
                row["status"], row["latency_s"] = status, time.perf_counter() - t0
                row["response"] = self.http.redact(text[:4000])
                answer = json.loads(text) if status == 200 else {}
                if body is None:  # readiness: the served model is listed
                    listed = [m.get("id") for m in answer.get("data", [])]
                    row["passed"] = status == 200 and self.served_model in listed
                    row["error"] = None if row["passed"] else f"HTTP {status}, {self.served_model!r} not in {listed}"
                else:
                    tokens = answer.get("usage", {}).get("completion_tokens", 0)
                    row["passed"] = status == 200 and tokens > 0
                    row["error"] = None if row["passed"] else f"HTTP {status}, {tokens} completion tokens"
            except Exception as e:  # noqa: BLE001  (a failed check is a row, not an exception)
                row |= {"passed": False, "error": self.http.redact(f"{type(e).__name__}: {e}")[:1000]}
            return row

        async def run() -> list[dict[str, Any]]:
            async with self.http.session(2) as session:
                return [await check(session, route, body) for route, body in SMOKE_CHECKS.items()]

        return pa.Table.from_pylist(asyncio.run(run()), schema=perf_schema.SMOKE)

    def perf(
        self,
        scenario: Scenario,
        level: int,
        prompts: Sequence[str | Prompt] | None = None,
        parity_prompts: Sequence[Prompt] | None = None,
    ) -> PerfResult:
        """One level of a perf scenario over streaming HTTP (SSE); see actors/loadgen.py. The
        scenario's `parity:` prompts go as `generate` sends them, alone and mid-load (actors/load_parity.py)."""
        from actors.load_parity import run_level
        from actors.loadgen import prepare_level

        tokenizer, max_len = self.tokenizer, self.max_model_len
        prepared = prepare_level(self, scenario, level, prompts, tokenizer=tokenizer, max_model_len=max_len)

        if scenario.clients > 1:  # several client processes, each with its own session
            from actors.load_clients import spread

            send, clients = spread(self.http, scenario.clients, client_cpus=scenario.client_cpus)

            async def spread_run() -> PerfResult:
                async with self.http.session(0) as session:  # the driver's: only the prefix-cache counters
                    return await prepared.measure(None, send, cache=functools.partial(self.http.prefix_cache, session))

            try:
                return asyncio.run(spread_run())
            finally:
                clients.close()

        async def run() -> PerfResult:
            async with self.http.session(0) as session:  # 0: no connection cap, the level is the cap
                cache = functools.partial(self.http.prefix_cache, session)

                async def complete(prompt: Prompt) -> Completion:
                    route, body, sent = self._request(prompt)
                    t0 = time.perf_counter()
                    answer = await self.http.post(session, route, body)
                    return self._completion(prompt, route, sent, answer, time.perf_counter() - t0)

                stream = functools.partial(self.http.stream, session)
                return await run_level(prepared, stream, cache=cache, prompts=parity_prompts, complete=complete)

        return asyncio.run(run())

    def describe(self) -> dict[str, str]:
        from actors.provenance import describe

        info = describe(self.args.device) | {"base_url": self.http.base_url, "served_model": self.served_model}
        try:  # vLLM answers GET /version beside /v1; other servers may not
            root, _, _ = self.http.base_url.rpartition("/")
            info["server_version"] = str(self.http.get_url(f"{root}/version").get("version", ""))
        except Exception:  # noqa: BLE001
            pass
        return info


def _tid(token: str) -> int:
    if not token.startswith("token_id:"):
        msg = f"token {token!r} is not 'token_id:N' (does the server support return_tokens_as_token_ids?)"
        raise ValueError(msg)
    return int(token.removeprefix("token_id:"))


def _rank(token: int, logprob: float, top: list[tuple[int, float]]) -> int | None:
    if token not in {t for t, _ in top}:
        return None
    return 1 + sum(lp > logprob for _, lp in top)
