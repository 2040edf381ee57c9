"""Which columns each report table shows, in order, and their display names: the one place.

Keys are the column names of fleet.analysis's frames (and of fleet.report.model's); values are
the headers every format prints.
"""

from __future__ import annotations

from fleet.analysis.gates import VERDICT_COLUMNS

PARITY = {
    "model": "model",
    "target": "candidate",
    "n_prompts": "prompts",
    "first_top1_agreement": "first top-1",
    "first_logprob_diff_mean": "first |dlogp|",
    "first_prob_rel_err_mean": "first P rel err",
    "seq_match_rate": "seq match",
    "token_match_rate": "token match",
    "pearson_r": "r (matched)",
    "mae": "MAE (matched)",
    "tf_top1_agreement": "TF top-1",
    "tf_max_abs_logprob_diff": "TF max |dlogp|",
    "kl_topk_mean": "KL top-k",
    "first_divergence_mean": "first div (mean pos)",
    "n_diverged": "diverged",
    "near_ties": "near ties",
    "real_divergences": "real divergences",
    "tf_p99_abs_logprob_diff": "TF p99 |dlogp|",
    "twin_p99_abs_logprob_diff": "twin p99 |dlogp|",
    "noise": "noise (nats)",
    "tf_excess": "excess (x noise)",
    "tf_excess_ci_low": "excess CI low",
    "tf_excess_ci_high": "excess CI high",
    "precision_verdict": "precision",
}
CALIBRATION = {
    "candidate": "candidate",
    "dtype": "dtype",
    "mutation": "mutation",
    "target": "target",
    "tf_p99_abs_logprob_diff": "TF p99 |dlogp|",
    "noise": "noise (nats)",
    "tf_excess": "excess (x noise)",
    "tf_excess_ci_low": "excess CI low",
    "caught": "caught",
    "failed_gates": "failed gates",
}
FIRST_STEP = {
    "model": "model",
    "target": "candidate",
    "prompt_set": "set",
    "prompt_id": "prompt",
    "ref_logprob_of_cand": "ref logprob",
    "cand_logprob": "cand logprob",
    "logprob_diff": "|diff|",
    "p_ref": "ref P",
    "p_cand": "cand P",
    "rel_err": "rel err",
    "top1_match": "top-1 match",
}
SEQUENCES = {
    "model": "model",
    "target": "candidate",
    "prompt_set": "set",
    "prompt_id": "prompt",
    "ref_text": "reference output",
    "cand_text": "candidate output",
    "match": "match",
    "first_divergence": "first divergence",
    "kind": "divergence kind",
    "ref_margin": "ref margin (nats)",
    "noise": "noise (nats)",
    "ref_correct": "ref correct",
    "cand_correct": "cand correct",
}
SEQUENCES_DETAIL = {"prompt": "prompt text"}  # chat prompts as rendered: too long for a text table
ACCURACY = {
    "model": "model",
    "target": "target",
    "n_expected": "prompts",
    "n_correct": "correct",
    "accuracy_pct": "accuracy %",
    "delta_points": "vs reference (points)",
}
THROUGHPUT = {
    "model": "model",
    "target": "target",
    "n_requests": "requests",
    "output_tokens": "out tokens",
    "output_tok_s": "out tok/s",
    "ttft_p50_s": "TTFT p50 s",
    "ttft_p90_s": "TTFT p90 s",
    "ttft_p99_s": "TTFT p99 s",
    "tpot_p50_s": "TPOT p50 s",
    "tpot_p90_s": "TPOT p90 s",
    "tpot_p99_s": "TPOT p99 s",
    "e2e_p50_s": "E2E p50 s",
    "e2e_p99_s": "E2E p99 s",
}
SCENARIOS = {
    "model": "model",
    "target": "target",
    "scenario": "scenario",
    "level": "concurrency",
    "n_completed": "done",
    "n_errors": "errors",
    "qps": "QPS",
    "output_tok_s": "out tok/s",
    "total_tok_s": "total tok/s",
    "prefill_tok_s": "prefill tok/s",
    "goodput_qps": "goodput req/s",
    "goodput_tok_s": "goodput tok/s",
    "slo_share": "met SLO",
    "ttft_p50_s": "TTFT p50 s",
    "ttft_p90_s": "TTFT p90 s",
    "ttft_p99_s": "TTFT p99 s",
    "tpot_p50_s": "TPOT p50 s",
    "tpot_p99_s": "TPOT p99 s",
    "itl_p50_s": "ITL p50 s",
    "itl_p99_s": "ITL p99 s",
    "e2e_p50_s": "E2E p50 s",
    "e2e_p90_s": "E2E p90 s",
    "e2e_p99_s": "E2E p99 s",
    "queue_delay_max_s": "queue delay max s",
    "send_lag_p99_s": "send lag p99 s",
    "client_cpu_share": "client CPU",
    "client_bound": "client-bound",
}
SWEEPS = {
    "model": "model",
    "target": "target",
    "scenario": "scenario",
    "level": "concurrency",
    "probe": "probe",
    "offered_rps": "offered req/s",
    "qps": "served req/s",
    "goodput_qps": "goodput req/s",
    "slo_share": "met SLO",
    "meets": "meets",
    "best_rps": "best req/s",
}
LOAD_PARITY = {
    "model": "model",
    "target": "target",
    "scenario": "scenario",
    "level": "concurrency",
    "n_prompts": "prompts",
    "in_flight_mean": "load in flight",
    "real_divergences": "real divergences",
    "near_ties": "near ties",
    "tf_p99_abs_logprob_diff": "TF p99 |dlogp|",
    "first_top1_agreement_excl_ties": "first top-1 (excl. ties)",
    "delta_real_divergences": "real div. vs c=1",
    "delta_tf_p99": "TF p99 vs c=1",
    "paths_changed_vs_solo": "paths changed vs c=1",
    "real_divergences_vs_solo": "real div. from c=1",
}
WORKLOADS = {
    "model": "model",
    "target": "target",
    "scenario": "scenario",
    "level": "concurrency",
    "requested_input_mean": "in asked",
    "input_tokens_mean": "in seen",
    "requested_output_mean": "out asked",
    "output_tokens_mean": "out got",
    "length_miss_max": "max miss",
    "lengths_exact": "exact (<=1)",
    "prefix_cache_hit_rate": "prefix-cache hits",
}
SMOKE = {
    "model": "model",
    "target": "target",
    "check": "check",
    "passed": "passed",
    "status": "HTTP",
    "latency_s": "latency s",
    "error": "error",
}
LOGITS = {
    "model": "model",
    "target": "candidate",
    "n_positions": "positions",
    "logits_cosine_min": "cosine min",
    "logits_nmse_max": "NMSE max",
    "logits_max_abs_err": "max |dlogp|",
    "logits_kl_max": "KL max",
    "logits_kl_mean": "KL mean",
    "logits_top1_agreement": "top-1",
    "logits_top5_agreement": "top-5 set",
}
LAYERS = {
    "model": "model",
    "target": "candidate",
    "layer": "layer",
    "kind": "kind",
    "rel_l2": "rel L2",
    "cosine": "cosine",
    "cosine_min": "cosine min",
    "within_0p1pct": "within 0.1%",
    "within_0p5pct": "within 0.5%",
}
MATRIX = {
    "model": "model",
    "variant": "variant",
    "settings": "settings",
    "started": "started",
    "gates": "gates",
    "output_tok_s": "out tok/s",
    "failure": "failure",
}
NOISE_FLOOR = {
    "model": "model",
    "target": "target",
    "copy": "repeated as",
    "n_prompts": "prompts",
    "seq_identical_rate": "identical sequences",
    "tokens_compared": "tokens compared",
    "max_abs_logprob_diff": "max |dlogp| vs itself",
    "mean_abs_logprob_diff": "mean |dlogp| vs itself",
}
CONSISTENCY = {
    c: c
    for c in (
        "model", "base", "target_a", "target_b", "differs_in", "n_prompts", "n_identical", "identical",
        "n_near_ties", "real_divergences", "first_diff_prompt", "first_diff_position",
    )
}  # fmt: skip
VERDICTS = {c: c for c in VERDICT_COLUMNS}
EVIDENCE = {c: c for c in ("gate", "model", "target", "evidence")}  # a table of its own: the code is long
ARCHITECTURE = {"config": "config", "value": "value"}
COMPARE = {c: c for c in ("metric", "a", "b", "delta")} | {"delta_ci": "delta 95 % CI"}
COMPARE |= {c: c for c in ("rel_delta", "direction", "gate", "verdict_a", "verdict_b")}
# The first screen (fleet.report.summary). {at} is where the perf figures were measured: "@1" and
# "@16" (a scenario's lowest and highest concurrency) or "(parity runs)".
SUMMARY = {
    "model": "model",
    "target": "target",
    "verdict": "verdict",
    "failed_checks": "failed checks",
    "tf_p99_abs_logprob_diff": "TF p99 |dlogp|",
    "noise": "noise (nats)",
    "tf_excess_ci": "excess x noise (95% CI)",
    "first_top1_agreement_excl_ties": "first top-1 (near ties agree)",
    "seq_match_rate_excl_ties": "seq match (near ties agree)",
    "output_tok_s": "out tok/s {at}",
    "ttft_p50_s": "TTFT p50 s {at}",
    "output_tok_s_top": "out tok/s {at}",
    "ttft_p50_s_top": "TTFT p50 s {at}",
}
