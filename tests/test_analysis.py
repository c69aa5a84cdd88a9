"""The light path of Chinese segmentation cuts exactly as rjieba does, and a one-shot question never builds rjieba."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import rjieba

from kindex import analysis

FIXED = [
    "今天上海会下雨吗出门要不要带伞",
    "主从复制怎么配置",
    "word怎么自动生成目录",
    "如何配置限流插件并且设置每秒请求数",
    "中华人民共和国成立了",
    "手机上记的账电脑上怎么看不到",
    "锟斤拷烫烫烫屯屯屯",  # rare characters: the HMM's territory
    "𠀀𠀁𠀂测试",
]


def _han_runs(sample_kb: Path) -> list[str]:
    texts = [p.read_text(encoding="utf-8") for p in sorted(sample_kb.rglob("*.md"))]
    runs = [m.group("han") for t in texts for m in analysis._TOKEN.finditer(t) if m.group("han")]
    return FIXED + runs


def test_the_light_path_cuts_exactly_as_rjieba(sample_kb: Path) -> None:
    runs = _han_runs(sample_kb)
    assert len(runs) > 500
    for run in runs:
        light = analysis._Segmenters()  # a fresh budget: every text on the light path
        segmenter = light.for_text(run)
        assert segmenter is not rjieba, "the light path is unavailable"
        assert segmenter.cut(run) == rjieba.cut(run), run
        assert segmenter.cut_for_search(run) == rjieba.cut_for_search(run), run
        pieces = {run[i : i + n] for n in (1, 2, 3, 4) for i in range(len(run) - n + 1)}
        for piece in pieces | set(rjieba.cut(run)):
            assert segmenter.has_word(piece) == rjieba.has_word(piece), piece
            assert segmenter.suggest_freq(piece) == rjieba.suggest_freq(piece), piece


def test_after_its_budget_a_process_uses_the_full_segmenter() -> None:
    segmenters = analysis._Segmenters()
    assert segmenters.for_text("退款多久到账") is not rjieba
    assert segmenters.for_text("退" * analysis.LIGHT_BUDGET) is rjieba
    assert segmenters.for_text("退款") is rjieba  # and stays there


@pytest.mark.slow
def test_a_one_shot_question_does_not_build_the_full_dictionary(sample_kb: Path) -> None:
    import kindex

    kindex.reindex(sample_kb)
    script = (
        "import sys\n"
        "from kindex.cli import main\n"
        "try:\n"
        f"    main(['context', {str(sample_kb)!r}, '退款一般多久能到账'], standalone_mode=False)\n"
        "finally:\n"
        "    print('rjieba built:', 'rjieba' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert "退款政策" in done.stdout and done.stdout.rstrip().endswith("rjieba built: False")


def _with_total(table: bytes, total: int) -> bytes:
    out = bytearray(table)
    struct.pack_into("<Q", out, len(analysis._MAGIC) + 4, total)
    return bytes(out)


def _table_at(tmp_path: Path, table: bytes | None) -> Path:
    """A path holding ``table`` (``None``: nothing there)."""
    path = tmp_path / "words.bin"
    if table is not None:
        path.write_bytes(table)
    return path


@pytest.mark.parametrize(
    "table",
    [
        None,
        b"not a table",
        b"",
        analysis._MAGIC + b"\x01",
        analysis._WORDS_FILE.read_bytes()[:4000],
        analysis._WORDS_FILE.read_bytes()[:-1],
        _with_total(analysis._WORDS_FILE.read_bytes(), 0),  # frequencies that do not add up
    ],
    ids=["missing", "not a table", "empty", "header only", "first 4000 bytes", "last byte cut", "bad total"],
)
def test_without_a_usable_word_table_the_full_segmenter_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: bytes | None
) -> None:
    monkeypatch.setattr(analysis, "_WORDS_FILE", _table_at(tmp_path, table))
    assert analysis._Segmenters().for_text("退款多久到账") is rjieba


def test_english_rates_are_by_stem_and_names_have_none() -> None:
    # tools/build_en_words.py: Google Books counts, by the analyzer's stem; a name English does not hold has none.
    rate = analysis.english_rate
    assert rate("thank") and rate("joke") and rate("weather")
    assert rate("weather") > rate("joke") > rate("thank")  # type: ignore[operator]
    assert rate("fastapi") is None and rate("websocket") is None and rate("退款") is None and rate("the") is None


def test_english_rates_are_kept_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(analysis, "_english_rates", {})
    monkeypatch.setattr(analysis, "MAX_KEPT_RATES", 3)
    words = ["thank", "joke", "weather", "zqxv", "qqzzx"]
    first = [analysis.english_rate(w) for w in words]
    assert list(analysis._english_rates) == words[:3]  # the rest looked up, not kept
    assert [analysis.english_rate(w) for w in words] == first and first[3] is None and first[0]


@pytest.mark.parametrize("table", [None, b"not a table", analysis._EN_MAGIC + b"\x01"], ids=["missing", "junk", "cut"])
def test_without_a_usable_english_table_no_word_has_a_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: bytes | None
) -> None:
    monkeypatch.setattr(analysis, "_EN_FILE", _table_at(tmp_path, table))
    monkeypatch.setattr(analysis, "_english", [])
    monkeypatch.setattr(analysis, "_english_rates", {})
    assert analysis.english_rate("thank") is None


def test_the_kb_vocabulary_keeps_words_the_segmenter_cuts_apart_but_no_stop_words_alone() -> None:
    # 时区 is 时 (a stop word) + 区 to jieba; 请用 is 请 + 用, both stop words: a heading "请用 HTTPS" must not make
    # every "请用中文…" match it.
    assert analysis.vocabulary(["时区", "请用 HTTPS", "会用", "企业采购", "数据的导入"]) == {"时区", "企业采购"}


def test_traditional_characters_are_read_as_simplified_ones() -> None:
    assert analysis.analyze("如何開啟雙重驗證？發票怎麼開") == analysis.analyze("如何开启双重验证？发票怎么开")
    assert analysis.analyze("啟動伺服器") == analysis.analyze("启动伺服器")  # Taiwan's form of 啓 too
    assert analysis.vocabulary(["企業採購"]) == {"企业采购"}
    assert analysis.normalize("發票 ＡＰＩ") == "发票 api"
    # Characters simplified text also writes as they are (乾坤, 瞭望, 覆盖) stay: simplified documents keep their words.
    assert analysis.simplified("乾坤瞭覆") == "乾坤瞭覆"
    # Taiwan's everyday forms that mainland text writes at most as variants are mapped (關於 is 关于); and the
    # mainland's own variant 帐 meets 账, as Taiwan's 帳 does: 帳號, 帐号 and 账号 are one word.
    assert analysis.simplified("關於什麽 帳號 帐号 記帳") == "关于什么 账号 账号 记账"
    traditional, simple = analysis._T2S_FILE.read_text(encoding="utf-8").splitlines()
    assert len(traditional) == len(simple) == len(set(traditional)) > 4000
    assert all(t != s for t, s in zip(traditional, simple, strict=True))
    assert not set(simple) & set(traditional)  # one pass reads as two: 薴 → 苎, not 苧 (itself mapped to 苎)


def test_values_are_urls_addresses_and_words_mixing_letters_and_digits() -> None:
    assert analysis.value_terms("退款多久到账 用户 zhangsan01") == {"zhangsan01", "zhangsan"}
    assert analysis.value_terms("错误0x80180014怎么办") == {"0x80180014"}
    assert analysis.value_terms("设备 DESKTOP-8F3K2J") == {"desktop-8f3k2j", "desktop"}
    assert analysis.value_terms("john.doe@contoso.com 退款") >= {"john", "contoso"}
    url = analysis.value_terms("访问https://portal.contoso.cn/x报错")  # no space between Chinese and the URL
    assert {"portal", "contoso"} <= url and not url & {"访问", "报错"}
    assert analysis.value_terms("contoso 和 zhangsan01") == {"zhangsan01", "zhangsan"}  # contoso is said as a word
    assert analysis.value_terms("2024年的发票 CORS middleware") == frozenset()  # numbers and words are no values
    assert analysis.value_terms("改一下 src/App.tsx 的组件") == {"src", "app.tsx", "app", "tsx"}
    assert analysis.value_terms("在docs/guide/里") == {"doc", "guid"}
    assert analysis.value_terms("TCP/IP、CI/CD 和 and/or，Node.js") == frozenset()  # words and names, no paths
    assert analysis.value_terms("见src/App.tsx，报错") == {"src", "app.tsx", "app", "tsx"}
    assert analysis.value_terms("a1" * 100_000) == frozenset()  # longer than any word: no term at all
    # 200,000 values in one 1.5 MB line without a space: linear (cutting each out of the line took 145 s).
    assert len(analysis.value_terms(",".join(f"a{i}" for i in range(200_000)))) == 200_000
    assert len(analysis.value_terms(",".join(f"d/x{i}.md" for i in range(200_000)))) == 200_002  # and of paths


def test_letters_of_every_script_split_alike_and_lose_their_accents() -> None:
    # Accented letters used to be cut off as parts of their own: Zürich gave zürich and rich, résumé gave sum,
    # so a question about Zürich matched pages about rich clients.
    # And their accents are taken off, as people type names without them; other scripts' marks stay.
    assert analysis.analyze("Zürich café résumé naïve") == ["zurich", "cafe", "resum", "naiv"]
    assert analysis.analyze("CaféBar getHTTPResponse") == [
        "cafebar",
        "cafe",
        "bar",
        "gethttpresponse",
        "http",
        "respons",
    ]
    assert analysis.identifier_terms("ÉtatCivilRecord naïveBayes") == {
        "etatcivilrecord": ("etat", "civil", "record"),
        "naivebayes": ("naiv", "bay"),
    }
    assert analysis.analyze("がぎ 한국어 Ærø") == ["が", "ぎ", "한국어", "ærø"]


def test_a_letter_without_a_capital_takes_its_neighbours_case() -> None:
    # ß is lower case with no single capital: STRAßE was cut as camel case into str and ass.
    assert analysis.analyze("STRAßE Straße MAßNAHME") == ["strass", "strass", "massnahm"]
    assert analysis.analyze("fooßBar") == ["foossbar", "fooss", "bar"]


def test_identifiers_are_snake_case_header_names_camel_case_or_letters_with_digits() -> None:
    assert analysis.identifier_terms("next_cursor 怎么用") == {"next_cursor": ("next", "cursor")}
    assert analysis.identifier_terms("X-Nonce 和 x-request-id") == {
        "x-nonce": ("nonc",),
        "x-request-id": ("request", "id"),
    }
    assert analysis.identifier_terms("useEffect") == {"useeffect": ("effect",)}
    assert analysis.identifier_terms("MDMWinsOverGP") == {"mdmwinsovergp": ("mdm", "win", "over", "gp")}
    assert analysis.identifier_terms("报 0x87D1041C, HMAC-SHA256") == {"0x87d1041c": (), "hmac-sha256": ("hmac", "sha")}
    # Product names and prose are not identifiers: two-part capitalised camel case, hyphenated words in any case
    # (a header without the X- prefix looks like High-Performance), one capital, a number left by a contraction.
    prose = "GreptimeDB PowerShell iPhone built-in Built-in Content-Type High-Performance CHECK-IN __init__ 2.15 1'd"
    assert analysis.identifier_terms(prose) == {}
    assert len(analysis.identifier_terms(" ".join(f"ab_{i}x" for i in range(100_000)))) == 100_000  # linear


def test_c_sharp_and_c_plus_plus_are_names_of_their_own() -> None:
    # C#, C++ and C were one term (``c``) and one title key: `C#` ranked the page titled C first.
    assert analysis.analyze("C# 和 C++ 教程") == ["c", "c#", "c", "c++", "教程"]
    assert analysis.analyze("Notepad++") == ["notepad", "notepad++"]
    # A version after the name: C++17, C#10 (one letter), as a hostile campaign asked.
    assert analysis.analyze("C++17 与 C#10") == ["c", "c++", "17", "c", "c#", "10"]
    assert [analysis.title_key(t) for t in ("C", "C#", "c# ?", "C++", "C#教程")] == ["c", "c#", "c#", "c++", "c#教程"]
    # Not a name: a '#' or '+' before a letter or digit, after a digit, or standing apart.
    assert analysis.analyze("issue#12 a+b x2# C ++") == ["issu", "12", "b", "x2", "c"]
    assert [analysis.title_key(t) for t in ("A+B", "A + B", "issue#12", "## 标题")] == ["ab", "ab", "issue12", "标题"]
    # No letter right before: no suffix.
    assert [analysis.title_key(t) for t in ("++ 运算符", "# 标题 #", "x++y")] == ["运算符", "标题", "xy"]
    assert analysis.surface_forms("c#?")["c#"] == "c#" and analysis.surface_forms("C++")["c++"] == "C++"
    # Typed full-width, shown as typed (it read "c#"); a version after it stays a number of its own.
    assert (
        analysis.surface_forms("Ｃ＃ 和 Ｃ＋＋17")["c#"] == "Ｃ＃"
        and analysis.surface_forms("Ｃ＋＋17")["c++"] == "Ｃ＋＋"
    )


def test_the_english_a_chinese_question_pastes_is_read_as_prose_and_code() -> None:
    # Error messages pasted into Chinese questions fell back: their English words (recent, present, policy) and code
    # names (model_attributes_type, GraphMemoryExceeded) weighed as other products' names.
    got = analysis.pasted_english(
        "报错 Traceback (most recent call last): fastapi.exceptions.FastAPIError: Invalid args，"
        '{"type":"model_attributes_type"} GraphMemoryExceeded TypeError 再用 MySQL PowerShell 和 x2y 查'
    )
    assert {"recent", "call", "last", "invalid"} <= got.prose and "traceback" not in got.prose  # no English word
    assert got.compounds == {
        "fastapi.exceptions.fastapierror": ("fastapi", "except", "fast", "api", "error"),
        "model_attributes_type": ("model", "attribut", "type"),
        "graphmemoryexceeded": ("graph", "memori", "exceed"),
        "typeerror": ("type", "error"),  # an exception's name, not a product's
    }
    # Names a Chinese sentence drops in are not pasted English: fewer than three words in a row.
    for question in ("Nginx 怎么用 limit_req 按 IP 限流", "Word 和 Excel 怎么合并", "tokio 的 spawn_blocking 是什么"):
        assert analysis.pasted_english(question) == analysis.Pasted(frozenset(), {}), question
    # Products' names and values stay out even in a run: MySQL, PowerShell (two capitalised parts), x2y (a value).
    assert not analysis.pasted_english("run MySQL PowerShell x2y GitHub now").compounds
