"""fleet.report: one RunReport, rendered as text, HTML and Markdown, each with every section.

`write_full_run` is a run directory with every table a report reads, built by hand through
RunStore from the other tests' builders: parity rows (test_compare.write_run, with expected
answers), perf_requests/perf_levels (test_perf), smoke rows, logits and layers probe rows
(test_probes) and a feature matrix of two variants in run.json. No engine, no Ray.
"""

from __future__ import annotations

import json
import re
from html import escape, unescape
from pathlib import Path
from typing import Any

import mdcheck
import numpy as np
import polars as pl
import pytest
from test_compare import DIVERGED, SAME, _table, write_model_dir, write_run
from test_perf import _request
from test_probes import layers_frame, logits_frame

from actors import capture
from fleet import cli
from fleet.analysis import gates, probe_metrics
from fleet.contracts import perf_schema, schema, stored_tables
from fleet.contracts.gates import Gate
from fleet.contracts.spec import DrillPoint
from fleet.report import columns, compare, html, markdown, summary, text
from fleet.report.blocks import NOT_MEASURED
from fleet.report.layouts import seed_sections
from fleet.report.model import RunReport
from fleet.report.sections import sections
from fleet.results import reader
from fleet.results.store import RunStore
from fleet.run.drill import drilldown_rows
from fleet.run.plan import DrillCall

VARIANTS = {
    "v.eager-true": {"base": "v", "settings": {"enforce_eager": True}},
    "v.eager-false": {"base": "v", "settings": {"enforce_eager": False}},
}
EXPECTED = {"p2": json.dumps({"contains": "t8"})}  # the reference and SAME answer t8, DIVERGED t3
PERF_SCENARIOS = [
    {"name": "decode", "concurrency": [1, 4], "input_tokens": 8, "output_tokens": 4, "num_requests": 4,
     "warmup_requests": 0},
    {"name": "capacity", "concurrency": [4], "input_tokens": 8, "output_tokens": 4, "num_requests": 4,
     "warmup_requests": 0, "slo": {"e2e_s": 0.5}, "sweep": {"floor_rps": 1.0, "min_share": 0.9, "steps": 1}},
]  # fmt: skip
GATES = [
    {"metric": "seq_match_rate", "op": ">=", "threshold": 1.0},  # DIVERGED fails it
    {"metric": "first_top1_agreement", "op": ">=", "threshold": 1.0},
]


