"""Every relative link in README.md and docs/*.md names a file in this repository (and, into a
Markdown page, a heading it has), and nothing in the docs points outside the repository. mkdocs
build --strict checks docs/ in `make lint`; this also covers the README, which is not in the site.
Pure file reading: no Ray, no engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and [text](target "title"); images too. Code spans and fenced blocks are removed
# first, so a `[x](y)` inside code is not a link.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
SPAN = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    text = SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


def slugs(page: Path) -> set[str]:
    """The anchors a page's headings get (Python-Markdown's toc slugify, which mkdocs and GitHub
    agree with for the plain headings these pages use)."""
    out = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            title = re.sub(r"[^\w\s-]", "", m[1].replace("`", "")).strip().lower()
            out.add(re.sub(r"[-\s]+", "-", title))
    return out


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("//")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    for target in (t for t in links(page) if relative(t)):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.is_file(), f"{page.relative_to(ROOT)}: {target} names no file"
        assert dest.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: {target} leaves the repository"
        if anchor and dest.suffix == ".md":
            assert anchor in slugs(dest), f"{page.relative_to(ROOT)}: {target}: no such heading"


def test_the_link_pattern_and_the_slugs() -> None:
    page = 'See [a](docs/x.md#y), ![i](p.png "t") and `[not](code.md)`, [web](https://example.org).\n'
    assert LINK.findall(SPAN.sub("", page)) == ["docs/x.md#y", "p.png", "https://example.org"]
    assert not relative("https://example.org") and relative("docs/x.md")
    assert len(links(ROOT / "README.md")) >= 10  # the README's links to the docs are found
    assert {"gate-metric-ids", "the-noise-models-per-dtype-defaults"} <= slugs(ROOT / "docs" / "metrics.md") | slugs(
        ROOT / "docs" / "measurements.md"
    )


def test_the_docs_refer_to_nothing_outside_the_repository() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for outside in ("shared/seeds", "../shared", "PLATFORM.md", "STYLE.md"):
            assert outside not in text, f"{page.relative_to(ROOT)} refers to {outside}, outside the repository"


def test_the_readme_is_short_and_names_the_tiny_manifest() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250  # issue 20: the details live in docs/
    assert "manifests/tiny.yaml" in readme and "the quickest end-to-end check" in readme
    for command in ("make demo", "make test"):
        assert f"    {command}    # set up .venv (once)" in readme
