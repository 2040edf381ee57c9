"""Inline-SVG chart primitives for the HTML report: scatter, lines (incl. step CDFs), grouped bars.

Hand-rolled so that the report needs no plotting library and no network: each function returns
one `<svg>` element as a string, with a `<title>` per chart and per series, which browsers show
as a tooltip. They take plain sequences keyed by legend label, and optionally a colour per label
(fleet.report.plots gives each target one colour across every plot); non-finite values are
dropped, and a chart with nothing to draw becomes a labelled placeholder box.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

# Tableau 10: distinguishable in print and for the common colour-vision deficiencies.
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]
WIDTH, HEIGHT = 660, 330
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 170, 34, 46  # the right margin holds the legend

XY = tuple[Sequence[float], Sequence[float]]


def nice_ticks(lo: float, hi: float, *, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    lo, hi = min(lo, hi), max(lo, hi)
    # One distinct value (or values apart by float noise, which the ticks' 12 digits would merge):
    # centre it in a unit-wide range.
    if hi - lo <= 1e-9 * max(abs(lo), abs(hi)):
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step)
    # Rounded so that ticks print as 0.6, not 0.6000000000000001.
    n = math.ceil(hi / step - first - 1e-9)  # the epsilon keeps 5.000000000000001 steps at 5
    return [float(f"{(first + i) * step:.12g}") for i in range(n + 1)]


@dataclass(frozen=True)
class _Axes:
    x_ticks: list[float]
    y_ticks: list[float]

    def x(self, v: float) -> float:
        lo, hi = self.x_ticks[0], self.x_ticks[-1]
        return _LEFT + (v - lo) / (hi - lo) * (WIDTH - _LEFT - _RIGHT)

    def y(self, v: float) -> float:
        lo, hi = self.y_ticks[0], self.y_ticks[-1]
        return HEIGHT - _BOTTOM - (v - lo) / (hi - lo) * (HEIGHT - _TOP - _BOTTOM)

    def frame(self, x_label: str, y_label: str, *, x_ticks: bool = True) -> list[str]:
        out = [
            f'<rect x="{_LEFT}" y="{_TOP}" width="{WIDTH - _LEFT - _RIGHT}" height="{HEIGHT - _TOP - _BOTTOM}" '
            'fill="#fff" stroke="#999"/>'
        ]
        for t in self.x_ticks if x_ticks else []:
            px = self.x(t)
            out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{_TOP}" y2="{HEIGHT - _BOTTOM}" stroke="#eee"/>')
            out.append(f'<text x="{px:.1f}" y="{HEIGHT - _BOTTOM + 15}" text-anchor="middle">{_num(t)}</text>')
        for t in self.y_ticks:
            py = self.y(t)
            out.append(f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{_LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{_num(t)}</text>')
        mid_y = (HEIGHT - _BOTTOM + _TOP) / 2
        out.append(
            f'<text x="{(WIDTH - _RIGHT + _LEFT) / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>'
        )
        out.append(f'<text transform="translate(14 {mid_y}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
        return out


def _num(v: float) -> str:
    return f"{v:.4g}"


def _finite(xs: Sequence[float], ys: Sequence[float]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in zip(xs, ys, strict=True) if _ok(x) and _ok(y)]


def _ok(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _svg(title: str, body: list[str]) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'font-family="sans-serif" font-size="11"><title>{escape(title)}</title>'
        f'<text x="{_LEFT}" y="20" font-size="13" font-weight="bold">{escape(title)}</text>' + "".join(body) + "</svg>"
    )


def _legend(labels: Sequence[str], colors: Mapping[str, str] | None) -> list[str]:
    out = []
    for i, label in enumerate(labels):
        y = _TOP + 8 + 16 * i
        fill = _color(label, i, colors)
        out.append(f'<rect x="{WIDTH - _RIGHT + 12}" y="{y - 8}" width="10" height="10" fill="{fill}"/>')
        out.append(f'<text x="{WIDTH - _RIGHT + 27}" y="{y + 1}">{escape(label[:24])}</text>')
    return out


def _color(label: str, i: int, colors: Mapping[str, str] | None) -> str:
    """The label's own colour if given, else the i-th of the palette."""
    return (colors or {}).get(label) or PALETTE[i % len(PALETTE)]


def placeholder(title: str, message: str) -> str:
    """A framed box saying why there is no chart (no data, or a probe that was not run)."""
    box = (
        f'<rect x="1" y="30" width="{WIDTH - 2}" height="{HEIGHT - 32}" fill="#fafafa" stroke="#bbb" '
        'stroke-dasharray="4 3"/>'
    )
    text = f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#666">{escape(message)}</text>'
    return _svg(title, [box, text])