def write_full_run(run_dir: Path, *, cand: dict[str, Any] | None = None, noise: float = 0.01, **kwargs: Any) -> Path:
    """write_run's reference and candidate `cand` (default DIVERGED) plus two matrix variants, with
    perf levels 1 and 4 and two smoke checks for `cand`, and probes of `ref` and `cand` (whose
    logits and hidden states are the reference's with `noise`)."""
    candidates = {"cand": DIVERGED if cand is None else cand, "v.eager-true": SAME, "v.eager-false": DIVERGED}
    candidates["cand.repeat-2"] = candidates["cand"]  # `repeat: 2`: the candidate run again
    run = write_run(run_dir, candidates, expected=EXPECTED, **kwargs)
    store = RunStore(run)
    extra = {"variants": VARIANTS, "repeats": {"cand.repeat-2": "cand"}, "perf": PERF_SCENARIOS}
    store.update_info(manifest_resolved=store.info()["manifest_resolved"] | extra)
    weights = {"model": "m", "model_weights": "0123456789abcdef"}
    for level, wall_s in ((1, 2.0), (4, 1.0)):
        key = weights | {"target": "cand", "scenario": "decode", "level": level}
        shard = f"m/cand/decode/{level:05d}"
        perf = [_request(i, 0.1 * level, [0.02] * 3, 0.2 * level) | key for i in range(4)]
        store.write("perf_requests", shard, _table(perf_schema.PERF_REQUESTS, perf))
        level_row = key | {"wall_s": wall_s, "n_requests": 4, "n_errors": 0, "hostname": "node-1"}
        level_row |= {"prefix_cache_queries": 400, "prefix_cache_hits": 100 * (level // 2 + 1)}  # 0.25, 0.75
        store.write("perf_levels", shard, _table(perf_schema.PERF_LEVELS, [level_row]))
    # A sweep at level 4: the closed loop (E2E 0.8 s) and 2.5 req/s (0.6 s) miss the 0.5 s SLO, 1 req/s meets it.
    for probe, rate, e2e in ((0, None, 0.8), (1, 1.0, 0.2), (2, 2.5, 0.6)):
        key = weights | {"target": "cand", "scenario": "capacity", "level": 4, "probe": probe}
        perf = [_request(i, 0.1, [0.02] * 3, e2e) | key for i in range(4)]
        store.write("perf_requests", f"m/cand/capacity/00004-{probe}", _table(perf_schema.PERF_REQUESTS, perf))
        level_row = key | {"request_rate": rate, "wall_s": 2.0, "n_requests": 4, "n_errors": 0, "hostname": "node-1"}
        store.write("perf_levels", f"m/cand/capacity/00004-{probe}", _table(perf_schema.PERF_LEVELS, [level_row]))
    smoke = [
        {"check": "completions", "passed": True, "status": 200, "latency_s": 0.05},
        {"check": "chat/completions", "passed": False, "status": 500, "latency_s": 0.07, "error": "HTTP 500: a | b"},
    ]
    store.write(
        "smoke", "m/cand/smoke/00000", _table(perf_schema.SMOKE, [weights | {"target": "cand"} | r for r in smoke])
    )
    # Parity under load at both levels: the candidate's own parity rows, as if sent alone and mid-load.
    stored = {
        name: reader.load(run)[name].filter(pl.col("target") == "cand").collect() for name in ("requests", "tokens")
    }
    for level in (1, 4):
        at = [
            pl.lit("decode").alias("scenario"),
            pl.lit(level, pl.Int32).alias("level"),
            pl.lit(level).alias("in_flight_sent"),
        ]
        for name, frame in stored.items():
            both = pl.concat([frame.with_columns(*at, phase=pl.lit(phase)) for phase in perf_schema.LOAD_PHASES])
            declared = stored_tables.all_tables()[f"load_{name}"]
            store.write(f"load_{name}", f"m/cand/decode/{level:05d}", schema.conform(both.to_arrow(), declared))
    rng = np.random.default_rng(0)
    ref = probe_metrics.log_normalize(rng.normal(size=(2, 16))).astype(np.float32)
    noisy = (ref + noise * rng.normal(size=ref.shape)).astype(np.float32)
    hidden = [rng.normal(size=(2, 8)) for _ in range(3)]
    probe_tables = {
        "logits": logits_frame({"ref": [("p1", [1, 2], ref)], "cand": [("p1", [1, 2], noisy)]}),
        "layers": layers_frame({"ref": hidden, "cand": [h * (1 + noise * i) for i, h in enumerate(hidden)]}),
    }
    for name, frame in probe_tables.items():
        for target in ("ref", "cand"):
            rows = frame.filter(pl.col("target") == target).with_columns(model_weights=pl.lit(weights["model_weights"]))
            store.write(name, f"m/{target}/s/00000", rows.to_arrow())
    write_drilldown(store, weights, rng)
    return run


def write_drilldown(store: RunStore, weights: dict[str, str], rng: np.random.Generator) -> None:
    """The drill-down at cand's divergence on p2 (token 1), as fleet/run/drill.py stores it: the
    reference, its float32 twin (1e-7 off) and cand, broken from layer 2's attention output on."""
    labels = [(0, "embed"), (1, "attention"), (1, "mlp"), (1, "decoder")]
    labels += [(2, "attention"), (2, "mlp"), (2, "decoder"), (3, "norm")]
    ref = [rng.normal(size=(1, 8)) for _ in labels]
    twin = [h + 1e-7 * rng.normal(size=h.shape) for h in ref]
    cand = [h + (0.3 if i >= 4 else 0.0) * rng.normal(size=h.shape) for i, h in enumerate(ref)]
    point = DrillPoint("cand", "s", "p2", 1, (1, 2, 5))
    for target, dtype, hidden in (("ref", None, ref), ("ref", "float32", twin), ("cand", None, cand)):
        rows = capture.LayerRows("0", [1, 2, 5], [2], labels, hidden)
        layers = capture.layers_table(weights | {"target": target, "prompt_set": "drilldown"}, [rows])
        call = DrillCall("m", target, dtype, (point,))
        store.write("drilldown", call.key, drilldown_rows(layers, call))


@pytest.fixture
def full(tmp_path: Path) -> RunReport:
    run = write_full_run(tmp_path / "run", model_dir=write_model_dir(tmp_path / "model"), gate_specs=GATES)
    return RunReport.build(run)


def chunk(document: str, title: str, *, ends: str) -> str:
    """The part of `document` from `title` to the next section heading (the pattern `ends`)."""
    start = document.index(title) + len(title)
    end = re.compile(ends).search(document, start)
    return document[start : end.start() if end else len(document)]


def rendered(report: RunReport) -> dict[str, tuple[str, str]]:
    """Each format's document and the pattern that starts a section (not a table's title)."""
    return {
        "text": (text.render(report), r"\n## "),
        "markdown": (markdown.render_markdown(report), r"\n##+ \d"),
        "html": (html.render_html(report), "<h2"),
    }


def test_every_section_in_every_format(full: RunReport) -> None:
    assert full.logits is not None
    logits_cos = f"{full.logits['logits_cosine_min'].item():.4g}"
    data = {
        "parity": ["0.9428", "0.04167"],  # r and MAE over the matched prefix
        "first_step": ["0.2212", "top-1 agreement 2/2"],
        "sequences": ["t5 t3 t9", "sequence match 1/2 (50.0%), token match 5/6 (83.3%)"],
        "accuracy": ["-100"],
        "throughput": ["0.0199"],
        "scenarios": ["decode", "1000", "416"],  # prefill tok/s at 1, total tok/s at 4
        "sweeps": ["capacity", "2.5", "cand / capacity @ 4: 1 req/s"],
        "smoke": ["chat/completions", "HTTP 500: a | b"],
        "workloads": ["0.25", "0.75", "prefix-cache hits: tokens found cached / looked up"],
        "logits": [logits_cos],
        "layers": ["decoder", "0.02"],
        "drilldown": ["prompt p2 diverges at token 1; the error first exceeds precision at layer 2 (attention output)"],
        "matrix": ["enforce_eager=False", "enforce_eager: true vs false", "s/p2"],
        # eager vs graph part on one prompt beyond the noise (s/p2): the setting is above the noise.
        "setting_effects": ["v.eager-false", "1 of 2 greedy paths change beyond the noise", "above noise"],
        "noise_floor": ["cand.repeat-2", "bit-identical to its rerun"],
        "load_parity": ["decode", "the batch changed the answer"],
        "environment": ["Test CPU", "0123456789abcdef"],
        "architecture": ["LlamaForCausalLM", "10000.0", "40"],
        "gates": ["FAIL: 3 of 8 gate checks fail.", "0.5 >= 1 is false"],
    }
    titles = {key: s.title for key, s in sections(full).items()}
    assert set(data) == set(titles)
    for fmt, (document, ends) in rendered(full).items():
        assert NOT_MEASURED not in document, fmt
        for key, title in titles.items():
            part = chunk(document, escape(title) if fmt == "html" else title, ends=ends)
            for value in data[key]:
                shown = escape(value) if fmt == "html" else value.replace("|", "\\|") if key == "smoke" else value
                assert shown in part, (fmt, key, value)
        if fmt != "html":
            mdcheck.tables(document)


def test_tables_are_valid_markdown_with_their_headers(full: RunReport) -> None:
    for document in (text.render(full), markdown.render_markdown(full)):
        headers = [table[0] for table in mdcheck.tables(document)]
        assert list(columns.PARITY.values()) in headers  # "first |dlogp|" is one header, not two
        assert list(columns.SEQUENCES.values()) in headers  # with the prompt set
        rows = mdcheck.rows(document)
        assert ["m", "cand", "chat/completions", "❌", "500", "0.07", "HTTP 500: a | b"] in rows
        # The divergence kind, margin and noise sit between the divergence and correctness columns.
    head, tail = ["m", "cand", "s", "p2", "t5 t8 t9", "t5 t3 t9", "❌", "1", "divergence"], ["✅", "❌"]
    assert any(row[:9] == head and row[-2:] == tail for row in rows)


def html_rows(fragment: str) -> list[list[str]]:
    """The cells of every table row in an HTML fragment, header rows included, as text."""
    rows = re.findall(r"<tr>(.*?)</tr>", fragment)
    return [[unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r)] for r in rows]


def test_summary_has_one_row_per_target_with_the_gates_verdict(full: RunReport) -> None:
    """Every format opens with the summary: one row per target the manifest names, the reference
    first, and each candidate's verdict the one its rows in the gates section add up to."""
    targets = ["ref", "cand", "v.eager-true", "v.eager-false", "cand.repeat-2"]
    verdict = list(columns.VERDICTS).index("verdict")
    for fmt, (document, _) in rendered(full).items():
        if fmt == "html":
            head = document.index('<section id="summary">')
            first = html_rows(document[head : document.index("</section>", head)])
            checks = html_rows(chunk(document, escape(sections(full)["gates"].title), ends='<details class="fold">'))
        else:
            tables = mdcheck.tables(document)
            first = tables[0]
            [checks] = [t for t in tables if t[0] == list(columns.VERDICTS.values())]
        header, *rows = first
        assert header[:4] == ["model", "target", "verdict", "failed checks"], fmt
        assert [row[1] for row in rows] == targets, fmt
        failed: dict[str, list[bool]] = {}
        for row in checks[1:]:
            failed.setdefault(row[2], []).append(row[verdict] == "FAIL")
        expected = {t: "FAIL" if any(f) else "PASS" for t, f in failed.items()} | {"ref": "reference"}
        assert {row[1]: row[2] for row in rows} == expected, fmt
        assert {row[1]: row[3] for row in rows}["cand"] == f"{sum(failed['cand'])}/{len(failed['cand'])}", fmt
    assert set(expected.values()) == {"PASS", "FAIL", "reference"}  # each verdict is there to match
    # The headline figures: the noise model's excess with its interval, and the sweep's both ends.
    assert "6904.76 (2380.95-7142.86)" in text.render(full)
    assert "| out tok/s @1 | TTFT p50 s @1 | out tok/s @4 | TTFT p50 s @4 |" in text.render(full)


def test_a_seed_layout_follows_the_summary(full: RunReport) -> None:
    """`report: {layout: ...}`: the summary still opens every format, the seed's sections follow in
    its order, then the standard ones."""
    store = RunStore(full.run_dir)
    store.update_info(manifest_resolved=store.info()["manifest_resolved"] | {"report": {"layout": "004-openelm-3b"}})
    report = RunReport.build(full.run_dir)
    shaped = seed_sections(report)
    assert shaped is not None
    title, seed = shaped
    opening = {"text": "## Summary", "markdown": "## 1. Summary", "html": '<section id="summary">'}
    for fmt, (document, _) in rendered(report).items():
        shown = [escape(t) if fmt == "html" else t for t in (title, *(s.title for s in seed))]
        where = [document.index(opening[fmt]), *(document.index(t) for t in shown)]
        where.append(document.index(escape(sections(report)["parity"].title) if fmt == "html" else "Parity vs"))
        assert where == sorted(where), fmt


def test_absent_sections_say_so(tmp_path: Path) -> None:
    report = RunReport.build(write_run(tmp_path / "run", {"cand": SAME}))  # parity only, no gates
    assert summary.frame(report)["verdict"].to_list() == [summary.REFERENCE, summary.NO_GATES]
    assert "Perf: the parity runs" in text.render(report)
    for fmt, (document, ends) in rendered(report).items():
        by_title = {s.key: s.title for s in sections(report).values()}
        for key in ("accuracy", "scenarios", "sweeps", "smoke", "logits", "layers", "matrix", "noise_floor"):
            assert NOT_MEASURED in chunk(document, by_title[key], ends=ends), (fmt, key)
        assert "No gates configured: no verdict." in chunk(document, by_title["gates"], ends=ends), fmt
        assert "m: config.json not readable from here." in document
        if fmt != "html":
            mdcheck.tables(document)


def test_one_colour_per_target_in_every_plot(full: RunReport) -> None:
    page = html.render_html(full)
    legend = re.findall(r'fill="(#[0-9a-f]{6})"/><text x="[\d.]+" y="[\d.]+">([^<]+)</text>', page)
    colours: dict[str, set[str]] = {}
    for colour, label in legend:
        colours.setdefault(label, set()).add(colour)
    targets = {label: c for label, c in colours.items() if label in full.colors}  # not a metric's legend
    assert {label: c.pop() for label, c in targets.items() if len(c) == 1} == {t: full.colors[t] for t in targets}, (
        colours
    )
    assert len({full.colors[t] for t in ("ref", "cand", "v.eager-true", "v.eager-false")}) == 4
    # cand is in every plot: scatter, drift, divergence, 2 latency CDFs, 2 concurrency sweeps (decode and
    # capacity's closed loop), the rate sweep, parity vs load (TF p99 and real divergences), 2 layer
    # curves, the drill-down's curve.
    assert sum(label == "cand" for _, label in legend) == 13


def test_cli_report_writes_every_format_and_exits_on_gates(
    full: RunReport, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page, md = tmp_path / "report.html", tmp_path / "report.md"
    run = str(full.run_dir)
    assert cli.main(["report", run, "--html", str(page), "--markdown", str(md)]) == 4  # the run's gates: FAIL
    captured = capsys.readouterr()
    out = captured.out
    assert "## Gates: FAIL" in out and f"wrote {page}" in out and f"wrote {md}" in out
    # The code's meaning as the last line: `ray job submit` turns every failure into exit 1.
    assert captured.err.splitlines()[-1] == "fleet report: exit 4: a gate failed"
    mdcheck.tables(out.split(f"wrote {page}")[0])
    mdcheck.tables(md.read_text(encoding="utf-8"))
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    passing = tmp_path / "gates.yaml"
    passing.write_text('- {metric: first_top1_agreement, op: ">=", threshold: 1.0}\n')
    assert cli.main(["report", run, "--gates", str(passing)]) == 0
    assert "## Gates: PASS" in capsys.readouterr().out


def test_report_and_compare_name_their_steps_on_a_terminal_only(full: RunReport) -> None:
    """stderr a terminal (a pseudo-terminal here): each step on one line, rewritten, and erased before
    the report; stderr a pipe: only the exit line. The report on stdout the same either way."""
    import subprocess
    import sys

    from fleet.report.status import ERASE

    steps = [
        "report: reading the run's tables",
        "report: pairing each candidate's answers with the reference's",
        "report: parity figures",
        "report: the 20 worst prompts of each candidate, perf, probes and gates",
    ]
    run = str(full.run_dir)
    for verb, code, shown in (("report", 4, steps), ("compare", 0, steps * 2)):  # full's gates: FAIL
        cmd = [sys.executable, "-m", "fleet", verb, run, *([run] if verb == "compare" else [])]
        returncode, out, err = _on_a_terminal(cmd)
        piped = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        assert returncode == piped.returncode == code, verb
        # compare's last digits may differ between two processes (test_compare: no change below 1e-12)
        assert out == piped.stdout if verb == "report" else out.startswith(b"# A: "), verb
        *lines, after = err.split(ERASE)  # after the last erase: what a pipe gets too
        assert after.replace("\r\n", "\n") == piped.stderr.decode(), verb
        named = [line.split(" (")[0] for line in lines[1:]]
        # Each step once, in order; a step that lasts past a second is drawn again as it ticks.
        assert lines[0] == "" and [s for i, s in enumerate(named) if not i or s != named[i - 1]] == shown, verb
    assert piped.stderr == b""


def test_the_status_line_ticks_within_a_step() -> None:
    import io
    import time

    from fleet.report.status import ERASE, StatusLine

    out = io.StringIO()
    with StatusLine(out, tty=True, tick_s=0.01) as say:
        say("parity figures")
        deadline = time.monotonic() + 10
        while out.getvalue().count("report: parity figures (") < 3:  # drawn again with no new step
            assert time.monotonic() < deadline, "the status line did not tick"
            time.sleep(0.01)
    assert not say.ticker.is_alive() and out.getvalue().endswith(ERASE)
    quiet = io.StringIO()
    with StatusLine(quiet, tty=False, tick_s=0.01) as say:  # a pipe: nothing, and no thread
        say("parity figures")
    assert quiet.getvalue() == "" and not say.ticker.is_alive()


def _on_a_terminal(cmd: list[str]) -> tuple[int, bytes, str]:
    """(exit code, stdout, stderr) of `cmd` with stderr on a pseudo-terminal."""
    import os
    import pty
    import subprocess

    master, terminal = pty.openpty()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=terminal) as proc:
        os.close(terminal)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side is closed (Linux)
                break
            if not chunk:
                break
            err += chunk
        out = proc.communicate(timeout=120)[0]
    os.close(master)
    return proc.returncode, out, err.decode()


def test_compare_checks_accuracy_and_probe_gates(tmp_path: Path) -> None:
    """task_accuracy_delta, logits_* and layer_* reach the gates in compare: A passes, B fails
    where its candidate answers wrong and drifts, and layer cosine (a scaling keeps it) passes in both."""
    a = write_full_run(tmp_path / "a", cand=SAME, noise=0.0)
    b = write_full_run(tmp_path / "b", cand=DIVERGED, noise=0.05)
    specs = [
        {"metric": "task_accuracy_delta", "op": ">=", "threshold": -1.0},
        {"metric": "logits_cosine_min", "op": ">=", "threshold": 0.999},
        {"metric": "logits_kl_max", "op": "<=", "threshold": 1e-4},
        {"metric": "layer_rel_l2_max", "op": "<=", "threshold": 0.05},
        {"metric": "layer_cosine_min", "op": ">=", "threshold": 0.999},
    ]
    frame = compare.compare(a, b, gates=gates.parse([s | {"targets": ["cand"]} for s in specs]))
    cand = frame.filter(pl.col("target") == "cand", pl.col("gate").is_not_null())
    verdicts = {r["metric"]: (r["verdict_a"], r["verdict_b"]) for r in cand.iter_rows(named=True)}
    assert verdicts == {
        "task_accuracy_delta": ("PASS", "FAIL"),
        "logits_cosine_min": ("PASS", "FAIL"),
        "logits_kl_max": ("PASS", "FAIL"),
        "layer_rel_l2_max": ("PASS", "FAIL"),
        "layer_cosine_min": ("PASS", "PASS"),
    }
    delta = cand.filter(pl.col("metric") == "task_accuracy_delta").row(0, named=True)
    assert (delta["a"], delta["b"], delta["direction"]) == (0.0, -100.0, "worse")
    shown = compare.render(frame, run_a=a, run_b=b)
    assert "m/cand: task_accuracy_delta >= -1: PASS -> FAIL" in shown
    row = ["layer_rel_l2_max", "0", "0.1", "0.1", "—", "—", "worse", "layer_rel_l2_max <= 0.05", "PASS", "FAIL"]
    assert row in (mdcheck.rows(shown))


def test_perf_gates_name_their_scenario_and_level(tmp_path: Path) -> None:
    run = write_full_run(tmp_path / "run")
    measured = RunReport.build(run, gates=[]).scenarios
    assert measured is not None
    at4 = measured.filter(target="cand", scenario="decode", level=4)["output_tok_s"].item()
    spec = {"metric": "perf_output_tok_s", "op": ">=", "scenario": "decode", "level": 4, "targets": ["cand"]}
    passing = Gate.model_validate(spec | {"ratio": 0.97, "baseline": {"cand": at4}})
    failing = Gate.model_validate(spec | {"ratio": 0.97, "baseline": {"cand": at4 * 1.1}})
    absent = Gate.model_validate(spec | {"threshold": 0.0, "level": 8})
    verdicts = RunReport.build(run, gates=[passing, failing, absent]).verdicts
    assert verdicts is not None
    assert verdicts["verdict"].to_list() == ["PASS", "FAIL", "FAIL"]
    assert verdicts["value"][0] == pytest.approx(at4) and "not measured" in verdicts["reason"][2]
    assert "[decode @ 4]" in verdicts["gate"][0]
    with pytest.raises(ValueError, match="set scenario and level"):
        Gate.model_validate({"metric": "perf_output_tok_s", "op": ">=", "threshold": 1.0})
    with pytest.raises(ValueError, match="apply to perf_\\* metrics only"):
        Gate.model_validate({"metric": "output_tok_s", "op": ">=", "threshold": 1.0, "level": 1})


def test_targets_of_a_model_that_loaded_different_weights_are_named(tmp_path: Path) -> None:
    """Every target of a model must have loaded the same bytes: a candidate whose shards record
    another weights digest puts a warning among the notices (read from the shards table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = write_run(tmp_path / "r", {"cand": SAME, "cand2": SAME})
    assert not [n for n in RunReport.build(run, gates=[]).notices if "different weights" in n]
    for table in ("requests", "tokens", "shards"):
        for file in (run / table).glob("**/target=cand2/*.parquet"):
            rows = pq.read_table(file)
            digest = pa.array(["fedcba9876543210"] * rows.num_rows, pa.string())
            pq.write_table(rows.set_column(rows.schema.get_field_index("model_weights"), "model_weights", digest), file)
    notices = RunReport.build(run, gates=[]).notices
    assert "WARNING m: targets loaded different weights ['0123456789abcdef', 'fedcba9876543210']" in notices, notices
