"""The run report people read: one self-contained HTML file, and Markdown in the seed reports' shape.

Both are computed from a run directory alone (its Parquet tables and run.json), like the text
summary of fleet.report. The HTML has no scripts and loads nothing: CSS is inline, plots are
inline SVG (fleet.svg), and a Content-Security-Policy forbids any fetch, so the file opens the same
offline, attached to a ticket or years later. Tables that later probes add (per-layer errors,
throughput vs concurrency) are passed in as frames; until then their sections say "not measured".
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import polars as pl

from fleet.analysis import parity as analysis
from fleet.analysis.gates import evaluate, expected_pairs, from_info
from fleet.analysis.perf import summary as perf_summary
from fleet.contracts.gates import Gate
from fleet.report import svg
from fleet.report.text import FIRST_STEP_COLUMNS, PARITY_COLUMNS, PERF_COLUMNS, Measured
from fleet.results import reader
from fleet.results.reader import read_info

# fmt: off
ARCH_KEYS = [
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size", "rope_theta", "hidden_act",
    "rms_norm_eps", "tie_word_embeddings", "dtype", "torch_dtype",
]
# fmt: on


@dataclass(frozen=True)
class Run:
    """Everything the report shows, computed once from the run directory."""

    run_dir: str | Path  # a local directory or a URI (s3://bucket/prefix/run_id)
    info: dict[str, Any]
    tables: dict[str, pl.DataFrame]
    parity: pl.DataFrame
    first: pl.DataFrame
    seqs: pl.DataFrame
    perf: pl.DataFrame
    verdicts: pl.DataFrame | None
    layers: pl.DataFrame | None
    concurrency: pl.DataFrame | None

    @property
    def reference(self) -> str:
        return str(self.info["reference"])


def gather(
    run_dir: str | Path,
    *,
    gates: Sequence[Gate] | None = None,
    layers: pl.DataFrame | None = None,
    concurrency: pl.DataFrame | None = None,
) -> Run:
    """Load and compute. `gates` None means the gates recorded in run.json; [] means no verdicts.

    layers: model, target, layer, rel_l2 [, cosine]; concurrency: model, target, concurrency, output_tok_s.
    """
    info = read_info(run_dir)
    ref = info["reference"]
    t = {name: frame.collect() for name, frame in reader.load(run_dir).items()}
    parity, perf = analysis.parity(t["requests"], t["tokens"], ref), analysis.throughput(t["requests"], t["shards"])
    gates = from_info(info) if gates is None else gates
    measured = Measured.of(t, ref)
    layers = measured.layer_curve if layers is None else layers
    if concurrency is None and t["perf_levels"].height:
        levels = perf_summary(t["perf_requests"], t["perf_levels"])
        concurrency = levels.select("model", "target", concurrency="level", output_tok_s="output_tok_s")
    verdicts = None
    if gates:
        verdicts = evaluate(
            gates,
            parity,
            perf,
            run_dir=run_dir,
            reference=ref,
            expected=expected_pairs(info),
            extra=measured.gate_frames(),
        )
    first, seqs = analysis.first_step(t["tokens"], ref), analysis.sequences(t["requests"], ref)
    return Run(run_dir, info, t, parity, first, seqs, perf, verdicts, layers, concurrency)


def architecture(run: Run, model: str) -> dict[str, Any]:
    """Selected config.json fields of `model` (model_dir from run.json provenance), plus its parameter count."""
    for key, prov in (run.info.get("provenance") or {}).items():
        model_dir = Path(prov.get("model_dir") or "/nonexistent")
        if key.split("/")[0] == model and (model_dir / "config.json").is_file():
            config = json.loads((model_dir / "config.json").read_text())
            rope = (config.get("rope_parameters") or {}).get("rope_theta")  # transformers 5 moved it here
            out = {k: config[k] for k in ARCH_KEYS if k in config} | ({"rope_theta": rope} if rope else {})
            return out | {"parameters": _parameters(model_dir), "model_dir": str(model_dir)}
    return {}


def _parameters(model_dir: Path) -> str | None:
    """Parameter count from the safetensors headers (no weights read): '135.0M', '7.62B', '40'."""
    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with file.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    if not total:
        return None
    return f"{total / 1e9:.2f}B" if total >= 1e9 else f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total:,}"


def environment(run: Run) -> pl.DataFrame:
    """One row per provenance key (versions, device, host, weights sha), one column per model/target."""
    prov = run.info.get("provenance") or {}
    keys = list(dict.fromkeys(k for p in prov.values() for k in p if k != "model_dir"))
    data = {"component": keys} | {name: [str(p.get(k, "—")) for k in keys] for name, p in prov.items()}
    return pl.DataFrame(data, schema=dict.fromkeys(data, pl.String))


def side_by_side(run: Run) -> pl.DataFrame:
    """model, target, prompt_id, prompt, reference, candidate (output texts), match, first_divergence."""
    req = run.tables["requests"].select("model", "target", "prompt_set", "prompt_id", "prompt", "output_text")
    keys = ["model", "prompt_set", "prompt_id"]
    ref = req.filter(pl.col("target") == run.reference).select(*keys, "prompt", reference="output_text")
    cand = req.filter(pl.col("target") != run.reference).select(*keys, "target", candidate="output_text")
    seqs = run.seqs.select(*keys, "target", match="exact_match", first_divergence="first_divergence")
    out = cand.join(ref, on=keys).join(seqs, on=[*keys, "target"])
    columns = ["model", "target", "prompt_id", "prompt", "reference", "candidate", "match", "first_divergence"]
    return out.select(columns).sort("model", "target", "prompt_id")


def summary(run: Run) -> pl.DataFrame:
    """The seed reports' summary metrics per candidate, as display strings ('66.7% (4/6)')."""
    rows = []
    for p in run.parity.iter_rows(named=True):
        exact = round((p["seq_match_rate"] or 0) * p["n_prompts"])
        rows.append({
            "model": p["model"], "candidate": p["target"],
            "first-step top-1": _pct(p["first_top1_agreement"]),
            "sequence match": f"{_pct(p['seq_match_rate'])} ({exact}/{p['n_prompts']})",
            "token match": f"{_pct(p['token_match_rate'])} ({p['tokens_matched']}/{p['tokens_total']})",
            "logprob r (matched)": fmt(p["pearson_r"]), "logprob MAE (matched)": fmt(p["mae"]),
            "TF top-1": _pct(p["tf_top1_agreement"]), "TF max |Δlogprob|": fmt(p["tf_max_abs_logprob_diff"]),
            "KL top-k": fmt(p["kl_topk_mean"]),
        })  # fmt: skip
    return pl.DataFrame(rows, schema=dict.fromkeys(rows[0], pl.String) if rows else None)


