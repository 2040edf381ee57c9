"""Deep parity probes' metrics of one pair of vectors, candidate vs reference, in float64 numpy.

fleet/analysis/probes.py pairs the probe tables' rows and applies these row by row; the drill-down
(fleet/analysis/drilldown.py) applies `layer_metrics` at each real divergence.

Full distribution (the Qwen2.5 report, 002 section 5; one row per prompt position):

* `cosine`: cosine similarity of the *mean-centred* logprob vectors. logprob = logit - logsumexp,
  so centring removes the per-engine normaliser and equals centring the raw logits: this is the
  report's "cosine of the full logits" (which it computed on logits whose mean is ~0) made
  independent of the offset. Uncentred logprob vectors share a large negative mean (about
  -log(vocab)), which would push the cosine towards 1 whatever the error.
* `nmse`: ||x_c - x_r||^2 / ||x_r||^2 on the same centred vectors (the report's "normalized MSE").
* `max_abs_err`: max over the vocabulary of |logprob_c - logprob_r| (nats), uncentred.
* `kl`: exact KL(ref || cand) = sum_i p_r(i) (log p_r(i) - log p_c(i)) over the whole vocabulary,
  each side renormalised in float64 first (float32 log-softmax leaves ~1e-7 of mass error).
* `top1_match`: some token is top-1 on both sides; `top5_match`: the same set of 5 most likely
  tokens; `top5_overlap`: |top5_c ∩ top5_r| / 5. All three are tie-aware (fleet/analysis/ties.py):
  bfloat16 has exact ties, and which tied id `argmax` picks says nothing about the port.

Layer-wise (the Llama-3.2 report, 001 section 4.2; layer 0 = embeddings, i = output of decoder
layer i, L + 1 = after the final norm):

* `rel_l2`: ||h_c - h_r|| / ||h_r|| over all [positions x hidden] elements of the layer.
* `cosine`: mean over positions of the cosine of h_c[p] and h_r[p]; `cosine_min`: the lowest.
* `within_0p1pct` / `within_0p5pct`: share of elements whose relative error
  |h_c - h_r| / max(|h_r|, 1e-6) is below 0.1 % / 0.5 % (msprobe's "One Thousandth" and "Five
  Thousandths Err Ratio"; msprobe floors only exact zeros, with eps, the floor here keeps
  elements within float noise of zero from counting as 100 % errors).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleet.analysis import ties

REL_FLOOR = 1e-6  # |h_r| below this counts as this in the elementwise relative error


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """a.b / (|a| |b|); NaN when either is all zeros."""
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b)) / denom if denom > 0 else float("nan")


def nmse(cand: np.ndarray, ref: np.ndarray) -> float:
    """||cand - ref||^2 / ||ref||^2."""
    denom = float(np.dot(ref, ref))
    return float(np.sum((cand - ref) ** 2)) / denom if denom > 0 else float("nan")


def log_normalize(logprobs: np.ndarray) -> np.ndarray:
    """logprobs - logsumexp(logprobs): a distribution that sums to 1 in float64."""
    top = np.max(logprobs)
    return logprobs - (top + np.log(np.sum(np.exp(logprobs - top))))


def kl_exact(ref: np.ndarray, cand: np.ndarray) -> float:
    """KL(ref || cand) = sum_i p_r(i) (log p_r(i) - log p_c(i)), both renormalised; terms with p_r = 0 are 0."""
    r, c = log_normalize(ref), log_normalize(cand)
    p = np.exp(r)
    with np.errstate(invalid="ignore"):  # -inf - -inf where p_r = 0: masked below
        return float(np.sum(np.where(p > 0, p * (r - c), 0.0)))


def rel_err_share(cand: np.ndarray, ref: np.ndarray, bound: float, *, floor: float = REL_FLOOR) -> float:
    """Share of elements with |cand - ref| / max(|ref|, floor) < bound."""
    rel = np.abs(cand - ref) / np.maximum(np.abs(ref), floor)
    return float(np.mean(rel < bound))


def logits_metrics(ref: np.ndarray, cand: np.ndarray) -> dict[str, Any]:
    """All full-distribution metrics of one position (see the module docstring)."""
    rc, cc = ref - ref.mean(), cand - cand.mean()
    return {
        "cosine": cosine(cc, rc),
        "nmse": nmse(cc, rc),
        "max_abs_err": float(np.max(np.abs(cand - ref))),
        "kl": kl_exact(ref, cand),
        "ref_top1": int(np.argmax(ref)),
        "cand_top1": int(np.argmax(cand)),
        "top1_match": ties.top1_match(ref, cand),
        "top5_match": ties.topk_match(ref, cand, 5),
        "top5_overlap": ties.topk_overlap(ref, cand, 5),
    }


def layer_metrics(ref: np.ndarray, cand: np.ndarray) -> dict[str, Any]:
    """All layer-wise metrics of one [positions, hidden] block (see the module docstring)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # an all-zero position: NaN, as cosine()
        per_position = np.sum(cand * ref, axis=1) / (np.linalg.norm(cand, axis=1) * np.linalg.norm(ref, axis=1))
    return {
        "rel_l2": float(np.linalg.norm(cand - ref) / np.linalg.norm(ref)),
        "cosine": float(np.mean(per_position)),
        "cosine_min": float(np.min(per_position)),
        "max_abs_err": float(np.max(np.abs(cand - ref))),
        "within_0p1pct": rel_err_share(cand, ref, 1e-3),
        "within_0p5pct": rel_err_share(cand, ref, 5e-3),
    }
