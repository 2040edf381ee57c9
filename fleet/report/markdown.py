"""The Markdown report, in the shape of the seed adaptation reports: summary (the verdict and
fleet.report.summary's table), environment, architecture, method and accuracy, performance,
conclusion; every standard section of the registry (fleet.report.blocks) under its chapter, after
the seed report's own sections when the manifest names a layout (fleet.report.layouts). `blocks` lays out
a section's content as Markdown for this report and for the text summary (fleet.report.text),
which is Markdown too.
"""

from __future__ import annotations

from fleet.report import summary
from fleet.report.blocks import SECTIONS, Block, Section, Table
from fleet.report.layouts import seed_sections
from fleet.report.model import RunReport
from fleet.report.sections import sections
from fleet.report.table import markdown, worst_first

MD_ROWS = 50  # per-prompt rows shown; the worst first (blocks.Table.worst)
# The chapters after "1. Summary", in order; a section's own chapter (SectionSpec.chapter) not
# listed here comes before the conclusion. A chapter holding one section of its name is titled by it.
CHAPTERS = ["environment", "architecture", "Accuracy", "Performance", "Conclusion"]
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
| KL top-k | mean KL(ref \\|\\| cand) over the reference's top-k tokens plus a tail bucket |"""


def render_markdown(report: RunReport) -> str:
    """The adaptation report of `report`'s run."""
    ref, info = report.reference, report.info
    by_key = sections(report)
    out = [f"# {', '.join(report.models)}: parity and performance vs `{ref}` (fleet-eval run {report.run_id})"]
    out += ["", "## 1. Summary", "", f"**{report.verdict_line}** Run status: {info.status}."]
    out += ["", *(f"- {notice}" for notice in report.notices)] if report.notices else []
    out += ["", *blocks(summary.section(report).blocks, level=3, limit=None)]  # one row per target: never cut
    start = 2
    if (seed := seed_sections(report)) is not None:  # the seed report's own sections, in its order
        title, shaped = seed
        out += ["", f"## 2. {title}"]
        for s in shaped:
            out += ["", *section(s, "### ", limit=MD_ROWS)]
        start = 3
    for number, (chapter, keys) in enumerate(chapters(by_key).items(), start=start):
        if keys == [chapter]:
            out += ["", *section(by_key[chapter], f"## {number}. ", limit=MD_ROWS)]
            continue
        out += ["", f"## {number}. {chapter}"]
        first = 1
        if chapter == "Accuracy":
            sampling = info.sampling
            method = METHOD.format(ref=ref, max_tokens=sampling.get("max_tokens", "?"), k=sampling.get("logprobs", "?"))
            out += ["", f"### {number}.1 Method", "", method]
            first = 2
        if chapter == "Conclusion":
            out += ["", f"**{report.verdict_line}**"]
        for sub, key in enumerate(keys, start=first):
            out += ["", *section(by_key[key], f"### {number}.{sub} ", limit=MD_ROWS)]
    return "\n".join(out) + "\n"


def chapters(by_key: dict[str, Section]) -> dict[str, list[str]]:
    """Chapter -> its sections' keys, in registration order; CHAPTERS' order, new chapters before the last."""
    named = list(dict.fromkeys([*CHAPTERS[:-1], *(SECTIONS[k].chapter for k in by_key), CHAPTERS[-1]]))
    grouped = {chapter: [k for k in by_key if SECTIONS[k].chapter == chapter] for chapter in named}
    return {chapter: keys for chapter, keys in grouped.items() if keys}


def section(s: Section, prefix: str = "## ", *, limit: int | None, max_chars: int | None = None) -> list[str]:
    """A section as Markdown: `prefix` + title, then its blocks or the sentence saying it is absent."""
    level = prefix.count("#") + 1
    return [f"{prefix}{s.title}", "", *(blocks(s.blocks, level=level, limit=limit, max_chars=max_chars) or [s.absent])]


def blocks(items: list[Block], *, level: int, limit: int | None, max_chars: int | None = None) -> list[str]:
    """Paragraphs, lists (one item a line) and tables, a blank line between them (a line right
    after a table would be read as one more row); a table title becomes a heading of `level`."""
    out: list[str] = []
    for block in items:
        out += [""] if out else []
        if isinstance(block, str):
            out.append(block)
        elif isinstance(block, list):
            out += [f"- {line}" for line in block]
        else:
            out += table(block, level=level, limit=limit, max_chars=max_chars)
    return out


def table(t: Table, *, level: int, limit: int | None, max_chars: int | None = None) -> list[str]:
    frame, note = t.frame, ""
    if t.worst is not None:
        frame, note = worst_first(frame, by=t.worst[0], descending=t.worst[1], limit=limit)
    out = [f"{'#' * level} {t.title}", ""] if t.title else []
    out.append(markdown(frame, t.columns, code=t.code, max_chars=max_chars))
    return out + (["", note] if note else [])
