"""The budget's token estimate against real tokenizers (SPEC §6.5: it must not undercount common ones), read from
the files litellm ships, so offline."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kindex.fitting import cut_to_budget
from kindex.tokenize import estimate_tokens, tokens_of, units

SAMPLE_KB = Path(__file__).resolve().parent.parent / "sample_kb"
OTHER_SCRIPTS = [
    "안녕하세요. 환불은 보통 영업일 기준 3~5일 이내에 처리됩니다. 계정 설정에서 알림을 변경할 수 있습니다.",
    "Возврат средств обычно занимает от трёх до пяти рабочих дней. Проверьте сетевые настройки.",
    "การคืนเงินมักใช้เวลาสามถึงห้าวันทำการ ขึ้นอยู่กับวิธีการชำระเงิน",
    "返金は通常、三から五営業日以内に処理されます。",
    "好的👍 收到🎉 退款✅ 😀😃😄 👨‍👩‍👧",
    "def handler(request: Request) -> Response:\n    return JSONResponse({'ok': True}, status_code=200)\n",
    "| 参数 | 类型 | 默认值 |\n|---|---|---|\n| timeout | int | 3000 |\n| retries | int | 3 |\n",
]


def _tokenizers(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    spec = importlib.util.find_spec("litellm")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("litellm (and the tokenizer files it ships) is not installed")
    files = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    if not (files / "anthropic_tokenizer.json").is_file():
        pytest.skip(f"litellm no longer ships its tokenizer files in {files}")
    # tiktoken's files, named as its cache names them: no download.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(files))
    import tiktoken
    from tokenizers import Tokenizer

    anthropic = Tokenizer.from_file(str(files / "anthropic_tokenizer.json"))
    deepseek = Tokenizer.from_file(str(files / "deepseek_tokenizer.json"))
    cl100k, o200k = tiktoken.get_encoding("cl100k_base"), tiktoken.get_encoding("o200k_base")
    return {
        "cl100k": lambda t: len(cl100k.encode(t, disallowed_special=())),
        "o200k": lambda t: len(o200k.encode(t, disallowed_special=())),
        "anthropic": lambda t: len(anthropic.encode(t).ids),
        "deepseek": lambda t: len(deepseek.encode(t).ids),
    }


def test_the_estimate_never_undercounts_common_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    # One token per Chinese character and one per four other characters undercounted cl100k on most files: a
    # context of 6,000 estimated tokens was up to 7,900 of GPT-4's, and Korean 5 times its estimate.
    texts = [p.read_text(encoding="utf-8") for p in sorted(SAMPLE_KB.rglob("*.md"))] + OTHER_SCRIPTS
    for name, count in _tokenizers(monkeypatch).items():
        for text in texts:
            assert estimate_tokens(text) >= count(text), (name, text[:60])  # type: ignore[operator]


def test_the_estimate_is_additive_and_cuts_stay_within_budget() -> None:
    text = "# 标题\n\n" + "退款一般三到五个工作日到账。Refunds take 3-5 days. " * 300
    lines = text.splitlines(keepends=True)
    assert sum(units(line) for line in lines) == units(text)
    assert tokens_of(units(text)) == estimate_tokens(text) and estimate_tokens("") == 0
    for budget in (1, 7, 50, 333):
        cut = cut_to_budget(text, budget)
        assert cut is None or estimate_tokens(cut) <= budget
    one_line = "x" * 10_000  # cut into at a character: as much as fits, not three quarters of it
    cut = cut_to_budget(one_line, 100)
    assert cut is not None and estimate_tokens(cut) <= 100 < estimate_tokens(one_line[: len(cut) + 3])
