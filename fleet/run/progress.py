"""What a run shows while it runs: per model, shards done of planned, tokens/s and an ETA.

On a terminal it is one tqdm bar (shards and perf levels) whose postfix holds the per-model
figures. Where stderr is not a terminal (`ray job submit` streams the driver's output into a
log; CI) a carriage-return bar would become thousands of fragments, so it prints one plain line
per model every `interval_s` instead, and one when the run ends.

Both tick between updates too: a big model's engines take minutes to load, and a slow shard
longer, and a line that stands still all that time reads as a hang.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import IO, Any


class Ticker(threading.Thread):
    """Calls `draw` under `lock` every `every_s` seconds until `stop()`, and stops by itself when
    `draw` finds its stream gone (a pipe's reader, a terminal): a line that stands still while
    nothing finishes reads as a hang (this bar, `fleet report`'s status line)."""

    def __init__(self, draw: Callable[[], None], lock: threading.Lock, every_s: float, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.draw, self.lock, self.every_s = draw, lock, every_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            with self.lock:
                try:
                    self.draw()
                except (OSError, ValueError):  # the stream closed under us
                    return

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join()


def _duration(seconds: float) -> str:
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
        tick_s: float = 1.0,
    ) -> None:
        self.planned, self.done, self.tokens = planned, Counter[str](), Counter[str]()
        self.waiting = Counter[str]()  # shards generated while taking turns, for the reference to score
        self.stream = stream or sys.stderr
        self.enabled, self.interval_s = enabled, interval_s
        self.tty = self.stream.isatty() if tty is None else tty
        self.started: dict[str, float] = {}
        self.lock = threading.Lock()
        self.last_line = time.monotonic()
        self.printed, self.changed = False, False  # a line printed; finished work since the last one
        self.bar: Any = None
        if enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=sum(planned.values()), unit="shard", desc="shards+perf", file=self.stream)
        self.ticker = Ticker(self._tick, self.lock, tick_s, "fleet-progress")
        if enabled and planned:
            self.ticker.start()

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
            self.changed = True
            if self.bar is not None:
                self.bar.set_postfix_str(" | ".join(self.lines()), refresh=False)
                self.bar.update(n)
            elif self.enabled and now - self.last_line >= self.interval_s:
                self._print()

    def staged(self, model: str, waiting: int) -> None:
        """`waiting` shards of `model` are generated and stored for the reference's turn (its
        targets take turns): they count as done once it has scored them."""
        with self.lock:
            self.waiting[model] = waiting

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
            # While shards wait for the reference's turn the pace of stored shards says nothing of
            # what is left (the reference scores them in a burst): no ETA then.
            waiting = f", {self.waiting[model]} more generated, for the reference's turn" if self.waiting[model] else ""
            if not done:  # its actors starting (engines loading) or its first shards running; or waiting for room
                since = f", {_duration(elapsed)} since its actors started" if model in self.started else ""
                out.append(f"{model}: 0/{planned} shards{waiting}{since}")
                continue
            rate = self.tokens[model] / elapsed if elapsed > 0 else 0.0
            eta = elapsed / done * (planned - done) if done < planned else 0.0
            ahead = waiting or f", ETA {_duration(eta)}"
            out.append(f"{model}: {done}/{planned} shards, {rate:,.0f} token rows stored/s{ahead}")
        return out

    def write(self, message: str) -> None:
        """A message (retry, timeout, failure) that must not garble the bar, nor a ticked line."""
        with self.lock:
            if self.bar is not None:
                self.bar.write(message)
            else:
                print(message, file=self.stream, flush=True)

    def _tick(self) -> None:
        """The bar redrawn (its elapsed time and ETA move), or a plain line once `interval_s` has
        passed, whether or not work finished meanwhile."""
        if self.bar is not None:
            self.bar.set_postfix_str(" | ".join(self.lines()), refresh=False)
            self.bar.refresh()
        elif time.monotonic() - self.last_line >= self.interval_s:
            self._print()

    def _print(self) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        self.last_line, self.printed, self.changed = time.monotonic(), True, False
        for line in self.lines():
            print(f"[{stamp}] progress {line}", file=self.stream, flush=True)

    def close(self) -> None:
        self.ticker.stop()
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and (self.changed or not self.printed):
            self._print()  # the state at the end, unless the last line already says it
