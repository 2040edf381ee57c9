"""Progress at scale: per model shards, tokens/s and an ETA; plain periodic lines off a terminal."""

from __future__ import annotations

import io
import re
from collections import Counter

from fleet.run.progress import Progress


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()  # not a TTY: what `ray job submit` logs see
    with Progress(Counter({"m1": 4, "m2": 2}), stream=out, interval_s=0.0) as progress:
        progress.update(1, model="m1", tokens=500)
        progress.write("retry 2/3 m1/cand generate: boom")
        progress.update(1, model="m2", tokens=100)
        progress.update(1, model="m2", tokens=100)
    text = out.getvalue()
    assert "\r" not in text
    assert re.search(r"progress m1: 1/4 shards, [\d,]+ token rows stored/s, ETA \d+:\d\d:\d\d\n", text)
    assert re.search(r"progress m2: 2/2 shards, [\d,]+ token rows stored/s, ETA 0:00:00\n", text)
    assert "retry 2/3 m1/cand generate: boom\n" in text


def test_lines_are_rate_limited() -> None:
    out = io.StringIO()
    progress = Progress(Counter({"m": 100}), stream=out, interval_s=3600.0)
    for _ in range(50):
        progress.update(1, model="m", tokens=10)
    assert out.getvalue() == ""  # nothing before the interval...
    progress.close()
    assert out.getvalue().count("progress m: 50/100 shards") == 1  # ...and one line at the end


def test_disabled_prints_nothing_but_messages() -> None:
    out = io.StringIO()
    with Progress(Counter({"m": 1}), stream=out, enabled=False, interval_s=0.0) as progress:
        progress.update(1, model="m")
        progress.write("FAILED m/cand: x")
    assert out.getvalue() == "FAILED m/cand: x\n"
