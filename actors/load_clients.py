"""A perf level's load spread over several client processes (Scenario.clients): Ray actors that each
send part of one schedule to a target served over HTTP (vllm-server, endpoint), figures merged.

One asyncio client tops out at about one core (benchmarks/client_ceiling.py); a target that serves
more than that is measured with k clients:

* placement: each client is a Ray actor reserving `client_cpus` CPUs (1: the core its event loop
  can use; 0 where the target holds every core of a small machine), scheduled with Ray's SPREAD
  strategy, so k clients land on k nodes when the cluster has them. They are made once per level
  and killed after it;
* the schedule: one seeded schedule of the level (actors/arrivals.py) is dealt round robin: client
  j sends requests j, j + k, ... at their own due times, so the merged arrivals are exactly the
  one-process schedule. A closed loop's level is split as evenly as can be (its in-flight caps
  sum to the level);
* the clock: every run starts at one wall-clock instant the level's driver chooses (after every
  client answered), and each client measures from there on its own perf_counter. On one node that
  is one clock; across nodes the offset is the nodes' clock agreement (NTP: about a millisecond),
  which shifts a client's sent_s and scheduled_s together, never a latency;
* the merge: the requests rows of every client (each tagged with its `client`), one level row:
  wall_s to the last request done of any client, client_cpu_s the busiest client's, hostname the
  clients' nodes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from actors.arrivals import split, split_level
from actors.send_loop import Sent, send

if TYPE_CHECKING:
    from actors.openai_http import OpenAIHttp
    from actors.send_loop import Send
    from actors.workloads import Request

START_LEAD_S = 0.5  # from choosing the shared start to it: time for every client to receive its part
READY_TIMEOUT_S = 120.0


class LoadClient:
    """One client process: sends its part of each run on its own HTTP session (a Ray actor class)."""

    def __init__(self, http: OpenAIHttp, index: int) -> None:
        self.http, self.index = http, index

    def ready(self) -> str:
        import socket

        return socket.gethostname()

    def send(
        self,
        prompts: Sequence[list[int] | Request],
        offsets: list[float] | None,
        indices: list[int],
        level: int,
        max_tokens: int,
        start_at: float,
    ) -> Sent:
        """This client's part of one run, timed from the shared `start_at` (wall clock)."""
        import socket

        async def run() -> Sent:
            async with self.http.session(0) as session:

                def stream(ids: list[int], n: int, **options: Any) -> Any:
                    return self.http.stream(session, ids, n, **options)

                return await send(
                    stream, prompts, max_tokens, level=level, offsets=offsets, indices=indices,
                    start_at=start_at, client=self.index,
                )  # fmt: skip

        sent = asyncio.run(run())
        sent.hostname = socket.gethostname()
        return sent


class Clients:
    """k LoadClient actors for one level; `send` runs a batch over them (a loadgen `Send`)."""

    def __init__(self, http: OpenAIHttp, clients: int, *, client_cpus: float = 1.0) -> None:
        import ray

        if not ray.is_initialized():
            msg = f"clients: {clients} spreads the load over Ray actors: run it under `fleet run` (or ray.init first)"
            raise RuntimeError(msg)
        remote = ray.remote(LoadClient).options(num_cpus=client_cpus, scheduling_strategy="SPREAD")
        self.actors = [remote.remote(http, j) for j in range(clients)]
        try:
            self.hosts = ray.get([a.ready.remote() for a in self.actors], timeout=READY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.close()
            msg = (
                f"{clients} client actors of {client_cpus:g} CPUs each did not start within {READY_TIMEOUT_S:g} s "
                f"(the cluster has {ray.available_resources().get('CPU', 0):g} CPUs free): lower the scenario's "
                "clients or client_cpus, or add nodes"
            )
            raise RuntimeError(msg) from None

    async def send(
        self, prompts: Sequence[list[int] | Request], offsets: list[float] | None, level: int, max_tokens: int
    ) -> Sent:
        """Run one batch: client j takes every k-th request of the schedule and 1/k of the level."""
        k = len(self.actors)
        parts, caps = split(list(range(len(prompts))), k), split_level(level, k)
        start_at = time.time() + START_LEAD_S
        refs = [
            actor.send.remote(
                [prompts[i] for i in part], None if offsets is None else [offsets[i] for i in part],
                part, cap, max_tokens, start_at,
            )
            for actor, part, cap in zip(self.actors, parts, caps, strict=True)
            if part
        ]  # fmt: skip
        return merge(list(await asyncio.gather(*refs)), started_at=start_at, clients=k)

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def merge(parts: list[Sent], *, started_at: float, clients: int) -> Sent:
    """One run from its clients' parts: every timing (each from the shared start), the busiest client's CPU."""
    hosts = sorted({p.hostname for p in parts if p.hostname})
    return Sent(
        timings=[t for p in parts for t in p.timings],
        started_at=started_at,
        client_cpu_s=max((p.client_cpu_s for p in parts), default=0.0),
        clients=clients,
        hostname=",".join(hosts) or None,
    )


def spread(http: OpenAIHttp, clients: int, *, client_cpus: float) -> tuple[Send, Clients]:
    """A `Send` over `clients` actors, and the actors (close them after the level)."""
    pool = Clients(http, clients, client_cpus=client_cpus)
    return pool.send, pool
