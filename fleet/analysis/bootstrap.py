"""The noise model's bootstrap interval of candidate p99 / twin p99, resampling whole prompts,
computed without concatenating each resample's values.

Values are sorted once; a resample is a count per prompt (how often it was drawn), and a
quantile of the resample is read off the cumulative counts of the sorted values: the same order
statistics, interpolated as numpy.quantile's "linear" method does, so the result equals the
resample-and-concatenate loop for the same draws (tests/test_report_aggregates.py checks it).

That costs one pass over the values per resample. Past EXACT_MAX_VALUES values (a 10M-token run
has millions per candidate) the prompts are dealt, in key order, into BLOCKS blocks, the values
binned on a log scale (BINS_PER_OCTAVE bins per doubling, 1.1 % wide) into one histogram per
block, and blocks are resampled: one matrix product for every resample. Blocks of prompts drawn
at random are themselves independent draws, so the interval estimates the same sampling spread;
what differs is Monte-Carlo noise and the bin width (the stated tolerance is in docs/results.md).
"""

from __future__ import annotations

import functools

import numpy as np

from fleet.analysis.linear_quantile import lerp, virtual_index

EXACT_MAX_VALUES = 20_000
BLOCKS = 1000
BINS_PER_OCTAVE = 64
# The resampled p99 is never below the pooled median: bins under it are pooled into one count.
_FLOOR_QUANTILE = 0.5
_CHUNK = 1 << 20
# Below floor(log2(x) x BINS_PER_OCTAVE) of the smallest positive float32 (2^-149): the zeros' bin.
_ZERO_BIN = -150 * BINS_PER_OCTAVE


def interval(
    cand: np.ndarray,
    twin: np.ndarray | None,
    prompt: np.ndarray,
    *,
    twin_p99: float,
    allowance: float,
    quantile: float,
    resamples: int,
    seed: int = 0,
) -> tuple[float, float]:
    """95 % interval of quantile(cand) / (quantile(twin) x allowance) over prompt resamples.

    `prompt` codes each value's prompt 0..P-1 (the resampling unit, in key order); `twin`, when
    given, holds the twin's values at the same positions (same codes); without it the twin's
    quantile is the fixed `twin_p99`."""
    n_prompts = int(prompt.max()) + 1
    rng = np.random.default_rng(seed)
    if len(cand) <= EXACT_MAX_VALUES:
        # Every resample at once (the draws one seed gives, one by one): a loop over them cost a
        # third of a second of Python per report, in parity vs load's small levels.
        drawn = draws(rng, n_prompts, resamples)
        c_q = resampled_quantiles(cand, prompt, drawn, quantile)
        t_q = resampled_quantiles(twin, prompt, drawn, quantile) if twin is not None else np.full(resamples, twin_p99)
    else:
        blocks, units = block_of(prompt)
        drawn = draws(rng, units, resamples)
        c_q = _Binned(cand, blocks, units).quantiles(drawn, quantile)
        t_q = (
            _Binned(twin, blocks, units).quantiles(drawn, quantile)
            if twin is not None
            else np.full(resamples, twin_p99)
        )
    return _ratio_interval(c_q, t_q, allowance)


def _ratio_interval(c_q: np.ndarray, t_q: np.ndarray, allowance: float) -> tuple[float, float]:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(t_q > 0, c_q / (t_q * allowance), np.inf)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(low), float(high)


def block_of(prompt: np.ndarray) -> tuple[np.ndarray, int]:
    """(each code's block, the number of blocks) of prompt codes 0..P-1 past EXACT_MAX_VALUES values:
    prompts dealt in key order into BLOCKS blocks."""
    n_prompts = int(prompt.max()) + 1
    return (prompt % BLOCKS if n_prompts > BLOCKS else prompt), min(n_prompts, BLOCKS)


def tail_interval(
    cand: Tail,
    twin: Tail | None,
    units: int,
    *,
    twin_p99: float,
    allowance: float,
    quantile: float,
    resamples: int,
    seed: int = 0,
) -> tuple[float, float] | None:
    """`interval` past EXACT_MAX_VALUES values from tails (the values above a floor, with every
    block's count of those below): the same draws and, for each resample, the same quantile, read
    off the same bins; None where some resample's quantile falls among values a tail lacks."""
    drawn = _same_draws(units, resamples, seed)
    c_bins = _Binned.of_tail(cand, units)
    c_q = c_bins.quantiles(drawn, quantile)
    t_bins = _Binned.of_tail(twin, units) if twin is not None else None
    t_q = t_bins.quantiles(drawn, quantile) if t_bins is not None else np.full(resamples, twin_p99)
    if c_bins.pooled_reached or (t_bins is not None and t_bins.pooled_reached):
        return None
    return _ratio_interval(c_q, t_q, allowance)


