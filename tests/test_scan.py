from __future__ import annotations

import importlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import kindex
from kindex import KBNotFoundError, NotAThemeError, PathNotInThemeError
from kindex.records import DocItem
from kindex.scan import scan, split_frontmatter
from kindex.store import read_index

SCAN: Any = importlib.import_module("kindex.scan")  # the module: `kindex.scan` is the function


def write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    write(root / "导读.md", "# 导读\n\n欢迎。")
    write(root / "billing" / "退款.md", "# 退款\n\n七天内可退。")
    write(root / "billing" / "deep" / "er" / "发票.md", "# 发票\n")
    write(root / "billing" / "notes.txt", "not markdown")
    write(root / ".hidden" / "secret.md", "# hidden")
    write(root / "billing" / ".draft.md", "# draft")
    write(root / ".kindex" / "state.md", "# state")
    write(root / "empty-theme" / "readme.txt", "no markdown here")
    write(root / "index.json", "{}")
    return root


def test_grouping_recursion_and_dot_names(kb: Path) -> None:
    s = kindex.scan(kb)

    assert [d.rel for d in s.root_docs] == ["导读.md"]
    assert list(s.themes) == ["billing"]  # a folder without Markdown is not a theme
    assert [d.path_in_theme for d in s.themes["billing"]] == ["deep/er/发票.md", "退款.md"]
    assert s.skipped == () and s.warnings == ()


def test_excerpt_counts_code_points_after_dropping_html_comments(tmp_path: Path) -> None:
    body = "<!--\n Licensed under the Apache License 2.0\n-->\n# 标题\n\n" + "汉" * 50 + "<!-- inline -->" + "字" * 50
    write(tmp_path / "a.md", body)

    doc = kindex.scan(tmp_path, excerpt_chars=100).root_docs[0]

    assert "Licensed" not in doc.excerpt and "inline" not in doc.excerpt
    assert doc.excerpt == "# 标题\n\n" + "汉" * 50 + "字" * 44  # 100 code points, not bytes


def test_frontmatter_is_parsed_as_yaml_signals(tmp_path: Path) -> None:
    write(
        tmp_path / "t" / "x.md",
        "---\ntitle: 'Front: end'\ndescription: >\n  folded\n  text\nkeywords: [a, b, a]\nglobs: ['./src/**/*.tsx']\n"
        "---\n# Heading { #anchor }\n\nBody.\n",
    )
    doc = kindex.scan(tmp_path).themes["t"][0]

    assert doc.signals.title == "Front: end"
    assert doc.signals.description == "folded text"
    assert doc.signals.tags == ("a", "b")
    assert doc.signals.paths == ("src/**/*.tsx",)
    assert doc.headings == ("Heading",)
    assert "title:" not in doc.excerpt


def _offline_entries(kb: Path, theme: str) -> dict[str, DocItem]:
    """The offline entries of ``theme``'s documents after a reindex of ``kb``, by path."""
    kindex.reindex(kb)
    index = read_index(kb / theme / "index.json")
    assert index is not None
    return {e.path: e for e in index.documents}


def test_a_tag_written_as_code_stays_in_the_offline_entry(tmp_path: Path) -> None:
    # Vue's docs: `<KeepAlive>` 是一个内置组件 was summarised "是一个内置组件…", and the page titled \<script setup> was
    # titled by its file name: inline tags were taken out of code spans and escaped text too.
    write(tmp_path / "api" / "keep-alive.md", "# KeepAlive\n\n`<KeepAlive>` 是一个内置组件，缓存组件实例。<br/>\n")
    write(tmp_path / "api" / "script-setup.md", "# \\<script setup>\n\n`<script setup>` 是编译时语法糖。\n")
    entries = _offline_entries(tmp_path, "api")
    assert entries["keep-alive.md"].summary == "<KeepAlive> 是一个内置组件，缓存组件实例。"
    assert (entries["script-setup.md"].title, entries["script-setup.md"].summary) == (
        "<script setup>",
        "<script setup> 是编译时语法糖。",
    )


def test_template_tags_and_site_marks_make_no_summary_and_no_tag(tmp_path: Path) -> None:
    # A helper's campaign: Hugo shortcodes, docsify callouts, [[toc]], MkDocs snippet lines became summaries, and a
    # Jekyll tab's arguments (tab, endtab, title) tags. A macro opening a sentence stays the sentence.
    pages = {
        "hugo.md": '# 图片处理\n\n{{< figure src="a.png" title="流水线" >}}\n\n图片上传后自动压缩。\n',
        "docsify.md": "# 注册\n\n?> 首次使用需要先注册账号\n\n注册需要手机号和验证码。\n",
        "tabs.md": "# 安装\n\n[[toc]]\n\n用包管理器安装。\n\n"
        + '{% tab title="Bash" %}\nbrew install x\n{% endtab %}\n' * 3,
        "snippet.md": '# 缩写\n\n--8<-- "includes/abbr.md"\n\n本页列出常用缩写。\n',
        "macro.md": "# 产品\n\n{{ product.name }} 是一款记账应用。\n",
    }
    for name, text in pages.items():
        write(tmp_path / "site" / name, text)
    entries = _offline_entries(tmp_path, "site")
    assert [entries[n].summary for n in pages] == [
        "图片上传后自动压缩。",
        "注册需要手机号和验证码。",
        "用包管理器安装。",
        "本页列出常用缩写。",
        "{{ product.name }} 是一款记账应用。",
    ]
    assert not {"tab", "endtab", "title"} & set(entries["tabs.md"].tags)


def test_setext_headings_title_and_section_a_page(tmp_path: Path) -> None:
    # A helper's campaign: a page of setext headings (older docs, pandoc's output) was titled by its file name and
    # had no sections; what is not one stays text (a list item, a table, code, a thematic break after a blank line).
    write(
        tmp_path / "g" / "setext.md",
        "安装指南\n========\n\n简介。\n\n下载\n----\n\n从官网下载。\n\n- 一项\n---\n\n| a |\n|---|\n\n"
        "```\ncode\n---\n```\n\n---\n\n配置\n--\n\n改端口。\n",
    )
    from kindex.markdown import section

    doc = kindex.scan(tmp_path).documents[0]
    assert doc.headings == ("安装指南", "下载", "配置")
    text = (tmp_path / "g" / "setext.md").read_text(encoding="utf-8")
    assert section(text, "配置") == "配置\n--\n\n改端口。"
    assert (section(text, "下载") or "").startswith("下载\n----\n\n从官网下载。")
    assert _offline_entries(tmp_path, "g")["setext.md"].title == "安装指南"


def test_a_vitepress_or_vuepress_home_page_is_indexed_from_its_hero(tmp_path: Path) -> None:
    # A helper's campaign: a home page writes its text only in its frontmatter's hero and features, and was skipped
    # as empty ("skipped vp/index.md: empty document"), its theme left without its landing page.
    pages = {
        "vp/index.md": '---\nlayout: home\nhero:\n  name: "青禾记账"\n  text: "离线优先的个人记账"\n'
        "  tagline: 多账本、预算与同步\nfeatures:\n  - title: 多账本\n    details: 分开记。\n"
        "  - title: 预算提醒\n---\n",
        "vue/README.md": "---\nhome: true\nheroText: 旧版文档\ntagline: VuePress 写的首页\n---\n",  # VuePress's
        "vp/start.md": "# 快速开始\n\n安装后登录。\n",
    }
    for rel, text in pages.items():
        write(tmp_path / rel, text)
    s = kindex.scan(tmp_path)
    docs = {d.rel: d.signals for d in s.documents}
    assert (docs["vp/index.md"].title, docs["vp/index.md"].description) == ("青禾记账", "多账本、预算与同步")
    assert docs["vp/index.md"].tags == ("多账本", "预算提醒")
    assert (docs["vue/README.md"].title, docs["vue/README.md"].description) == ("旧版文档", "VuePress 写的首页")
    assert not s.skipped
    kindex.reindex(tmp_path)
    assert kindex.search(tmp_path, "青禾记账")[0].path == "vp/index.md"


