"""fleet/analysis/prefix_pairs.py: the common prefix's figures a chunk at a time equal the figures
of the whole prefix as one Polars frame (parity.prefix_expressions, the noise floor's |d|)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from fleet.analysis import parity, prefix_pairs
from fleet.analysis.aligned import Flat, common


def _lists(rng: np.random.Generator, rows: int, offset: float) -> pl.Series:
    lengths = rng.integers(0, 12, rows)
    values = [(offset + rng.normal(-2.0, 1.5, n)).astype(np.float32).tolist() for n in lengths]
    return pl.Series(values, dtype=pl.List(pl.Float32))


def _whole(a: Flat, a_rows: np.ndarray, b: Flat, b_rows: np.ndarray, n: np.ndarray) -> dict[str, object]:
    """The definition: every prefix position in one frame."""
    row, position = common(n)
    frame = pl.DataFrame(
        {
            "_cand_lp": a.at(a_rows[row], position, inside_lists=True).cast(pl.Float64),
            "_ref_lp": b.at(b_rows[row], position, inside_lists=True).cast(pl.Float64),
        }
    )
    d = (pl.col("_cand_lp") - pl.col("_ref_lp")).abs()
    return frame.select(**parity.prefix_expressions(), count=pl.len(), largest=d.max()).row(0, named=True)


def _chunked(a: Flat, a_rows: np.ndarray, b: Flat, b_rows: np.ndarray, n: np.ndarray) -> dict[str, object]:
    pearson, diff = prefix_pairs.Pearson(), prefix_pairs.AbsDiff()
    for x, y in prefix_pairs.chunks(a, a_rows, b, b_rows, n):
        pearson.add(x, y)
        diff.add(x, y)
    return {"pearson_r": pearson.r(), "mae": diff.mean(), "count": diff.count, "largest": diff.max()}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("chunk", [1, 7, 1 << 21])
def test_chunks_give_the_whole_prefix_figures(seed: int, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefix_pairs, "_POSITIONS", chunk)
    rng = np.random.default_rng(seed)
    # A large offset: the centred sums must not lose r's digits to the means.
    a, b = Flat(_lists(rng, 60, 1e4 * seed)), Flat(_lists(rng, 40, 1e4 * seed))
    a_rows, b_rows = rng.integers(0, 60, 50), rng.integers(0, 40, 50)
    first = rng.integers(0, 14, 50)
    n = np.minimum(np.minimum(a.n[a_rows], b.n[b_rows]), first)
    whole, chunked = _whole(a, a_rows, b, b_rows, n), _chunked(a, a_rows, b, b_rows, n)
    assert chunked["count"] == whole["count"] and chunked["largest"] == whole["largest"]
    for name in ("pearson_r", "mae"):  # the order of additions differs: r at 3e4 agreed to 1e-11
        assert math.isclose(chunked[name], whole[name], rel_tol=1e-9), name  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "pearson_r", "mae"),
    [
        ([[-1.0, float("nan")]], [[-1.5, -2.0]], None, None),  # a NaN: both figures null
        ([[-1.0, -1.0, -1.0]], [[-0.5, -2.0, -3.0]], None, 3.5 / 3),  # no spread on a side: no r
        ([[-1.0]], [[-0.5]], None, 0.5),  # one pair: no r
        ([[]], [[]], None, None),  # nothing compared
    ],
)
def test_edge_cases_are_the_frames_nulls(
    a: list[list[float]], b: list[list[float]], pearson_r: float | None, mae: float | None
) -> None:
    fa, fb = Flat(pl.Series(a, dtype=pl.List(pl.Float32))), Flat(pl.Series(b, dtype=pl.List(pl.Float32)))
    rows, n = np.zeros(1, dtype=np.int64), np.array([len(a[0])])
    whole, chunked = _whole(fa, rows, fb, rows, n), _chunked(fa, rows, fb, rows, n)
    assert (chunked["pearson_r"], chunked["mae"]) == (whole["pearson_r"], whole["mae"]) == (pearson_r, mae)


def test_a_null_inside_a_list_is_not_for_the_chunks() -> None:
    assert prefix_pairs.holds_no_null(Flat(pl.Series([[-1.0, -2.0]], dtype=pl.List(pl.Float32))))
    assert not prefix_pairs.holds_no_null(Flat(pl.Series([[-1.0, None]], dtype=pl.List(pl.Float32))))
