"""Fitting a document into a token budget: whole lines and whole fenced blocks, the head plus matching sections.

A cut never lands inside a fenced code block (CommonMark fences, shared with the scan), and a first block larger
than the budget is cut at a line, then at a character, never dropped.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence

from kindex.analysis import normalize
from kindex.markdown import Line, within
from kindex.markdown import lines as markdown_lines
from kindex.tokenize import estimate_tokens, tokens_of, units

OMITTED_MARK = "\n\n[…]\n\n"

SECTION_SCAN_CHARS = 20_000
"""Characters of each section looked at to tell whether it matches the question: bounded work per request."""
PAGE_SCAN_CHARS = 100_000
"""Characters of a page of one section (no heading below its title) looked through for the question's heaviest
term: five sections' worth. The whole page was, and a megabyte of characters that normalisation expands (﷽, 18
letters each) took seconds a call."""
MAX_FIT_CHARS = 1_000_000
"""Characters of a document a request reads, cleans and fits, at most (whole lines): the sections a question
matches lie anywhere in a long page (FastAPI's release notes run to 693,000), and a bound on the work of one
request; a 5 MB page of 640,000 headings took 3.4 s a call to parse whole."""


def _costs(lines: Sequence[Line]) -> list[int]:
    """Cumulative token estimates: ``cum[i]`` is exactly ``estimate_tokens`` of the first ``i`` lines."""
    cum = [0]
    total = 0
    for line in lines:
        total += units(line.text)
        cum.append(tokens_of(total))
    return cum


def _char_cut(line: str, budget: int) -> str:
    """The longest start of one oversized line within ``budget`` tokens, ending at a sentence end if that keeps
    most of it (a last resort: never inside a character)."""
    # No character costs less than a twentieth of a token (a space): the cut lies within budget × 20 characters.
    low, high = 0, min(len(line), max(budget, 0) * 20)
    while low < high:  # the longest start within the budget: the estimate grows with the length
        mid = (low + high + 1) // 2
        low, high = (mid, high) if estimate_tokens(line[:mid]) <= budget else (low, mid - 1)
    low = _grapheme_start(line, low)
    part = line[:low]
    end = max(part.rfind(mark) for mark in "。！？.!?;；")
    return part[: end + 1] if end >= len(part) // 2 else part


def _extends(ch: str) -> bool:
    """Whether ``ch`` belongs to the character before it, as a reader sees it: a combining, spacing or enclosing
    mark (accents, Indic and Thai vowel signs, a keycap), a joiner, a variation selector, a skin tone, an emoji
    tag, a Hangul vowel or final consonant."""
    return (
        unicodedata.category(ch) in ("Mn", "Mc", "Me")
        or ch in "\u200c\u200d"
        or "\ufe00" <= ch <= "\ufe0f"
        or "\U0001f3fb" <= ch <= "\U0001f3ff"
        or "\U000e0020" <= ch <= "\U000e007f"
        or "\U000e0100" <= ch <= "\U000e01ef"
        or "\u1160" <= ch <= "\u11ff"
        or "\ud7b0" <= ch <= "\ud7ff"
    )


def _regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _grapheme_start(line: str, at: int) -> int:
    """``at`` moved back to the start of the character a reader sees there, so a cut never leaves an accent
    without its letter, half a flag, an emoji joined to nothing or half a conjunct. Steps back over what extends
    the character before it (:func:`_extends`), and over the consonant a joiner or a virama binds to it."""
    while 0 < at < len(line) and (
        _extends(line[at]) or line[at - 1] == "\u200d" or unicodedata.combining(line[at - 1]) == 9
    ):
        at -= 1
    if 0 < at < len(line) and _regional(line[at]) and _regional(line[at - 1]):
        run = 0
        while run < at and _regional(line[at - 1 - run]):
            run += 1
        at -= run % 2  # flags are pairs: an odd run before the cut ends with half of one
    return at


def _cut(text: str, budget: int) -> str | None:
    """The longest start of ``text`` within ``budget`` tokens, cut where a reader expects it.

    Before a paragraph or a heading when that keeps at least half of what fits; else at a line outside code
    blocks; inside a code block larger than the room left, at a line, with the block closed by its own fence; and
    into one oversized line (a 40,000-character paragraph) at a sentence end or a character. ``None`` when not
    even a character fits.
    """
    if estimate_tokens(text) <= budget:
        return text
    if budget < 1:
        return None
    # No character costs less than a twentieth of a token: what fits lies within budget × 20 characters, and the
    # lines past them need no parse (a million short lines cost a second).
    text = text[: budget * 20 + 2]
    lines = markdown_lines(text)
    cum = _costs(lines)
    k = 0  # the most lines that fit
    while k < len(lines) and cum[k + 1] <= budget:
        k += 1
    # A cut before line i is inside a code block when one is open after line i - 1.
    inside = [False] + [ln.open_after for ln in lines]
    block = line = 0
    for i in range(1, k + 1):
        if not inside[i]:
            line = i
            starts_block = i == len(lines) or lines[i].heading is not None or lines[i - 1].blank
            if starts_block:
                block = i
    choice = block if block and cum[block] * 2 >= cum[line] else line
    closing = ""
    # What a cut into the block could keep: the lines that fit, or, when the line after them takes more than half
    # the budget alone (a one-line block of minified JSON), the budget itself, that line being cut into.
    reach = budget if k < len(lines) and (budget - cum[k]) * 2 > budget else cum[k]
    if cum[choice] * 2 < reach and inside[k]:  # a code block bigger than the room: cut in it, then close it
        fence = lines[k - 1].fence or "```"
        closing = "\n" + fence
        choice = k
        while choice and cum[choice] + estimate_tokens(closing) > budget:
            choice -= 1
    kept = text[: lines[choice].start].rstrip() if choice < len(lines) else text.rstrip()
    if not kept:
        closing = ""  # not even the block's opening line fits with its closing: no lone fence
    # The start of an oversized line joins what is kept as it stood: after a blank line it is a paragraph of its
    # own, and a single newline would merge it into the paragraph or heading before it.
    sep = ("\n\n" if lines[k - 1].blank else "\n") if kept and k else ""
    room = budget - cum[choice] - estimate_tokens(closing) - max(len(sep), 1)
    # Into a line of code only when the block is closed after it: a one-line block (minified JSON) larger than the
    # budget hands over its start, not an empty block.
    if choice == k and k < len(lines) and room * 2 > budget and (lines[k].fence is None or closing):
        kept = kept + sep + _char_cut(lines[k].text.rstrip("\r\n"), room)
    return (kept + closing).strip("\n") or None


def cut_to_budget(text: str, budget_tokens: int) -> str | None:
    """The longest start of ``text`` that fits ``budget_tokens``, cut at a paragraph, heading or line boundary.

    Never inside a character, never inside a fenced code block (one larger than the budget is closed after the
    cut). ``None`` when nothing fits.
    """
    return _cut(text, budget_tokens)


def fit_to_budget(text: str, budget: int, terms: Sequence[str], written: Mapping[str, str] | None = None) -> str | None:
    """``text`` within ``budget`` tokens: its head, then the sections that match the question best.

    A long document is rarely about the question from its first line on: the matching sections are what the
    agent needs, the head says what the document is. Sections keep their document order; gaps are marked.
    ``terms`` are the question's, heaviest first: a section too long to hand over whole gives its start, or, when
    that start misses the heaviest term it holds, its heading and the part from that term's first line on.
    A section matches a term when its normalised text holds the term or the word the question wrote for it
    (``written``: term → that word, normalised): an English stem is often no part of its word (``polici`` of
    "policy", ``retri`` of "retry"). ``None`` when nothing fits (a budget under one token).
    """
    if budget < 1:
        return None
    text = within(text, MAX_FIT_CHARS)
    wanted = {t: (t, w) if (w := (written or {}).get(t)) and w != t else (t,) for t in terms}
    if not wanted:
        return _cut(text, budget)
    # A page of one section (no heading below its title: an FAQ of collapsible blocks, a long note) hands over its
    # first line and the part from its heaviest match on: its start alone missed the answer 13,000 characters down.
    if "#" not in text:  # no heading, so one section: no need to parse a long page for its structure
        return _matching_part(text, budget, wanted.values(), PAGE_SCAN_CHARS)
    lines = markdown_lines(text)
    starts = [i for i, ln in enumerate(lines) if ln.heading and i > 0]
    bounds = [0, *starts, len(lines)]
    edges = [ln.start for ln in lines] + [len(text)]
    sections = [(edges[bounds[i]], edges[bounds[i + 1]]) for i in range(len(bounds) - 1)]
    if len(sections) < 2:
        return _matching_part(text, budget, wanted.values(), PAGE_SCAN_CHARS)
    scores = []
    for i, (s, e) in enumerate(sections[1:], start=1):
        sample = normalize(text[s : min(e, s + SECTION_SCAN_CHARS)])
        hits = sum(1 for forms in wanted.values() if any(f in sample for f in forms))
        if hits:
            scores.append((hits, i))
    if not scores:  # only the head can hold the match
        return _matching_part(text, budget, wanted.values(), PAGE_SCAN_CHARS)
    scores.sort(key=lambda x: (-x[0], x[1]))
    gap = estimate_tokens(OMITTED_MARK)
    head = _cut(text[sections[0][0] : sections[0][1]].rstrip(), max(budget // 3, 1))
    chosen: dict[int, str] = {0: head} if head else {}
    left = budget - (estimate_tokens(head) if head else 0)
    for _, i in scores:
        if left <= gap:
            break  # the budget is spent: the other sections' costs need not be worked out
        s, e = sections[i]
        piece = text[s:e].rstrip()
        cost = estimate_tokens(piece) + gap
        if cost <= left:
            chosen[i] = piece
            left -= cost
        elif len(chosen) <= 1:  # the best section does not fit whole: its start, or its heading and its match
            part = _matching_part(piece, left - gap, wanted.values())
            if part:
                chosen[i] = part
            break
    out = ""
    for i in sorted(chosen):
        whole_before = i - 1 in chosen and chosen[i - 1] == text[sections[i - 1][0] : sections[i - 1][1]].rstrip()
        if out:
            out += "\n\n" if whole_before else OMITTED_MARK
        out += chosen[i]
    return out or None


def _matching_part(
    piece: str, budget: int, wanted: Iterable[tuple[str, ...]], scan: int = SECTION_SCAN_CHARS
) -> str | None:
    """The start of section ``piece`` within ``budget``, unless that start misses the heaviest of the question's
    terms the section holds (``wanted``: heaviest first) in its first ``scan`` characters: then its heading, the
    gap mark and the section from the first line holding that term on (the fourth bullet of a list that answers,
    not the three before it), or from the opening fence of the code block that line is in: a cut never starts
    inside a block. Where the rest of the section from there is shorter than the budget, the lines before that
    line fill it (a match on a long page's last lines handed over 89 tokens of a 4,000-token budget). A first line
    that opens a code block is left out, not served open."""
    part = _cut(piece, budget)
    first, _, rest = piece.partition("\n")
    folded = normalize(rest[:scan])
    key = next((fs for fs in wanted if any(f in folded for f in fs)), None)
    if part is None or key is None or any(f in normalize(part[len(first) :]) for f in key):
        return part
    lines = markdown_lines(piece[: len(first) + 1 + scan])
    head = "" if lines[0].open_after else first  # a fence opened on the first line would never be closed
    gap = OMITTED_MARK if head else OMITTED_MARK.lstrip("\n")
    room = budget - estimate_tokens(head + gap)
    opening = 0
    for i, line in enumerate(lines):
        if line.fence is not None and (i == 0 or not lines[i - 1].open_after):
            opening = i  # a code block opens here
        if i and any(f in normalize(line.text) for f in key):
            start = opening if line.fence is not None else i
            if lines[start].start <= len(first):
                return part
            if lines[-1].start + len(lines[-1].text) == len(piece):  # the whole section was parsed
                start = _earliest_start(lines, start, room)
            if start == 1 and head:
                return _cut(piece, budget) or part  # from its first line on, whole: no gap to mark
            tail = _cut(piece[lines[start].start :], room)
            return head + gap + tail.strip("\n") if tail else part
    return part


def _earliest_start(lines: Sequence[Line], start: int, room: int) -> int:
    """The earliest of ``lines`` (the first aside) from which the rest, through ``lines[start]`` to the end, fits
    ``room`` tokens, outside code blocks; ``start`` when nothing before it does. A backward walk: linear."""
    left = room * 100 - sum(units(line.text) for line in lines[start:])
    best = start
    for i in range(start - 1, 0, -1):
        left -= units(lines[i].text)
        if left < 0:
            break
        if not lines[i - 1].open_after and not lines[i].blank:
            best = i
    return best


def one_line(value: str) -> str:
    """A title or path as one line of the header: a newline in a file name must not forge prompt lines."""
    return value.replace("\r", "\\r").replace("\n", "\\n")