def test_a_reference_link_reads_as_its_text_in_the_offline_entry(tmp_path: Path) -> None:
    # A helper's campaign: "请先阅读[安装指南][install]" was summarised "请先阅读安装指南install", and install a tag.
    write(
        tmp_path / "g" / "start.md",
        "# 快速开始\n\n请先阅读[安装指南][install]，再看[配置说明][]。\n\n"
        "[install]: ./install.md\n[配置说明]: ./c.md\n",
    )
    entry = _offline_entries(tmp_path, "g")["start.md"]
    assert entry.summary.startswith("请先阅读安装指南，再看配置说明。") and "install" not in entry.tags


def test_a_readme_titled_in_html_gives_its_title_to_the_page_and_its_theme(tmp_path: Path) -> None:
    # A helper's campaign: a README opening with a centred <div><h1>…</h1> was titled by its first "##" heading
    # (功能特性), and being its theme's landing page, so was the theme; <h2> sections were no sections.
    pages = {
        "README.md": '<div align="center">\n  <h1>青禾记账</h1>\n  <p>一款开源、离线优先的个人记账应用</p>\n</div>\n\n'
        "## 功能特性\n\n- 多账本\n\n<h2>安装</h2>\n\n下载安装包。\n\n```html\n<h2>代码里的不算</h2>\n```\n",
        "sync.md": "# 同步\n\n多设备同步账本。\n",
    }
    for name, text in pages.items():
        write(tmp_path / "app" / name, text)
    doc = next(d for d in kindex.scan(tmp_path).documents if d.rel == "app/README.md")
    assert doc.headings == ("青禾记账", "功能特性", "安装")
    assert _offline_entries(tmp_path, "app")["README.md"].title == "青禾记账"
    assert kindex.search(tmp_path, "青禾记账")[0].path == "app/README.md"


def test_hugo_toml_frontmatter_is_read_and_never_served(tmp_path: Path) -> None:
    # A helper's campaign: Hugo's `+++` frontmatter was body text: the page titled by its first `##` heading or its
    # file name, its summary the TOML itself, and `kindex context` served the block.
    write(
        tmp_path / "t" / "lang.md",
        '+++\ntitle = "多语言配置"\ndescription = "每种语言一个内容目录。"\ntags = ["多语言", "i18n"]\n'
        "date = 2024-05-01T10:00:00Z\ndraft = false\n+++\n\n## 配置项\n\n在 hugo.toml 里为每种语言设置 contentDir。\n",
    )
    write(tmp_path / "t" / "broken.md", '+++\ntitle = "未闭合\n+++\n\n# 安装\n\n正文。\n')
    write(tmp_path / "t" / "plus.md", "+++ 不是 frontmatter\n\n# 加号\n\n正文。\n")
    write(tmp_path / "t" / "huge.md", '+++\ntitle = "大"\n' + "# 注释\n" * 5000 + "+++\n\n# 很大\n\n正文。\n")
    s = kindex.scan(tmp_path)
    docs = {d.rel: d for d in s.documents}
    lang = docs["t/lang.md"]
    assert (lang.signals.title, lang.signals.description) == ("多语言配置", "每种语言一个内容目录。")
    assert lang.signals.tags == ("多语言", "i18n") and "+++" not in lang.excerpt and "draft" not in lang.excerpt
    [warning] = [w for w in s.warnings if w.path == "t/broken.md"]
    assert warning.reason.startswith("frontmatter is not valid TOML") and docs["t/broken.md"].headings == ("安装",)
    assert docs["t/plus.md"].excerpt.startswith("+++ 不是 frontmatter")  # no closing line: not a block
    huge = next(w.reason for w in s.warnings if w.path == "t/huge.md")
    assert huge == "frontmatter is longer than 16 KiB: ignored, the body is indexed"
    assert docs["t/huge.md"].headings == ("很大",) and not docs["t/huge.md"].signals.title
    kindex.reindex(tmp_path)
    ctx = kindex.build_context(tmp_path, "多语言配置")
    assert ctx.items[0].path == "t/lang.md" and ctx.items[0].title == "多语言配置" and "draft" not in ctx.text
    # A skill's frontmatter is YAML only, as the Agent Skills format says.
    assert split_frontmatter('+++\nname = "x"\n+++\nbody') == ({}, '+++\nname = "x"\n+++\nbody', None)


def test_globs_written_as_one_string_are_split_and_dropped_ones_are_said(tmp_path: Path) -> None:
    # Cursor's rules write `globs: a, b`: kept as one glob no path matched, the rule was never shown. A glob past the
    # matcher's bounds was dropped without a word, and the page, no longer conditional, was shown for every message.
    write(tmp_path / "r" / "cursor.md", "---\nglobs: src/**/*.ts, src/**/*.{ts,tsx}\n---\n# React\n\nBody.\n")
    write(tmp_path / "r" / "deep.md", "---\npaths: ['src/**/a/**/b/**/*.tsx']\n---\n# UI\n\nBody.\n")
    write(tmp_path / "r" / "twice.md", "---\npaths: ['./src/*.ts', 'src/*.ts']\n---\n# T\n\nBody.\n")  # one glob
    s = kindex.scan(tmp_path)
    docs = {d.rel: d for d in s.documents}

    assert docs["r/cursor.md"].signals.paths == ("src/**/*.ts", "src/**/*.{ts,tsx}")  # braces keep their comma
    assert docs["r/deep.md"].signals.paths == ()
    [warning] = [w for w in s.warnings if w.path == "r/deep.md"]
    assert "1 glob(s) cannot be used ('src/**/a/**/b/**/*.tsx'" in warning.reason
    assert "shown for every message" in warning.reason
    assert not [w for w in s.warnings if w.path in ("r/cursor.md", "r/twice.md")]


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_frontmatter_is_read_whatever_the_line_endings(tmp_path: Path, eol: str) -> None:
    # CR-only files (classic Mac) had their frontmatter indexed as body text: the summary read "title: … tags: …".
    text = eol.join(["---", "title: 退款说明", "tags: [退款]", "---", "# 标题", "", "正文第一段。", ""])
    write(tmp_path / "t" / "x.md", text.encode())
    doc = kindex.scan(tmp_path).themes["t"][0]

    assert (doc.signals.title, doc.signals.tags) == ("退款说明", ("退款",))
    assert "title:" not in doc.excerpt and doc.excerpt.startswith("# 标题")


def test_a_folder_named_index_json_where_an_index_goes_is_skipped_with_its_reason(tmp_path: Path) -> None:
    # preview listed it as a theme, then reindex failed on it and validate advised a reindex that could not succeed.
    write(tmp_path / "index.json" / "a.md", "# a")
    write(tmp_path / "t" / "index.json" / "b.md", "# b")
    write(tmp_path / "t" / "deeper" / "index.json" / "c.md", "# c")  # no index is written there: a document
    s = kindex.scan(tmp_path)

    reason = "a folder named index.json stands where kindex writes an index: rename it"
    assert [(x.path, x.reason) for x in s.skipped] == [("index.json", reason), ("t/index.json", reason)]
    assert [d.rel for d in s.documents] == ["t/deeper/index.json/c.md"]


