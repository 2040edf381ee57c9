"""The lines under the parity tables, written from figures already computed (fleet.report.model):
each candidate's precision against the noise model, the first-step and sequence totals, how many
prompts a per-prompt table shows and the query for the rest, what the noise floor and each matrix
setting say against the noise, and which targets loaded other weights than the reference.
fleet.report.sections places them.
"""

from __future__ import annotations

import polars as pl

from fleet.report.blocks import Block
from fleet.report.model import RunReport
from fleet.results.info import RunInfo


def _g(value: float | None, *, scale: float = 1.0) -> str:
    return "n/a" if value is None else f"{scale * value:.4g}"


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def cut_note(r: RunReport, table: str, order: str) -> list[Block]:
    """Where a per-prompt table shows only the worst prompts: how many, and the query for the rest."""
    cut = r.shown.filter(pl.col("n_shown") < pl.col("n_prompts"))
    if cut.is_empty():
        return []
    counts = ", ".join(f"{t}: {s} of {n}" for t, s, n in cut.select("target", "n_shown", "n_prompts").iter_rows())
    return [
        f"Showing the worst prompts per target ({counts}; `--top N` shows more). All of them: "
        f"`fleet query {r.run_dir} \"SELECT * FROM {table} WHERE target = '{cut['target'][0]}' {order}\"`"
    ]


def weights_lines(info: RunInfo, reference: str | None) -> list[Block]:
    """Targets that loaded other weights than the reference did for the same model (a calibrate
    mutant's weight_noise, a different checkpoint behind one name): their parity is not a port's."""
    prov = info.provenance
    lines = []
    for key, facts in prov.items():
        model, target = key.split("/", 1)
        ref = prov.get(f"{model}/{reference}", {}).get("weights_sha256")
        if target != reference and ref and facts.get("weights_sha256") not in (None, ref):
            lines.append(f"{key}: weights {facts['weights_sha256']}, not the reference's {ref}")
    return [["These targets loaded other weights than the reference:", *lines]] if lines else []


def first_step_totals(parity: pl.DataFrame) -> list[str]:
    """The summary lines under the first-step table: means and the top-1 count."""
    return [
        f"{r['model']} / {r['target']}: mean |diff| {_g(r['first_logprob_diff_mean'])}, "
        f"mean rel err {_g(r['first_prob_rel_err_mean'], scale=100)}%, "
        f"top-1 agreement {round((r['first_top1_agreement'] or 0) * r['n_prompts'])}/{r['n_prompts']}"
        for r in parity.iter_rows(named=True)
    ]


def precision_lines(parity: pl.DataFrame) -> list[str]:
    """Each candidate's error against the noise model's (fleet/analysis/noise_model.py): within
    precision, or beyond it by more than the bootstrap interval (a bug)."""
    out = []
    for r in parity.iter_rows(named=True):
        if r.get("tf_excess") is None:
            out.append(f"{r['model']} / {r['target']}: precision not measured ({r.get('noise_source') or 'no rows'})")
            continue
        out.append(
            f"{r['model']} / {r['target']}: TF p99 |dlogp| {_g(r['tf_p99_abs_logprob_diff'])} is "
            f"{r['tf_excess']:.2f}x the noise {_g(r['noise'])} nats ({r['noise_source']}), 95% CI "
            f"{r['tf_excess_ci_low']:.2f}-{r['tf_excess_ci_high']:.2f}: {r['precision_verdict']}"
        )
    return out


def sequence_totals(parity: pl.DataFrame) -> list[str]:
    """Sequence and token match with their counts, and r / MAE over the matched tokens."""
    out = []
    for r in parity.iter_rows(named=True):
        seqs = round(r["seq_match_rate"] * r["n_prompts"])
        out.append(
            f"{r['model']} / {r['target']}: sequence match {seqs}/{r['n_prompts']} "
            f"({_pct(r['seq_match_rate'])}), token match {r['tokens_matched']}/{r['tokens_total']} "
            f"({_pct(r['token_match_rate'])}), "
            f"matched-token logprob r = {_g(r['pearson_r'])}, MAE = {_g(r['mae'])}"
            + (
                f"; of {r['n_diverged']} divergences {r['near_ties']} near ties "
                f"(within the noise {_g(r.get('noise'))} nats)"
                if r.get("near_ties") is not None and r["n_diverged"]
                else ""
            )
        )
    return out


def noise_floor_lines(noise_floor: pl.DataFrame, parity: pl.DataFrame) -> list[str]:
    """Per repeated target, its noise floor against its distance from the reference: is that distance
    run-to-run noise or not."""
    lines = []
    for row in noise_floor.iter_rows(named=True):
        floor = row["max_abs_logprob_diff"]
        vs_ref = parity.filter((pl.col("model") == row["model"]) & (pl.col("target") == row["target"]))
        to_ref = vs_ref["tf_max_abs_logprob_diff"].item() if vs_ref.height else None
        where = f"{row['model']} / {row['target']}"
        if floor is None:
            lines.append(f"{where}: no common prefix with its copy to compare.")
        elif floor == 0:
            lines.append(
                f"{where}: bit-identical to its rerun (floor 0 within this run on this machine); its distance "
                f"to the reference (TF max |dlogp| {_g(to_ref)}) is not run-to-run noise here. Another machine's "
                "kernels may still differ, which the near-tie rule allows for."
            )
        elif to_ref is not None and to_ref <= floor:
            lines.append(f"{where}: TF max |dlogp| to the reference {_g(to_ref)} is within its own noise {_g(floor)}.")
        else:
            lines.append(f"{where}: TF max |dlogp| to the reference {_g(to_ref)}; its own noise is {_g(floor)}.")
    return lines


def setting_effect_lines(effects: pl.DataFrame) -> list[str]:
    """Per model and matrix setting, how far it moves the logprobs and how many greedy paths, against
    the noise (consistency.effects)."""
    lines = []
    for (model, setting), group in effects.group_by("model", "setting", maintain_order=True):
        worst = group.sort("effect_x_noise", descending=True, nulls_last=True).row(0, named=True)
        changed, prompts = int(group["paths_changed"].fill_null(0).sum()), int(group["n_prompts"].sum())
        above = (group["effect"] == "above noise").any()
        lines.append(
            f"{model} / {setting}: TF p99 moves by {_g(worst['delta_tf_p99'])} nats at most "
            f"({_g(worst['effect_x_noise'])}x the noise {_g(worst['noise'])}); {changed} of {prompts} greedy paths "
            f"change beyond the noise over {group.height} pairs: {'above' if above else 'within'} noise"
        )
    return lines
