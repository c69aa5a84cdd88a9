from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kindex import AnswerError, extract_object

GOOD = {"title": "退款", "summary": "怎么退款", "tags": ["退款"]}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ('{"title": "退款", "summary": "怎么退款", "tags": ["退款"]}', GOOD),
        ('```json\n{"title": "退款", "summary": "怎么退款", "tags": ["退款"]}\n```', GOOD),
        ('Sure! Here it is:\n{"title": "退款", "summary": "怎么退款", "tags": ["退款"]}\nHope this helps.', GOOD),
        ('{"title": "a {b} c", "summary": "}{", "tags": []}', {"title": "a {b} c", "summary": "}{", "tags": []}),
        (
            '{"title": "say \\"hi\\" {", "summary": "x", "tags": []}',
            {"title": 'say "hi" {', "summary": "x", "tags": []},
        ),
        ('{"title": "back\\\\", "summary": "}", "tags": []} tail', {"title": "back\\", "summary": "}", "tags": []}),
        ('{"a": {"b": {"c": [1, {"d": 2}]}}}', {"a": {"b": {"c": [1, {"d": 2}]}}}),
        ('{"first": 1} and then {"second": 2}', {"first": 1}),
        ('note {not json} then {"x": 1}', {"x": 1}),
        ('前言 {"标题": "中文"}', {"标题": "中文"}),
    ],
    ids=[
        "clean",
        "fence",
        "prose-around",
        "braces-in-strings",
        "escaped-quotes",
        "escaped-backslash",
        "nested",
        "two-objects",
        "brace-prose-first",
        "cjk",
    ],
)
def test_the_first_balanced_object_is_recovered(answer: str, expected: dict[str, Any]) -> None:
    assert extract_object(answer) == expected


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("", "empty"),
        ("   \n ", "empty"),
        ("I cannot help with that.", "holds no JSON object"),
        ('[{"title": "x"}]', "JSON list, not an object"),
        ('"just a string"', "JSON str, not an object"),
        ('{"title": "x", "summary": "trunc', "not closed"),
        ("{not: json}", "no valid JSON object"),
    ],
    ids=["empty", "blank", "no-object", "top-level-array", "string", "truncated", "invalid"],
)
def test_unusable_answers_say_why(answer: str, message: str) -> None:
    with pytest.raises(AnswerError, match=message):
        extract_object(answer)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(
    obj=st.dictionaries(st.text(max_size=8), json_values, max_size=5),
    before=st.text(max_size=40).filter(lambda s: "{" not in s),
    after=st.text(max_size=40),
    ascii_only=st.booleans(),
)
def test_any_object_embedded_in_text_is_recovered_exactly(
    obj: dict[str, Any], before: str, after: str, ascii_only: bool
) -> None:
    text = before + json.dumps(obj, ensure_ascii=ascii_only) + after
    try:
        whole = json.loads(text)
    except ValueError:
        whole = obj
    if not isinstance(whole, dict):  # '"' + '{}' + '"' is a JSON string, '[' + '{}' + ']' a list: refused as such
        with pytest.raises(AnswerError, match=f"the answer is a JSON {type(whole).__name__}, not an object"):
            extract_object(text)
        return
    assert extract_object(text) == obj


@pytest.mark.parametrize("text", ['"{}"', "[{}]", ' "{}" '])
def test_an_object_inside_a_whole_json_string_or_list_is_refused_not_searched(text: str) -> None:
    # The property test above once drew before='"', after='"': that answer is a string, refused by design.
    with pytest.raises(AnswerError, match="not an object"):
        extract_object(text)


def test_a_lone_surrogate_in_an_answer_costs_one_character_not_the_entry() -> None:
    from kindex.jsonextract import salvage_truncated

    # What a provider's broken "\\ud800" escape leaves in the decoded answer: no UTF-8 encoding exists for it.
    assert extract_object('{"title": "退款\ud800", "summary": "摘要"}') == {"title": "退款?", "summary": "摘要"}
    assert salvage_truncated('{"title": "退\udfff款", "summary": "cut') == {"title": "退?款"}


def test_a_quoted_brace_in_the_prose_before_the_answer_does_not_hide_it() -> None:
    # The scans take quotes outside any object for prose, so the quoted "{" opens a string that swallows the answer.
    answer = 'The object starts at "{": {"title": "Closing } brace", "summary": "x"}'
    assert extract_object(answer) == {"title": "Closing } brace", "summary": "x"}


def test_a_cut_off_answer_after_a_quoted_brace_is_salvaged_from_its_own_start() -> None:
    from kindex.jsonextract import salvage_truncated

    answer = 'Tip: "{" opens. {"title": "T", "summary": "}", "links": [{"path": "p", "why": ""'
    assert salvage_truncated(answer) == {"title": "T", "summary": "}", "links": [{"path": "p"}]}


def test_an_object_inside_a_malformed_cut_off_answer_is_not_taken_for_the_answer() -> None:
    from kindex.generators import _check_doc, _extract_or_salvage

    # The outer object lacks a comma and is cut off; its example question is a complete, plausible entry.
    answer = (
        '{"title": "Refund policy" "summary": "How refunds work", "questions": [{"title": "Can I get a refund?", '
        '"summary": "Yes, within 7 days", "tags": ["refund", "po'
    )
    with pytest.raises(AnswerError):
        _extract_or_salvage(answer, _check_doc)  # a repair request follows, not an inner object indexed


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_the_last_resort_parse_is_as_strict_as_json(number: str) -> None:
    with pytest.raises(AnswerError):
        extract_object(f'Note "{{": {{"title": "x", "summary": "y", "score": {number}}}')
