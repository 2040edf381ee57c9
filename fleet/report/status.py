"""What `fleet report` shows while it reads and computes: on a terminal, one line on stderr naming
the step under way and the seconds so far, rewritten in place and erased before the report prints
(at 100M token rows the report takes tens of seconds; on S3, longer). Elsewhere (a pipe, a log, CI)
nothing: the report itself is the output."""

from __future__ import annotations

import sys
import time

ERASE = "\r\x1b[K"  # back to the line's start, then clear it


class StatusLine:
    """Call it with each step's name; use it as a context manager, so the line goes on any exit."""

    def __init__(self) -> None:
        self.stream = sys.stderr
        self.on = self.stream.isatty()
        self.started = time.monotonic()

    def __call__(self, step: str) -> None:
        if self.on:
            self.stream.write(f"{ERASE}report: {step} ({time.monotonic() - self.started:.0f} s)")
            self.stream.flush()

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on:
            self.stream.write(ERASE)
            self.stream.flush()
