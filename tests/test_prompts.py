"""Prompts: text or chat, expected answers and their match rules, built-in sets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fleet.contracts.errors import ManifestError
from fleet.contracts.prompts import Expected, Prompt, is_correct
from fleet.run.manifest_file import load
from fleet.run.prompt_files import builtin_names


@pytest.mark.parametrize(
    ("rule", "output", "verdict"),
    [
        (Expected(contains="Paris"), " paris, of course.", True),
        (Expected(contains="Paris"), " Lyon.", False),
        (Expected(exact="4"), "  4\n", True),
        (Expected(exact="4"), "4.", False),
        (Expected(regex=r"H2O|H₂O"), "It is H₂O.", True),
        (Expected(number=7), "10 - 3 = 7", True),
        (Expected(number=7), "You have 7 apples left (10 - 3).", False),  # the last number decides
        (Expected(number=4), "2 + 2 = 4.", True),
        (Expected(number=1000), "1,000", True),
        (Expected(number=0.5), "about 0.50", True),
        (Expected(number=4), "four", False),
    ],
)
def test_match_rules(rule: Expected, output: str, verdict: bool) -> None:
    assert is_correct(rule.rule(), output) is verdict


def test_no_rule_is_no_verdict() -> None:
    assert is_correct(None, "anything") is None


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({}, "exactly one of contains, exact, regex, number"),
        ({"contains": "a", "number": 1}, "exactly one"),
        ({"regex": "("}, "does not compile"),
    ],
)
def test_expected_needs_one_valid_rule(fields: dict[str, object], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        Expected.model_validate(fields)


def test_prompt_is_text_or_chat() -> None:
    assert Prompt(id="a", prompt="hi").messages_json() is None
    chat = Prompt.model_validate({"id": "b", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.messages_json() == '[{"role": "user", "content": "hi"}]'
    for bad in ({"id": "c"}, {"id": "d", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}):
        with pytest.raises(ValidationError, match="exactly one of 'prompt' or 'messages'"):
            Prompt.model_validate(bad)


def test_builtin_sets_load_by_name(tmp_path: Path) -> None:
    assert {"smollm-six", "arith-knowledge"} <= set(builtin_names())
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "models: [{name: m, source: {kind: synthetic}}]\n"
        "prompts: {six: {builtin: smollm-six}, quiz: {builtin: arith-knowledge}}\n"
        "targets: [{name: ref, kind: hf}]\nreference: ref\n"
    )
    m = load(manifest)
    assert m.prompts["six"][0].prompt == "The capital of France is"
    assert len(m.prompts["six"]) == 6
    assert all(p.messages and p.expected for p in m.prompts["quiz"])


def test_unknown_builtin_lists_the_known_ones(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "models: [{name: m, source: {kind: synthetic}}]\nprompts: {x: {builtin: gsm9k}}\n"
        "targets: [{name: ref, kind: hf}]\nreference: ref\n"
    )
    with pytest.raises(
        ManifestError, match="no built-in set 'gsm9k'; built-in sets: arith-knowledge, long-context, smollm-six"
    ):
        load(manifest)
