"""Each seed-report manifest (manifests/reports/) runs to completion with `fleet run`, sizes cut with
`--set`, on real engines, and `fleet report` prints that seed's sections, in its order, in text,
Markdown (valid pipe tables) and HTML. The full manifests are run once for the seed table (docs/measurements.md)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import mdcheck
import pytest

from fleet import cli
from fleet.report.layouts import seed_sections
from fleet.report.model import RunReport
from fleet.report.text import render

pytestmark = pytest.mark.engine

REPORTS = Path(__file__).parents[1] / "manifests" / "reports"
TINY_LLAMA = (
    "models=[{name: tiny-llama, source: {kind: synthetic, family: llama, seed: 3, hidden_size: 128,"
    " intermediate_size: 256, num_layers: 3, num_heads: 4, num_kv_heads: 2, init_std: 0.1}, max_model_len: 512}]"
)
# The long-context prompts (1k-3.4k tokens) exceed the tiny models' 512: one short prompt in their place.
SHORT_CONTEXT = 'prompts.long-context=[{id: long-cut, prompt: "Paris stands on the river Seine. Which river?"}]'
SMALL_PERF = [
    SHORT_CONTEXT,
    "perf.0.concurrency=[2]",
    "perf.0.num_requests=2",
    "perf.0.output_tokens=4",
    "perf.0.warmup_requests=0",
]
# Per manifest: the cut-down sizes (the model stays in its family; fewer tokens, requests and variants).
CASES: dict[str, list[str]] = {
    "001-llama-3.2-3b": [TINY_LLAMA, *SMALL_PERF, "perf.0.input_tokens=16"],
    "002-qwen2.5-0.5b": [
        "models.0.source.vocab_size=1024",
        "models.0.source.num_layers=2",
        *SMALL_PERF,
        "sampling.max_tokens=4",
    ],
    "003-qwen-7b": [
        "models.0.source.vocab_size=1024",
        "models.0.source.num_layers=2",
        "models.0.max_model_len=512",
        "targets.3.matrix={engine_args.enable_chunked_prefill: [true, false]}",
        "targets.3.num_cpus=1",  # one rank each: the session's Ray has 2 CPU slots beside the reference's 1
        "gates.0.targets=[stage-b-real, vllm.enable_chunked_prefill-true, vllm.enable_chunked_prefill-false]",
        "gates.1.targets=[stage-b-real]",
        *SMALL_PERF,
        "perf.0.input_tokens=16",
        "perf.1.input_tokens=64",
        "perf.1.num_requests=1",
        "perf.1.warmup_requests=0",
        "sampling.max_tokens=6",
    ],
    "004-openelm-3b": [TINY_LLAMA, *SMALL_PERF, "sampling.max_tokens=6"],
}


SEED_DOC = Path(__file__).parents[1] / "docs" / "seed-reports.md"


def stated_verdicts() -> dict[str, str]:
    """The cut runs' verdicts as docs/seed-reports.md states them: {"001": "PASS", ...}."""
    text = SEED_DOC.read_text(encoding="utf-8")
    stated = re.search(r"\*\*cut-run verdicts: ([^*]+)\*\*", text)
    assert stated, "docs/seed-reports.md states no cut-run verdicts"
    return dict(pair.split() for pair in stated[1].split(", "))


def test_the_docs_state_a_verdict_for_every_seed() -> None:
    assert set(stated_verdicts()) == {name[:3] for name in CASES}
    assert set(stated_verdicts().values()) <= {"PASS", "FAIL"}


