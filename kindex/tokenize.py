"""Text normalisation, terms for matching, and a CJK-aware token estimate.

The seed rule (SPEC §6.2): Latin words and numbers are terms; each run of Han characters becomes its single
characters plus overlapping pairs, so a Chinese question written without spaces still meets its document.
"""

from __future__ import annotations

import re
import unicodedata

_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
_TERM = re.compile(rf"(?P<han>[{_CJK_RANGES}]+)|(?P<word>[^\W_{_CJK_RANGES}]+)")
_CJK_CHAR = re.compile(rf"[{_CJK_RANGES}]")


def normalize(text: str) -> str:
    """NFKC plus case folding: full-width letters, compatibility forms and case all compare equal."""
    return unicodedata.normalize("NFKC", text).casefold()


def terms(text: str) -> list[str]:
    """Matching terms of ``text`` in order: Latin words, numbers, Han single characters and Han pairs."""
    out: list[str] = []
    for m in _TERM.finditer(normalize(text)):
        run = m.group("han")
        if run is None:
            out.append(m.group("word"))
            continue
        out.extend(run)
        out.extend(run[i : i + 2] for i in range(len(run) - 1))
    return out


def is_weak(term: str) -> bool:
    """A lone CJK character: evidence too common (的, 是, 如) to decide a match on its own."""
    return len(term) == 1 and _CJK_CHAR.match(term) is not None


def estimate_tokens(text: str) -> int:
    """A provider-neutral token estimate: about one token per CJK character, one per four other characters.

    Deliberately on the high side for CJK, so that a budget computed with it is not overrun by real tokenizers.
    """
    cjk = len(_CJK_CHAR.findall(text))
    return cjk + (len(text) - cjk + 3) // 4
