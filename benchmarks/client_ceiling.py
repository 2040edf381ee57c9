"""The load generator's own ceiling: fleet's streaming OpenAI client (actors/openai_http.py through
actors/loadgen.py, exactly as a perf level runs) against a loopback server that answers at once.

    .venv/bin/python benchmarks/client_ceiling.py [--levels 1 8 64 256] [--output-tokens 64] [--requests 400]
                                                  [--clients 1 2]

The server is a separate process (aiohttp, one core) that streams `max_tokens` SSE events, one
token id each, with no model behind them. Per level the benchmark prints the requests/s and
output tok/s the client sustained, the send lag (how late requests left against the closed loop's
schedule), and the CPU per wall second of the client's event loop (the busiest client's) and of the
server: a client near 100 % is the bottleneck, and a real server slower than these figures is
measured, not the client. `--clients 2` runs the same levels again spread over two Ray actors
(actors/load_clients.py, each every other arrival), as a scenario's `clients: 2` does. On a 2-core
machine the server and the clients share the cores, so this is a floor of the client's ceiling, not its limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as `python benchmarks/x.py`


def serve(port: int) -> None:
    """A completions endpoint that streams `max_tokens` one-token events and a usage event."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            event = {"choices": [{"index": 0, "text": "x", "token_ids": [1 + i % 100]}]}
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": len(body.get("prompt") or []), "completion_tokens": n}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2], help="client processes (2+: Ray actors)")
    args = parser.parse_args()

    from actors.load_clients import Clients
    from actors.loadgen import measure_level
    from actors.openai_http import OpenAIHttp
    from fleet.contracts.scenario import Scenario

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(port,), daemon=True)
    server.start()
    http = OpenAIHttp(f"http://127.0.0.1:{port}/v1", api_key=None, request_timeout_s=60, max_concurrency=4096)
    http.model = "loopback"
    for _ in range(100):  # the server is up once a connection is accepted
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)

    print(f"loopback server pid {server.pid}; {args.requests} requests x {args.output_tokens} tokens per level")
    print(
        f"{'clients':>7} {'level':>6} {'req/s':>8} {'out tok/s':>10} {'send lag p99 s':>15} "
        f"{'client CPU':>11} {'server CPU':>11}"
    )
    prompt = [[7] * 16 for _ in range(args.requests)]
    for clients in args.clients:
        pool = None
        if clients > 1:
            import ray

            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
            pool = Clients(http, clients, client_cpus=0)  # the server and the actors share this machine's cores
        for level in args.levels:
            if level < clients:
                continue
            scenario = Scenario(
                name="ceiling", concurrency=[level], input_tokens=16, output_tokens=args.output_tokens,
                num_requests=args.requests, warmup_requests=min(level, 32), clients=clients,
            )  # fmt: skip

            async def run(scenario: Scenario = scenario, level: int = level, pool: Clients | None = pool) -> object:
                async with http.session(0) as session:

                    def stream(ids: list[int], max_tokens: int) -> object:
                        return http.stream(session, ids, max_tokens)

                    return await measure_level(
                        None if pool else stream,  # type: ignore[arg-type]
                        scenario,
                        level,
                        prompts=prompt,
                        warmup=prompt[: scenario.warmup_requests],
                        model="loopback",
                        model_weights="none",
                        target="loopback",
                        send=pool.send if pool else None,
                    )

            server0, wall0 = cpu_seconds(server.pid or 0), time.perf_counter()
            result = asyncio.run(run())
            wall, server_cpu = time.perf_counter() - wall0, cpu_seconds(server.pid or 0) - server0
            row = result.level.to_pylist()[0]  # type: ignore[attr-defined]
            requests = result.requests.to_pylist()  # type: ignore[attr-defined]
            qps, tok_s = row["n_requests"] / row["wall_s"], sum(r["n_output_tokens"] or 0 for r in requests)
            lags = sorted(r["send_lag_s"] for r in requests if r["send_lag_s"] is not None)
            lag_p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else float("nan")
            print(
                f"{clients:>7} {level:>6} {qps:>8.1f} {tok_s / row['wall_s']:>10.0f} {lag_p99:>15.4f} "
                f"{100 * row['client_cpu_s'] / row['wall_s']:>10.0f}% {100 * server_cpu / wall:>10.0f}%"
                + (f"  ({row['n_errors']} errors)" if row["n_errors"] else ""),
                flush=True,
            )
        if pool is not None:
            pool.close()
            import ray

            ray.shutdown()
    server.terminate()
    server.join(timeout=10)


if __name__ == "__main__":
    main()