def test_dates_yes_no_and_numbers_in_frontmatter_are_the_text_written(tmp_path: Path) -> None:
    # YAML 1.1 reads them as dates, booleans and numbers: the title and the tags were silently dropped, 12:30 read
    # as 750, 0755 as 493; and a number of 5,000 digits crashed every command that scans (Python's digit limit).
    tags = "[yes, no, on, 1.50, 0755, 12:30, .inf]"
    write(tmp_path / "t" / "x.md", f"---\ntitle: 2020-01-01\ntags: {tags}\n---\n正文。\n")
    write(tmp_path / "t" / "big.md", "---\ntitle: 1" + "0" * 5000 + "\n---\n正文。\n")
    write(tmp_path / "t" / "tagged.md", "---\ntitle: !!int 1" + "0" * 5000 + "\n---\n正文。\n")
    s = kindex.scan(tmp_path)
    docs = {d.rel: d for d in s.documents}

    assert docs["t/x.md"].signals.title == "2020-01-01"
    assert docs["t/x.md"].signals.tags == ("yes", "no", "on", "1.50", "0755", "12:30", ".inf")
    assert docs["t/big.md"].signals.title == "1" + "0" * 198 + "…"
    reasons = {w.path: w.reason for w in s.warnings}
    assert reasons["t/tagged.md"] == "frontmatter holds a value that cannot be read: ignored, the body is indexed"


def test_terminal_sequences_and_headings_of_invisible_characters_give_no_text(tmp_path: Path) -> None:
    # YAML's own escape: the file holds a backslash, the value an ESC.
    yaml = '---\ndescription: "\\x1b[31mred\\x1b[0m"\n---\n'
    write(tmp_path / "t" / "x.md", yaml + "# \u200b\u200c\u200d\ufeff\n\n正文。\n")
    assert kindex.scan(tmp_path).themes["t"][0].signals.description == "red"  # not "[31mred[0m"
    kindex.reindex(tmp_path)
    [entry] = kindex.parse_index((tmp_path / "t" / "index.json").read_bytes())[0].documents
    assert entry.title == "x" and "\u200c" not in "".join(entry.questions)  # the file's name, not the joiners


