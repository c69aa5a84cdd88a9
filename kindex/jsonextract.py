"""Recover the one JSON object a model was asked for from whatever it actually wrote (SPEC §4)."""

from __future__ import annotations

from typing import Any

import orjson

from kindex.errors import AnswerError

# A summary answer is a few hundred characters; anything far longer is runaway generation, not an entry.
MAX_ANSWER_CHARS = 200_000
MAX_CANDIDATES = 1_000
FRESH_SCANS = 4
"""Objects tried in order of their opening brace: bounds the parsing an adversarial answer can cause."""


def extract_object(text: str) -> dict[str, Any]:
    """Return the first balanced ``{…}`` of ``text`` that parses as a JSON object.

    A clean answer is taken as it is. Otherwise prose, code fences and trailing objects around the first object
    are ignored; braces and quotes inside JSON strings (with their escapes) do not confuse the scan. An answer that
    is valid JSON but not an object (an array, a string) is refused rather than searched, since the model did not
    do what was asked. Raises :class:`AnswerError` saying why nothing usable was found.
    """
    if not text or not text.strip():
        raise AnswerError("the answer is empty")
    if len(text) > MAX_ANSWER_CHARS:
        raise AnswerError(f"the answer is {len(text)} characters long, more than {MAX_ANSWER_CHARS}")
    try:
        whole = orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    else:
        if isinstance(whole, dict):
            return whole
        raise AnswerError(f"the answer is a JSON {type(whole).__name__}, not an object")

    pairs = _object_spans(text)
    if not pairs and "{" not in text:
        raise AnswerError("the answer holds no JSON object")
    for start, end in pairs[:MAX_CANDIDATES]:
        if end < 0:
            continue
        try:
            obj = orjson.loads(text[start : end + 1])
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    # A stray "{" in the prose before the object shifts the single pass's idea of strings: rescan from the first
    # few unclosed braces afresh (a bounded number of linear scans).
    unclosed = [start for start, end in pairs if end < 0]
    for start in unclosed[:FRESH_SCANS]:
        for s, e in _object_spans(text[start + 1 :]):
            if e >= 0:
                try:
                    obj = orjson.loads(text[start + 1 + s : start + 2 + e])
                except orjson.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    return obj
    if unclosed:
        raise AnswerError("the answer's JSON object is not closed (truncated output?)")
    raise AnswerError("the answer holds braces but no valid JSON object")


def _object_spans(text: str) -> list[tuple[int, int]]:
    """Every ``{`` outside JSON strings with the index of its closing ``}`` (-1 if it never closes), by start."""
    return _scan(text)[0]


def _scan(text: str) -> tuple[list[tuple[int, int]], list[int]]:
    """Object spans (see :func:`_object_spans`) and the commas directly inside the first object.

    One pass with a stack: linear in the answer, whatever its shape (a per-brace scan was quadratic on "{" * n).
    Quotes count as strings only inside an object, so prose before the object cannot hide it.
    """
    spans: list[tuple[int, int]] = []
    commas: list[int] = []
    stack: list[int] = []
    depth = 0  # of objects and arrays, inside the first object
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"' and stack:
            in_string = True
        elif ch == "{":
            stack.append(len(spans))
            spans.append((i, -1))
            depth += 1 if spans[0][1] < 0 else 0
        elif ch == "}" and stack:
            at = stack.pop()
            spans[at] = (spans[at][0], i)
            depth -= 1 if depth else 0
        elif spans and spans[0][1] < 0:
            if ch == "[":
                depth += 1
            elif ch == "]":
                depth -= 1
            elif ch == "," and depth == 1:
                commas.append(i)
    return spans, commas


def salvage_truncated(text: str) -> dict[str, Any] | None:
    """The complete members of a JSON object whose end was cut off (``max_tokens`` reached), or ``None``.

    A small model that loops on tags runs out of tokens with its title and summary long finished: the object up to
    its last complete member, closed, is a usable entry (the caller still checks it). Linear, like the scan above.
    """
    if len(text) > MAX_ANSWER_CHARS:
        return None
    for _ in range(FRESH_SCANS):  # "Here is {doc}: {…cut off": skip a few closed braces of prose first
        spans, commas = _scan(text)
        if not spans:
            return None
        if spans[0][1] >= 0:
            text = text[spans[0][1] + 1 :]
            continue
        if not commas:  # not one complete member
            return None
        try:
            obj = orjson.loads(text[spans[0][0] : commas[-1]] + "}")
        except orjson.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) and obj else None
    return None
