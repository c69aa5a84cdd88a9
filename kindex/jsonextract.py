"""Recover the one JSON object a model was asked for from whatever it actually wrote (SPEC §4)."""

from __future__ import annotations

from typing import Any

import orjson

from kindex.errors import AnswerError

# A summary answer is a few hundred characters; anything far longer is runaway generation, not an entry.
MAX_ANSWER_CHARS = 200_000


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

    start = text.find("{")
    if start < 0:
        raise AnswerError("the answer holds no JSON object")
    saw_unclosed = False
    while start >= 0:
        end = _balanced_end(text, start)
        if end < 0:
            saw_unclosed = True
        else:
            try:
                obj = orjson.loads(text[start : end + 1])
            except orjson.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                return obj
        start = text.find("{", start + 1)
    if saw_unclosed:
        raise AnswerError("the answer's JSON object is not closed (truncated output?)")
    raise AnswerError("the answer holds braces but no valid JSON object")


def _balanced_end(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``start``, honouring JSON strings; -1 if it never closes."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1