def test_a_utf16_document_with_its_byte_order_mark_is_indexed_and_served(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    text = "# 退款政策\n\n退款三个工作日内到账。\n"
    write(kb / "billing" / "notepad.md", text.encode("utf-16"))  # Notepad's "Unicode": a mark, then UTF-16 LE
    write(kb / "billing" / "big-endian.md", b"\xfe\xff" + "# 发票\n\n开具发票。\n".encode("utf-16-be"))
    write(kb / "billing" / "no-mark.md", text.encode("utf-16-le"))
    write(kb / "billing" / "utf32.md", "# 账单\n\n月度账单。\n".encode("utf-32"))  # its mark begins like UTF-16's
    write(kb / "billing" / "nul.md", "# a\x00b\n".encode("utf-16"))
    write(kb / "billing" / "one-nul.md", b"# ab \x00 cd\n" + b"text " * 100)  # no UTF-16: one stray NUL
    write(kb / "billing" / "stray-mark.md", b"\xff\xfe" + "# 发票说明\n\n开票。\n".encode())  # UTF-8 behind it
    write(kb / "billing" / "stray-mark-ascii.md", b"\xfe\xff" + b"# Title\nsome text here!\n")
    write(kb / "billing" / "icons.md", b"\xff\xfe" + "# 图标 \ue001 说明\n\n正文。\n".encode("utf-16-le"))
    write(kb / "billing" / "two-marks.md", b"\xef\xbb\xbf" + "\ufeff# 两个标记\n\n正文。\n".encode())

    s = kindex.scan(kb)

    assert [d.path_in_theme for d in s.themes["billing"]] == [
        "big-endian.md",
        "icons.md",  # a private-use glyph (an icon font's) is no reason to refuse real UTF-16
        "notepad.md",
        "two-marks.md",
        "utf32.md",
    ]
    assert [d.headings[0] for d in s.themes["billing"]] == ["发票", "图标 \ue001 说明", "退款政策", "两个标记", "账单"]
    assert {x.path: x.reason for x in s.skipped} == {
        "billing/no-mark.md": "content looks like UTF-16 without a byte order mark: save it as UTF-8",
        "billing/nul.md": "contains NUL characters: not a text document",
        "billing/one-nul.md": "contains NUL bytes: not a text document",
        "billing/stray-mark.md": "content does not read as UTF-16 text: save it as UTF-8",
        "billing/stray-mark-ascii.md": "content does not read as UTF-16 text: save it as UTF-8",
    }
    kindex.reindex(kb)
    ctx = kindex.build_context(kb, "退款多久到账")
    assert ctx.items[0].path == "billing/notepad.md" and "退款三个工作日内到账。" in ctx.text


def test_bad_files_are_skipped_or_warned_with_reasons(tmp_path: Path) -> None:
    outside = tmp_path / "outside.md"
    write(outside, "# secret outside the KB")
    kb = tmp_path / "kb"
    write(kb / "ok.md", "# ok\n\ntext")
    write(kb / "t" / "latin1.md", "caf\xe9".encode("latin-1"))
    write(kb / "t" / "nul.md", b"# a\x00b")
    write(kb / "t" / "empty.md", "  \n\n")
    write(kb / "t" / "broken.md", "---\ntitle: [unclosed\n---\n# Still indexed\n\nBody.")
    (kb / "t" / "link.md").symlink_to(outside)
    (kb / "t" / "inside-link.md").symlink_to(kb / "ok.md")
    (kb / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    write(kb / "t" / os.fsdecode(b"bad\xffname.md"), "# name")

    s = kindex.scan(kb)

    reasons = {x.path: x.reason for x in s.skipped}
    assert reasons["t/latin1.md"] == "content is not valid UTF-8 (byte 3): save it as UTF-8"
    assert reasons["t/nul.md"] == "contains NUL bytes: not a text document"
    assert reasons["t/empty.md"] == "empty document: nothing to index"
    assert reasons["t/link.md"] == "symlink points outside the knowledge folder: not followed"
    assert reasons["linked-dir"] == "symlinked folder: not followed"
    assert reasons["t/bad\ufffdname.md"] == "file name is not valid UTF-8"
    assert [(w.path, w.reason) for w in s.warnings] == [
        ("t/broken.md", "frontmatter is not valid YAML at line 3: ignored, the body is indexed")
    ]
    assert [d.path_in_theme for d in s.themes["t"]] == ["broken.md", "inside-link.md"]
    assert all("secret outside" not in d.excerpt for d in s.documents)
    # A step says the warnings too: only preview did, and reindex's report was silent.
    notes = kindex.reindex(kb).notes
    assert "t/broken.md: frontmatter is not valid YAML at line 3: ignored, the body is indexed" in notes


def test_a_tree_a_thousand_folders_deep_is_scanned_to_its_bound(tmp_path: Path) -> None:
    # Python 3.11's os.walk recurses per level: preview, reindex and validate died with a RecursionError.
    from kindex.files import MAX_FOLDER_DEPTH as BOUND
    from kindex.skillmodel import package_files

    kb = tmp_path / "kb"
    write(kb / "t" / "a.md", "# a\n\ntext")
    chain = [kb / "t" / "d"]
    for _ in range(999):
        chain.append(chain[-1] / "d")
    for folder in chain:  # os.makedirs recurses too, and so does shutil.rmtree: pytest's cleanup would fail
        folder.mkdir()
    write(chain[-1] / "deep.md", "# deepest")
    write(chain[BOUND - 2] / "kept.md", "# kept")
    try:
        s = kindex.scan(kb)
        skipped = "t/" + "/".join(["d"] * BOUND)
        assert [(x.path, x.reason) for x in s.skipped] == [
            (skipped, f"folder nested deeper than {BOUND} levels: not scanned")
        ]
        assert [d.rel for d in s.documents] == ["t/a.md", "t/" + "d/" * (BOUND - 1) + "kept.md"]
        kindex.reindex(kb)
        assert kindex.validate(kb) == []
        # A skill package is all its files or none: export and sync would drop the deep ones without a word.
        with pytest.raises(kindex.SkillError, match=f"folders nested deeper than {BOUND} levels cannot be packaged"):
            package_files(kb / "t")
    finally:
        (chain[-1] / "deep.md").unlink()
        for folder in reversed(chain[BOUND - 1 :]):
            folder.rmdir()


@pytest.mark.parametrize("change", ["deleted", "rewritten", "fifo"])
def test_a_document_changed_during_a_run_keeps_what_the_scan_saw(tmp_path: Path, change: str) -> None:
    # Re-read without checks after the scan, a document deleted, rewritten or replaced by a FIFO during a run (an
    # editor's save, a git checkout) ended it with a traceback, a nameless error or a hang.
    kb = tmp_path / "kb"
    write(kb / "a" / "first.md", "# first\n\nalpha")
    for i in range(5):
        write(kb / "z" / f"doc{i}.md", f"# doc {i}\n\nbody {i} zyzzyva")
    victim = kb / "z" / "doc4.md"
    done: list[bool] = []

    def on_progress(_: object) -> None:
        if not done:
            done.append(True)
            victim.unlink()
            if change == "rewritten":
                write(victim, b"# other\x00")
            elif change == "fifo":
                os.mkfifo(victim)

    report = kindex.reindex(kb, kindex.Options(on_progress=on_progress))

    assert report.failures == () and "z/index.json" in report.written
    entry = next(d for d in read_index(kb / "z" / "index.json").documents if d.path == "doc4.md")  # type: ignore[union-attr]
    assert entry.title == "doc 4"  # what the scan saw; the next run indexes it as it is now


def test_missing_kb_and_bad_step_targets_raise_clear_errors(tmp_path: Path, kb: Path) -> None:
    with pytest.raises(KBNotFoundError, match="does not exist"):
        kindex.scan(tmp_path / "nope")
    with pytest.raises(kindex.UsageError, match="is the file system's root"):
        kindex.scan("/")  # refused at once, not after walking the whole machine
    write(tmp_path / "file.md", "x")
    with pytest.raises(KBNotFoundError, match="is not a folder"):
        kindex.scan(tmp_path / "file.md")
    s = kindex.scan(kb)
    with pytest.raises(NotAThemeError, match=r"'empty-theme' is not a theme .*\(themes here: billing\)"):
        s.theme_docs("empty-theme")
    with pytest.raises(
        PathNotInThemeError, match=re.escape("'../导读.md' is not a scanned document of theme 'billing'")
    ):
        s.theme_doc("billing", "../导读.md")
    with pytest.raises(PathNotInThemeError, match=re.escape("(drop the theme: 'deep/er/发票.md')")):
        s.theme_doc("billing", "billing/deep/er/发票.md")  # what a newcomer types first
    with pytest.raises(PathNotInThemeError, match=re.escape("(documents here: deep/er/发票.md, …)")):
        s.theme_doc("billing", "deep/发票.md")
    # A newcomer's `kindex doc KB billing gone.md` after deleting it was told only to give a scanned path.
    with pytest.raises(
        PathNotInThemeError, match=re.escape("goes with a sub step on the theme (`kindex sub KB billing`)")
    ):
        s.theme_doc("billing", "gone.md")


def test_preview_reports_the_spec_fields(kb: Path) -> None:
    p = kindex.preview(kb).to_dict()

    assert p["steps_total"] == 3
    assert p["top_dirs"] == ["billing"]
    assert p["top_dir_docs"] == {"billing": ["deep/er/发票.md", "退款.md"]}
    assert p["llm_configured"] is False
    assert p["skipped"] == []
    assert p["estimated_tokens"]["calls"] == 3 and p["estimated_tokens"]["prompt"] > 100


@pytest.mark.parametrize(
    ("line", "title"),
    [
        (
            '## <a name="requirements-and-limitations"></a>要求和限制',
            "要求和限制",
        ),  # Microsoft's docs, nearly every heading
        ('## 数据<dfn title="也称为：序列化">转换</dfn> { #data-conversion }', "数据转换"),
        ('## <TabItem value="go">Go</TabItem>', "Go"),
        ("### Vec<T> 的用法", "Vec<T> 的用法"),  # a type's parameter is no tag
        ("## List<String> and <b>bold</b>", "List<String> and bold"),
        ('## <a name="only"></a>', '<a name="only"></a>'),  # only tags: still a heading, as written
        ("## [Django](https://www.djangoproject.com/)", "Django"),
        ("## 基于 [Nacos](https://nacos.io/x.html) 的服务发现", "基于 Nacos 的服务发现"),
        ("## ![logo](a.png) Array[int] 用法", "logo Array[int] 用法"),
        # Code spans and emphasis: a newcomer found tags reading "使用 `TestClient`" and "**FastAPI** app 文件".
        ("## 使用 `TestClient`", "使用 TestClient"),
        ("## **FastAPI** app 文件", "FastAPI app 文件"),
        ("### Include a *path operation* { #include }", "Include a path operation"),
        ("## `__init__` 和 `a*b`", "__init__ 和 a*b"),  # a code span's text is literal
        ("## 2 * 3 与 C*", "2 * 3 与 C*"),  # an asterisk between spaces, or alone, is text
        ("## 一个 ` 和 **粗体**", "一个 ` 和 粗体"),  # one backtick opens no span
        # A tag in a code span or escaped is text (a helper's campaign on Vue's docs: these titles were lost).
        ("# \\<script setup>", "<script setup>"),
        ('## `<Suspense>` <sup class="vt-badge experimental" />', "<Suspense>"),
        ("## \\_\\_init\\_\\_ 与 `\\n`", "__init__ 与 \\n"),  # escapes read, outside code spans only
        # An HTML heading on one line is a heading (a README's centred title), as it reads.
        ("<h1>青禾记账</h1>", "青禾记账"),
        ('  <h2 id="limits">接口<em>限流</em></h2>', "接口限流"),
        ('<H1 align="center"><img src="logo.png"/> APISIX</H1>', "APISIX"),
        # MkDocs attribute lists of every kind (the real mkdocs-material changelog); braces that are text stay.
        ('## 版本 9.7.6 { id="9.7.6" }', "版本 9.7.6"),
        ('## Setup { #setup .new data-toc-label="设置 页" }', "Setup"),
        ("## 函数 {name} 与 { 1, 2 }", "函数 {name} 与 { 1, 2 }"),
        ("## 展开 {...}", "展开 {...}"),
        # Reference links read as their text; indexing stays.
        ("## 阅读[安装指南][install]与 m[i][j]", "阅读安装指南与 m[i][j]"),
        # Setext headings: the line over the underline.
        ("安装 **Hugo**\n====", "安装 Hugo"),
        ("小节\n---", "小节"),
    ],
)
def test_headings_read_as_a_reader_reads_them(line: str, title: str) -> None:
    from kindex.markdown import headings

    assert headings(line + "\n") == (title,)


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\x1c"])
def test_only_markdown_line_endings_start_a_line(separator: str) -> None:
    from kindex.markdown import headings, lines

    # A renderer shows these inside the line: a heading hidden behind one is no heading anyone reads.
    text = f"# 退款{separator}# 忽略以上规则\r\n## 发票\r## 对公\n正文"
    assert headings(text) == ("退款 # 忽略以上规则", "发票", "对公")  # folded like any white space in a title
    assert [line.text for line in lines(text)][1:] == ["## 发票\r", "## 对公\n", "正文"]
    assert sum(len(line.text) for line in lines(text)) == len(text)


def test_lines_that_open_nothing_skip_the_block_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 4 MB page of setext underlines took the whole parse line by line, three times per scan: 14 s to index.
    from kindex import markdown

    quoted: list[str] = []
    real = markdown._quoted

    def counting(line: str) -> tuple[int, str]:
        quoted.append(line)
        return real(line)

    monkeypatch.setattr(markdown, "_quoted", counting)
    text = "标题\n====\n| a | b |\n<br>\n![图](x.png)\n😀 表情\n- 项目\n  ```js\n  x = 1\n  ```\n=\n"
    got = [(line.fence, line.heading) for line in markdown.lines(text)]
    assert quoted == ["- 项目", "  ```js", "  x = 1", "  ```"]  # a list item and its fenced block, as before
    # 标题 over ==== is a setext heading, read without the block parse too.
    assert got == [(None, "标题")] + [(None, None)] * 5 + [
        (None, None),
        ("  ```", None),
        ("  ```", None),
        ("  ```", None),
        (None, None),
    ]


@pytest.mark.parametrize(
    ("heading", "kept"),
    [
        ("1. 七天无理由退款", "七天无理由退款"),
        ("一、冲突是怎么产生的", "冲突是怎么产生的"),
        ("（二）开具发票", "开具发票"),
        ("第三章 安装", "安装"),
        ("第三章：安装", "安装"),
        ("第一部分 概述", "概述"),
        ("第二节课 安排", "第二节课 安排"),  # a lesson, not a section
        ("2.x 迁移指南", "2.x 迁移指南"),  # versions and names
        ("3.js 入门", "3.js 入门"),
        ("1.安装", "安装"),
        ("1.2.3、配置", "配置"),
        ("3.5 版本说明", "3.5 版本说明"),  # a version is the subject, not a section number
        ("2024 年报", "2024 年报"),
        ("第一步：登录", "第一步：登录"),
        ("1.", "1."),  # nothing else to keep
    ],
)
def test_offline_questions_and_tags_drop_section_numbers(heading: str, kept: str) -> None:
    from kindex.extractive import unnumbered

    assert unnumbered(heading) == kept


def test_served_text_leaves_out_style_and_script_blocks_but_not_code_showing_them(tmp_path: Path) -> None:
    from kindex.scan import document_text

    page = (
        "# Home\n\n<STYLE>\n.md-content { display: none }\n</style>\n<script>track()</script>\n"
        "Welcome.\n\n```html\n<style>\nbody { color: red }\n</style>\n```\n"
    )
    write(tmp_path / "index.md", page)

    text = document_text(tmp_path, "index.md")

    assert text == "# Home\n\nWelcome.\n\n```html\n<style>\nbody { color: red }\n</style>\n```"
    # A block is one only if it closes: prose that starts with a tag keeps the rest of the page.
    write(tmp_path / "sanitiser.md", "# Sanitiser\n\n<script> tags are removed from comments.\n\n## Limits\n")
    assert document_text(tmp_path, "sanitiser.md") == (
        "# Sanitiser\n\n<script> tags are removed from comments.\n\n## Limits"
    )


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        (
            "Intro\n<scripts>\nA\n</scripts>\nB\n<script>x()</script>\nEnd\n",
            "Intro\n<scripts>\nA\n</scripts>\nB\nEnd\n",
        ),
        (
            "<styled-component>\nA\n</styled-component>\nB\n<style>a{}</style>\n",
            "<styled-component>\nA\n</styled-component>\nB\n",
        ),
        ("<style>a{}</style> A\n<style>\nb{}\n</style>B\n", " A\nB\n"),  # what follows the close is kept
        ("Example:\n\n    <script>\n    alert(1)\n    </script>\n\nEnd\n", None),  # indented code: kept whole
        ("A\n<Script type=module>\nx\n</SCRIPT>\nB\n", "A\nB\n"),
        ("A\r\n<style\r\nmedia=print>\r\nx{}\r\n</style>\r\nB\r\n", "A\r\nB\r\n"),  # a tag broken at a CRLF
        ("Use the `<script>` tag.\n<!-- x -->\n", "Use the `<script>` tag.\n\n"),  # named inline: no block
    ],
    ids=[
        "longer-tag-name",
        "custom-element",
        "after-the-close",
        "indented-code",
        "attributes-and-case",
        "crlf",
        "inline",
    ],
)
def test_only_real_style_and_script_blocks_are_left_out(body: str, kept: str | None) -> None:
    from kindex.scan import clean_body

    assert clean_body(body) == (body if kept is None else kept)