def _axes(points: list[tuple[float, float]], *, y_from_zero: bool = False) -> _Axes:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    y_lo = min(0.0, *ys) if y_from_zero else min(ys)
    return _Axes(nice_ticks(min(xs), max(xs)), nice_ticks(y_lo, max(ys)))


def scatter(
    series: Mapping[str, XY],
    *,
    title: str,
    x_label: str,
    y_label: str,
    diagonal: bool = False,
    colors: Mapping[str, str] | None = None,
) -> str:
    """One dot per (x, y); `diagonal` draws y = x, the line a perfect port sits on."""
    clean = {k: _finite(*xy) for k, xy in series.items()}
    points = [p for pts in clean.values() for p in pts]
    if not points:
        return placeholder(title, "no data")
    lo, hi = min(min(p) for p in points), max(max(p) for p in points)
    # Shared x/y range, so the diagonal is at 45 degrees and offsets read the same on both axes.
    axes = _Axes(nice_ticks(lo, hi), nice_ticks(lo, hi)) if diagonal else _axes(points)
    body = axes.frame(x_label, y_label)
    if diagonal:
        a, b = axes.x_ticks[0], axes.x_ticks[-1]
        body.append(
            f'<line x1="{axes.x(a):.1f}" y1="{axes.y(a):.1f}" x2="{axes.x(b):.1f}" y2="{axes.y(b):.1f}" '
            'stroke="#999" stroke-dasharray="4 3"/>'
        )
    for i, (label, pts) in enumerate(clean.items()):
        dots = "".join(f'<circle cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="2.5"/>' for x, y in pts)
        fill = _color(label, i, colors)
        body.append(f'<g fill="{fill}" fill-opacity="0.6"><title>{escape(label)}</title>{dots}</g>')
    return _svg(title, body + _legend(list(clean), colors))


def lines(
    series: Mapping[str, XY],
    *,
    title: str,
    x_label: str,
    y_label: str,
    step: bool = False,
    markers: bool = True,
    y_from_zero: bool = True,
    colors: Mapping[str, str] | None = None,
) -> str:
    """A polyline per series (sorted by x); `step` draws a staircase, as for an empirical CDF.

    y_from_zero=False zooms the y axis onto the data, for values like cosine similarity near 1.
    """
    clean = {k: sorted(_finite(*xy)) for k, xy in series.items()}
    points = [p for pts in clean.values() for p in pts]
    if not points:
        return placeholder(title, "no data")
    axes = _axes(points, y_from_zero=y_from_zero)
    body = axes.frame(x_label, y_label)
    for i, (label, pts) in enumerate(clean.items()):
        path = _step(pts) if step else pts
        coords = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in path)
        dots = (
            "".join(f'<circle cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="2.5"/>' for x, y in pts) if markers else ""
        )
        color = _color(label, i, colors)
        body.append(
            f'<g stroke="{color}" fill="{color}"><title>{escape(label)}</title>'
            f'<polyline points="{coords}" fill="none" stroke-width="1.8"/>{dots}</g>'
        )
    return _svg(title, body + _legend(list(clean), colors))


def _step(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for x, y in points:
        if out:
            out.append((x, out[-1][1]))
        out.append((x, y))
    return out


def bars(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    colors: Mapping[str, str] | None = None,
) -> str:
    """Grouped vertical bars: one group per category, one bar per series (e.g. a histogram per target)."""
    values = [v for vs in series.values() for v in vs if _ok(v)]
    if not categories or not values:
        return placeholder(title, "no data")
    y_ticks = nice_ticks(0.0, max(max(values), 1.0))
    axes = _Axes([0.0, float(len(categories))], y_ticks)
    body = axes.frame(x_label, y_label, x_ticks=False)  # categories are labelled below instead
    slot = (axes.x(1) - axes.x(0)) * 0.8 / max(len(series), 1)
    for c, name in enumerate(categories):
        body.append(
            f'<text x="{axes.x(c + 0.5):.1f}" y="{HEIGHT - _BOTTOM + 15}" text-anchor="middle">{escape(name)}</text>'
        )
        for i, (label, vs) in enumerate(series.items()):
            v = vs[c] if c < len(vs) and _ok(vs[c]) else 0.0
            x0, top = axes.x(c + 0.1) + i * slot, axes.y(v)
            tip = f"<title>{escape(label)} {escape(name)}: {_num(v)}</title>"
            body.append(
                f'<rect x="{x0:.1f}" y="{top:.1f}" width="{slot:.1f}" height="{axes.y(0) - top:.1f}" '
                f'fill="{_color(label, i, colors)}">{tip}</rect>'
            )
    return _svg(title, body + _legend(list(series), colors))