def _pct(rate: float | None) -> str:
    return "—" if rate is None else f"{100 * rate:.1f}%"


def fmt(value: Any) -> str:
    """One cell: 4 significant digits (a float32 port's 3e-6 must not print as 0.0000), ✅/❌ for booleans."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "✅" if value else "❌"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def verdict_line(run: Run) -> str:
    v = run.verdicts
    if v is None or v.is_empty():
        return "No gates configured: no verdict."
    n_fail = int((v["verdict"] == "FAIL").sum())
    return f"FAIL: {n_fail} of {v.height} gate checks fail." if n_fail else f"PASS: all {v.height} gate checks pass."


def notices(info: dict[str, Any]) -> list[str]:
    """What a reader must know before trusting the figures: failed targets and shards, test doubles."""
    out = [f"FAILED {key}: {reason}" for key, reason in (info.get("failures") or {}).items()]
    out += [f"FAILED shard {shard}: {reason}" for shard, reason in (info.get("failed_shards") or {}).items()]
    doubles = [k for k, p in (info.get("provenance") or {}).items() if p.get("device") == "test-double"]
    out += [f"TEST DOUBLE targets (no model ran; figures are meaningless): {', '.join(doubles)}"] if doubles else []
    return out


def worst_first(frame: pl.DataFrame, *, by: str, descending: bool, limit: int) -> tuple[pl.DataFrame, str]:
    """At most `limit` rows, the worst by `by` when some must go, and a note saying so."""
    if frame.height <= limit:
        return frame, ""
    kept = frame.sort(by, descending=descending, nulls_last=True).head(limit)
    return kept, f"Showing the {limit} worst of {frame.height} rows by {by}; `fleet query` has them all."


# --- HTML ----------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1380px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f3f5f8}tr:nth-child(even) td{background:#fafbfc}
td.num{text-align:right;font-variant-numeric:tabular-nums}
table td.pass{background:#e3f4e1;color:#1d6b1a;font-weight:600}
table td.fail{background:#fbe3e3;color:#a11;font-weight:600}
code{font-size:11px;word-break:break-all}
.banner{padding:10px 14px;border-radius:6px;font-weight:600;margin:10px 0}.PASS{background:#e3f4e1;color:#1d6b1a}
.FAIL{background:#fbe3e3;color:#a11}.No{background:#f3f5f8}.plots{display:flex;flex-wrap:wrap;gap:12px}
.meta{color:#555;font-size:13px}td.text{max-width:400px;white-space:pre-wrap;word-break:break-all}
"""
HTML_ROWS, MD_ROWS = 500, 50  # per-prompt rows shown; a 10k-prompt run must still open quickly
# No script and no fetch: the file must render identically offline (the browser test checks it).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def html_table(frame: pl.DataFrame, columns: dict[str, str] | None = None, *, text: Sequence[str] = ()) -> str:
    """`frame` as a <table>; `columns` renames and selects, `text` names columns of free text to wrap."""
    columns = columns or {c: c for c in frame.columns}
    keep = [c for c in columns if c in frame.columns]
    rows = []
    for row in frame.select(keep).iter_rows(named=True):
        cells = []
        for c, v in row.items():
            cls = v.lower() if c == "verdict" else "num" if isinstance(v, int | float) else "text" if c in text else ""
            cell = f"<code>{escape(v)}</code>" if c == "evidence" and v else escape(fmt(v))
            if isinstance(v, bool):  # ✓/✗ are in every common font; emoji need a colour-emoji font
                cls, cell = ("pass", "✓") if v else ("fail", "✗")
            cells.append(f'<td class="{cls}">{cell}</td>' if cls else f"<td>{cell}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{escape(columns[c])}</th>" for c in keep)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def plots(run: Run) -> list[str]:
    t = run.tables
    has_cosine = run.layers is not None and "cosine" in run.layers.columns
    cosine = [svg.layer_errors(run.layers, metric="cosine")] if has_cosine else []
    return [
        svg.logprob_scatter(t["tokens"]), svg.drift_by_position(t["tokens"]), svg.divergence_histogram(run.seqs),
        svg.latency_cdf(t["requests"], "ttft_s", name="TTFT"), svg.latency_cdf(t["requests"], "e2e_s", name="E2E"),
        svg.layer_errors(run.layers), *cosine, svg.throughput_vs_concurrency(run.concurrency),
    ]  # fmt: skip