class Tail:
    """The values at or above `floor` of a set of non-negative values, with how many there are in all
    (`n`) and, per block, how many (`block_n`); `block` gives each tail value's block."""

    def __init__(self, values: np.ndarray, block: np.ndarray, floor: float, n: int, block_n: np.ndarray) -> None:
        self.values, self.block, self.floor, self.n, self.block_n = values, block, floor, n, block_n

    def quantile(self, q: float) -> float | None:
        """linear_quantile.quantile of all n values, the same float, when both order statistics it
        interpolates are in the tail; else None."""
        index = (self.n - 1) * q
        below = int(np.floor(index))
        ranks = min(max(below, 0), self.n - 1), min(max(below + 1, 0), self.n - 1)
        above = self.values[self.values >= self.floor]  # values >= floor: all of them are here
        missing = self.n - len(above)
        if ranks[0] < missing:
            return None
        wanted = [ranks[0] - missing, ranks[1] - missing]
        lo, hi = np.partition(above, wanted)[wanted]
        return lerp(lo, hi, index - below)


def draw(rng: np.random.Generator, units: int) -> np.ndarray:
    """One resample: how often each of `units` units (prompts, requests) is drawn in `units` draws
    with replacement."""
    return np.bincount(rng.integers(0, units, units), minlength=units)


@functools.lru_cache(maxsize=2)
def _same_draws(units: int, resamples: int, seed: int) -> np.ndarray:
    """`draws` of a fresh generator: the same for every candidate of as many blocks (a report's
    candidates nearly always have 1,000), so drawn once (8 MB)."""
    drawn = draws(np.random.default_rng(seed), units, resamples)
    drawn.flags.writeable = False
    return drawn


