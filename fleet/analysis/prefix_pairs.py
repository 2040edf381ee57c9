"""Two list columns' values over each pair's common prefix, a chunk of pairs at a time, and the
figures summed over them: |a - b| (count, max, mean) and Pearson r.

At 100M token rows the prefix holds tens of millions of positions; gathering whole lists and
exploding them into one float64 frame per side faulted in gigabytes for one pass (a third of
the report's CPU was the kernel's). Chunks keep each pass's arrays a few MB; the sums merge
exactly as one pass would take them, bar the order of floating-point additions. The values must
hold no null (a null is not NaN to the figures): callers check `holds_no_null` and else take the
frame path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fleet.analysis.aligned import Flat

# Positions per chunk: ~2 MB per float64 array. A chunk's index, gathers and differences are about
# eight such arrays at once: at 1 << 21 that was ~90 MB on top of the 10M report's working set.
_POSITIONS = 1 << 18


def holds_no_null(*flats: Flat) -> bool:
    return all(f.values.null_count() == 0 for f in flats)


def chunks(
    a: Flat, a_rows: np.ndarray, b: Flat, b_rows: np.ndarray, n: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(a's values, b's) as float64 at positions 0..n[i]-1 of lists a_rows[i] and b_rows[i], for
    consecutive runs of pairs holding about _POSITIONS positions (a pair with n[i] = 0 takes none,
    whatever its rows)."""
    if not len(n) or not n.sum():
        return
    av, bv = a.array(), b.array()
    ends = np.cumsum(n)
    first = 0
    while first < len(n):
        base = int(ends[first - 1]) if first else 0
        last = max(int(np.searchsorted(ends, base + _POSITIONS, side="right")), first + 1)
        part = n[first:last]
        before = np.cumsum(part) - part
        index = np.arange(int(part.sum()), dtype=np.int64)
        a_at = index + np.repeat(a.start[a_rows[first:last]] - before, part)
        b_at = index + np.repeat(b.start[b_rows[first:last]] - before, part)
        yield av[a_at].astype(np.float64), bv[b_at].astype(np.float64)
        first = last


@dataclass
class AbsDiff:
    """|a - b| over the pairs added: their count, and (null where a difference is NaN, or none was
    added) its maximum and mean."""

    count: int = 0
    nan: bool = False
    largest: float = 0.0
    total: float = 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        if not a.size:
            return
        d = np.abs(a - b)
        self.count += d.size
        self.nan = self.nan or bool(np.isnan(d).any())
        if not self.nan:
            self.largest = max(self.largest, float(d.max()))
            self.total += float(d.sum())

    def max(self) -> float | None:
        return None if self.nan or not self.count else self.largest

    def mean(self) -> float | None:
        return None if self.nan or not self.count else self.total / self.count


@dataclass
class Pearson:
    """Pearson r of the pairs added, from each chunk's count, means and centred sums of squares and
    products, merged as Chan et al. merge variances (no digits lost to large means)."""

    count: int = 0
    mean_a: float = 0.0
    mean_b: float = 0.0
    ss_a: float = 0.0
    ss_b: float = 0.0
    sp: float = 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        if not a.size:
            return
        m_a, m_b = float(a.mean()), float(b.mean())
        da, db = a - m_a, b - m_b
        n, k = self.count, a.size
        total = n + k
        delta_a, delta_b = m_a - self.mean_a, m_b - self.mean_b
        weight = n * k / total
        self.ss_a += float(da @ da) + delta_a * delta_a * weight
        self.ss_b += float(db @ db) + delta_b * delta_b * weight
        self.sp += float(da @ db) + delta_a * delta_b * weight
        self.mean_a += delta_a * k / total
        self.mean_b += delta_b * k / total
        self.count = total

    def r(self) -> float | None:
        """None for fewer than two pairs, no spread on a side, or a NaN among the values."""
        if self.count < 2:
            return None
        r = self.sp / math.sqrt(self.ss_a * self.ss_b) if self.ss_a * self.ss_b > 0 else math.nan
        return None if math.isnan(r) else r
