"""Which setting moved the outputs: a feature matrix where one flag drifts (the labelled test
double's `logprob_shift`, a candidate whose logprobs are off by 0.5 nats) and one does not (its
per-token sleep); a whole run on the session's Ray, and the report's one-factor-at-a-time table
names the drifting flag, and only it, above the noise."""

from __future__ import annotations

import textwrap
from pathlib import Path

import polars as pl
import pytest

from fleet.analysis import consistency
from fleet.report import text
from fleet.report.model import RunReport
from fleet.run import driver

pytestmark = pytest.mark.engine

MANIFEST = textwrap.dedent(
    """
    models:
      - {name: m, source: {kind: synthetic, seed: 3}}
    prompts:
      p: [{id: a, prompt: "one"}, {id: b, prompt: "two"}, {id: c, prompt: "three"}, {id: d, prompt: "four"}]
    targets:
      - {name: ref, kind: test-double, num_cpus: 0.25}
      - name: v
        kind: test-double
        num_cpus: 0.25
        matrix: {logprob_shift: [0.0, 0.5], seconds_per_token: [0.0, 0.001]}
    reference: ref
    sampling: {max_tokens: 6, logprobs: 3}
    """
)


def test_the_drifting_flag_is_named_and_the_other_is_not(local_ray: object, tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(MANIFEST)
    run_dir, outcome = driver.run(tmp_path / "m.yaml", results_dir=tmp_path / "r", run_id="fx", progress=False)
    assert not outcome.failures
    report = RunReport.build(run_dir)
    assert report.consistency is not None
    effects = consistency.effects(report.consistency, report.parity)
    by_setting = {s: set(g["effect"]) for (s,), g in effects.group_by("setting")}
    assert by_setting == {"logprob_shift": {"above noise"}, "seconds_per_token": {"within noise"}}
    shift = effects.filter(pl.col("setting") == "logprob_shift")
    assert shift["delta_tf_p99"].abs().min() == pytest.approx(0.5, abs=1e-6)  # the drift itself, recomputed
    lines = text.render(report)
    assert "m / logprob_shift: TF p99 moves by" in lines and "above noise" in lines
    assert "m / seconds_per_token: TF p99 moves by 0 nats" in lines
