"""Validation messages name fields as the user wrote them (never pydantic's union tags or its URL),
and a wrong name gets the closest known one and a list that is whole or not shown at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_compare import SAME, write_run
from test_inputs import assert_user_error, check, run_cli, tiny

from fleet.contracts import schema_docs
from fleet.contracts.messages import LIST_BUDGET, field_path, unknown

ROOT = Path(__file__).resolve().parents[1]

INTERNALS = ("function-after[", "list[", "union[", "tagged-union[", "json-or-python[", "errors.pydantic.dev")


def assert_plain(err: str) -> None:
    assert not [marker for marker in INTERNALS if marker in err], err


def test_a_typo_in_an_inline_prompt_names_the_prompt(tmp_path: Path) -> None:
    # Issue 20: `prompts.p.list[function-after[_text_or_chat(), Prompt]][0].answer: unknown key`.
    text = tiny(**{"{id: capital, ": "{id: capital, answer: Paris, "})
    err = check(tmp_path, text, "1 error(s)", "prompts.smollm-six[0].answer: unknown key 'answer'")
    assert_plain(err)  # and the file form's "Input should be a valid dictionary" is not listed


def test_a_wrong_type_for_a_union_is_one_error(tmp_path: Path) -> None:
    text = tiny(**{"  smollm-six:\n": "  smollm-six: 3\n  unused:\n"})
    err = check(tmp_path, text, "prompts.smollm-six: Input should be a valid list, or a valid dictionary (got 3)")
    assert_plain(err)


def test_an_unknown_key_with_a_dash_is_a_key_not_a_union_tag(tmp_path: Path) -> None:
    # The fuzzer's `prompts: {x: {smollm-six: ...}}`: a set nested one level too deep. Its key has a
    # dash, as pydantic's tags do; it was shown as "unknown key 'function-after[_text_or_chat(), PromptFile]'".
    text = tiny(**{"  smollm-six:\n": "  x:\n    smollm-six: {builtin: smollm-six}\n  smollm-six:\n"})
    err = check(tmp_path, text, "prompts.x.smollm-six: unknown key 'smollm-six' (known keys: expected, file")
    assert_plain(err)


def test_a_prompt_file_mapping_error_names_the_key_not_a_url(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "x"}\n')
    text = tiny(**{"  smollm-six:\n": "  smollm-six: {file: p.jsonl, bogus: 1}\n  unused:\n"})
    err = check(tmp_path, text, "prompt set 'smollm-six': bogus: unknown key 'bogus'")
    assert_plain(err)


def test_field_path_keeps_keys_and_drops_tags() -> None:
    raw = {"prompts": {"p-1": [{"id": "a", "answer": 1}]}, "targets": [{"kind": "vllm", "dtype": "x"}]}
    loc = ("prompts", "p-1", "list[function-after[_text_or_chat(), Prompt]]", 0, "answer")
    assert field_path(raw, loc) == "prompts.p-1[0].answer"
    assert field_path(raw, ("targets", 0, "vllm", "dtype")) == "targets[0].dtype"
    assert field_path(raw, ("prompts", "p-1", "PromptFile")) == "prompts.p-1"  # a list has no string keys
    assert field_path(raw, ("targets", 0, "vllm", "name")) == "targets[0].name"  # missing: still named


# --- a wrong name gets "did you mean", and a list that is not cut mid-way --------------------------

GATE = "\ngates:\n  - {metric: METRIC, op: '<=', threshold: 1.0}\n"


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("sampling:", GATE.replace("METRIC", "tf_p99_abs_logprob_dif") + "sampling:", "'tf_p99_abs_logprob_diff'"),
        ("kind: vllm, device: cpu, dtype: float32", "kind: vlm, device: cpu, dtype: float32", "'vllm'"),
        ("kind: synthetic", "kind: synthetc", "'synthetic'"),
        ("sampling:", "report: {layout: 002-qwen2.5}\nsampling:", "'002-qwen2.5-0.5b'"),
        ("dtype: bfloat16", "dtype: bfloat61", "'bfloat16'"),
    ],
    ids=["gate metric", "target kind", "source kind", "report layout", "dtype"],
)
def test_a_wrong_name_gets_the_closest_one(tmp_path: Path, old: str, new: str, needle: str) -> None:
    err = check(tmp_path, tiny(**{old: new}), f"did you mean {needle}")
    assert "chars)" not in err  # cut() marks a cut line so: no list may be cut mid-way


def test_the_gate_metric_list_is_pointed_to_and_the_docs_have_it_whole(tmp_path: Path) -> None:
    err = check(tmp_path, tiny(sampling=GATE.replace("METRIC", "pearson") + "sampling:"), "did you mean 'pearson_r'")
    assert f'known metrics, all listed in {schema_docs.NAMES_PAGE} "Gate metric ids"' in err
    page = (ROOT / schema_docs.NAMES_PAGE).read_text(encoding="utf-8")
    assert "\n### Gate metric ids\n" in page  # the heading the message names
    [(key, names)] = schema_docs.documented_names().items()
    assert f"<!-- names:{key} -->\n{names}\n<!-- /names -->" in page  # `make docs` regenerates it


def test_a_wrong_query_table_or_column_gets_the_closest_one(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", {"cand": SAME})
    code, _, err = run_cli("query", run, "SELECT * FROM paritty")
    assert_user_error(code, err, "unknown table 'paritty'; did you mean 'parity'?", "throughput")
    code, _, err = run_cli("query", run, "SELECT logprb FROM tokens")
    assert_user_error(code, err, "unknown column 'logprb'; did you mean 'logprob'", "twin_logprob")
    assert "chars)" not in err


def test_a_long_list_is_whole_or_not_shown() -> None:
    known = [f"metric_number_{i}" for i in range(60)]
    msg = unknown("metric", "metric_numbr_7", known, listed="the docs")
    assert "did you mean 'metric_number_7'" in msg and msg.endswith("(60 known metrics, all listed in the docs)")
    short = unknown("kind", "x", ["a", "b"])
    assert short == "unknown kind 'x' (known kinds: a, b)" and len(", ".join(known)) > LIST_BUDGET


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        # a target field, inside the union of backends: the keys of the kind it names
        ("max_model_len: 256}", "max_model_length: 256}",
         "targets[1].max_model_length: unknown key 'max_model_length'; did you mean 'max_model_len'?"),
        ("  logprobs: 5", "  logprob: 5", "sampling.logprob: unknown key 'logprob'; did you mean 'logprobs'?"),
        ("{id: capital, ", "{id: capital, expectd: {contains: Paris}, ",
         "prompts.smollm-six[0].expectd: unknown key 'expectd'; did you mean 'expected'?"),
    ],
)  # fmt: skip
def test_an_unknown_key_gets_the_closest_known_one(tmp_path: Path, old: str, new: str, needle: str) -> None:
    err = check(tmp_path, tiny(**{old: new}), needle)
    assert_plain(err)


def test_known_keys_follow_lists_dicts_and_the_kind_of_a_union() -> None:
    from fleet.contracts.messages import known_keys
    from fleet.run.manifest import Manifest

    vllm = known_keys(Manifest, ("targets", 1, "vllm", "bogus"))
    assert "max_model_len" in vllm and "attn_implementation" not in vllm  # the vllm backend's, not hf's
    assert {"matrix", "repeat"} <= set(vllm)  # expanded before validation, but keys the user writes
    assert "attn_implementation" in known_keys(Manifest, ("targets", 0, "hf", "bogus"))
    assert known_keys(Manifest, ("sampling", "bogus")) == ["logprobs", "max_tokens", "seed", "temperature"]
    assert known_keys(Manifest, ("nosuchfield", "bogus")) == []  # nothing to offer: the plain message
