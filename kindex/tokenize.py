"""A provider-neutral token estimate for budgets (SPEC §6.5)."""

from __future__ import annotations

import re

_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef]")


def estimate_tokens(text: str) -> int:
    """About one token per CJK character, one per four other characters.

    Deliberately on the high side for CJK, so that a budget computed with it is not overrun by real tokenizers.
    """
    cjk, other = char_counts(text)
    return tokens_of(cjk, other)


def char_counts(text: str) -> tuple[int, int]:
    """(CJK characters, other characters): what the estimate is made of, additive over pieces of a text."""
    cjk = len(_CJK_CHAR.findall(text))
    return cjk, len(text) - cjk


def tokens_of(cjk: int, other: int) -> int:
    """The estimate for a text of ``cjk`` CJK and ``other`` other characters."""
    return cjk + (other + 3) // 4