def render_html(
    run_dir: str | Path,
    *,
    gates: Sequence[Gate] | None = None,
    layers: pl.DataFrame | None = None,
    concurrency: pl.DataFrame | None = None,
) -> str:
    """The whole report as one HTML document (arguments as for gather())."""
    run = gather(run_dir, gates=gates, layers=layers, concurrency=concurrency)
    info = run.info
    title = f"fleet-eval report: {info.get('run_id', run.run_dir)}"
    meta = escape(
        f"status {info.get('status')} · started {info.get('started_at')} · finished {info.get('finished_at')} · "
        f"manifest {info.get('manifest_path')} (sha256 {str(info.get('manifest_sha256', ''))[:12]}) · "
        f"reference {run.reference}"
    )
    verdict = verdict_line(run)
    body = [f"<h1>{escape(title)}</h1>", f'<p class="meta">{meta}</p>']
    body.append(f'<div class="banner {verdict.split()[0].rstrip(":")}">{escape(verdict)}</div>')
    body += [f'<div class="banner FAIL">{escape(notice)}</div>' for notice in notices(info)]
    if run.verdicts is not None:
        verdicts = run.verdicts.sort(pl.col("verdict") != "FAIL", maintain_order=True)
        body += ["<h2>Gate verdicts</h2>", html_table(verdicts)]
    body += ["<h2>Parity vs reference</h2>", html_table(run.parity, PARITY_COLUMNS)]
    body += ["<h2>Plots</h2>", '<div class="plots">', *plots(run), "</div>"]
    first, note = worst_first(run.first, by="rel_err", descending=True, limit=HTML_ROWS)
    body += [
        "<h2>First step per prompt</h2>",
        f"<p>{escape(note)}</p>" * bool(note),
        html_table(first, FIRST_STEP_COLUMNS),
    ]
    sbs, note = worst_first(side_by_side(run), by="first_divergence", descending=False, limit=HTML_ROWS)
    sbs = sbs.with_columns(pl.col("reference", "candidate").str.slice(0, 300))
    body += ["<h2>Full sequences, side by side</h2>", f"<p>{escape(note)}</p>" * bool(note)]
    body.append(html_table(sbs, text=["prompt", "reference", "candidate"]))
    body += ["<h2>Performance (engine-side timestamps)</h2>", html_table(run.perf, PERF_COLUMNS)]
    body += ["<h2>Environment and provenance</h2>", html_table(environment(run))]
    for model in run.tables["requests"]["model"].unique(maintain_order=True).to_list():
        arch = architecture(run, model)
        table = html_table(_arch_frame(arch)) if arch else "<p>config.json not readable from here.</p>"
        body += [f"<h2>Model architecture: {escape(model)}</h2>", table]
    head = f'<meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
    head += f"<title>{escape(title)}</title><style>{CSS}</style>"
    return f'<!DOCTYPE html><html lang="en"><head>{head}</head><body>{"".join(body)}</body></html>'


