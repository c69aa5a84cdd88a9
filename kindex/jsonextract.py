"""Recover the one JSON object a model was asked for from whatever it actually wrote (SPEC §4)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import orjson

from kindex.errors import AnswerError

TRUNCATED = "the answer's JSON object is not closed (truncated output?)"
"""Said of an answer cut off by the token limit (generation adds advice to a run's failures that say it)."""

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
    do what was asked, and so is one that could not be written back as JSON (the answer cache keeps it). Raises
    :class:`AnswerError` saying why nothing usable was found.
    """
    obj = _extract(text)
    try:
        orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError) as exc:
        # The parsers read 1,024 levels and integers of any size; orjson writes 254 levels and 64-bit integers, and
        # the run crashed caching the answer (every later run again, since nothing was kept).
        raise AnswerError(f"the answer's JSON object cannot be kept: {exc}") from None
    return obj


def _extract(text: str) -> dict[str, Any]:
    if not text or not text.strip():
        raise AnswerError("the answer is empty")
    if len(text) > MAX_ANSWER_CHARS:
        raise AnswerError(f"the answer is {len(text)} characters long, more than {MAX_ANSWER_CHARS}")
    text = _encodable(text)
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
    # A quoted "{" in the prose flips the scans' idea of what is inside a string: parse from each of the first
    # few braces as a JSON parser would, which knows where its value ends (bounded: MAX_RAW_STARTS parses).
    found = _first_object_parsed_from_a_brace(text)
    if found is not None:
        return found
    if unclosed:
        raise AnswerError(TRUNCATED)
    raise AnswerError("the answer holds braces but no valid JSON object")


MAX_RAW_STARTS = 32


def _not_json(value: str) -> float:
    raise AnswerError(f"{value} is no JSON number")


def _finite(value: str) -> float:
    number = float(value)
    if math.isinf(number):
        raise AnswerError(f"{value} is no finite number")
    return number


def _int(value: str) -> int | float:
    number = int(value)
    return number if -(2**63) <= number < 2**64 else _finite(value)  # beyond 64 bits a float, as orjson reads it


# As strict as the parser of the other paths (orjson): no NaN, no Infinity, no 1e999.
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite, parse_int=_int)


def _first_object_parsed_from_a_brace(text: str) -> dict[str, Any] | None:
    start = text.find("{")
    for _ in range(MAX_RAW_STARTS):
        if start < 0:
            return None
        try:
            obj, _end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError, AnswerError):
            pass
        else:
            if isinstance(obj, dict):
                return _without_surrogates(obj)
        start = text.find("{", start + 1)
    return None


def _without_surrogates(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with each lone surrogate its escapes decoded to (``"\\ud83d"``, half an emoji, which this parser
    takes and orjson refuses) made a ``?``: no UTF-8 encodes one, and the answer cache could not store the entry."""
    dumped = json.dumps(obj, ensure_ascii=False)
    cleaned = _encodable(dumped)
    return obj if cleaned is dumped else dict(orjson.loads(cleaned))


def _encodable(text: str) -> str:
    """``text`` with each lone surrogate (a provider's broken ``\\ud800`` escape) made a ``?``: the JSON parser
    refuses the whole answer over one, where the rest of it is a usable entry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _structure(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """The brackets and commas of ``text`` from ``start`` that lie outside JSON strings, with their indices.

    Quotes count as strings only inside an object, so prose before the object cannot hide it.
    """
    depth = 0  # of braces, as the object scan counts them
    in_string = escaped = False
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
            in_string = depth > 0
        elif ch in "{}[],":
            if ch == "{":
                depth += 1
            elif ch == "}" and depth:
                depth -= 1
            yield i, ch


def _object_spans(text: str) -> list[tuple[int, int]]:
    """Every ``{`` outside JSON strings with the index of its closing ``}`` (-1 if it never closes), by start.

    One pass with a stack: linear in the answer, whatever its shape (a per-brace scan was quadratic on "{" * n).
    """
    spans: list[tuple[int, int]] = []
    stack: list[int] = []
    for i, ch in _structure(text):
        if ch == "{":
            stack.append(len(spans))
            spans.append((i, -1))
        elif ch == "}" and stack:
            at = stack.pop()
            spans[at] = (spans[at][0], i)
    return spans


def salvage_truncated(text: str) -> dict[str, Any] | None:
    """The complete part of a JSON object whose end was cut off (``max_tokens`` reached), or ``None``.

    The object is cut after its last complete value, at whatever depth, and closed: a small model that loops on
    tags keeps its title, summary and the tags it finished; a root answer cut inside its ``themes`` list keeps the
    themes it wrote (the caller fills in the rest and checks it all). Linear, like the scan above.
    """
    if len(text) > MAX_ANSWER_CHARS:
        return None
    text = _encodable(text)
    # Objects closed before the answer ("Here is {doc}: {…cut off") are stepped over, and so is a quoted "{" in the
    # prose, which would start a reading with the answer's strings inside out. The first object that does not
    # close is the answer: when its cut does not parse, nothing inside it is taken for it instead.
    start = _next_brace(text, 0)
    for _ in range(FRESH_SCANS):
        if start < 0:
            return None
        cut = _last_complete_value(text, start)
        if isinstance(cut, int):  # closed at that index
            start = _next_brace(text, cut + 1)
            continue
        if cut is None:
            return None
        end, closers = cut
        try:
            obj = orjson.loads(text[start:end] + closers)
        except orjson.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) and obj else None
    return None


def _next_brace(text: str, at: int) -> int:
    """The next ``{`` from ``at`` that is not a quoted one (``"{"`` in prose), or -1."""
    start = text.find("{", at)
    while start > 0 and text[start - 1 : start] == '"' and text[start + 1 : start + 2] == '"':
        start = text.find("{", start + 1)
    return start


_Open = tuple[str, "_Open | None"]
"""The containers open at a point, innermost first, as a shared linked list: a snapshot costs nothing."""


def _last_complete_value(text: str, start: int) -> tuple[int, str] | int | None:
    """Where the unclosed object at ``text[start]`` can be cut after its last complete value, and the closing
    brackets that then end it; the index of its closing brace if it closes after all; ``None`` if no value inside
    it was complete or a bracket closes nothing open (malformed, not cut off).

    A comma follows a complete value (an array item or an object member), and so does a nested container's close.
    The open containers at each such point are kept as an immutable linked list, so recording the point is O(1)
    and the pass stays linear even on ``[[[[…`` runs.
    """
    open_: _Open | None = None
    best: tuple[int, _Open | None] | None = None
    for i, ch in _structure(text, start):
        if ch in "{[":
            open_ = ("}" if ch == "{" else "]", open_)
        elif ch in "}]":
            if open_ is None or open_[0] != ch:
                return None  # a bracket that closes nothing open: malformed (or misread from here), not cut off
            open_ = open_[1]
            if open_ is None:
                return i  # the object closed after all: nothing was cut off
            best = (i + 1, open_)
        elif open_ is not None:  # a comma
            best = (i, open_)
    if best is None:
        return None
    end, rest = best
    closers = []
    while rest is not None:
        closers.append(rest[0])
        rest = rest[1]
    return end, "".join(closers)
