"""Tie-aware top-1 and top-k matching.

bfloat16 logits hold exact ties, and which of two tied tokens an `argmax` or `argpartition`
returns depends on their ids (or on nothing at all), so an id comparison counts a tie as a hit on
one vocabulary and as a miss on another. The rules here depend on the values only:

* top-1: the two sides match when some token is among the reference's tied maxima and among the
  candidate's (either side's top-1 may be any of its tied maxima);
* top-k: each side's top-k is every token at or above its k-th largest value. The sets match when
  one choice of k tokens is a valid top-k of both sides: the tokens strictly above either side's
  k-th value are in both tie-inclusive sets, and the two tie-inclusive sets share at least k tokens;
* top-k overlap: the most tokens two valid top-k choices can share, divided by k.
"""

from __future__ import annotations

import numpy as np

# The per-row rule as a Polars expression, shared with the writer's prompt_stats (one definition).
from fleet.results.prompt_stats import longest_topk, top1_agreement

__all__ = ["longest_topk", "tied_max", "top1_agreement", "top1_match", "topk_match", "topk_overlap"]


def tied_max(x: np.ndarray) -> set[int]:
    """Ids of every token at the maximum of `x`."""
    return set(np.flatnonzero(x == np.max(x)).tolist())


def top1_match(ref: np.ndarray, cand: np.ndarray) -> bool:
    return bool(tied_max(ref) & tied_max(cand))


def _topk_sets(x: np.ndarray, k: int) -> tuple[set[int], set[int]]:
    """(ids strictly above the k-th largest value, ids at or above it)."""
    if len(x) <= k:
        everything = set(range(len(x)))
        return everything, everything
    kth = np.partition(x, len(x) - k)[len(x) - k]
    return set(np.flatnonzero(x > kth).tolist()), set(np.flatnonzero(x >= kth).tolist())


def topk_match(ref: np.ndarray, cand: np.ndarray, k: int) -> bool:
    above_r, within_r = _topk_sets(ref, k)
    above_c, within_c = _topk_sets(cand, k)
    common = within_r & within_c
    return (above_r | above_c) <= common and len(common) >= min(k, len(ref))


def topk_overlap(ref: np.ndarray, cand: np.ndarray, k: int) -> float:
    """max |A_r ∩ A_c| / k over valid top-k choices: the tokens that must be in one side's top-k
    and cannot be in the other's take that side's slots."""
    above_r, within_r = _topk_sets(ref, k)
    above_c, within_c = _topk_sets(cand, k)
    shared = min(len(within_r & within_c), k - len(above_r - within_c), k - len(above_c - within_r))
    return max(shared, 0) / k
