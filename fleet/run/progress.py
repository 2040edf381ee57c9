"""What a run shows while it runs: per model, shards done of planned, tokens/s and an ETA.

On a terminal it is one tqdm bar (shards and perf levels) whose postfix holds the per-model
figures. Where stderr is not a terminal (`ray job submit` streams the driver's output into a
log; CI) a carriage-return bar would become thousands of fragments, so it prints one plain line
per model every `interval_s` instead, and one when the run ends.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from collections import Counter
from typing import IO, Any


def _eta(seconds: float) -> str:
    return str(dt.timedelta(seconds=round(seconds))) if seconds < 1e7 else "?"


class Progress:
    """Counts finished work per model; `update` and `write` are what the scheduler calls
    (from its writer threads too, hence the lock)."""

    def __init__(
        self,
        planned: Counter[str],
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        interval_s: float = 30.0,
        tty: bool | None = None,
    ) -> None:
        self.planned, self.done, self.tokens = planned, Counter[str](), Counter[str]()
        self.stream = stream or sys.stderr
        self.enabled, self.interval_s = enabled, interval_s
        self.tty = self.stream.isatty() if tty is None else tty
        self.started: dict[str, float] = {}
        self.lock = threading.Lock()
        self.last_line = time.monotonic()
        self.bar: Any = None
        if enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=sum(planned.values()), unit="shard", desc="shards+perf", file=self.stream)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1, *, model: str = "", tokens: int = 0) -> None:
        """`n` shards or perf levels of `model` finished, writing `tokens` token rows."""
        with self.lock:
            now = time.monotonic()
            self.started.setdefault(model, now)
            self.done[model] += n
            self.tokens[model] += tokens
            if self.bar is not None:
                self.bar.set_postfix_str(" | ".join(self.lines()), refresh=False)
                self.bar.update(n)
            elif self.enabled and now - self.last_line >= self.interval_s:
                self.last_line = now
                self._print()

    def started_model(self, model: str) -> None:
        """The model's actors are being started: its rate counts from here."""
        with self.lock:
            self.started.setdefault(model, time.monotonic())

    def lines(self) -> list[str]:
        """One status per model with work: 'm: 12/40 shards, 3,200 token rows stored/s, ETA 0:00:42'.

        The rate is the run's own pace, token rows stored (every target's, scored) per wall second
        since the model's actors started, engine starts included; an engine's throughput is the
        report's figure, not this one, and the label says which it is."""
        now, out = time.monotonic(), []
        for model, planned in self.planned.items():
            done, elapsed = self.done[model], now - self.started.get(model, now)
            if not done:
                out.append(f"{model}: 0/{planned} shards")
                continue
            rate = self.tokens[model] / elapsed if elapsed > 0 else 0.0
            eta = elapsed / done * (planned - done) if done < planned else 0.0
            out.append(f"{model}: {done}/{planned} shards, {rate:,.0f} token rows stored/s, ETA {_eta(eta)}")
        return out

    def write(self, message: str) -> None:
        """A message (retry, timeout, failure) that must not garble the bar."""
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, file=self.stream, flush=True)

    def _print(self) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        for line in self.lines():
            print(f"[{stamp}] progress {line}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._print()