def _arch_frame(arch: dict[str, Any]) -> pl.DataFrame:
    values = [", ".join(map(str, v)) if isinstance(v, list) else str(v) for v in arch.values()]
    return pl.DataFrame({"config": list(arch), "value": values}, schema={"config": pl.String, "value": pl.String})


# --- Markdown, in the shape of the seed adaptation reports ---------------------------------------

METHOD = """\
Reference: `{ref}`. Every target generates greedily (temperature 0) up to {max_tokens} tokens per prompt and
records its top-{k} logprobs. The reference then scores each candidate's output by teacher forcing (prompt + the
candidate's tokens in one forward pass), so every candidate position also has the reference's logprob of the
same token after the same prefix.

| metric | definition |
|---|---|
| first-step top-1 | share of prompts whose first generated token equals the reference's |
| first-step rel err | \\|P_cand - P_ref\\| / P_ref of the candidate's first token |
| sequence match | share of prompts whose whole greedy output equals the reference's |
| token match | positions holding the same token / sum of the longer output lengths |
| logprob r, MAE (matched) | Pearson r and mean \\|Δlogprob\\| over the common prefix, before the first divergence |
| TF top-1, TF max \\|Δlogprob\\| | teacher-forced: candidate token is the reference's argmax; largest logprob gap |
| KL top-k | mean KL(ref \\|\\| cand) over the reference's top-k tokens plus a tail bucket |
"""


def md_table(frame: pl.DataFrame, columns: dict[str, str] | None = None) -> str:
    columns = columns or {c: c for c in frame.columns}
    keep = [c for c in columns if c in frame.columns]
    lines = ["| " + " | ".join(_md_cell(columns[c]) for c in keep) + " |", "|" + "---|" * len(keep)]
    for row in frame.select(keep).iter_rows(named=True):
        lines.append("| " + " | ".join(f"`{row[c]}`" if c == "evidence" else _md_cell(row[c]) for c in keep) + " |")
    return "\n".join(lines)


def _md_cell(value: Any) -> str:
    return fmt(value).replace("|", "\\|").replace("\n", "⏎").replace("\r", "")


