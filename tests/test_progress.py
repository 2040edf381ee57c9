"""Progress at scale: per model shards, tokens/s and an ETA; plain periodic lines off a terminal."""

from __future__ import annotations

import io
import re
import time
from collections import Counter
from collections.abc import Callable

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


def _until(seen: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not seen():
        assert time.monotonic() < deadline, "the progress line did not tick"
        time.sleep(0.01)


def test_plain_lines_tick_while_no_shard_finishes() -> None:
    """An engine that takes minutes to load: the log still gets a line every interval."""
    out = io.StringIO()
    progress = Progress(Counter({"m": 3, "waiting": 2}), stream=out, interval_s=0.05, tick_s=0.01, tty=False)
    progress.started_model("m")
    _until(lambda: out.getvalue().count("progress m: 0/3 shards") >= 2)
    text = out.getvalue()
    assert re.search(r"progress m: 0/3 shards, 0:00:\d\d since its actors started\n", text)
    assert "progress waiting: 0/2 shards\n" in text  # not started: no time since
    progress.close()
    assert not progress.ticker.is_alive()
    printed = out.getvalue().count("progress m:")
    progress.close()  # nothing finished since the last line: no second copy of it
    assert out.getvalue().count("progress m:") == printed


def test_the_bar_ticks_on_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(Counter({"m": 3}), stream=out, tick_s=0.01, tty=True)
    assert progress.bar is not None
    progress.started_model("m")
    _until(lambda: "since its actors started" in out.getvalue())  # no update came: the ticker drew it
    progress.close()
    assert not progress.ticker.is_alive()


def test_the_ticker_stops_when_its_stream_is_gone() -> None:
    out = io.StringIO()
    progress = Progress(Counter({"m": 3}), stream=out, interval_s=0.0, tick_s=0.01, tty=False)
    out.close()  # a closed pipe: the ticker stops instead of raising in its thread
    progress.ticker.join(timeout=10)
    assert not progress.ticker.is_alive()


def test_shards_waiting_for_the_reference_turn_are_named_and_no_eta_is_guessed() -> None:
    progress = Progress(Counter({"m": 4, "other": 1}), enabled=False)
    progress.staged("m", 2)
    assert progress.lines()[0] == "m: 0/4 shards, 2 more generated, for the reference's turn"
    progress.update(1, model="m", tokens=10)
    [line] = [x for x in progress.lines() if x.startswith("m:")]
    assert re.fullmatch(r"m: 1/4 shards, [\d,]+ token rows stored/s, 2 more generated, for the reference's turn", line)
    progress.staged("m", 0)  # the reference scored them: the ETA is back
    assert re.search(r"m: 1/4 shards, .*, ETA \d+:\d\d:\d\d$", progress.lines()[0])
