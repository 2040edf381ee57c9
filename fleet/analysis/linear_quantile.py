"""numpy.quantile's "linear" method, the same float, computed cheaper: a point quantile of a big
array (the noise model's p99s) selects among the values above a sampled bound, and the bootstrap's
quantiles of many resamples at once (fleet/analysis/bootstrap.py) share the virtual index and the
interpolation, written as numpy computes them, so every reader gets numpy's bits.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

_SELECT_MIN = 1 << 16  # below this many values, numpy.quantile itself
_Count = TypeVar("_Count", float, np.ndarray)  # one resample's total, or every resample's


def quantile(values: np.ndarray, q: float) -> float:
    """numpy.quantile(values, q) ("linear"), the same float, for values without NaN. On a big array
    an upper quantile's two order statistics are selected among the values above a bound read off
    every 64th value (about 1 % of them for a p99), not by partitioning a copy of them all."""
    n = len(values)
    index = (n - 1) * q  # numpy's "linear" virtual index, as numpy.quantile computes it
    below = int(np.floor(index))
    ranks = min(max(below, 0), n - 1), min(max(below + 1, 0), n - 1)
    if n >= _SELECT_MIN and values.dtype == np.float64:  # numpy interpolates other types in their own
        sample = values[::64]
        # Six standard deviations of the sample's rank under the quantile: the bound is below the
        # order statistics wanted but for a freak sample, and then every value is partitioned.
        spread = 6 * np.sqrt(len(sample) * q * (1 - q)) + 8
        at = int(max(0, min(len(sample) - 1, np.floor(len(sample) * ranks[0] / n - spread))))
        bound = np.partition(sample, at)[at]
        top = values[values >= bound]
        skipped = n - len(top)
        if skipped <= ranks[0]:
            wanted = [ranks[0] - skipped, ranks[1] - skipped]
            lo, hi = np.partition(top, wanted)[wanted]
            return lerp(lo, hi, index - below)
    return float(np.quantile(values, q))


def virtual_index(n: _Count, quantile: float) -> _Count:
    """numpy.quantile's "linear" virtual index, written as numpy computes it (bit for bit)."""
    return n * quantile + (1 + quantile * (1 - 1 - 1)) - 1


def lerp(a: float, b: float, t: float) -> float:
    """numpy's interpolation between neighbouring order statistics (its two-sided form)."""
    diff = b - a
    return float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t)
