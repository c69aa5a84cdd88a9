"""A provider-neutral token estimate for budgets (SPEC §6.5)."""

from __future__ import annotations

import re

_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef]")


def estimate_tokens(text: str) -> int:
    """About one token per CJK character, one per four other characters.

    Deliberately on the high side for CJK, so that a budget computed with it is not overrun by real tokenizers.
    """
    cjk = len(_CJK_CHAR.findall(text))
    return cjk + (len(text) - cjk + 3) // 4
