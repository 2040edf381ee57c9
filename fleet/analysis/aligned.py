"""Position-by-position comparison of two list columns, one pair of lists per row, in numpy.

`sequences` and the per-prompt figures compare a candidate's output with the reference's token by
token. Exploding both lists into one row per position and grouping back costs a hash group-by over
every token of the run; here the flat Arrow buffers are compared in place, one vectorised pass.
"""

from __future__ import annotations

import numpy as np
import polars as pl

# Series, not pyarrow: converting Arrow arrays to numpy makes pyarrow import pandas (0.3 s a report).


def elements(lists: pl.Series) -> pl.Series:
    """Every element of every list, in order (nulls inside lists kept); null and empty lists hold none."""
    return lists.explode(empty_as_null=False, keep_nulls=False)


def flat(lists: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(values, start offset of each row's list): null lists count as empty."""
    values = elements(lists).to_numpy()
    n = lengths(lists)
    return values, np.concatenate([[0], np.cumsum(n)[:-1]]) if len(n) else n


def lengths(lists: pl.Series) -> np.ndarray:
    return lists.list.len().fill_null(0).to_numpy().astype(np.int64)


def common(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows with n[i] positions each: (row of each position, position within its row)."""
    # int32: a run's positions per list and lists per table fit, and the arrays are half the size.
    row = np.repeat(np.arange(len(n), dtype=np.int32), n)
    position = np.arange(int(n.sum()), dtype=np.int32)
    position -= np.repeat((np.cumsum(n) - n).astype(np.int32), n)
    return row, position


def compare(cand: pl.Series, ref: pl.Series) -> dict[str, np.ndarray]:
    """Per row: n_cand, n_ref, tokens_matched (#positions where both lists hold the same id),
    first_divergence (the first position where they differ, a position past the shorter list
    counting as different; -1 where the lists are equal)."""
    rows = np.arange(len(cand))
    return compare_rows(Lists(pl.concat([cand, ref])), rows, rows + len(cand))


class Lists:
    """A list column as flat values (numpy) with each row's start and length."""

    def __init__(self, lists: pl.Series) -> None:
        self.values, self.start = flat(lists)
        self.n = lengths(lists)

    def at(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Values at (row, position); -1 where the position is past the row's list (ids are >= 0)."""
        inside = positions < self.n[rows]
        index = np.where(inside, self.start[rows] + np.where(inside, positions, 0), 0)
        return np.where(inside, self.values[index] if len(self.values) else -1, -1)


def compare_rows(lists: Lists, cand_rows: np.ndarray, ref_rows: np.ndarray) -> dict[str, np.ndarray]:
    """`compare` of the lists at rows cand_rows[i] and ref_rows[i] of one list column, without
    gathering them first (a big run's output ids would be copied twice)."""
    # Filled in place, a slice at a time: concatenating the parts wrote every figure twice.
    out = {
        k: np.zeros(len(cand_rows), dtype=np.int64) for k in ("n_cand", "n_ref", "tokens_matched", "first_divergence")
    }
    for i in range(0, len(cand_rows), _ROWS):
        for k, v in _compare(lists, cand_rows[i : i + _ROWS], ref_rows[i : i + _ROWS]).items():
            out[k][i : i + _ROWS] = v
    return out


_ROWS = 1 << 16  # pairs compared at a time: the per-position arrays stay a few MB on a big run


def _compare(lists: Lists, cand_rows: np.ndarray, ref_rows: np.ndarray) -> dict[str, np.ndarray]:
    n_cand, n_ref = lists.n[cand_rows], lists.n[ref_rows]
    shorter = np.minimum(n_cand, n_ref)
    # Each side's flat index of each compared position: its list's start, repeated over the
    # shorter length, plus the running count less the pair's own start (no row or position arrays).
    before = np.cumsum(shorter) - shorter
    index = np.arange(int(shorter.sum()), dtype=np.int64)
    ids = lists.values
    cand_ids = ids[index + np.repeat(lists.start[cand_rows] - before, shorter)]
    index += np.repeat(lists.start[ref_rows] - before, shorter)
    differ = cand_ids != ids[index]
    del cand_ids, index
    # Per pair, the differing positions before its start and up to its end, by one running count.
    count = np.concatenate([[0], np.cumsum(differ)])
    n_differ = count[before + shorter] - count[before]
    matched = (shorter - n_differ).astype(np.int64)
    first = np.where(n_cand != n_ref, shorter, -1)
    some = np.flatnonzero(n_differ > 0)
    # The first differing position of a pair: where the running count first passes its value at the start.
    first[some] = np.searchsorted(count, count[before[some]] + 1) - 1 - before[some]
    return {"n_cand": n_cand, "n_ref": n_ref, "tokens_matched": matched, "first_divergence": first}


class Flat:
    """A list column as one flat Series of its elements (nulls kept) and each row's start and length."""

    def __init__(self, lists: pl.Series) -> None:
        self.n = lengths(lists)
        self.start = np.concatenate([[0], np.cumsum(self.n)[:-1]]).astype(np.int64) if len(self.n) else self.n
        self.values = elements(lists)
        self._array: np.ndarray | None = None

    def array(self) -> np.ndarray:
        """`values` as numpy, converted once (a column of many chunks is copied to convert)."""
        if self._array is None:
            self._array = self.values.to_numpy()
        return self._array

    def at(self, rows: np.ndarray, positions: np.ndarray, *, inside_lists: bool = False) -> pl.Series:
        """Values at (row, position) pairs; null where the position is past the row's list
        (`inside_lists`: the caller knows none is, and no mask is built)."""
        if inside_lists:
            return self.values.gather(self.start[rows] + positions)
        inside = positions < self.n[rows]
        if not inside.any():  # then there may be no values to point the others at
            return pl.Series(self.values.name, dtype=self.values.dtype).extend_constant(None, len(rows))
        found = self.values.gather(np.where(inside, self.start[rows] + np.minimum(positions, self.n[rows] - 1), 0))
        return pl.select(pl.when(pl.Series(inside)).then(found)).to_series().alias(self.values.name)

    def numbers(self, first: int, last: int) -> np.ndarray:
        """`rows` as numbers (float32 as stored, not copied where there is no null), NaN for nulls."""
        return self.rows(first, last).to_numpy()

    def nulls(self, first: int, last: int) -> np.ndarray:
        return self.rows(first, last).is_null().to_numpy()

    def rows(self, first: int, last: int) -> pl.Series:
        """Every value of rows first..last-1, in order."""
        lo = int(self.start[first]) if last > first else 0
        hi = int(self.start[last - 1] + self.n[last - 1]) if last > first else 0
        return self.values.slice(lo, hi - lo)