def draws(rng: np.random.Generator, units: int, resamples: int) -> np.ndarray:
    """[resamples, units]: `draw` repeated, in the order one seed gives them (numpy draws a block of
    rows as it draws them one by one: tests/test_compare_ci.py checks it), a block of rows at a
    time, each row's counts by one bincount: 2,000 calls of `draw` cost 20 ms of Python each time."""
    out = np.zeros((resamples, units), dtype=np.int64)
    if not units:  # nothing to draw (numpy refuses an empty range)
        return out
    rows = max(1, _CHUNK // max(units, 1))
    for at in range(0, resamples, rows):
        picked = rng.integers(0, units, (min(rows, resamples - at), units))
        picked += np.arange(len(picked))[:, None] * units  # row r's draws counted in cells r x units + i
        out[at : at + len(picked)] = np.bincount(picked.ravel(), minlength=len(picked) * units).reshape(-1, units)
    return out


def resampled_quantiles(values: np.ndarray, unit: np.ndarray, drawn: np.ndarray, quantile: float) -> np.ndarray:
    """The `quantile` of `values` in each resample of units (`drawn` from `draws`; `unit` codes the
    unit of each value; NaN for a resample that drew none), many resamples at once, in chunks of
    about _CHUNK cells: the order statistics and interpolation of numpy.quantile's "linear" method
    on the resample's values, read off the cumulative counts of the values sorted once."""
    out = np.full(len(drawn), np.nan)
    if not len(values):
        return out
    order = np.argsort(values, kind="stable")
    ranked, units = values[order], unit[order]
    rows = max(1, _CHUNK // len(ranked))
    for at in range(0, len(drawn), rows):
        counts = np.cumsum(drawn[at : at + rows][:, units], axis=1)
        total = counts[:, -1]
        index = virtual_index(total, quantile)
        below = np.floor(index)
        # searchsorted(counts, rank, side="right") per row: the cumulative counts at or below the rank
        ends = [(np.clip(r, 0, total - 1)[:, None] >= counts).sum(axis=1) for r in (below, below + 1)]
        lo, hi = (ranked[np.minimum(e, len(ranked) - 1)] for e in ends)
        t, diff = index - below, hi - lo
        found = np.where(t >= 0.5, hi - diff * (1 - t), lo + diff * t)
        out[at : at + rows] = np.where(total > 0, found, np.nan)
    return out


def log_bins(values: np.ndarray) -> np.ndarray:
    """Each value's bin, floor(log2(value) x BINS_PER_OCTAVE), as int32; _ZERO_BIN for zeros."""
    # float32 is ample for a bin 1.1 % wide, and half the memory and time of float64. Zeros give
    # -inf and are clipped to _ZERO_BIN, below every positive float32's bin: no masked copies.
    logs = values.astype(np.float32)
    with np.errstate(divide="ignore"):
        np.log2(logs, out=logs)
    logs *= BINS_PER_OCTAVE
    np.floor(logs, out=logs)
    np.maximum(logs, _ZERO_BIN, out=logs)
    return logs.astype(np.int32)


class _Binned:
    """Per-block log-binned histograms of non-negative values: quantiles of block resamples."""

    def __init__(self, values: np.ndarray, block: np.ndarray, units: int) -> None:
        bins = np.empty(len(values), dtype=np.int32)
        lowest, highest = None, _ZERO_BIN  # the lowest positive bin, the highest bin
        for at in range(0, len(values), _CHUNK):  # in chunks: the temporaries stay small on a big run
            chunk = bins[at : at + _CHUNK]
            chunk[:] = log_bins(values[at : at + _CHUNK])
            highest = max(highest, int(chunk.max()))
            positive = chunk[chunk > _ZERO_BIN]
            if positive.size:
                lowest = int(positive.min()) if lowest is None else min(lowest, int(positive.min()))
        # One histogram per block over every bin from the lowest positive one up, the zeros in
        # column 0 (one bincount pass); the pooled histogram is its column sums.
        base = _ZERO_BIN if lowest is None else lowest - 1
        span = highest - base + 1
        np.maximum(bins, base, out=bins)
        np.subtract(bins, base, out=bins)
        if units * span < 2**31:  # the cell of each value: block x span + column, in place
            bins += block.astype(np.int32) * span
            cells = bins
        else:
            cells = block.astype(np.int64) * span + bins
        full = np.bincount(cells, minlength=units * span).reshape(units, span)
        # The median's bin, from the pooled histogram (zeros first), not from sorting the values.
        at_median = int(np.searchsorted(np.cumsum(full.sum(axis=0)), len(values) * _FLOOR_QUANTILE, side="right"))
        # Column 0 pools the zeros and every value under the median's bin; column j >= 1 is bin first + j - 1.
        self.exact_zeros = at_median == 0  # then column 0 holds zeros alone, and its value is exact
        first = (0 if lowest is None else lowest) if self.exact_zeros else base + at_median
        pooled_below = min(max(first - base, 1), span)  # full's columns pooled into column 0
        width = span - pooled_below + 1
        self.hist = np.empty((units, width))  # filled in place: full may be thousands of bins wide
        np.sum(full[:, :pooled_below], axis=1, out=self.hist[:, 0])
        self.hist[:, 1:] = full[:, pooled_below:]
        del full
        bin_of = first + np.arange(width) - 1
        self.low, self.high = np.exp2(bin_of / BINS_PER_OCTAVE), np.exp2((bin_of + 1) / BINS_PER_OCTAVE)
        self.floor = float(self.low[1]) if width > 1 else 0.0

    @classmethod
    def of_tail(cls, tail: Tail, units: int) -> _Binned:
        """The histograms `__init__` builds from all the values, from a tail: the bins wholly above
        the floor as they are there, and column 0 pooling the rest of each block (`pooled_reached`
        says whether a quantile read was in it: then it is not the value from all the values)."""
        self = cls.__new__(cls)
        bins = log_bins(tail.values)
        # A value in a bin above the floor's is above the floor (the bins are monotone): all are here.
        first = int(log_bins(np.array([tail.floor]))[0]) + 1 if tail.floor > 0 else _ZERO_BIN + 1
        above = bins >= first
        width = (int(bins[above].max()) - first + 1 if above.any() else 0) + 1
        upper = np.bincount(
            tail.block[above].astype(np.int64) * (width - 1) + (bins[above] - first), minlength=units * (width - 1)
        ).reshape(units, width - 1)
        self.hist = np.empty((units, width))
        self.hist[:, 1:] = upper
        self.hist[:, 0] = tail.block_n - upper.sum(axis=1)
        bin_of = first + np.arange(width) - 1
        self.low, self.high = np.exp2(bin_of / BINS_PER_OCTAVE), np.exp2((bin_of + 1) / BINS_PER_OCTAVE)
        self.floor = float(self.low[1]) if width > 1 else 0.0
        self.exact_zeros = False
        return self

    pooled_reached = False

    def quantiles(self, draws: np.ndarray, quantile: float) -> np.ndarray:
        """Every resample's quantile at once: `resampled_quantiles`' ranks and interpolation, on bins."""
        counts = np.cumsum(draws.astype(float) @ self.hist, axis=1)
        total = counts[:, -1].astype(np.int64)
        index = virtual_index(total, quantile)
        below = np.floor(index).astype(np.int64)
        lo, hi = (self._values(counts, np.clip(r, 0, total - 1)) for r in (below, below + 1))
        t, diff = index - below, hi - lo
        return np.where(t >= 0.5, hi - diff * (1 - t), lo + diff * t)  # lerp, row by row

    def _values(self, counts: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """The value of 0-based `rank` in each row of cumulative counts: the bin's values taken as
        evenly spread on the log scale."""
        j = (counts <= rank[:, None]).sum(axis=1)  # searchsorted(row, rank, side="right"), per row
        self.pooled_reached = self.pooled_reached or bool((j == 0).any())
        rows = np.arange(len(counts))
        before = counts[rows, np.maximum(j - 1, 0)]
        with np.errstate(divide="ignore", invalid="ignore"):  # j == 0 rows: replaced below
            share = (rank - before + 0.5) / (counts[rows, j] - before)
            value = self.low[j] * (self.high[j] / self.low[j]) ** share
        # Column 0 pools zeros, or (never in practice: under the median) the floor.
        return np.where(j == 0, 0.0 if self.exact_zeros else self.floor, value)
