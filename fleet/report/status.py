"""What `fleet report` shows while it reads and computes: on a terminal, one line on stderr naming
the step under way and the seconds so far, rewritten in place every second and erased before the
report prints (at 100M token rows the report takes tens of seconds, one step ~10 s; on S3, longer).
Elsewhere (a pipe, a log, CI) nothing: the report itself is the output."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO

from fleet.run.progress import Ticker

ERASE = "\r\x1b[K"  # back to the line's start, then clear it


class StatusLine:
    """Call it with each step's name; use it as a context manager, so the line goes on any exit."""

    def __init__(self, stream: IO[str] | None = None, *, tty: bool | None = None, tick_s: float = 1.0) -> None:
        self.stream = stream or sys.stderr
        self.on = self.stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self.step: str | None = None
        self.lock = threading.Lock()
        self.ticker = Ticker(self._draw, self.lock, tick_s, "fleet-report-status")  # the seconds move within a step

    def __call__(self, step: str) -> None:
        with self.lock:
            self.step = step
            self._draw()

    def _draw(self) -> None:
        if self.on and self.step is not None:
            self.stream.write(f"{ERASE}report: {self.step} ({time.monotonic() - self.started:.0f} s)")
            self.stream.flush()

    def __enter__(self) -> StatusLine:
        if self.on:
            self.ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ticker.stop()
        if self.on:
            self.stream.write(ERASE)
            self.stream.flush()