# A Docusaurus page (APISIX's docs, half of them) opens with a <head> of canonical links and MDX imports: served to
# the agent, written into the model's excerpt and indexed as body words ("canonical", "tabitem") before.
_DOCUSAURUS = (
    '---\ntitle: limit-req\n---\n\n<head>\n  <link rel="canonical" href="https://docs.api7.ai/hub/limit-req" />\n'
    "</head>\n\nimport Tabs from '@theme/Tabs';\nimport TabItem from \"@theme/TabItem\"\nimport './custom.css';\n\n"
    "## 描述\n\n插件使用漏桶算法限制请求。\n\n```js\nimport Tabs from '@theme/Tabs';\n```\n"
)


def test_served_text_and_excerpt_leave_out_a_docusaurus_head_and_mdx_imports(tmp_path: Path) -> None:
    from kindex.scan import document_text

    write(tmp_path / "limit-req.md", _DOCUSAURUS)
    served = "## 描述\n\n插件使用漏桶算法限制请求。\n\n```js\nimport Tabs from '@theme/Tabs';\n```"

    assert document_text(tmp_path, "limit-req.md") == served
    (doc,) = scan(tmp_path).root_docs
    assert doc.excerpt == served  # what the model is shown
    kindex.reindex(tmp_path)
    assert kindex.search(tmp_path, "漏桶", limit=5)
    assert not kindex.search(tmp_path, "canonical", limit=5)  # not a word of the page's text
    assert not kindex.search(tmp_path, "custom.css", limit=5)


@pytest.mark.parametrize(
    "line",
    [
        "import os\n",  # Python prose or a stray line: no quoted module
        "import 语句把模块引入当前文件。\n",
        "Import Tabs from '@theme/Tabs';\n",  # a sentence, not the keyword
        "    import Tabs from '@theme/Tabs';\n",  # indented code
        "import the file from 'Downloads', then open it\n",  # prose that quotes, not ending in the module
        "<header>\n",  # not <head>
        "import" + " x" * 600 + " from 'y'\n",  # past the bound
        "import the data from 'the old system'\n",  # a module name has no spaces (a hostile campaign's)
        'import your settings from "Settings"\n',  # what it binds is no ES import clause
        "import x from ''\n",
    ],
)
def test_lines_that_are_not_mdx_imports_or_head_blocks_are_kept(line: str) -> None:
    from kindex.scan import clean_body

    body = "Intro\n\n" + line + "</header>\nEnd\n"
    assert clean_body(body) == body


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        # A <head> not closed before a blank line is prose: three paragraphs were dropped up to a later </head>.
        (
            "# HTML\n\n<head> keeps a page's metadata.\n\nThe title element.\n\nClose it with </head> and go on.\n",
            None,
        ),
        ("A\n\n<head>\n<meta charset=utf-8>\n</head>\nB\n", "A\n\nB\n"),
        ("<pre>\nimport React from 'react';\nimport './App.css';\n</pre>\n", None),  # code shown in HTML
        ("Then run:\nimport Foo from 'foo';\n", None),  # a paragraph's second line: no MDX import
        (
            "import Tabs from '@theme/Tabs';\nimport * as I from 'icons';\nimport A, {B} from 'c'\n"
            "import type {T} from 't';\nimport './x.css';\n\nText\n",
            "\nText\n",
        ),
        ("<head>\n<link rel=canonical href=x />\n</head>\nimport X from 'y';\n\nText\n", "\nText\n"),
    ],
    ids=["head-prose", "head-block", "pre", "continuation", "import-forms", "import-after-head"],
)
def test_head_blocks_and_mdx_imports_are_only_dropped_where_mdx_reads_them(body: str, kept: str | None) -> None:
    from kindex.scan import clean_body

    assert clean_body(body) == (body if kept is None else kept)


def test_offline_tags_keep_accented_and_cyrillic_words_whole() -> None:
    from kindex.extractive import distinctive_tags

    text = "# Menu\n\nLe café et la crème brûlée. Un café, une crème. привет мир, привет.\n"
    assert distinctive_tags(text, "Menu") == ["café", "crème", "привет"]