def _run(name: str, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    argv = ["run", str(REPORTS / f"{name}.yaml"), "--results", str(tmp), "--run-id", name, "--no-progress"]
    code = cli.main([*argv, *(a for s in CASES[name] for a in ("--set", s))])
    run_dir = tmp / name
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "complete", (info.get("failures"), info.get("failed_shards"))
    # The verdict the docs state for this cut run, in run.json and in the exit code.
    verdict = stated_verdicts()[name[:3]]
    assert (info["gates"], code) == (verdict, cli.EXIT_OK if verdict == "PASS" else cli.EXIT_GATES)
    assert info["overrides"] == CASES[name]
    capsys.readouterr()
    return run_dir, name


def _check_formats(run_dir: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[RunReport, dict[str, Any]]:
    md, page_file = tmp / "r.md", tmp / "r.html"
    verdict = stated_verdicts()[run_dir.name[:3]]
    expected = cli.EXIT_OK if verdict == "PASS" else cli.EXIT_GATES
    assert cli.main(["report", str(run_dir), "--markdown", str(md), "--html", str(page_file)]) == expected
    assert "## The full fleet-eval report" in capsys.readouterr().out  # printed; checked as text.render below
    report = RunReport.build(run_dir)
    text = render(report)
    shaped = seed_sections(report)
    assert shaped is not None
    title, sections = shaped
    markdown, page = md.read_text(), page_file.read_text()
    for output in (text, markdown, page):
        assert title in output
        # Every seed section, in the seed's order, before the standard report.
        where = [output.index(html.escape(s.title) if output is page else s.title) for s in sections]
        assert where == sorted(where), [s.title for s in sections]
    mdcheck.tables(markdown)
    mdcheck.tables(text)
    return report, {s.key: s for s in sections}


@pytest.mark.usefixtures("local_ray")
def test_001_layerwise_token_match_eager_perf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = _run("001-llama-3.2-3b", tmp_path, capsys)
    report, by_key = _check_formats(run_dir, tmp_path, capsys)
    assert report.layers is not None and report.layers["layer"].n_unique() == 3 + 2  # embed, 3 decoders, norm
    for key in ("seed-hidden", "seed-curve", "seed-tokens", "seed-perf", "seed-logits"):
        assert by_key[key].blocks, key
    assert not by_key["seed-resources"].blocks  # no device memory figures: says so
    assert "not measured on this run" in by_key["seed-resources"].absent


@pytest.mark.usefixtures("local_ray")
def test_002_random_weight_logits_and_dummy_perf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = _run("002-qwen2.5-0.5b", tmp_path, capsys)
    report, by_key = _check_formats(run_dir, tmp_path, capsys)
    assert report.scenarios is not None and report.scenarios["target"].to_list() == ["vllm-cpu-bf16-dummy"]
    for key in ("seed-perf", "seed-logits", "seed-samples", "seed-spread"):
        assert by_key[key].blocks, key


@pytest.mark.usefixtures("local_ray")
def test_003_playbook_stages_matrix_perf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = _run("003-qwen-7b", tmp_path, capsys)
    report, by_key = _check_formats(run_dir, tmp_path, capsys)
    assert report.smoke is not None
    checks = set(zip(report.smoke["target"], report.smoke["check"], report.smoke["passed"], strict=True))
    for target in ("stage-a-dummy", "stage-b-real"):
        assert {(target, c, True) for c in ("models", "completions", "chat/completions")} <= checks
    assert report.matrix is not None and report.matrix["started"].all()
    assert report.consistency is not None and report.consistency["identical"].all()
    assert report.scenarios is not None and set(report.scenarios["scenario"]) == {"decode", "prefill-1k"}
    for key in ("seed-stages", "seed-ready", "seed-infer", "seed-matrix", "seed-precision", "seed-perf"):
        assert by_key[key].blocks, key


@pytest.mark.usefixtures("local_ray")
def test_004_gsm8k_accuracy_examples_latency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = _run("004-openelm-3b", tmp_path, capsys)
    report, by_key = _check_formats(run_dir, tmp_path, capsys)
    assert report.accuracy is not None and set(report.accuracy["n_expected"]) == {54}
    for key in ("seed-accuracy", "seed-examples", "seed-perf"):
        assert by_key[key].blocks, key
