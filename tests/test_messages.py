"""Validation messages name fields as the user wrote them (never pydantic's union tags or its URL)."""

from __future__ import annotations

from pathlib import Path

from test_inputs import check, tiny

from fleet.contracts.messages import field_path

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
