"""BuildContext: matching, fallback, globs, budget, caching and errors."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import kindex
import kindex.analysis
import kindex.fitting
import kindex.globs
import kindex.kb
import kindex.markdown
import kindex.retrieve
from kindex import DocItem, Index, IndexMissingError, ThemeItem, searchindex
from kindex.cli import main
from kindex.fitting import OMITTED_MARK, cut_to_budget, fit_to_budget
from kindex.scan import document_start
from kindex.store import write_index
from kindex.tokenize import estimate_tokens


def _doc(path: str, title: str, summary: str, tags: tuple[str, ...] = (), paths: tuple[str, ...] = ()) -> DocItem:
    return DocItem(path=path, title=title, summary=summary or title, tags=tags, paths=paths)


def _theme(name: str, title: str, summary: str, tags: tuple[str, ...] = ()) -> ThemeItem:
    return ThemeItem(dir=name, title=title, summary=summary or title, tags=tags)


@pytest.fixture
def indexed(sample_kb: Path) -> Path:
    kindex.reindex(sample_kb)
    return sample_kb


def make_kb(root: Path, docs: dict[str, tuple[DocItem, str]], themes: tuple[ThemeItem, ...] = ()) -> Path:
    """A KB whose index is written by hand: {relative path: (entry, file text)}."""
    root_docs: list[DocItem] = []
    by_theme: dict[str, list[DocItem]] = {}
    for rel, (item, text) in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
        if "/" in rel:
            by_theme.setdefault(rel.split("/", 1)[0], []).append(item)
        else:
            root_docs.append(item)
    all_themes = themes or tuple(_theme(name, name, "") for name in by_theme)
    write_index(root / "index.json", Index(themes=all_themes, documents=tuple(root_docs)))
    for name, items in by_theme.items():
        write_index(root / name / "index.json", Index(documents=tuple(items)))
    return root


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("退款一般多久能到账", "billing/退款政策.md"),
        ("手机上记的账电脑上怎么看不到", "sync/多设备同步.md"),
        ("两台设备同时改了一条记录数据被覆盖了", "sync/同步冲突处理.md"),
        ("接口签名老是失败怎么办", "developer/API快速入门.md"),
        ("开了两步验证手机丢了登不上", "account/双重验证.md"),
        ("how many requests per second can my app send", "developer/rate-limits.md"),
    ],
)
def test_a_question_without_spaces_finds_its_document(indexed: Path, question: str, expected: str) -> None:
    ctx = kindex.build_context(indexed, question)

    assert not ctx.fallback
    assert ctx.items[0].path == expected and ctx.items[0].level == "document"
    assert ctx.items[0].reason == "matched" and ctx.items[0].matched
    assert f"(source: {expected})" in ctx.text


def test_single_characters_and_function_pairs_do_not_select_an_entry(tmp_path: Path) -> None:
    kb = make_kb(
        tmp_path,
        {
            "导读.md": (_doc("导读.md", "导读", "入门"), "# 导读\n欢迎"),
            "t/x.md": (_doc("x.md", "的是如何", "的是如何处理", ("如何",)), "# x"),
        },
    )
    ctx = kindex.build_context(kb, "今天是星期几，如何是好的")

    assert ctx.fallback and [i.path for i in ctx.items] == ["导读.md"]


def test_off_topic_messages_get_the_overview_documents_with_the_reason(indexed: Path) -> None:
    for message in ("今天北京天气怎么样", "给我写一首关于春天的诗", "你好", "", "   \n"):
        ctx = kindex.build_context(indexed, message)
        assert ctx.fallback, message
        assert [i.path for i in ctx.items] == ["导读.md", "00-总则与功能导航.md"]
        assert all(i.reason == "fallback" for i in ctx.items)
        assert "overview" in ctx.reason


def test_glob_entries_enter_only_with_a_matching_path(indexed: Path) -> None:
    rule = "developer/前端组件编码规范.md"
    question = "组件里的金额怎么显示"
    assert rule not in [i.path for i in kindex.build_context(indexed, question).items]
    assert rule not in [i.path for i in kindex.build_context(indexed, question, paths=["server/main.py"]).items]

    for ctx in (
        kindex.build_context(indexed, question, paths=["web\\src\\Money.tsx"]),
        kindex.build_context(indexed, "请检查 ./web/src/App.tsx 的写法"),
        kindex.build_context(indexed, "看看 App.tsx"),
    ):
        assert ctx.items[0].path == rule
        assert ctx.items[0].reason == "scope glob **/*.tsx"
    # Off topic, with a budget the rule fills: no overview document came, and the reason must not announce one.
    small = kindex.build_context(indexed, "改一下 src/App.tsx 的金额组件", budget_tokens=100)
    assert small.fallback and [i.path for i in small.items] == [rule]
    assert small.reason == (
        "no document matched the question; the documents its paths bring in left no room for the overview"
    )


def test_globs_left_uncompiled_for_the_budget_are_said(indexed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kindex import globs

    ctx = kindex.build_context(indexed, "组件里的金额怎么显示", paths=["web/src/Money.tsx"])
    assert ctx.items[0].path == "developer/前端组件编码规范.md" and not ctx.warnings
    monkeypatch.setattr(globs, "MAX_COMPILED_EXPANSIONS", 0)
    ctx = kindex.KnowledgeBase(indexed).context(  # a fresh handle: its own cache of compiled globs
        "组件里的金额怎么显示", paths=["web/src/Money.tsx"]
    )
    assert ctx.items[0].path != "developer/前端组件编码规范.md"
    assert any("were not matched (use fewer or simpler globs)" in w for w in ctx.warnings)


def test_budget_is_respected_and_a_long_document_gives_its_head_and_matching_sections(indexed: Path) -> None:
    ctx = kindex.build_context(indexed, "赠送的会员时长能退款吗", budget_tokens=400, max_docs=3)

    assert ctx.tokens <= 400
    first = ctx.items[0]
    assert first.path == "billing/退款政策.md" and first.truncated
    assert "[… truncated to fit the context budget; open billing/退款政策.md for the rest]" in ctx.text
    original = (indexed / "billing" / "退款政策.md").read_text(encoding="utf-8")
    kept = ctx.text.split("(source: billing/退款政策.md)\n\n", 1)[1].split("\n\n[… truncated")[0]
    pieces = kept.split("\n\n[…]\n\n")
    assert original.startswith(pieces[0])  # the head, cut where a paragraph ends
    assert len(pieces) > 1 and all(p in original for p in pieces)  # whole sections, in document order
    assert "### 赠送的会员时长" in kept  # the section the question is about, though far from the head
    assert [original.index(p) for p in pieces] == sorted(original.index(p) for p in pieces)


def test_traditional_and_simplified_chinese_find_each_other(sample_kb: Path) -> None:
    traditional, simple = kindex.analysis._T2S_FILE.read_text(encoding="utf-8").splitlines()
    to_traditional = str.maketrans(simple[::-1], traditional[::-1])  # one traditional form of each character
    page = sample_kb / "billing" / "退款政策.md"
    original = page.read_text(encoding="utf-8")
    page.write_text(original.translate(to_traditional), encoding="utf-8")
    assert "### 贈送的會員時長" in page.read_text(encoding="utf-8")
    kindex.reindex(sample_kb)

    # A simplified question finds the traditional page, and its budget goes to the section it asks about.
    ctx = kindex.build_context(sample_kb, "赠送的会员时长能退款吗", budget_tokens=400, max_docs=1)
    assert ctx.items[0].path == "billing/退款政策.md" and ctx.items[0].truncated
    assert "### 贈送的會員時長" in ctx.text
    # A traditional question finds a simplified page as its simplified twin does.
    for question in ("如何開啟雙重驗證", "發票怎麼開"):
        twin = question.translate(str.maketrans(traditional, simple))
        assert [h.path for h in kindex.search(sample_kb, question)] == [h.path for h in kindex.search(sample_kb, twin)]
        assert kindex.search(sample_kb, question)
    # "matched" shows the words as the question wrote them, in a document cut to the budget too.
    assert kindex.search(sample_kb, "發票怎麼開")[0].matched == ("發票", "開")
    cut = kindex.build_context(sample_kb, "發票抬頭打錯了可以重開嗎", budget_tokens=300, max_docs=1).items[0]
    assert cut.truncated and cut.matched[:2] == ("發票", "抬頭")
    assert kindex.search(sample_kb, "发票怎么开")[0].matched == ("发票", "开")


def test_a_long_document_is_cut_by_the_heaviest_words_it_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each question word costs the cut a scan of the document: a 20,000-character message held by a document of
    # 60,000 sections took 40 s. Only the words the document holds count, and of those the heaviest.
    words = [f"widget{i:03d}" for i in range(100)]
    body = "# 组件手册\n\n组件说明。\n\n" + "".join(f"## {w}\n\n{w} 的参数说明。{'填充' * 200}\n\n" for w in words)
    kb = make_kb(tmp_path, {"t/manual.md": (_doc("manual.md", "组件手册", "组件说明"), body)})
    seen: list[list[str]] = []
    real = kindex.fitting.fit_to_budget

    def spy(text: str, budget: int, terms: list[str], written: dict[str, str]) -> str | None:
        seen.append(list(terms))
        return real(text, budget, terms, written)

    monkeypatch.setattr(kindex.retrieve, "fit_to_budget", spy)
    ctx = kindex.build_context(kb, "组件手册 " + " ".join(words) + " unknownword", budget_tokens=2000)
    assert ctx.items[0].path == "t/manual.md" and ctx.items[0].truncated
    assert len(seen) == 1 and len(seen[0]) == kindex.retrieve.MAX_FIT_TERMS
    assert "unknownword" not in seen[0] and set(seen[0]) <= {*words, "widget", "组件", "手册", "组件手册"}


def test_a_cut_never_lands_inside_a_code_block_and_a_huge_first_block_is_cut_at_a_line() -> None:
    fence = "```python\n" + "".join(f"print({i})\n" for i in range(200)) + "```\n"
    text = "intro line\n\n" + fence + "\nafter"
    cut = cut_to_budget(text, 120)
    assert cut is not None and estimate_tokens(cut) <= 120
    assert cut.count("```") % 2 == 0  # a code block larger than the budget is closed again after the cut
    first_block = "\n".join("一二三四五六七八九十" for _ in range(100))  # one paragraph of 1,000 tokens
    cut = cut_to_budget(first_block + "\n\n后文", 50)
    assert cut is not None and 0 < estimate_tokens(cut) <= 50 and first_block.startswith(cut)


def test_cut_to_budget_prefers_paragraph_and_heading_boundaries() -> None:
    text = "# A\n\n" + "一" * 30 + "\n\n## B\n" + "二" * 30 + "\n\n" + "三" * 30
    assert cut_to_budget(text, 1000) == text
    assert cut_to_budget(text, 45) == "# A\n\n" + "一" * 30
    assert cut_to_budget(text, 5) == "# A"
    assert cut_to_budget(text, 0) is None
    two_sections = "# A\n\n" + "一" * 30 + "\n\n## B\n" + "二" * 30
    assert cut_to_budget(text, 90) == two_sections and estimate_tokens(two_sections) <= 90  # whole sections only


def test_an_oversized_paragraph_cut_into_stays_a_paragraph_of_its_own() -> None:
    # Cut into at a character, the start of a long paragraph kept the one newline of its line break: under a
    # heading it ran on from it, after another paragraph Markdown read both as one.
    long = "这是一个很长的段落。" * 200
    for head in ("# 标题", "# 标题\n\n第一段。"):
        cut = cut_to_budget(f"{head}\n\n{long}\n", 100)
        assert cut is not None and cut.startswith(f"{head}\n\n这是") and estimate_tokens(cut) <= 100
    cut = cut_to_budget(f"# 标题\n第一行\n{long}", 100)  # lines of one paragraph stay one paragraph
    assert cut is not None and cut.startswith("# 标题\n第一行\n这是")


def test_a_budget_under_one_token_fits_nothing_and_no_fence_is_left_open() -> None:
    # Cutting into a heading at a budget of one token gave "# ", a start the assembly then went over its budget
    # with; a code block whose opening line fitted but not its closing left a lone fence.
    assert cut_to_budget("# 使用 Prometheus\n\nbody", 1) is None
    assert fit_to_budget("# Title\n\nintro\n\n## k8s\n\nk8s text\n", -20, ["k8s"]) is None
    code = (
        "```python\n"
        + "\n".join(f"x = {i}  # some code line here" for i in range(40))
        + "\n```\n\n## k8s\n\nk8s text\n"
    )
    assert cut_to_budget(code, 3) is None
    assert fit_to_budget(code, 20, ["k8s"]) == "## k8s\n\nk8s text"


def test_a_long_page_serves_its_matching_section_past_a_pasted_image_and_half_a_million_characters(
    tmp_path: Path,
) -> None:
    # Only the first 500,000 characters were looked at, to the last line break within them: a section further on
    # (FastAPI's release notes run to 693,000) or after a 400 KB inline image was never served, though search ranked
    # the page by its words.
    from kindex.markdown import LONG_LINE_CHARS

    image = "![截图](data:image/png;base64," + "QUJD" * 150_000 + ")\n\n"
    notes = "## 版本说明\n\n修复了若干问题，改进了性能。\n\n" * 24_000
    tail = "## 退款步骤\n\n在设置页点击「申请退款」，填写订单号。\n"
    for text in ("# 安装指南\n\n说明。\n\n" + image + tail, "# 发行说明\n\n" + notes[:650_000] + tail):
        fitted = fit_to_budget(text, 300, ["退款", "订单"])
        assert fitted is not None and fitted.endswith("在设置页点击「申请退款」，填写订单号。")
    kb = tmp_path / "kb"
    (kb / "guide").mkdir(parents=True)
    (kb / "guide" / "install.md").write_text("# 安装指南\n\n说明。\n\n" + notes + image + tail, encoding="utf-8")
    kindex.reindex(kb)
    ctx = kindex.build_context(kb, "退款步骤 订单号", budget_tokens=1000)
    assert "填写订单号" in ctx.text and ctx.items[0].truncated
    assert len(image) > LONG_LINE_CHARS


def test_a_long_page_without_sections_serves_the_part_that_matches(tmp_path: Path) -> None:
    # A helper's campaign: an FAQ of MkDocs collapsibles (`???`), VitePress `::: details`, `<details>` or a page
    # under one title handed over its first 13,000 characters, never the answer further down: a page of one section
    # was only cut from its start.
    item = "\n    关于{0}：请在「设置 → {0}」中操作。" + "这一段是补充说明，介绍不同平台上的差异。" * 8 + "\n\n"
    topics = ["导出", "同步", "预算", "账本", "分类", "标签", "提醒", "备份"] * 6 + ["汇率"] + ["密码", "主题"] * 10
    faq = "".join(f'??? question "{t}第{i}问怎么用？"' + item.format(t) for i, t in enumerate(topics))
    for text in ("# 常见问题\n\n本页汇总常见问题。\n\n" + faq, faq, "# 常见问题\n\n" + faq + "## 联系我们\n\n邮件。\n"):
        fitted = fit_to_budget(text, 600, ["汇率", "功能"])
        assert fitted is not None and "「设置 → 汇率」" in fitted and estimate_tokens(fitted) <= 600
        assert fitted.startswith(text.partition("\n")[0] + OMITTED_MARK)  # the page's first line says what it is
    # A page whose start holds the match is cut from its start, as before.
    early = "# 常见问题\n\n汇率在设置里改。\n\n" + faq
    assert fit_to_budget(early, 600, ["汇率"]) == cut_to_budget(early, 600)
    kb = tmp_path / "kb"
    (kb / "help").mkdir(parents=True)
    (kb / "help" / "faq.md").write_text("# 常见问题\n\n" + faq, encoding="utf-8")
    for name in ("intro", "sync", "theme", "backup"):  # 设置 is everywhere; 汇率 is the page's alone
        page = f"# {name}\n\n在设置里打开{name}，设置好后保存设置。\n"
        (kb / "help" / f"{name}.md").write_text(page, encoding="utf-8")
    kindex.reindex(kb)
    ctx = kindex.build_context(kb, "汇率怎么设置", budget_tokens=800)
    assert ctx.items[0].path == "help/faq.md" and "「设置 → 汇率」" in ctx.text


def test_a_cut_at_the_match_fills_its_budget_closes_its_blocks_and_reads_a_bounded_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hostile campaign on the fit of pages without sections: a match on the last lines handed over 89 tokens of a
    # 4,000-token budget; a first line opening a code block was served with the block never closed; a megabyte page
    # was normalised whole (seconds for characters NFKC expands); and a fallback's overview was cut at a word of the
    # question it happened to hold.
    filler = "".join(f"第{i}段：这一段讲别的事情，和问题无关。\n\n" for i in range(400))
    page = "# 常见问题\n\n" + filler + "汇率在「设置 → 汇率」中修改。\n"
    fit = fit_to_budget(page, 2000, ["汇率"])
    assert fit is not None and fit.endswith("汇率在「设置 → 汇率」中修改。") and 1800 <= estimate_tokens(fit) <= 2000
    assert fit.startswith("# 常见问题" + OMITTED_MARK + "第")  # whole lines before the match, after the gap

    fenced = "```yaml\nkey: value\n```\n\n" + filler + "汇率在设置中修改。\n"
    fit = fit_to_budget(fenced, 200, ["汇率"])
    assert fit is not None and _fences_closed(fit) and not fit.startswith("```") and "汇率在设置中修改" in fit

    normalised: list[int] = []
    real = kindex.analysis.normalize

    def spy(text: str) -> str:
        normalised.append(len(text))
        return real(text)

    monkeypatch.setattr(kindex.fitting, "normalize", spy)
    fit_to_budget("# 长页\n\n" + "无关的一行。\n" * 150_000 + "汇率。\n", 300, ["汇率"])
    assert max(normalised) <= kindex.fitting.PAGE_SCAN_CHARS
    monkeypatch.undo()

    kb = tmp_path / "kb"
    (kb / "guide").mkdir(parents=True)
    readme = "# 青禾账本\n\n记账应用的使用说明。\n\n" + filler + "口罩要按时更换。\n"
    (kb / "README.md").write_text(readme, encoding="utf-8")
    (kb / "guide" / "sync.md").write_text("# 同步\n\n多设备同步账本。\n", encoding="utf-8")
    kindex.reindex(kb)
    ctx = kindex.build_context(kb, "N95 口罩能重复戴几次", budget_tokens=300)
    assert ctx.fallback and "记账应用的使用说明" in ctx.text and "口罩" not in ctx.text


@pytest.mark.parametrize("message", ["X-Nonce 怎么生成", "退款多久到账", "发票怎么开", "同步冲突怎么办"])
def test_the_assembled_context_never_exceeds_its_budget(indexed: Path, message: str) -> None:
    for budget in range(50, 301, 7):
        ctx = kindex.build_context(indexed, message, budget_tokens=budget)
        assert ctx.tokens <= budget, (budget, ctx.tokens)
        assert all(i.tokens > estimate_tokens(f"## {i.title}\n(source: {i.path})\n\n") for i in ctx.items)


def test_identical_scores_are_ordered_by_path(tmp_path: Path) -> None:
    entry = ("退款 说明", "退款")
    kb = make_kb(
        tmp_path,
        {f"t/{name}.md": (_doc(f"{name}.md", *entry), "# 说明\n退款") for name in ("c1", "a1", "b1")},
    )
    ctx = kindex.build_context(kb, "退款说明")
    assert [i.path for i in ctx.items] == ["t/a1.md", "t/b1.md", "t/c1.md"]
    assert len({i.score for i in ctx.items}) == 1


def test_a_vanished_file_is_skipped_and_reported(indexed: Path) -> None:
    (indexed / "billing" / "退款政策.md").unlink()

    ctx = kindex.build_context(indexed, "退款多久到账")

    assert "billing/退款政策.md" in ctx.missing
    assert ctx.items and all(i.path != "billing/退款政策.md" for i in ctx.items)


def test_paths_outside_the_kb_in_a_hand_edited_index_are_never_served(tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("# 退款政策 secret", encoding="utf-8")
    kb = make_kb(tmp_path / "kb", {"t/a.md": (_doc("a.md", "退款政策", "退款"), "# a")})
    write_index(kb / "t" / "index.json", Index(documents=(_doc("../../secret.md", "退款政策", "退款"),)))

    ctx = kindex.build_context(kb, "退款政策")
    assert "secret" not in ctx.text and all(".." not in i.path for i in ctx.items)


def test_a_step_that_rewrites_an_index_is_seen_by_the_next_call_in_the_same_process(tmp_path: Path) -> None:
    kb = make_kb(
        tmp_path,
        {"t/a.md": (_doc("a.md", "退款政策", "退款"), "# a"), "t/b.md": (_doc("b.md", "发票", "发票"), "# b")},
    )
    assert kindex.build_context(kb, "退款政策").items[0].path == "t/a.md"
    assert kindex.build_context(kb, "对公转账").fallback

    (kb / "t" / "b.md").write_text("# 对公转账\n\n对公转账说明。\n", encoding="utf-8")
    kindex.doc(kb, "t", "b.md")  # rewrites t/index.json, then the saved tables: no waiting

    assert kindex.build_context(kb, "对公转账").items[0].path == "t/b.md"


def test_a_theme_index_edited_by_hand_is_seen_within_the_recheck_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(kindex.retrieve, "_clock", lambda: now[0])
    kb = make_kb(
        tmp_path,
        {"t/a.md": (_doc("a.md", "退款政策", "退款"), "# a"), "t/b.md": (_doc("b.md", "发票", "发票"), "# b")},
    )
    assert kindex.build_context(kb, "对公转账").fallback

    write_index(kb / "t" / "index.json", Index(documents=(_doc("b.md", "对公转账", "对公转账说明"),)))
    # Theme index files are stat-ed at most once per interval (the root index and the saved tables every call):
    # within it the loaded tables still answer.
    now[0] += kindex.retrieve.THEME_RECHECK_S / 2
    assert kindex.build_context(kb, "对公转账").fallback
    now[0] += kindex.retrieve.THEME_RECHECK_S

    ctx = kindex.build_context(kb, "对公转账")
    assert ctx.items[0].path == "t/b.md"
    assert kindex.KnowledgeBase(kb).retriever.loaded().stale  # the saved tables no longer match: said so


def test_a_kb_without_an_index_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# a", encoding="utf-8")
    with pytest.raises(IndexMissingError, match=r"run `kindex reindex` on it first"):
        kindex.build_context(tmp_path, "hello")

    result = CliRunner().invoke(main, ["context", str(tmp_path), "hello"])
    assert result.exit_code == 1 and "has no index yet" in result.stderr


def test_context_cli_prints_text_and_json(indexed: Path) -> None:
    result = CliRunner().invoke(main, ["context", str(indexed), "发票开错了怎么办", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)  # the JSON is the library's answer, field for field
    assert data == kindex.build_context(indexed, "发票开错了怎么办").to_dict()
    assert data["items"][0]["path"] == "billing/发票开具.md" and not data["fallback"]

    result = CliRunner().invoke(main, ["context", str(indexed), "发票开错了怎么办", "--budget", "200"])
    assert result.exit_code == 0 and result.stdout.startswith("## 发票开具\n(source: billing/发票开具.md)")
    assert "# billing/发票开具.md  score" in result.stderr


@pytest.mark.slow  # a fresh interpreter, to see what it imports
def test_context_imports_only_the_read_path(indexed: Path) -> None:
    # Each of these is time a one-shot `kindex context` would pay for nothing: the model client, the answer cache's
    # SQLite, the TOML reader of a KB without kindex.toml, and pydantic's plugin loader (importlib.metadata), which
    # the first validator built pulls in: the results are built from checked tables, never validated.
    heavy = ["litellm", "sqlite3", "tomllib", "pydantic.plugin._loader"]
    probe = (
        "import sys\nfrom click.testing import CliRunner\nfrom kindex.cli import main\n"
        "r = CliRunner().invoke(main, ['context', sys.argv[1], '退款'])\nassert r.exit_code == 0, r.output\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(indexed)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_words_only_in_a_documents_body_still_find_it(indexed: Path) -> None:
    question = "苹果商店里买的会员怎么退"
    entry = next(
        d
        for d in kindex.parse_index((indexed / "billing" / "index.json").read_bytes())[0].documents
        if d.path == "退款政策.md"
    )
    assert "苹果" not in entry.title + entry.summary + "".join(entry.tags)

    assert kindex.search(indexed, question)[0].path == "billing/退款政策.md"
    assert "苹果" in kindex.search(indexed, question)[0].matched


def test_missing_search_tables_are_rebuilt_in_memory_not_silently_lost(indexed: Path) -> None:
    (indexed / ".kindex" / "search.npz").unlink()
    kindex.kb.clear_cache()

    assert kindex.search(indexed, "苹果商店里买的会员怎么退")[0].path == "billing/退款政策.md"
    assert kindex.KnowledgeBase(indexed).retriever.loaded().stale
    # Said on the command line, where every call pays for the rebuild until a step saves new tables.
    for command in ("context", "search"):
        result = CliRunner().invoke(main, [command, str(indexed), "发票"])
        assert result.exit_code == 0 and "the saved search tables are missing or do not match" in result.stderr
    # And to the library and JSON callers (and so to an HTTP service's), not only on a terminal.
    assert "saved search tables are missing" in kindex.build_context(indexed, "发票").warnings[0]
    search = CliRunner().invoke(main, ["search", str(indexed), "发票", "--json"])
    assert "saved search tables are missing" in orjson.loads(search.stdout)["warnings"][0]
    kindex.reindex(indexed)
    assert "search tables" not in CliRunner().invoke(main, ["context", str(indexed), "发票"]).stderr
    assert kindex.build_context(indexed, "发票").warnings == ()


def test_a_hand_edited_index_with_a_nul_or_a_huge_value_is_answered_with_short_warnings(indexed: Path) -> None:
    root = orjson.loads((indexed / "index.json").read_bytes())
    root["themes"].append({"dir": "x\u0000y", "title": "t", "summary": "s"})  # os.stat raises on a NUL
    (indexed / "index.json").write_bytes(orjson.dumps(root))
    billing = orjson.loads((indexed / "billing" / "index.json").read_bytes())
    billing["version"] = "V" * 1_000_000
    (indexed / "billing" / "index.json").write_bytes(orjson.dumps(billing))
    kindex.kb.clear_cache()

    ctx = kindex.build_context(indexed, "退款一般多久能到账")

    assert ctx.items[0].path == "billing/退款政策.md"  # the rest of the index still serves
    assert "index.json: themes[4] is not a usable entry" in ctx.warnings  # the file named, as a theme's is
    assert any(w.startswith("billing/index.json: version is 'VVV") for w in ctx.warnings)
    assert all(len(w) <= 300 for w in ctx.warnings if not w.startswith("the saved search tables"))


def test_theme_indexes_that_cannot_be_read_are_named_in_every_answer(indexed: Path) -> None:
    (indexed / "billing" / "index.json").unlink()
    (indexed / "sync" / "index.json").write_text("{not json", encoding="utf-8")
    kindex.kb.clear_cache()

    ctx = kindex.build_context(indexed, "对公转账购买流程")

    assert ctx.fallback  # the payment page's theme cannot be read: not silently "off topic"
    assert ctx.warnings[:2] == (
        "billing/index.json cannot be read (missing): its documents are not searched until `kindex reindex` writes it",
        ctx.warnings[1],
    )
    assert ctx.warnings[1].startswith("sync/index.json cannot be read (") and str(indexed) not in ctx.warnings[1]
    assert "kindex reindex" in ctx.warnings[1]


def test_a_saved_table_that_no_longer_matches_the_index_is_not_used(indexed: Path) -> None:
    assert (indexed / ".kindex" / "search.npz").exists()
    write_index(
        indexed / "sync" / "index.json",
        Index(documents=(_doc("离线模式.md", "飞行模式下记账", "没有网络也能记账"),)),
    )
    kindex.kb.clear_cache()

    assert kindex.search(indexed, "飞行模式下记账")[0].path == "sync/离线模式.md"


def test_a_doc_step_on_an_edited_document_refreshes_its_body_terms(indexed: Path) -> None:
    question = "海外信用卡付款失败怎么处理"
    before = kindex.search(indexed, question, min_relevance=0.0)
    assert before and before[0].path != "billing/自动续费.md"
    doc = indexed / "billing" / "自动续费.md"
    # A paragraph at the end: its words reach the body terms, not the entry (title, first paragraph, headings).
    doc.write_text(doc.read_text(encoding="utf-8") + "\n另外，海外信用卡付款失败时，请改用支付宝。\n", encoding="utf-8")

    kindex.doc(indexed, "billing", "自动续费.md")

    assert kindex.search(indexed, question, min_relevance=0.0)[0].path == "billing/自动续费.md"


def test_a_word_as_common_in_general_chinese_as_in_the_kb_ranks_below_a_word_of_the_kb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = make_kb(
        tmp_path,
        {
            "t/a.md": (_doc("a.md", "账户", "账户说明"), "# 账户\n\n注意注意注意，账户要注意安全。\n"),
            "t/b.md": (_doc("b.md", "报表", "报表说明"), "# 报表\n\n对账单在报表里导出。\n"),
        },
    )
    # As often in general Chinese as in this small KB: 注意 is phrasing here, 对账单 the subject.
    rates = {"注意": 1.0, "对账单": 1e-9}
    monkeypatch.setattr(kindex.retrieve, "background_rate", lambda word: rates.get(word, 1e-9))
    question = "注意对账单"

    assert kindex.search(kb, question, min_relevance=0.0)[0].path == "t/b.md"
    monkeypatch.setattr(kindex.retrieve, "GENERAL_WORD_RANK", 1.0)  # rarity in the KB alone: 注意 three times wins
    kindex.kb.clear_cache()
    assert kindex.search(kb, question, min_relevance=0.0)[0].path == "t/a.md"


def test_rows_of_words_the_kb_does_not_hold_are_kept_only_when_short(indexed: Path) -> None:
    loaded = kindex.KnowledgeBase(indexed).retriever.loaded()
    junk = "\U00020000\U00020001" * 5_000  # rare characters the segmenter returns as one 10,000-character word
    kindex.retrieve._score(loaded, [junk, "完全不存在的词", "zzqxv"])

    assert junk not in loaded.rows and {"完全不存在的词", "zzqxv"} <= set(loaded.rows)
    assert all(len(t) <= kindex.retrieve.MAX_ABSENT_TERM for t in loaded.rows if not len(loaded.rows[t].docs))


def test_a_step_that_finishes_while_a_reader_loads_is_seen_by_its_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a hostile review: the files were stat-ed after the tables were read, so a step finishing in between
    # left new stamps on old tables, and no later check saw a change.
    now = [1000.0]
    monkeypatch.setattr(kindex.retrieve, "_clock", lambda: now[0])
    kb = tmp_path / "kb"
    (kb / "t").mkdir(parents=True)
    (kb / "t" / "a.md").write_text("# 退款政策\n\n退款说明。\n", encoding="utf-8")
    (kb / "t" / "b.md").write_text("# 发票\n\n发票说明。\n", encoding="utf-8")
    kindex.reindex(kb)
    real = searchindex.signature_of
    fired: list[bool] = []

    def racing(root: Path, themes: list[str]) -> tuple[tuple[str, int, int], ...]:
        signature = real(root, themes)
        if not fired:  # another writer's `doc` step completes right after the reader read the tables
            fired.append(True)
            (kb / "t" / "b.md").write_text("# 对公转账\n\n对公转账说明。\n", encoding="utf-8")
            kindex.doc(kb, "t", "b.md")
        return signature

    monkeypatch.setattr(searchindex, "signature_of", racing)
    handle = kindex.KnowledgeBase(kb)
    assert handle.context("对公转账").fallback  # the load that raced answers from the tables it read
    monkeypatch.setattr(searchindex, "signature_of", real)

    ctx = handle.context("对公转账")
    assert not ctx.fallback and ctx.items[0].path == "t/b.md"


def test_english_contractions_are_no_search_terms(tmp_path: Path) -> None:
    kb = make_kb(
        tmp_path,
        {
            "t/https.md": (
                _doc("https.md", "HTTPS", "It's how a server proves who it is"),
                "# HTTPS\n\nIt's how a server proves who it is. Let's see what's inside FastAPI's certificates.\n",
            ),
            **{f"t/{n}.md": (_doc(f"{n}.md", n, f"Page {n}"), f"# {n}\n\nPage {n}.\n") for n in "abcd"},
        },
    )
    # Before, the apostrophe split "What's" into "what" and "s", and "s" matched every page with an "it's".
    for small_talk in ("What's new?", "It's broken", "Let's go"):
        assert kindex.search(kb, small_talk) == [], small_talk
    assert kindex.search(kb, "FastAPI's certificates", min_relevance=0.0)[0].path == "t/https.md"
    assert kindex.analysis.analyze("Don't use FastAPI’s BackgroundTasks") == [
        "fastapi",
        "fast",
        "api",
        "backgroundtasks",
        "background",
        "task",
    ]


def test_a_name_the_kb_never_uses_outweighs_one_it_mentions(tmp_path: Path) -> None:
    # A gateway manual with one migration page titled with Redis: a question about Redis Sentinel (a name the KB
    # never uses) is about another product. Every name used to weigh double, and the page's Redis covered 0.41 of
    # it; a name the KB uses now weighs its rarity, one it never uses still double.
    topics = ["路由", "插件", "上游", "证书", "限流", "日志", "监控", "鉴权", "缓存", "重试"]
    docs = {
        f"t/d{i}.md": (_doc(f"d{i}.md", f"{word}配置", f"网关的{word}说明"), f"# {word}配置\n\n网关{word}参数。")
        for i, word in enumerate(topics * 2)
    }
    docs["t/redis.md"] = (_doc("redis.md", "从 Redis 迁移", "把数据迁移到网关"), "# 从 Redis 迁移\n\n迁移步骤。")
    kb = make_kb(tmp_path, docs)
    assert kindex.build_context(kb, "Redis 的 Sentinel 是干什么的").fallback
    assert kindex.build_context(kb, "Redis 怎么迁移").items[0].path == "t/redis.md"
    idf = 2.0
    assert kindex.retrieve.informative("redis", idf, 1, 0.0) == idf
    assert kindex.retrieve.informative("sentinel", idf, 0, 0.0) == kindex.retrieve.NAME_WEIGHT * idf


def _pages_kb(root: Path, pages: dict[str, tuple[str, str]]) -> Path:
    """A KB of one theme ``t`` of one-line pages: {name: (title, text)}."""
    docs = {
        f"t/{name}.md": (_doc(f"{name}.md", title, text), f"# {title}\n\n{text}\n")
        for name, (title, text) in pages.items()
    }
    return make_kb(root, docs)


@pytest.mark.parametrize(
    ("question", "first", "shown"),
    [
        ("How do I enabel CORS?", "t/cors.md", "enabel"),  # two letters swapped
        ("upload a flie", "t/upload.md", "flie"),
        ("Dokcer deployment", "t/docker.md", "Dokcer"),
        ("configure authentcation", "t/auth.md", "authentcation"),  # a letter left out (six or more)
        ("reset the passwird", "t/password.md", "passwird"),  # one mistyped
        ("How do I enable CORS? thx", "t/cors.md", "CORS"),  # a chat word says nothing
    ],
)
def test_a_slip_of_the_keyboard_is_read_as_the_kbs_word_not_a_name(
    tmp_path: Path, question: str, first: str, shown: str
) -> None:
    # A newcomer's typo made 8 of 10 English questions off topic: a word neither the KB nor English knows was
    # weighed as another product's name.
    pages = {
        "cors": ("CORS", "Enable CORS for a frontend on another origin."),
        "upload": ("Upload a file", "Receive an uploaded file in a form."),
        "docker": ("Docker", "Build an image and run the app in Docker for deployment."),
        "auth": ("Authentication", "Configure authentication for every request."),
        "password": ("Password reset", "Reset a forgotten password."),
        "tests": ("Testing", "Write tests for the app with a test client."),
        "next": ("Next steps", "What to read next."),
    }
    kb = _pages_kb(tmp_path, pages)
    hits = kindex.search(kb, question)
    assert hits and hits[0].path == first and shown in hits[0].matched, hits[:2]


def test_a_message_of_many_unknown_words_looks_up_few_of_them_as_slips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hostile campaign's 20,000 characters of made-up words, each line ending in "?": every word was looked up
    # as a misspelling (a few hundred lookups each), 5 s a call. A question with a slip holds a few such words.
    kb = _pages_kb(tmp_path, {"cors": ("CORS", "Enable CORS for a frontend on another origin.")})
    looked: list[Sequence[str]] = []
    holders = kindex.retrieve._holders

    def counted(loaded: Any, terms: Sequence[str]) -> Any:
        looked.append(terms)
        return holders(loaded, terms)

    monkeypatch.setattr(kindex.retrieve, "_holders", counted)
    made_up = " ".join(f"zq{a}{b}x{c}wv" for a in "bcdfghjk" for b in "lmnprstv" for c in "bdgk")  # 256 words
    kindex.search(kb, made_up + " How do I enabel CORS?")
    assert len(looked) == kindex.retrieve.MAX_SPELLING_TRIES
    looked.clear()
    assert kindex.search(kb, "How do I enabel CORS?")[0].path == "t/cors.md" and len(looked) == 1


@pytest.mark.parametrize(
    "question", ["Nuxt deploy", "Vite config", "deploy with Kubernetes", "rebase the config", "VLOOKUP in the config"]
)
def test_a_name_one_letter_from_a_kb_word_is_still_a_name(tmp_path: Path, question: str) -> None:
    # Short names of other products are a letter away from common words (Nuxt and next, Vite and site): only a
    # swap of two letters is read as a slip in a word under six letters. A longer word one letter from the start
    # of a word the KB uses is no slip either (rebase and "rebale", whose stem is rebalance's), nor a name in
    # capitals (VLOOKUP and lookup).
    pages = {
        "next": ("Next steps", "What to read next."),
        "site": ("Site", "Deploy the site."),
        "config": ("Config", "Deploy and configure the app."),
        "rebalance": ("Rebalance", "Rebalance the config of the regions."),
        "lookup": ("Lookup", "Lookup tables for the config."),
    }
    kb = _pages_kb(tmp_path, pages)
    assert kindex.build_context(kb, question).fallback


@pytest.mark.parametrize(("mentions", "on_topic"), [(2, False), (8, True)])
def test_a_name_is_a_subject_once_its_count_shows_it(tmp_path: Path, mentions: int, on_topic: bool) -> None:
    # 装饰器 is a word the KB never uses, so the question needs a subject shared with a page. Python, a name, has no
    # rate in general Chinese to beat; like a Chinese word, it is shown to be a subject by five mentions or more,
    # not by two beside a CSV import. It used to be one at a single mention.
    topics = ["路由", "插件", "上游", "证书", "限流", "日志", "监控", "鉴权", "缓存", "重试"]
    docs = {
        f"t/d{i}.md": (_doc(f"d{i}.md", f"{word}配置", f"网关的{word}说明"), f"# {word}配置\n\n网关{word}参数。")
        for i, word in enumerate(topics)
    }
    body = "# 导入\n\n" + "用 Python 脚本导入。" * mentions
    docs["t/import.md"] = (_doc("import.md", "数据导入", "导入 CSV 数据"), body)
    kb = make_kb(tmp_path, docs)
    assert kindex.build_context(kb, "Python 的装饰器是什么").fallback is not on_topic


def test_a_version_or_a_date_weighs_as_a_number(tmp_path: Path) -> None:
    # Numbers weigh nothing in the on-topic decision, and a version or a date is a number: 0.17, which no page
    # writes, counted as a name the KB never uses (another product), twice the rarest word's weight, and pushed an
    # upgrade question off topic. It still ranks: the page that writes 1.0 comes first.
    topics = ["路由", "插件", "上游", "证书", "限流", "日志", "监控", "鉴权", "缓存", "重试"]
    docs = {
        f"t/d{i}.md": (_doc(f"d{i}.md", f"{word}配置", f"网关的{word}说明"), f"# {word}配置\n\n网关{word}参数。")
        for i, word in enumerate(topics)
    }
    docs["t/upgrade.md"] = (_doc("upgrade.md", "升级指南", "版本升级"), "# 升级指南\n\n从 0.16 升级到 1.0 的步骤。")
    kb = make_kb(tmp_path, docs)
    ctx = kindex.build_context(kb, "从 0.17 升级到 1.0 要做什么")
    assert not ctx.fallback and ctx.items[0].path == "t/upgrade.md"
    for number in ("42", "0.17", "1.0", "2024-05-18", "3'000"):
        assert kindex.analysis.is_number(number), number
    for word in ("v1.0", "http2", "1.0-beta", "-1", "."):
        assert not kindex.analysis.is_number(word), word


def test_a_word_mentioned_once_in_a_long_page_of_many_words_is_found(tmp_path: Path) -> None:
    # Release notes name thousands of things, each once or twice. A page keeps its 20,000 most frequent body terms;
    # at 5,000 the identifier mentioned once below was dropped, and asking for it fell back.
    letters = "bcdfghjklmnpqrtvwxz"
    words = [f"zq{a}{b}{c}" for a in letters for b in letters for c in letters][:6000]
    notes = "# Release notes\n\n" + " ".join(words * 2) + "\n\nFixed iter_route_contexts.\n"
    docs = {"t/notes.md": (_doc("notes.md", "Release notes", "What changed"), notes)}
    docs["t/other.md"] = (_doc("other.md", "Routing", "How routes work"), "# Routing\n\nRoutes and contexts.")
    kb = make_kb(tmp_path, docs)
    ctx = kindex.build_context(kb, "iter_route_contexts")
    assert not ctx.fallback and ctx.items[0].path == "t/notes.md"


def test_an_english_question_weighs_its_words_against_general_english(tmp_path: Path) -> None:
    # A word general English uses and the KB does not (chat) is phrasing, not another product's name: it used to
    # weigh twice the rarest word's weight and push the question off topic. A word the KB writes no more than
    # English does (joke, once in passing) is no subject of it: small talk falls back. A name English does not
    # know (Django) still names another product.
    topics = ["routing", "plugins", "upstreams", "certificates", "logging", "metrics", "tracing", "caching"]
    docs = {
        f"t/{word}.md": (
            _doc(f"{word}.md", f"Gateway {word}", f"How the gateway handles {word}"),
            f"# Gateway {word}\n\nThe gateway handles {word} for every route and every plugin.",
        )
        for word in topics
    }
    docs["t/websockets.md"] = (
        _doc("websockets.md", "WebSockets", "Proxy websocket connections"),
        "# WebSockets\n\nThe gateway proxies websocket connections. This is no joke: they stay open for hours. "
        + "A websocket route needs the websocket flag; websocket timeouts are per route. " * 2,
    )
    docs["t/notes.md"] = (
        _doc("notes.md", "Release notes", "What changed"),
        "# Release notes\n\n" + "".join(f"* Fix {word} for websocket routes.\n" for word in topics),
    )
    kb = make_kb(tmp_path, docs)
    ctx = kindex.build_context(kb, "how do I build a chat with websockets?")
    assert not ctx.fallback and ctx.items[0].path == "t/websockets.md"
    assert kindex.build_context(kb, "tell me a joke").fallback
    # Every word but one (fix, which the release notes stress) is one the KB never uses: they weigh half their
    # rarity (UNSEEN_ENGLISH_WEIGHT), not nothing, so fix alone does not make it a question about the KB.
    assert kindex.build_context(kb, "how do I fix a leaking dishwasher?").fallback
    assert kindex.build_context(kb, "how do I add django admin to a websocket route").fallback


def test_rows_of_english_words_the_kb_lacks_are_kept_up_to_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each word of an English question that the KB never uses gets a row of its own (weighed against English); a
    # stream of such questions must not grow a long-running process's rows without bound.
    kb = make_kb(tmp_path, {"t/a.md": (_doc("a.md", "Routing", "How routes work"), "# Routing\n\nRoutes.")})
    questions = [f"{w} routes" for w in ("banana", "orchestra", "volcano", "penguin", "lantern", "harbor", "meadow")]
    unbounded = [kindex.Retriever(kb).context(q) for q in questions]
    monkeypatch.setattr(kindex.retrieve, "MAX_ABSENT_ROWS", 4)
    retriever = kindex.Retriever(kb)
    assert [retriever.context(q) for q in questions] == unbounded  # past the bound still weighed, only not kept
    loaded = retriever.loaded()
    assert loaded.absent == 4 and sum(not len(r.docs) for r in loaded.rows.values()) == 4


def test_an_accented_name_mentioned_once_is_found(tmp_path: Path) -> None:
    # Zürich was zürich + rich to the analyzer; whole now, it must still find the one page that names it.
    docs = {
        f"t/{w}.md": (
            _doc(f"{w}.md", f"Gateway {w}", f"How the gateway handles {w}"),
            f"# Gateway {w}\n\n{w} for routes.",
        )
        for w in ("routing", "plugins", "upstreams", "certificates")
    }
    docs["t/offices.md"] = (_doc("offices.md", "Offices", "Where we work"), "# Offices\n\nBerlin, Zürich and Lyon.")
    kb = make_kb(tmp_path, docs)
    for question in ("Zürich", "office in Zürich", "zurich"):
        ctx = kindex.build_context(kb, question)
        assert not ctx.fallback and ctx.items[0].path == "t/offices.md", question


def test_a_path_has_one_name_whatever_its_empty_or_dot_folders() -> None:
    # billing//x.md and billing/x.md were two fallback documents, the same file served twice.
    normalize = kindex.globs.normalize_path
    assert normalize("./billing//x.md") == normalize("billing/./x.md") == normalize("billing/x.md") == "billing/x.md"
    assert normalize("C:\\web\\.\\a.tsx") == "web/a.tsx" and normalize("a.md") == "a.md"


def test_a_title_the_segmenter_cuts_apart_is_found_whole(tmp_path: Path) -> None:
    # jieba cuts 时区 into 时 (a stop word) and 区 wherever it stands; a title naming it makes it one term.
    kb = make_kb(
        tmp_path,
        {
            "t/timezone.md": (_doc("timezone.md", "时区", "数据库的时区设置"), "# 时区\n\n按客户端时区解析时间。"),
            "t/region.md": (_doc("region.md", "区域", "按区域划分存储"), "# 区域\n\n每个区一个副本。"),
            "t/backup.md": (_doc("backup.md", "备份", "备份与恢复"), "# 备份\n\n定期备份。"),
        },
    )
    ctx = kindex.build_context(kb, "时区")
    assert not ctx.fallback and ctx.items[0].path == "t/timezone.md" and "时区" in ctx.items[0].matched


def test_a_word_the_titles_use_as_much_as_general_chinese_is_no_subject(tmp_path: Path) -> None:
    # A large KB's titles hold everyday words: one of 60 titles saying 时间 is not what the KB is about, and
    # 时间过得真快啊 (small talk: 过得, 真快 the KB never uses) must fall back. A word the titles use far more than
    # general Chinese does stays a subject, however plain it is (时区, test above; 税 and 锁, test below).
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma".split()
    docs = {
        f"t/d{i}.md": (_doc(f"d{i}.md", f"widget{i} " + " ".join(words), "组件的说明"), f"# widget{i}\n\n组件参数。")
        for i in range(59)
    }
    docs["t/time.md"] = (_doc("time.md", "时间 " + " ".join(words), "组件的说明"), "# 时间\n\n组件参数。")
    kb = make_kb(tmp_path, docs)
    assert kindex.build_context(kb, "时间过得真快啊").fallback
    assert not kindex.build_context(kb, "组件的时间参数").fallback  # every word of it the KB uses: the cover decides


def test_the_on_topic_rule_looks_past_the_best_covering_document() -> None:
    from kindex.retrieve import _Scored, _Term

    def term(name: str, weight: float, docs: list[int], subject: float) -> _Term:
        d = np.array(docs, np.intp)
        return _Term(name, weight, d, subject)

    # Document 0 covers all of the heavier, general word (subject 0.2); document 2 covers the lighter word that is a
    # subject of the KB: 40% of the question's weight, a whole subject. 晚饭 the KB never uses (no weight).
    terms = [term("期间", 3.0, [0], 0.2), term("退款", 2.0, [2], 1.0), term("晚饭", 0.0, [], 0.0)]
    covered = np.array([3.0, 0.0, 2.0], np.float32)
    scored = _Scored(["期间", "退款", "晚饭"], np.ones(3, np.float32), terms, covered, 5.0)
    docs = np.array([0, 2], np.intp)
    assert scored.on_topic(docs, 0.3)  # not settled by document 0: document 2 shares a subject
    assert not scored.on_topic(docs, 0.5)  # document 2 covers too little, document 0 shares too little subject
    assert scored.on_topic(docs, 0.0)  # 0: no decision
    assert not scored.on_topic(np.array([], np.intp), 0.0)
    # Without 晚饭 the KB uses every word of the question: no hidden subject, the cover decides alone.
    known = _Scored(["期间", "退款"], np.ones(3, np.float32), terms[:2], covered, 5.0)
    assert known.on_topic(docs, 0.5) and not known.on_topic(docs, 0.7)


def test_a_single_character_that_titles_a_document_is_a_subject(tmp_path: Path) -> None:
    # And a name the KB uses often, only in a body, is one too (the cover already weighs how it is used).
    k8s = "把服务部署到 Kubernetes 集群。Kubernetes 的配置在 deploy 目录。用 Kubernetes 滚动升级。\n"
    kb = make_kb(
        tmp_path,
        {
            "tax/tax.md": (_doc("tax.md", "税", "个人所得税的计算", tags=("税",)), "# 税\n\n税的计算方法。"),
            "tax/lock.md": (_doc("lock.md", "锁", "文件锁与并发", tags=("锁",)), "# 锁\n\n加锁以避免并发写入。"),
            "ops/deploy.md": (_doc("deploy.md", "部署指南", "如何部署服务"), "# 部署\n\n" + k8s * 3),
        },
    )
    for message, path in (("税", "tax/tax.md"), ("锁", "tax/lock.md"), ("Kubernetes", "ops/deploy.md")):
        ctx = kindex.build_context(kb, message)
        assert not ctx.fallback and ctx.items[0].path == path, message


def test_the_page_that_has_an_identifier_outranks_pages_titled_by_its_parts(tmp_path: Path) -> None:
    # frame_end is one table row of the window-functions page; two other pages are titled by its parts. The parts
    # of an identifier the KB holds whole are weak evidence (PART_WEIGHT): they tip ties, not the ranking.
    kb = make_kb(
        tmp_path,
        {
            "t/frames.md": (_doc("frames.md", "Frame end", "How frames end"), "# Frame end\n\nEvery frame has an end."),
            "t/ends.md": (_doc("ends.md", "End of frame", "Ending frames"), "# End of frame\n\nThe frame ends here."),
            "t/window.md": (
                _doc("window.md", "Window functions", "Functions over a window of rows"),
                "# Window functions\n\n| option | meaning |\n|---|---|\n| `frame_end` | the last row |\n",
            ),
        },
    )
    for question in ("frame_end", "frame_end 是什么意思"):
        assert kindex.search(kb, question)[0].path == "t/window.md"
    assert kindex.search(kb, "frame end")[0].path != "t/window.md"  # words, not the identifier


def test_an_error_code_deep_in_a_long_table_ranks_its_page(tmp_path: Path) -> None:
    # The code is one row of 300 in the error-code reference, the question's other words are in every page. The
    # body's length normalisation made that one row count for little; an identifier ranks whatever the length.
    rows = "".join(f"| 0x87D1{i:04X} | 错误说明 {i} |\n" for i in range(1000, 1300))
    docs = {
        f"t/app{i}.md": (
            _doc(f"app{i}.md", f"应用部署 {i}", "部署应用"),
            f"# 应用部署 {i}\n\nWin32 应用安装报错时的处理。",
        )
        for i in range(30)
    }
    docs["t/codes.md"] = (
        _doc("codes.md", "错误代码", "错误代码参考"),
        f"# 错误代码\n\n| 代码 | 说明 |\n|---|---|\n{rows}",
    )
    kb = make_kb(tmp_path, docs)
    assert kindex.search(kb, "Win32 应用安装报错 0x87D1041C", min_relevance=0)[0].path == "t/codes.md"
    loaded = kindex.KnowledgeBase(kb).retriever.loaded()
    plain, exact = (kindex.retrieve._row(loaded, "0x87d1041c", exact=e) for e in (False, True))
    assert exact.adds[0].real > plain.adds[0].real  # the long table's length discounts nothing
    # A name with digits (HTTP2, UTF-8, an error code) covers as a word: mentioned in passing, it is not the subject.
    assert list(exact.cover) == list(plain.cover) and exact.cover[0] < 1


def test_a_name_with_digits_mentioned_in_passing_does_not_make_a_question_on_topic(indexed: Path) -> None:
    # The API page says HMAC-SHA256 once; a question about hashing files elsewhere is not about this KB.
    assert kindex.build_context(indexed, "Python 计算大文件 HMAC-SHA256 特别慢 怎么优化").fallback


@pytest.mark.parametrize(
    "message", ["Real-Time 股票行情怎么看", "real-time 股票行情怎么看", "REAL-TIME 股票行情怎么看"]
)
def test_a_capitalised_hyphenated_word_is_prose_not_an_identifier(tmp_path: Path, message: str) -> None:
    # The page says real-time once in passing. Spelt Real-Time, the word looked like a header name and covered the
    # question fully from that one mention: small talk got the page, and the decision changed with the case.
    docs = {f"t/p{i}.md": (_doc(f"p{i}.md", f"插件 {i}", "插件说明"), f"# 插件 {i}\n\n插件的配置。") for i in range(20)}
    docs["t/logs.md"] = (_doc("logs.md", "日志", "日志插件"), "# 日志\n\n日志以 real-time 方式推送到收集端。")
    kb = make_kb(tmp_path, docs)
    assert kindex.build_context(kb, message).fallback


def test_every_budget_from_the_least_serves_the_matched_document_within_it(sample_kb: Path) -> None:
    # At the documented minimum the header and the truncation mark (which repeats the path) took the whole budget:
    # the context came back empty, said the documents "cannot be read", and the overview failed the same way.
    folder = sample_kb / "billing" / "企业采购" / "发票与报销的全部细节说明"
    deep = folder / "境外电汇付款后多久可以开具增值税专用发票.md"
    deep.parent.mkdir(parents=True)
    deep.write_text("# 境外电汇开票\n\n" + "境外电汇到账后三个工作日内开具增值税专用发票。\n\n" * 40, encoding="utf-8")
    kindex.reindex(sample_kb)
    rel = deep.relative_to(sample_kb).as_posix()
    for question, page in (("退款多久到账", "billing/退款政策.md"), ("境外电汇多久开专用发票", rel)):
        for budget in (50, 51, 54, 60, 75, 100, 120, 160):
            ctx = kindex.build_context(sample_kb, question, budget_tokens=budget)
            assert not ctx.fallback and ctx.items[0].path == page, (question, budget, ctx.reason)
            assert ctx.items[0].truncated and ctx.text.strip() and estimate_tokens(ctx.text) <= budget
            assert "电汇" in ctx.text if page == rel else "退款" in ctx.text
    off = kindex.build_context(sample_kb, "讲个笑话", budget_tokens=50)
    assert off.fallback and off.items and off.text.strip() and estimate_tokens(off.text) <= 50


def test_many_documents_never_pass_the_budget_by_their_separators(indexed: Path) -> None:
    # Each "\n\n" between documents was charged one token; the estimate prices it at 2.2.
    for question, budget in (("退款", 4670), ("退款", 4992), ("发票怎么开", 4334), ("发票怎么开", 5447)):
        for shift in range(-3, 4):
            ctx = kindex.build_context(indexed, question, budget_tokens=budget + shift, max_docs=8)
            assert len(ctx.items) > 2 and estimate_tokens(ctx.text) <= budget + shift, (question, budget + shift)


def test_an_empty_overview_document_is_passed_over_for_one_that_says_something(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    (kb / "t").mkdir(parents=True)
    (kb / "导读.md").write_text("---\n---\n\n", encoding="utf-8")  # (only a frontmatter that says something serves)
    (kb / "00-总则与功能导航.md").write_text("<!-- Licensed under CC BY 4.0 -->\n", encoding="utf-8")
    (kb / "README.md").write_text("# README\n\nThis KB covers refunds.\n", encoding="utf-8")
    (kb / "t" / "refund.md").write_text("# 退款\n\n退款政策说明。\n", encoding="utf-8")
    kindex.reindex(kb)

    ctx = kindex.build_context(kb, "今天天气怎么样")
    assert [i.path for i in ctx.items] == ["README.md", "index.json"] and "covers refunds" in ctx.text

    (kb / "README.md").write_text("\u200b\n\u00a0\n\ufeff\u2060", encoding="utf-8")  # only what no one sees
    ctx = kindex.build_context(kb, "今天天气怎么样")
    assert [i.path for i in ctx.items] == ["index.json"] and ctx.text.strip()

    (kb / "t" / "refund.md").write_text("\n", encoding="utf-8")  # emptied after the reindex
    ctx = kindex.build_context(kb, "退款政策")
    assert ctx.text.strip() and all(i.path != "t/refund.md" for i in ctx.items)


def test_a_long_english_page_hands_over_the_section_its_words_match_not_only_its_stems(tmp_path: Path) -> None:
    # Sections were matched by the question's stems as substrings: "polici" and "retri" are in no "Retry policy".
    filler = "".join(
        f"## Topic {i}\n\n" + "Unrelated filler about routing and upstreams. " * 30 + "\n\n" for i in range(6)
    )
    body = (
        "# Gateway guide\n\nThis guide covers the gateway.\n\n"
        + filler
        + "## Retry policy\n\nThe retry policy sets how often a failed request is sent again.\n\n"
        + filler.replace("Topic", "More")
    )
    kb = make_kb(tmp_path, {"t/gateway.md": (_doc("gateway.md", "Gateway guide", "the gateway"), body)})
    ctx = kindex.build_context(kb, "retry policy", budget_tokens=400, max_docs=1)
    assert ctx.items[0].truncated and "## Retry policy\n\nThe retry policy sets" in ctx.text
    assert "## Retry policy" in (
        fit_to_budget(body, 300, ["retri", "polici"], {"retri": "retry", "polici": "policy"}) or ""
    )


def _fences_closed(text: str) -> bool:
    """Whether every fenced block of ``text`` ends with its closing fence, as markdown-it (CommonMark) reads it: a
    cut inside a block, not closed again, leaves a block running to the end of its container."""
    from markdown_it import MarkdownIt

    source = text.splitlines()
    for token in MarkdownIt("commonmark").parse(text):
        if token.type == "fence" and token.map:
            start, end = token.map
            last = source[end - 1].lstrip(" >\t") if end - 1 < len(source) else ""
            if end - 1 == start or not last.startswith(token.markup) or last.strip(token.markup[0]).strip():
                return False
    return True


def _block(opening: str, line: str, closing: str) -> str:
    """A fenced block of 80 lines (``line`` formatted with ``i``) between ``opening`` and ``closing``."""
    return opening + "".join(line.format(i=i) for i in range(80)) + closing


CONTAINER_FENCES = {
    "list item, indented": _block(
        "1. Step one:\n\n    ```bash\n", "    echo {i} with some words\n", "    ```\n\n2. Two.\n"
    ),
    "block quote": _block("> Note:\n>\n> ```python\n", "> print({i})  # with some words\n", "> ```\n\nAfter.\n"),
    "on the marker line": _block("- ```js\n", "  call({i}); // with some words\n", "  ```\n"),
    "nested list, tildes": _block("- a\n  - b\n\n    ~~~~\n", "    line {i} ~~~ with words\n", "    ~~~~\n"),
    # From the second campaign: the closing prefix keeps the list indent before the quote; an empty item's text
    # starts a space after its marker; a thematic break is no list item; a tab indents to the next multiple of 4.
    "quote in a list item": _block("- item\n\n  > ```js\n", "  > line {i} with words\n", "  > ```\n\nAfter.\n"),
    "empty item": _block("-\n  ```\n", "  code {i} with words\n", "  ```\n\nAfter.\n"),
    "after a thematic break": _block("- - -\n  ```\n", "  code {i} with words\n", "```\n"),
    "tab indents": _block("- item\n\n\t```\n", "\tcode {i} with words\n", "\t```\n\nAfter.\n"),
}


@pytest.mark.parametrize("name", CONTAINER_FENCES)
def test_a_cut_never_leaves_a_fence_open_in_a_list_item_or_a_block_quote(name: str) -> None:
    # Fences under a list item's text, in block quotes and on a marker's line were not code to the cutter: the
    # truncation mark landed inside them (hostile campaign; 10 of 24,900 cuts of the real corpora).
    text = "# Guide\n\nIntro.\n\n" + CONTAINER_FENCES[name]
    assert _fences_closed(text)
    for budget in range(8, 400, 9):
        for cut in (cut_to_budget(text, budget), fit_to_budget(text, budget, ["guide"])):
            assert cut is None or (_fences_closed(cut) and estimate_tokens(cut) <= budget), (budget, cut)


def test_a_one_line_code_block_larger_than_the_budget_hands_over_its_start() -> None:
    text = "```json\n" + '{"key": 1, ' * 20_000 + "\n```\n"
    cut = cut_to_budget(text, 300)
    assert cut is not None and cut.startswith('```json\n{"key": 1,') and cut.endswith("\n```")
    assert 250 <= estimate_tokens(cut) <= 300 and _fences_closed(cut)


def test_the_fitting_reads_a_bounded_start_of_a_huge_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 5 MB page of 640,000 headings cost 3.4 s a call: every call parsed all of it.
    parsed: list[int] = []
    real = kindex.markdown.lines

    def spy(text: str) -> list[kindex.markdown.Line]:
        parsed.append(len(text))
        return real(text)

    monkeypatch.setattr(kindex.fitting, "markdown_lines", spy)
    page = "# kiwi guide\n\n" + "## kiwi\n" * 640_000
    for fit in (fit_to_budget(page, 6000, ["kiwi"]), cut_to_budget(page, 6000)):
        assert fit is not None and fit.startswith("# kiwi guide") and estimate_tokens(fit) <= 6000
    assert parsed and max(parsed) <= kindex.fitting.MAX_FIT_CHARS

    # And a request reads and cleans no more of the page than that (a <style> block made it parse 5 MB each time).
    cleaned: list[int] = []
    scan_module = importlib.import_module("kindex.scan")  # ``kindex.scan`` is the function of that name
    clean: Callable[[str], str] = scan_module.clean_body

    def spy_clean(body: str) -> str:
        cleaned.append(len(body))
        return clean(body)

    monkeypatch.setattr(scan_module, "clean_body", spy_clean)
    kb = make_kb(tmp_path, {"t/kiwi.md": (_doc("kiwi.md", "kiwi guide", "kiwi"), "<style>\n</style>\n" + page)})
    kindex.build_context(kb, "kiwi guide", max_docs=1)  # the tables, built in memory from the whole page
    cleaned.clear()
    ctx = kindex.build_context(kb, "kiwi guide", max_docs=1)
    assert ctx.items[0].path == "t/kiwi.md" and ctx.items[0].truncated and "## kiwi" in ctx.text
    assert cleaned and max(cleaned) <= kindex.fitting.MAX_FIT_CHARS


def test_a_section_cut_to_fit_keeps_the_line_that_answers(indexed: Path) -> None:
    # A newcomer's run: the section that answers was cut after its third bullet; the App Store line is the fourth.
    ctx = kindex.build_context(indexed, "苹果商店里买的会员怎么退", budget_tokens=300)
    assert ctx.items[0].path == "billing/退款政策.md" and ctx.items[0].truncated
    assert "## 二、什么情况不能退款\n\n[…]\n\n" in ctx.text and "- 通过第三方渠道" in ctx.text
    assert "苹果 App Store" in ctx.text
    assert estimate_tokens(ctx.text) <= 300


def test_a_theme_entrys_paths_make_its_documents_conditional(indexed: Path) -> None:
    # SPEC §6.4: any theme or document entry may carry paths. A theme's were validated, then ignored.
    root = indexed / "index.json"
    index = orjson.loads(root.read_bytes())
    theme = next(t for t in index["themes"] if t["dir"] == "developer")
    theme["paths"] = ["server/**/*.go"]
    root.write_bytes(orjson.dumps(index, option=orjson.OPT_INDENT_2))
    assert kindex.validate(indexed) == []
    question = "X-Nonce 怎么生成"

    without = kindex.build_context(indexed, question)
    assert all(not i.path.startswith("developer/") for i in without.items)
    with_path = kindex.build_context(indexed, question, paths=["server/api/sign.go"])
    developer = [i for i in with_path.items if i.path.startswith("developer/")]
    assert developer and developer[0].reason == "scope glob server/**/*.go"
    # The documents a theme's paths bring in come best for the question first, not in the index's order.
    limits = kindex.build_context(indexed, "Rate limits 429 怎么办", paths=["server/api/sign.go"], max_docs=2)
    assert limits.items[0].path == "developer/rate-limits.md"


GRAPHEMES = {
    "family": "👨\u200d👩\u200d👧",
    "accent": "e\u0301",
    "flag": "🇨🇳",
    "conjunct": "क्षि",
    "Thai": "ที่",
    "jamo": "\u1100\u1161\u11a8",
    "skin tone and joiner": "👩🏽\u200d💻",
    "ideographic variation": "葛\U000e0100",
    "Tamil": "கொ",
    "tag flag": "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    "keycap": "1\ufe0f\u20e3",
    "ZWNJ": "می\u200cخواهم",
}


@pytest.mark.parametrize("name", GRAPHEMES)
def test_a_cut_into_a_line_never_splits_what_a_reader_sees_as_one_character(name: str) -> None:
    regex = pytest.importorskip("regex")  # its \X is Unicode's extended grapheme cluster (UAX #29)

    for line in (GRAPHEMES[name] * 400, "x" + GRAPHEMES[name] * 400):
        starts = {m.start() for m in regex.finditer(r"\X", line)}
        for budget in range(3, 300, 4):
            cut = cut_to_budget(line, budget)
            assert cut is None or (len(cut) in starts and line.startswith(cut) and estimate_tokens(cut) <= budget)


def test_a_section_cut_starting_at_its_match_never_starts_inside_a_code_block() -> None:
    # The match was on a line of code: the cut started there and left a lone closing fence, which CommonMark reads
    # as a new block swallowing the rest (101 of 9,260 fits over the corpora, second hostile campaign).
    doc = (
        "# Guide\n\nIntro.\n\n## Setup\n\n"
        + "Some prose line about things.\n\n" * 20
        + "```python\n"
        + "x = 1\n" * 5
        + "client.retry_policy = 3\ny = 2\n```\n\nAfter the code, more prose.\n\n## Other\n\nOther text.\n"
    )
    fit = fit_to_budget(doc, 80, ["retry_policy"])
    assert fit is not None and _fences_closed(fit) and estimate_tokens(fit) <= 80
    assert fit.startswith("# Guide\n\nIntro.\n\n## Setup\n\n[…]\n\n") and "```python\nx = 1" in fit
    assert "client.retry_policy = 3" in fit and "[…]\n\nx = 1" not in fit


@pytest.mark.parametrize("head", ["# T\n\nIntro.\n\n", "## 配置\n\n", "1. step\n\n"])
def test_a_one_line_code_block_after_a_short_head_is_cut_into_not_dropped(head: str) -> None:
    text = head + "```json\n" + '{"key": "value", "n": 12345}' * 500 + "\n```\n"
    for budget in (100, 400, 1500):
        cut = cut_to_budget(text, budget)
        assert cut is not None and cut.startswith(head + '```json\n{"key": "') and cut.endswith("\n```")
        assert budget * 0.8 <= estimate_tokens(cut) <= budget and _fences_closed(cut), budget


def test_a_thematic_break_is_no_list_item_that_keeps_a_fence_open() -> None:
    # "- - -" read as a list item kept the indented fence after it open past its closing fence at column 0, and
    # every later heading was hidden.
    assert kindex.markdown.headings("- - -\n  ```\n  code\n```\n\n# Real\n\n## Later\n") == ("Real", "Later")


@pytest.mark.parametrize(
    ("message", "first"),
    [
        ("billing/退款政策.md", "billing/退款政策.md"),
        ("看一下 docs/kb/billing/退款政策.md 这篇", "billing/退款政策.md"),  # from the repository's root
        ("DEVELOPER/RATE-LIMITS.MD", "developer/rate-limits.md"),
        ("今天天气怎么样 sync/离线模式.md", "sync/离线模式.md"),  # named: served though the words are off topic
        ("a/" * 1000 + "billing/退款政策.md", "billing/退款政策.md"),  # its last 64 folders are looked at
    ],
)
def test_a_document_named_by_its_path_comes_first(indexed: Path, message: str, first: str) -> None:
    # A message holding a document's path ranked it by the path's words: `tutorial/cors.md` got the middleware page.
    hits = kindex.search(indexed, message)
    assert (hits[0].path, hits[0].reason) == (first, "path in the message")
    assert [h.path for h in hits].count(first) == 1
    ctx = kindex.build_context(indexed, message)
    assert ctx.items[0].path == first and not ctx.fallback


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("billing/退款政策.md", "the documents the message names"),
        ("今天天气怎么样 sync/离线模式.md", "the documents the message names"),
        # It said "matched the question" with the named document first.
        ("billing/退款政策.md 里的发票怎么开", "the documents the message names, and those that match the question"),
        ("发票怎么开", "matched the question"),
    ],
)
def test_the_reason_says_what_chose_the_documents(indexed: Path, message: str, reason: str) -> None:
    assert kindex.build_context(indexed, message).reason == reason


@pytest.mark.parametrize("message", ["billing/退款政策.md 发票怎么开", "发票怎么开 看下 docs/kb/billing/退款政策.md"])
def test_the_words_of_a_path_naming_a_document_are_not_the_question(indexed: Path, message: str) -> None:
    # With the path's words (billing, 退款政策) in the question's weight, the invoice page covered too little of it:
    # the named page was all the message got.
    hits = kindex.search(indexed, message)
    assert [(h.path, h.reason) for h in hits[:2]] == [
        ("billing/退款政策.md", "path in the message"),
        ("billing/发票开具.md", "matched"),
    ]
    asked = [h.path for h in kindex.search(indexed, "发票怎么开")]
    assert [h.path for h in hits[1:]] == [p for p in asked if p != hits[0].path]


@pytest.mark.parametrize(
    "message",
    [
        "other/rate-limits.md",  # another folder's file of that name
        "rate-limits.md",  # a bare name is as often the user's own file (README.md, index.md)
        "导读.md 里说的",
        "Please follow ops/Release 退款政策.md",  # the tail of a name with a space, which the message cut
        "developer/前端组件编码规范.md",  # a conditional document: its globs decide (SPEC §6.4)
        "今天天气怎么样 notes/离线模式.txt",
        "a" * 5000 + "/billing/退款政策.md",  # longer than any path: not looked up
    ],
)
def test_paths_that_name_no_document(indexed: Path, message: str) -> None:
    assert all(h.reason != "path in the message" for h in kindex.search(indexed, message, min_relevance=0))


def test_an_attachment_path_names_no_document(indexed: Path) -> None:
    ctx = kindex.build_context(indexed, "今天天气怎么样", paths=["sync/离线模式.md"])
    assert ctx.fallback and all(i.path != "sync/离线模式.md" for i in ctx.items)


def test_a_fallback_document_is_read_once(indexed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It was read to tell that it says something, then again to serve it: two reads of a page per off-topic message.
    real = document_start
    read: list[str] = []

    def counting(kb: Path, rel: str, max_chars: int | None) -> tuple[str, bool] | None:
        read.append(rel)
        return real(kb, rel, max_chars)

    monkeypatch.setattr(kindex.retrieve, "document_start", counting)
    ctx = kindex.build_context(indexed, "今天天气怎么样")
    assert ctx.fallback and [i.path for i in ctx.items] == ["导读.md", "00-总则与功能导航.md"]
    assert sorted(read) == sorted(i.path for i in ctx.items)


def test_a_kb_copied_with_new_times_keeps_its_saved_tables(indexed: Path, tmp_path: Path) -> None:
    # `cp -r` gives every index file a new modification time: the saved tables looked stale, and every call of a
    # deployed copy rebuilt them in memory (3 times slower) until someone ran a reindex there.
    copy = tmp_path / "deployed"
    shutil.copytree(indexed, copy, copy_function=shutil.copy)  # contents only, as `cp -r` copies
    assert (copy / "index.json").stat().st_mtime_ns != (indexed / "index.json").stat().st_mtime_ns
    ctx = kindex.build_context(copy, "退款多久到账")
    assert kindex.retrieve.STALE_TABLES not in ctx.warnings and ctx.items[0].path == "billing/退款政策.md"
    theme = copy / "billing" / "index.json"
    theme.write_bytes(theme.read_bytes().replace("退款".encode(), "退货".encode(), 1))  # the same size, changed
    kindex.kb.clear_cache()
    assert kindex.retrieve.STALE_TABLES in kindex.build_context(copy, "退款多久到账").warnings


def test_paths_apart_only_in_case_are_named_exactly_or_not_at_all(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    for name in ("Setup.md", "setup.md"):
        (kb / "a").mkdir(parents=True, exist_ok=True)
        (kb / "a" / name).write_text(f"# {name}\n\n安装步骤。\n", encoding="utf-8")
    kindex.reindex(kb)
    first = kindex.search(kb, "a/Setup.md")[0]
    assert (first.path, first.reason) == ("a/Setup.md", "path in the message")
    assert all(h.reason != "path in the message" for h in kindex.search(kb, "A/SETUP.MD", min_relevance=0))


def test_a_home_page_standing_in_for_the_overview_serves_its_head_only(tmp_path: Path) -> None:
    # A newcomer's `你好` to FastAPI's docs got 5,975 of 6,000 tokens of its home page (badges, sponsors, templates).
    kb = tmp_path / "kb"
    (kb / "t").mkdir(parents=True)
    page = "# Project\n\nWhat this documentation covers.\n\n" + "\n\n".join(
        f"## Part {i}\n\n" + "正文。" * 300 for i in range(20)
    )
    (kb / "index.md").write_text(page, encoding="utf-8")
    (kb / "t" / "refund.md").write_text("# 退款\n\n退款政策说明。\n", encoding="utf-8")
    kindex.reindex(kb)
    ctx = kindex.build_context(kb, "你好", budget_tokens=6000)
    assert [(i.path, i.truncated) for i in ctx.items] == [("index.md", True), ("index.json", False)]
    assert 1000 < ctx.items[0].tokens <= kindex.retrieve.OVERVIEW_PAGE_TOKENS  # cut at a section or paragraph
    assert "What this documentation covers" in ctx.text
    # A home page names none of the KB's topics: the root index's overview after it does.
    assert ctx.text.index("- t (t/): ") > ctx.text.index("What this documentation covers")
    # With room for one document, the page alone; with room for its head only, that head.
    assert [i.path for i in kindex.build_context(kb, "你好", max_docs=1).items] == ["index.md"]
    assert [i.path for i in kindex.build_context(kb, "你好", budget_tokens=300).items] == ["index.md"]
    # An overview document the KB names is one: served as the budget allows.
    (kb / "导读.md").write_text(page, encoding="utf-8")
    kindex.root(kb)  # a document of the index: what the scan left out never serves
    ctx = kindex.build_context(kb, "你好", budget_tokens=6000)
    assert ctx.items[0].path == "导读.md" and ctx.items[0].tokens > 5000


@pytest.fixture
def analysed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The documents the search tables analyse afresh, in order."""
    seen: list[str] = []
    real = kindex.searchindex._doc_fields

    def counting(src: kindex.searchindex.Source, vocab: Any) -> Any:
        seen.append(src.path)
        return real(src, vocab)

    monkeypatch.setattr(kindex.searchindex, "_doc_fields", counting)
    return seen


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The KBs whose tables retrieval built in memory instead of loading them as saved."""
    seen: list[Path] = []
    real = kindex.searchindex.from_files

    def building(kb: Path, *args: Any) -> kindex.searchindex.SearchIndex:
        seen.append(kb)
        return real(kb, *args)

    monkeypatch.setattr(kindex.retrieve, "from_files", building)
    return seen


def test_stale_tables_are_rebuilt_in_memory_from_the_changed_documents_only(indexed: Path, analysed: list[str]) -> None:
    # While a step writes a theme index the saved tables are stale: every call in that window re-analysed every
    # document of the KB (10 s on 1,445 pages, while the step itself was doing the same work).
    theme = indexed / "billing" / "index.json"
    theme.write_bytes(theme.read_bytes().replace("退款".encode(), "退货".encode(), 1))  # one entry edited by hand
    kindex.kb.clear_cache()
    ctx = kindex.build_context(indexed, "退款多久到账")
    assert kindex.retrieve.STALE_TABLES in ctx.warnings and len(analysed) == 1
    assert ctx.items[0].path == "billing/退款政策.md"
    in_memory = kindex.search(indexed, "退货 发票 账号 同步", limit=None)
    # From nothing: every document analysed, the same ranking.
    (indexed / ".kindex" / kindex.searchindex.SEARCH_FILE).unlink()
    kindex.kb.clear_cache()
    analysed.clear()
    assert kindex.search(indexed, "退货 发票 账号 同步", limit=None) == in_memory and len(analysed) > 15


def test_without_saved_tables_a_changed_theme_costs_its_documents_not_the_kb(
    indexed: Path, analysed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first reindex saves no tables until it ends, and each theme index it writes meanwhile made every call
    # rebuild the whole KB in memory: the tables loaded before are where the next build starts.
    (indexed / ".kindex" / kindex.searchindex.SEARCH_FILE).unlink()
    kb = kindex.KnowledgeBase(indexed)
    assert kb.context("退款多久到账").items[0].path == "billing/退款政策.md" and len(analysed) > 15
    analysed.clear()
    theme = indexed / "billing" / "index.json"
    theme.write_bytes(theme.read_bytes().replace("退款".encode(), "退货".encode(), 1))
    monkeypatch.setattr(kindex.retrieve, "THEME_RECHECK_S", 0.0)  # theme files are looked at on every call
    ctx = kb.context("退款多久到账")
    assert len(analysed) == 1 and analysed[0].startswith("billing/") and ctx.items[0].path == "billing/退款政策.md"


def test_a_call_during_a_steps_table_update_waits_for_it_instead_of_building_the_same(
    indexed: Path, built: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # At the end of a first reindex the service's context calls built the tables in memory beside the step that
    # was building the same ones: 15 s a call on memdocs-zh and a reindex twice as long, instead of 5 s and 9 s.
    import threading

    (indexed / ".kindex" / kindex.searchindex.SEARCH_FILE).unlink()
    started, proceed = threading.Event(), threading.Event()
    real_update = kindex.searchindex._update

    def held(kb: Path, s: kindex.Scan) -> int:
        started.set()
        assert proceed.wait(30)
        return real_update(kb, s)

    monkeypatch.setattr(kindex.searchindex, "_update", held)
    step = threading.Thread(target=kindex.searchindex.update, args=(indexed, kindex.scan(indexed)))
    waiting = threading.Event()
    real_wait = kindex.searchindex.wait_for_update

    def wait(kb: Path, timeout: float) -> bool:
        waiting.set()
        return real_wait(kb, timeout)

    monkeypatch.setattr(kindex.retrieve, "wait_for_update", wait)
    step.start()
    assert started.wait(30)
    answers: list[kindex.Context] = []
    call = threading.Thread(target=lambda: answers.append(kindex.KnowledgeBase(indexed).context("退款多久到账")))
    call.start()
    assert waiting.wait(30)  # the call found the tables stale while the step holds them
    proceed.set()
    step.join(30)
    call.join(30)
    assert built == [] and answers[0].warnings == () and answers[0].items[0].path == "billing/退款政策.md"


def test_a_call_during_a_first_offline_reindex_waits_for_it(sample_kb: Path, built: list[Path]) -> None:
    # A call that came between the root index's write and the step's table update built every table itself,
    # beside the step (34 s calls under `kindex serve` with other load); one before the root index got
    # index_missing. A first offline run takes seconds: the call waits for it and answers from what it saved.
    import threading

    answers: list[kindex.Context] = []
    calls: list[threading.Thread] = []

    def ask_once(p: kindex.Progress) -> None:
        if not calls:  # the step has scanned and started: no index file written yet
            call = threading.Thread(
                target=lambda: answers.append(kindex.KnowledgeBase(sample_kb).context("退款多久到账"))
            )
            call.start()
            calls.append(call)

    kindex.reindex(sample_kb, kindex.Options(on_progress=ask_once))
    calls[0].join(30)
    assert built == [] and answers[0].warnings == () and answers[0].items[0].path == "billing/退款政策.md"


def test_an_empty_kb_says_it_holds_no_documents_yet(tmp_path: Path) -> None:
    # A newcomer's empty KB answered "This knowledge base holds:" and nothing after it.
    kindex.reindex(tmp_path)
    ctx = kindex.build_context(tmp_path, "你好")
    assert ctx.fallback and ctx.text.endswith("This knowledge base holds no documents yet.")


def test_a_page_that_is_only_its_frontmatter_is_served_as_written(tmp_path: Path) -> None:
    # search found it by its entry; context dropped it as unreadable and advised a reindex that changed nothing.
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.md").write_text(
        "---\ntitle: 发票抬头修改\ndescription: 如何修改发票抬头和税号\n---\n<!-- 草稿 -->\n", encoding="utf-8"
    )
    (tmp_path / "t" / "b.md").write_text("# 其他\n\n其他内容。\n", encoding="utf-8")
    kindex.reindex(tmp_path)
    ctx = kindex.build_context(tmp_path, "发票抬头怎么改")
    assert not ctx.fallback and [i.path for i in ctx.items] == ["t/a.md"]
    assert "description: 如何修改发票抬头和税号" in ctx.text and "草稿" not in ctx.text


def _held_loads(
    monkeypatch: pytest.MonkeyPatch, held: set[Path]
) -> tuple[threading.Semaphore, threading.Event, list[int]]:
    """Loads of the KBs in ``held`` wait for the event returned; each load's entry is signalled on the semaphore,
    and the most loads seen inside at once is kept in the list."""
    entered, release, most = threading.Semaphore(0), threading.Event(), [0]
    inside = [0]
    count = threading.Lock()
    real = kindex.retrieve._load

    def load(kb: Path, last: Any = None) -> Any:
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        entered.release()
        if kb in held:
            release.wait(30)
        with count:
            inside[0] -= 1
        return real(kb, last)

    monkeypatch.setattr(kindex.retrieve, "_load", load)
    monkeypatch.setattr(kindex.retrieve, "_LOADING", threading.BoundedSemaphore(2))
    return entered, release, most


def _small_kbs(root: Path, count: int) -> list[Path]:
    return [
        make_kb(root / f"kb{i}", {"t/a.md": (_doc("a.md", "退款", "退款说明"), "# 退款\n\n七天内可退款。\n")}).resolve()
        for i in range(count)
    ]


def test_loads_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 clients loading 56 agents at once put a loaded agent's 4–8 ms call at 76–149 ms while they ran.
    kbs = _small_kbs(tmp_path, 4)
    entered, release, most = _held_loads(monkeypatch, set(kbs))
    monkeypatch.setattr(kindex.retrieve, "LOAD_WAIT_S", 60.0)
    threads = [threading.Thread(target=kindex.Retriever(kb).loaded) for kb in kbs]
    for t in threads:
        t.start()
    assert entered.acquire(timeout=30) and entered.acquire(timeout=30)
    assert not entered.acquire(timeout=0.3)  # the other two wait for a turn
    release.set()
    for t in threads:
        t.join(30)
    assert most == [2] and all(not t.is_alive() for t in threads)


def test_a_slow_load_holds_no_other_back_for_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A KB rebuilt from its documents (its tables deleted) may take a minute to load: the others' first calls
    # wait LOAD_WAIT_S for a turn, then run anyway.
    slow_a, slow_b, other = _small_kbs(tmp_path, 3)
    entered, release, _ = _held_loads(monkeypatch, {slow_a, slow_b})
    monkeypatch.setattr(kindex.retrieve, "LOAD_WAIT_S", 0.05)
    threads = [threading.Thread(target=kindex.Retriever(kb).loaded) for kb in (slow_a, slow_b)]
    for t in threads:
        t.start()
    assert entered.acquire(timeout=30) and entered.acquire(timeout=30)
    found: list[str] = []
    asker = threading.Thread(target=lambda: found.extend(h.path for h in kindex.Retriever(other).search("退款")))
    asker.start()
    asker.join(10)
    loaded_while_held = not asker.is_alive()  # both turns are held until the release below
    release.set()
    for t in [*threads, asker]:
        t.join(30)
    assert loaded_while_held and found == ["t/a.md"]


def test_a_glob_many_entries_share_is_matched_once_a_question(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every entry's globs were matched against every path afresh: 100 paths over 1,444 entries of 16 globs drawn
    # from 40 took 198 ms a question.
    globs = ("web/**/*.tsx", "server/**/*.go")
    docs = {
        f"t/r{i}.md": (_doc(f"r{i}.md", f"规则{i}", "组件规范", paths=globs), f"# 规则{i}\n\n组件规范。\n")
        for i in range(30)
    }
    kb = make_kb(tmp_path / "kb", docs)
    looked: list[str] = []
    real = kindex.globs.Scope._matches

    def counted(self: Any, glob: str) -> bool:
        looked.append(glob)
        return real(self, glob)

    monkeypatch.setattr(kindex.globs.Scope, "_matches", counted)
    ctx = kindex.build_context(kb, "组件规范", paths=["server/api/sign.go", "docs/a.md"], max_docs=50)
    assert sorted(looked) == sorted(globs)
    assert len([i for i in ctx.items if i.reason == "scope glob server/**/*.go"]) == 30


def test_a_section_is_found_by_its_heading_as_the_page_writes_it() -> None:
    # MCP's read_document refused `使用 `CORSMiddleware``, the heading as get_context shows the page, and its raw
    # line with the `{ #id }` attribute: only the form without backticks was accepted.
    text = "# CORS\n\n简介。\n\n## 使用 `CORSMiddleware` { #use-corsmiddleware }\n\n这样用。\n\n## 其他\n\n别的。\n"
    for asked in ("使用 `CORSMiddleware`", "## 使用 `CORSMiddleware` { #use-corsmiddleware }", "使用 CORSMiddleware"):
        part = kindex.markdown.section(text, asked)
        assert part is not None and part.endswith("这样用。") and "别的" not in part, asked
    assert kindex.markdown.section(text, "无此标题") is None


def test_a_folder_deleted_after_its_first_question_is_not_found_not_unindexed(tmp_path: Path) -> None:
    # The library's kept handle said `index_missing: ... run kindex reindex on it first`, advice that would fail,
    # where the CLI, the service and a new handle say the folder is gone.
    kb = tmp_path / "kb"
    (kb / "t").mkdir(parents=True)
    (kb / "t" / "refund.md").write_text("# 退款\n\n退款政策说明。\n", encoding="utf-8")
    kindex.reindex(kb)
    assert kindex.build_context(kb, "退款").items
    shutil.rmtree(kb)
    for ask in (lambda: kindex.build_context(kb, "退款"), lambda: kindex.search(kb, "退款")):
        with pytest.raises(kindex.KBNotFoundError, match="knowledge folder 'kb' does not exist"):
            ask()


def test_a_loaded_index_sees_a_write_within_the_same_second_of_the_same_size(tmp_path: Path) -> None:
    # On a filesystem counting times in whole seconds, an edit and its undo written by two steps within a second left
    # the index files and tables with the times and sizes a long-lived handle had seen: it answered from the edit.
    kb = tmp_path / "kb"
    (kb / "fruit").mkdir(parents=True)
    page = kb / "fruit" / "a.md"
    page.write_text("# 苹果价格\n\n苹果的价格说明。\n", encoding="utf-8")
    (kb / "fruit" / "b.md").write_text("# 梨子\n\n梨子。\n", encoding="utf-8")
    kindex.reindex(kb)
    handle = kindex.KnowledgeBase(kb)
    written = [kb / "index.json", kb / "fruit" / "index.json", kb / ".kindex" / "search.npz"]

    def title() -> str:
        return handle.search("价格", limit=1)[0].title

    assert title() == "苹果价格"
    page.write_text("# 香蕉价格\n\n香蕉的价格说明。\n", encoding="utf-8")
    kindex.doc(kb, "fruit", "a.md")
    assert title() == "香蕉价格"
    seen = [(p.stat().st_mtime_ns, p.stat().st_size) for p in written]
    page.write_text("# 苹果价格\n\n苹果的价格说明。\n", encoding="utf-8")
    kindex.doc(kb, "fruit", "a.md")
    for p, (mtime, size) in zip(written, seen, strict=True):
        os.utime(p, ns=(mtime, mtime))  # the same second, and the same size: only the inode tells
        assert p.stat().st_size == size
    assert title() == "苹果价格"