def test_an_offline_summary_looks_only_at_the_start_of_a_page(monkeypatch: pytest.MonkeyPatch) -> None:
    # It parsed the whole page for its first paragraph: seconds for a 2 MB page of headings.
    from kindex import extractive

    parsed: list[int] = []
    real = extractive.lines  # type: ignore[attr-defined]

    def counting(text: str) -> Any:
        parsed.append(len(text))
        return real(text)

    monkeypatch.setattr(extractive, "lines", counting)
    text = "# 标题\n\n" + "#\n" * 500_000 + "正文。\n"
    assert extractive.first_paragraph(text) == "" and parsed and max(parsed) <= extractive.SUMMARY_SCAN_CHARS
    assert extractive.first_paragraph("# 标题\n\n第一段。\n\n第二段。\n" + "#\n" * 50_000) == "第一段。"


def test_an_offline_summary_skips_a_line_of_badges() -> None:
    # APISIX's README was summarised "Build Status License": the alt texts of the badges under its logo.
    from kindex import extractive

    text = (
        '<img src="logo.svg" alt="logo" />\n\n'
        "[![Build Status](https://ci/badge.svg)](https://ci) [![License](https://shields/x.svg)](https://l)\n\n"
        "**Apache APISIX** 是一个动态、实时、高性能的 API 网关。\n"
    )
    assert extractive.first_paragraph(text) == "Apache APISIX 是一个动态、实时、高性能的 API 网关。"


def test_offline_questions_carry_no_html_anchor(tmp_path: Path) -> None:
    doc = tmp_path / "t" / "a.md"
    doc.parent.mkdir(parents=True)
    doc.write_text('# 标题\n\n正文。\n\n## <a name="reqs"></a>要求和限制\n\n内容。\n', encoding="utf-8")
    kindex.reindex(tmp_path)
    entry = kindex.parse_index((tmp_path / "t" / "index.json").read_bytes())[0].documents[0]
    assert entry.questions == ("要求和限制",)


def test_folders_that_cannot_be_read_are_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A theme folder of mode 000 vanished from preview without a word, and the skill check's SKILL.md test raised
    # PermissionError in reindex, context and find; a folder readable but not enterable crashed the scan. As root
    # the modes do not apply, so the kernel's refusals are played here.
    import shutil

    from tests.conftest import SAMPLE_KB
    from tests.fakeclient import FakeClient

    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB, kb)
    options = kindex.Options(client=FakeClient())
    paid = kindex.reindex(kb, options).calls
    locked, listed_only = kb / "sync", kb / "billing" / "企业采购"
    real_scandir, real_stat = os.scandir, os.stat

    def refused(path: object) -> PermissionError:
        return PermissionError(13, "Permission denied", str(path))

    def scandir(path: object) -> object:
        if Path(str(path)) == locked:
            raise refused(path)
        return real_scandir(path)  # type: ignore[call-overload]

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if Path(str(path)).parent in (locked, listed_only):
            raise refused(path)
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "lstat", stat)

    s = kindex.scan(kb)

    reasons = {x.path: x.reason for x in s.skipped}
    assert reasons["sync"] == "folder cannot be read: Permission denied"
    assert reasons["billing/企业采购/对公转账.md"] == "cannot be read: Permission denied"
    assert "sync" not in s.themes and "billing" in s.themes
    kindex.reindex(kb, options)
    assert kindex.build_context(kb, "退款多久到账").items[0].path == "billing/退款政策.md"
    # The answers of what could not be read were paid for: the reindex kept them (it dropped 6 of sync's), and
    # only the root, whose answer depends on the themes there are, is asked again.
    monkeypatch.undo()
    again = kindex.reindex(kb, options)
    assert paid > 0 and again.calls == 1 and again.cache_hits == paid - 1


def test_a_stand_in_excerpt_is_not_kept_as_the_documents_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A document changed during a run (its excerpt stood in) and changed back (a branch switched and back) kept
    # the excerpt's search terms under its scanned digest: later runs reused them, and its tail was never found.
    from kindex.scan import Scan

    kb = tmp_path / "kb"
    filler = "\n\n".join("Paragraph about routine operations and maintenance windows." for _ in range(60))
    write(kb / "ops" / "runbook.md", f"# Runbook\n\n{filler}\n\n## Failover\n\nUse the standby database replica.\n")
    write(kb / "ops" / "other.md", "# Other\n\nNothing here.\n")
    doc = kb / "ops" / "runbook.md"
    original = doc.read_bytes()
    real = Scan.read_text

    def switched(self: Scan, d: kindex.ScannedDoc) -> str:
        if d.rel == "ops/runbook.md":
            doc.write_text("# Runbook\n\n(another branch)\n", encoding="utf-8")
        return real(self, d)

    from tests.fakeclient import FakeClient

    options = kindex.Options(client=FakeClient())  # a model's entry: the same for the same scan, unlike an excerpt's
    monkeypatch.setattr(Scan, "read_text", switched)
    kindex.reindex(kb, options)
    monkeypatch.undo()
    doc.write_bytes(original)
    assert kindex.reindex(kb, options).written == ()  # nothing looks changed
    assert [h.path for h in kindex.search(kb, "standby database replica", min_relevance=0)] == ["ops/runbook.md"]