def _first_step_md(first: pl.DataFrame, ref: str, target: str) -> list[str]:
    cols = {"prompt_id": "prompt", "ref_logprob_of_cand": f"{ref} logprob", "cand_logprob": f"{target} logprob",
            "logprob_diff": "logprob diff", "p_ref": f"{ref} P", "p_cand": f"{target} P", "rel_err_pct": "rel err %",
            "top1_match": "top-1"}  # fmt: skip
    frame = first.with_columns(rel_err_pct=pl.col("rel_err") * 100)
    mean = {
        "prompt_id": "mean",
        "logprob_diff": frame["logprob_diff"].mean(),
        "rel_err_pct": frame["rel_err_pct"].mean(),
    }
    shown, note = worst_first(frame, by="rel_err", descending=True, limit=MD_ROWS)  # the mean is over all rows
    table = md_table(pl.concat([shown, pl.DataFrame([mean])], how="diagonal_relaxed"), cols)
    n, hits = frame.height, int(frame["top1_match"].sum())
    return [
        table,
        *(["", note] if note else []),
        "",
        f"First-step top-1 agreement: {_pct(hits / n if n else None)} ({hits}/{n}).",
    ]


def render_markdown(
    run_dir: str | Path,
    *,
    gates: Sequence[Gate] | None = None,
    layers: pl.DataFrame | None = None,
    concurrency: pl.DataFrame | None = None,
) -> str:
    """The adaptation report: environment, architecture, method, results, performance, conclusion."""
    run = gather(run_dir, gates=gates, layers=layers, concurrency=concurrency)
    info, ref = run.info, run.reference
    sampling = (info.get("manifest_resolved") or {}).get("sampling") or {}
    models = run.tables["requests"]["model"].unique(maintain_order=True).to_list()
    out = [f"# {', '.join(models)}: parity and performance vs `{ref}` (fleet-eval run {info.get('run_id')})", ""]
    out += ["## 1. Summary", "", f"**{verdict_line(run)}** Run status: {info.get('status')}."]
    out += ["", *(f"- {notice}" for notice in notices(info))] if notices(info) else []
    out += ["", "## 2. Environment", "", md_table(environment(run)), "", "## 3. Model architecture"]
    for model in models:
        arch = architecture(run, model)
        out += ["", f"### {model}", "", md_table(_arch_frame(arch)) if arch else "config.json not readable from here."]
    method = METHOD.format(ref=ref, max_tokens=sampling.get("max_tokens", "?"), k=sampling.get("logprobs", "?"))
    out += ["", "## 4. Accuracy", "", "### 4.1 Method", "", method, "### 4.2 First step per prompt"]
    groups = run.first.partition_by("model", "target", as_dict=True, maintain_order=True)
    for (model, target), first in groups.items():
        out += ["", f"#### {model}: {target} vs {ref}", "", *_first_step_md(first, ref, str(target))]
    out += ["", "### 4.3 Full sequences"]
    for (model, target), part in side_by_side(run).partition_by("model", "target", as_dict=True).items():
        cols = {"prompt_id": "prompt", "reference": f"{ref} output", "candidate": f"{target} output",
                "match": "match", "first_divergence": "first divergence"}  # fmt: skip
        part, note = worst_first(part, by="first_divergence", descending=False, limit=MD_ROWS)
        out += ["", f"#### {model}: {target} vs {ref}", "", md_table(part, cols), *(["", note] if note else [])]
    out += ["", "### 4.4 Summary metrics", "", md_table(summary(run))]
    if layers is not None and not layers.is_empty():
        out += ["", "### 4.5 Per-layer error", "", md_table(layers)]
    out += ["", "## 5. Performance (engine-side timestamps)", "", md_table(run.perf, PERF_COLUMNS)]
    if concurrency is not None and not concurrency.is_empty():
        out += ["", md_table(concurrency)]
    out += ["", "## 6. Conclusion", "", f"**{verdict_line(run)}**"]
    if run.verdicts is not None and not run.verdicts.is_empty():
        out += ["", md_table(run.verdicts.sort(pl.col("verdict") != "FAIL", maintain_order=True))]
    return "\n".join(out) + "\n"