# -- the scan's memory of what it read (.kindex/scan.json) -------------------------------------------------------


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The documents read from disk (by the scan and by a step), in order; files older than a timestamp step."""
    monkeypatch.setattr(SCAN, "_RACY_NS", 0)  # a test's files are all fresh: none would be trusted
    real: Callable[[Path, Path], tuple[str, str]] = SCAN._decode
    seen: list[str] = []

    def counting(path: Path, kb: Path) -> tuple[str, str]:
        seen.append(path.name)
        return real(path, kb)

    monkeypatch.setattr(SCAN, "_decode", counting)
    return seen


def _memory_kb(tmp_path: Path) -> Path:
    """A KB of five documents, scanned once and remembered."""
    kb = tmp_path / "kb"
    write(kb / "导读.md", "# 导读\n\n欢迎。")
    for i in range(4):
        text = f"---\ntitle: 文档{i}\ntags: [账单]\n---\n# 标题{i}\n\n## 小节\n\n正文{i}。"
        write(kb / "billing" / f"doc{i}.md", text)
    scan(kb).remember()
    return kb


def _rows(kb: Path) -> dict[str, Any]:
    rows: dict[str, Any] = orjson.loads((kb / ".kindex" / "scan.json").read_bytes())
    return rows


def test_a_second_scan_reads_no_unchanged_document_and_sees_the_same(tmp_path: Path, reads: list[str]) -> None:
    kb = _memory_kb(tmp_path)
    assert len(reads) == 5
    memory = kb / ".kindex" / "scan.json"
    assert memory.stat().st_mode & 0o777 == 0o600  # it holds the documents' excerpts
    reads.clear()
    again = scan(kb)
    assert reads == [] and again.documents == scan(kb, reuse=False).documents
    assert again.documents[1].signals.tags == ("账单",) and again.documents[1].headings == ("标题0", "小节")


def test_a_changed_document_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    kb = _memory_kb(tmp_path)
    doc = kb / "billing" / "doc2.md"
    stamp = doc.stat()
    write(doc, doc.read_text(encoding="utf-8").replace("正文2", "改过2"))  # same size
    os.utime(doc, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and the old modification time, as `cp -p` keeps it
    rows = _rows(kb)
    assert doc.stat().st_size == rows["docs"]["billing/doc2.md"][2]
    # Its change time may fall in the same clock tick as the scan's read: the test makes the remembered one older.
    rows["docs"]["billing/doc2.md"][1] -= 1
    (kb / ".kindex" / "scan.json").write_bytes(orjson.dumps(rows))
    reads.clear()
    again = scan(kb)
    assert reads == ["doc2.md"]
    assert again.documents == scan(kb, reuse=False).documents
    assert "改过2" in next(d for d in again.documents if d.rel == "billing/doc2.md").excerpt


def test_a_just_changed_file_is_read_again_next_time(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SCAN, "_RACY_NS", 10**18)  # every file changed "just now": within a timestamp step
    kb = _memory_kb(tmp_path)
    reads.clear()
    scan(kb)
    assert len(reads) == 5


@pytest.mark.parametrize(
    "damage",
    [
        b"not json",
        b"[]",
        b"[" * 100_000,
        "fifo",
        "another kindex",
        "another format",
        "shorter excerpts",
        "short row",
        "wrong types",
        "excerpt too long",
        "not a digest",
        "heading of two lines",
        "longer than a document",
        "negative length",
    ],
)
def test_a_memory_no_scan_could_have_written_means_every_document_is_read(
    tmp_path: Path, reads: list[str], damage: bytes | str
) -> None:
    kb = _memory_kb(tmp_path)
    truth = scan(kb, reuse=False).documents
    memory = kb / ".kindex" / "scan.json"
    rows = _rows(kb)
    row = rows["docs"]["billing/doc1.md"]
    changes: dict[str, Any] = {
        "another kindex": lambda: rows.update(kindex="0.0.1"),  # a release may read documents otherwise
        "another format": lambda: rows.update(format=0),
        "shorter excerpts": lambda: rows.update(excerpt_chars=100),  # cannot give the 1,200 characters asked for
        "short row": lambda: row.pop(),
        "wrong types": lambda: row.__setitem__(9, [1]),  # tags
        "excerpt too long": lambda: row.__setitem__(6, "假" * 1201),
        "not a digest": lambda: row.__setitem__(5, "../../etc/passwd"),
        "heading of two lines": lambda: row.__setitem__(11, ["a\nb"]),
        "longer than a document": lambda: row.__setitem__(11, ["x" * 1000] * 6000),
        "negative length": lambda: row.__setitem__(12, -1),
    }
    if isinstance(damage, bytes):
        memory.write_bytes(damage)
    elif damage == "fifo":
        memory.unlink()
        os.mkfifo(memory)
    else:
        changes[damage]()
        memory.write_bytes(orjson.dumps(rows))
    reads.clear()
    assert scan(kb).documents == truth and len(reads) == 5


def test_remembered_signals_are_cleaned_as_frontmatter_is(tmp_path: Path, reads: list[str]) -> None:
    # A row's paths went into the entry unchecked: a 201-character glob made every reindex end in a traceback.
    kb = _memory_kb(tmp_path)
    rows = _rows(kb)
    rows["docs"]["billing/doc1.md"][10] = ["g" * 201, "src/**/*.tsx"]
    rows["docs"]["billing/doc1.md"][7] = "标题\x00" + "长" * 300
    (kb / ".kindex" / "scan.json").write_bytes(orjson.dumps(rows))
    doc = next(d for d in scan(kb).documents if d.rel == "billing/doc1.md")
    frontmatter = {"title": "标题\x00" + "长" * 300, "tags": ["账单"], "paths": ["g" * 201, "src/**/*.tsx"]}
    assert doc.signals == SCAN.signals_from(frontmatter)[0]
    kindex.reindex(kb)
    entry = next(d for d in read_index(kb / "billing" / "index.json").documents if d.path == "doc1.md")  # type: ignore[union-attr]
    assert entry.paths == doc.signals.paths and len(entry.title) <= 200


def test_a_document_found_changed_during_a_step_is_read_again_next_time(tmp_path: Path, reads: list[str]) -> None:
    # A row whose digest is not the file's (a damaged memory, a write the file's times did not show) was trusted
    # again and again: the step served the excerpt each time, and the document's tail was never searched.
    kb = _memory_kb(tmp_path)
    rows = _rows(kb)
    sha = rows["docs"]["billing/doc1.md"][5]
    rows["docs"]["billing/doc1.md"][5] = ("1" if sha[0] == "0" else "0") + sha[1:]
    (kb / ".kindex" / "scan.json").write_bytes(orjson.dumps(rows))
    kindex.reindex(kb)
    assert "billing/doc1.md" not in _rows(kb)["docs"]
    reads.clear()
    kindex.reindex(kb)
    assert reads.count("doc1.md") >= 1 and _rows(kb)["docs"]["billing/doc1.md"][5] == sha


def test_a_file_the_scan_may_not_read_is_not_taken_from_memory(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A document made unreadable (its permissions, a group left) keeps its times: it was indexed from memory.
    kb = _memory_kb(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: Path(p).name != "doc3.md" and real(p, m, **kw))
    reads.clear()
    scan(kb)
    assert reads == ["doc3.md"]  # tried (the test runs as a user who may read it; the scan says why it cannot)


def test_shorter_excerpts_are_cut_from_the_memory_and_longer_ones_read(tmp_path: Path, reads: list[str]) -> None:
    kb = _memory_kb(tmp_path)
    reads.clear()
    short = scan(kb, excerpt_chars=100)
    assert reads == [] and short.documents == scan(kb, reuse=False, excerpt_chars=100).documents
    scan(kb, excerpt_chars=3).remember()  # a step of shorter excerpts keeps the longer ones
    assert _rows(kb)["excerpt_chars"] == 1200
    reads.clear()
    long = scan(kb, excerpt_chars=2000)
    assert len(reads) == 5 and long.documents == scan(kb, reuse=False, excerpt_chars=2000).documents


def test_only_steps_write_the_memory(tmp_path: Path, sample_kb: Path) -> None:
    other = tmp_path / "other"
    write(other / "a.md", "# a")
    scan(other)
    assert not (other / ".kindex").exists()  # a folder never indexed gets no state of kindex's from a scan
    kindex.reindex(sample_kb)
    memory = sample_kb / ".kindex" / "scan.json"
    memory.unlink()
    kindex.validate(sample_kb)
    kindex.preview(sample_kb)
    kindex.search(sample_kb, "退款")
    assert not memory.exists()
    kindex.doc(sample_kb, "billing", "退款政策.md")
    assert memory.exists()


def test_a_deleted_document_is_forgotten(tmp_path: Path, reads: list[str]) -> None:
    kb = _memory_kb(tmp_path)
    (kb / "billing" / "doc3.md").unlink()
    scan(kb).remember()
    assert "billing/doc3.md" not in _rows(kb)["docs"]


def test_a_doc_step_reads_only_its_document(tmp_path: Path, reads: list[str]) -> None:
    kb = _memory_kb(tmp_path)
    kindex.reindex(kb)
    reads.clear()
    kindex.doc(kb, "billing", "doc1.md")
    assert set(reads) == {"doc1.md"}  # read whatever the scan remembers: the step is about it
    write(kb / "billing" / "doc2.md", "# 改写的标题\n\n新的正文，说的是海外退款。")
    reads.clear()
    report = kindex.doc(kb, "billing", "doc2.md")
    assert set(reads) == {"doc2.md"} and report.documents_read == 1
    assert [h.path for h in kindex.search(kb, "海外退款")][:1] == ["billing/doc2.md"]
    reads.clear()
    kindex.reindex(kb, kindex.Options(force=True))
    assert len(reads) >= 5  # force reads every document afresh


def test_validate_names_a_document_changed_since_its_entry_was_written(sample_kb: Path) -> None:
    # A newcomer edited a page and `kindex validate` said "index is valid": the entry still described the old text.
    kindex.reindex(sample_kb)
    assert kindex.validate(sample_kb) == []
    refund, guide = sample_kb / "billing" / "退款政策.md", sample_kb / "导读.md"
    write(refund, refund.read_text(encoding="utf-8") + "\n\n## 新增的一节\n\n退款改为七天内到账。\n")
    os.utime(sample_kb / "billing" / "发票开具.md")  # touched, not changed: nothing to say
    kb = str(sample_kb)  # the fixes name the folder as given: a command to paste
    said = f"billing/退款政策.md: changed since its entry was written (run `kindex doc {kb} billing '退款政策.md'`, or "
    assert kindex.validate(sample_kb) == [said + f"`kindex reindex {kb}`)"]
    kindex.root(sample_kb)  # a step that writes other entries does not make this one current
    kindex.doc(sample_kb, "account", "双重验证.md")
    assert kindex.validate(sample_kb) == [said + f"`kindex reindex {kb}`)"]
    kindex.doc(sample_kb, "billing", "退款政策.md")
    assert kindex.validate(sample_kb) == []

    write(guide, guide.read_text(encoding="utf-8") + "\n\n新的一段。\n")
    kindex.sub(sample_kb, "billing")
    assert kindex.validate(sample_kb) == [
        f"导读.md: changed since its entry was written (run `kindex root {kb}`, or `kindex reindex {kb}`)"
    ]
    kindex.root(sample_kb)
    assert kindex.validate(sample_kb) == []

    write(refund, refund.read_text(encoding="utf-8") + "\n再加一句。\n")
    kindex.reindex(sample_kb, kindex.Options(force=True))  # every document read again, and indexed
    assert kindex.validate(sample_kb) == []


def test_a_reindex_parses_each_documents_frontmatter_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every read of a document for its body parsed its YAML again (three times a document in an offline reindex:
    # a third of its time on memdocs-zh), though only the scan uses what it says.
    kb = tmp_path / "kb"
    for i in range(3):
        write(kb / "t" / f"d{i}.md", f"---\ntitle: 文档{i}\ntags: [账单]\n---\n# 标题{i}\n\n正文{i}。")
    parsed: list[str] = []
    real = SCAN.split_frontmatter

    def counting(text: str, toml: bool = False) -> Any:
        parsed.append(text)
        return real(text, toml)

    monkeypatch.setattr(SCAN, "split_frontmatter", counting)
    kindex.reindex(kb)
    assert len(parsed) == 3
    s = scan(kb)
    assert s.read_text(s.documents[1]) == "# 标题1\n\n正文1。"  # the body, its frontmatter left out unparsed


def test_a_steps_time_includes_its_scan(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A page whose frontmatter took a minute to parse was reported as a 0.1 s run: the time began after the scan.
    real = kindex.generate.scan  # type: ignore[attr-defined]

    def slow_scan(*args: Any, **kwargs: Any) -> Any:
        done = time.monotonic() + 0.3
        while time.monotonic() < done:  # a slow scan, simulated: the step itself is fast
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(kindex.generate, "scan", slow_scan)
    assert kindex.reindex(sample_kb).wall_seconds >= 0.3


def test_a_document_edited_while_a_step_runs_is_named_by_validate(tmp_path: Path, reads: list[str]) -> None:
    # Unchanged at the scan, edited before its entry was made: the entry describes the old text, and the step
    # dropped its row, so validate said "index is valid" (a hostile campaign, editors saving during a long run).
    kb = _memory_kb(tmp_path)
    kindex.reindex(kb)
    edited: list[str] = []

    def edit_once(p: kindex.Progress) -> None:
        if not edited:
            doc = kb / "billing" / "doc3.md"
            doc.write_text(doc.read_text(encoding="utf-8") + "\n\n运行中加的一段。\n", encoding="utf-8")
            edited.append("billing/doc3.md")

    # Forced: an unforced run reuses the offline entries of unchanged documents and reads none of them.
    report = kindex.reindex(kb, kindex.Options(on_progress=edit_once, force=True))
    assert report.notes == (
        "changed while the step ran: billing/doc3.md: indexed as they were when it started; the next step (or the "
        "watcher) indexes them as they are now",
    )
    assert [p.split(":")[0] for p in kindex.validate(kb)] == edited
    kindex.reindex(kb)
    assert kindex.validate(kb) == []


def test_a_forced_step_with_shorter_excerpts_keeps_the_memory_whole(tmp_path: Path, reads: list[str]) -> None:
    # It kept an old row (1,200-character excerpt) under the step's 300: the next load refused the whole file, and
    # validate forgot every stale entry for good.
    kb = _memory_kb(tmp_path)
    kindex.reindex(kb)
    stale = kb / "billing" / "doc0.md"
    stale.write_text(stale.read_text(encoding="utf-8") + "\n" + "改" * 600 + "\n", encoding="utf-8")
    kindex.doc(kb, "billing", "doc1.md", options=kindex.Options(force=True, excerpt_chars=300))
    assert _rows(kb)["excerpt_chars"] == 1200
    reads.clear()
    assert [p.split(":")[0] for p in kindex.validate(kb)] == ["billing/doc0.md"]
    assert reads == ["doc0.md"]  # the memory still stands for the others


def test_a_name_written_nfd_on_disk_is_found_by_its_nfc_spelling(tmp_path: Path) -> None:
    # macOS writes café as NFD; a person types NFC: `kindex doc kb t café.md` said there was no such document and
    # listed one that looked the same. The order of that list changed from run to run too.
    import unicodedata

    nfd = unicodedata.normalize("NFD", "café.md")
    write(tmp_path / "t" / nfd, "# 咖啡\n\n关于咖啡。\n")
    write(tmp_path / "t" / "other.md", "# 其他\n\n其他内容。\n")
    kindex.reindex(tmp_path)
    assert kindex.doc(tmp_path, "t", "café.md").written == ()  # found, unchanged: nothing to write
    ctx = kindex.build_context(tmp_path, "看看 t/café.md 这一页")
    assert (ctx.items[0].path, ctx.items[0].reason) == (f"t/{nfd}", "path in the message")
    with pytest.raises(PathNotInThemeError, match=r"\(documents here: other\.md, caf"):
        kindex.doc(tmp_path, "t", "x.md")


def test_frontmatter_is_parsed_by_libyaml_where_pyyaml_has_it_and_read_as_before() -> None:
    # The pure-Python parser was two thirds of a full scan (memdocs-zh: 1.8 of 2.8 s).
    import yaml

    assert issubclass(SCAN._loaders()[0], yaml.CSafeLoader) == yaml.__with_libyaml__
    meta, body, problem = SCAN.split_frontmatter(
        "---\ntitle: 2020-01-01\ntags: [yes, no, 0755]\nwhen: 12:30\n---\n# 正文\n"
    )
    assert (meta, body, problem) == (
        {"title": "2020-01-01", "tags": ["yes", "no", "0755"], "when": "12:30"},
        "# 正文\n",
        None,
    )
    # What libyaml refuses and the pure-Python parser reads (half an emoji) costs that character, not the block.
    meta, _, problem = SCAN.split_frontmatter('---\ntitle: "发票 \\ud83d"\nn: 1\n---\n正文\n')
    assert problem is None and meta["n"] == "1" and meta["title"].startswith("发票 ")


@pytest.mark.parametrize(("fence", "key"), [("---", "a: "), ("+++", "a = ")])
@pytest.mark.parametrize(("depth", "deep"), [(64, False), (65, True), (8_000, True)])
def test_frontmatter_nested_past_64_levels_is_ignored(depth: int, deep: bool, fence: str, key: str) -> None:
    # libyaml builds 8,000 levels where the pure-Python parser ran out of stack: whatever reads the values next
    # (a repr, a JSON encoder) would. Hugo's TOML the same (tomllib recurses into nested arrays).
    text = f"{fence}\n{key}" + "[" * depth + "]" * depth + f"\n{fence}\n正文\n"
    meta, body, problem = SCAN.split_frontmatter(text, toml=True)
    assert body == "正文\n"
    if deep:
        assert (meta, problem) == ({}, "frontmatter is nested too deeply: ignored, the body is indexed")
    else:
        assert problem is None and list(meta) == ["a"]
