"""The offline generator's heuristics: entries built from the document itself, deterministic and free.

Used when no model is configured, and as the stand-in entry for a document whose model answers failed, so that
every document stays navigable.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from kindex.markdown import Line, lines, outside_raw_blocks, readable_inline, without_link_targets
from kindex.records import QUESTION_MAX, QUESTIONS_MAX, SUMMARY_MAX, TAG_MAX, TITLE_MAX, clean_text
from kindex.sanitize import says
from kindex.scan import ScannedDoc

SUMMARY_TARGET = 160
_TAGS = 10
_SENTENCE_END = re.compile(r"(?<=[。！？!?；;])|(?<=\.)\s")
_CJK = re.compile(r"[\u3400-\u9fff]")
# Chinese characters and full-width punctuation: what separates Latin runs where there are no spaces.
_CJK_RUN = re.compile(r"([\u3000-\u303f\u3400-\u9fff\uff00-\uffef]+)")
# Letters of the alphabetic scripts (Latin with its accents, Greek, Cyrillic): "café" is a word, not "Caf".
_LETTER = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u04ff\u1e00-\u1eff"
_LATIN_WORD = re.compile(rf"[{_LETTER}][{_LETTER}0-9_\-]{{2,}}")
# A section number before a heading's words ("1. ", "2.3、", "一、", "（二）", "第三章 "): a tag or a question reads
# without it. A bare number ("2024 年报", "3.5 版本说明") may be the subject and stays.
_ENUMERATOR = re.compile(
    r"^(?:\d{1,3}(?:\.\d{1,3})*[.、)）](?![\dA-Za-z])|[一二三四五六七八九十]{1,3}[、.．]|[（(](?:\d{1,3}|[一二三四五六七八九十]{1,3})[)）]"
    r"|第[一二三四五六七八九十\d]{1,3}(?:章|节|部分|篇)(?=[\s：:、.．]|$))[\s：:、.．]*"
)
_CODE_SPAN = re.compile(r"`([^`\n]{2,40})`")
_NOISE_LINE = re.compile(
    r"^\s*(#|```|~~~|\||!\[|\[!\[|<|>|!!!|\?\?\?|---|\*\*\*|={3,}|-{3,}|:::|///|\{%|\{\{[<%]|import |\[\^"
    r"|\?>|!>|--8<--|\[\[toc\]\]|\[TOC\]|\{:)"
)
"""Lines no summary starts with: headings, code, tables, images, HTML, quotes and callouts (GitHub's, MkDocs',
VitePress', docsify's ``?>`` and ``!>``), rules, template and shortcode tags (Jekyll's ``{% %}``, Hugo's
``{{< >}}``; not a macro such as ``{{ product.name }}``, which opens sentences), MkDocs snippet includes
(``--8<--``), table-of-contents marks (``[[toc]]``, ``[TOC]``, kramdown's ``{:toc}``)."""
_STOP = frozenset(
    [
        "the",
        "and",
        "for",
        "with",
        "that",
        "this",
        "from",
        "are",
        "you",
        "your",
        "can",
        "will",
        "not",
        "but",
        "use",
        "used",
        "using",
        "how",
        "what",
        "when",
        "which",
        "into",
        "have",
        "has",
        "had",
        "was",
        "were",
        "its",
        "they",
        "them",
        "then",
        "than",
        "there",
        "here",
        "also",
        "all",
        "any",
        "one",
        "more",
        "most",
        "other",
        "such",
        "only",
        "about",
        "should",
        "would",
        "could",
        "may",
        "must",
        "our",
        "out",
        "see",
        "each",
        "these",
        "those",
        "their",
        "some",
        "like",
        "just",
        "get",
        "set",
        "new",
        "via",
    ]
)


def is_cjk_text(text: str) -> bool:
    """Whether text is mostly Chinese/Japanese, judged on its letters."""
    letters = sum(1 for ch in text[:2000] if ch.isalpha())
    return letters > 0 and len(_CJK.findall(text[:2000])) / letters > 0.3


def describe_doc(doc: ScannedDoc, text: str) -> dict[str, Any]:
    """An entry for ``doc``: frontmatter first, then the first heading, paragraph, section headings and terms."""
    sig = doc.signals
    name = doc.rel.rsplit("/", 1)[-1].removesuffix(".md")
    # The first that says something (a letter or digit): a page titled "..." whose body is "…" had no usable entry,
    # and kept its old content's on every run.
    title = next((t for t in (sig.title, *doc.headings[:1]) if says(t)), name)
    described = (sig.description, first_paragraph(text), "；".join(doc.headings[1:6]))
    summary = next((t for t in described if says(t)), title)
    tags = list(sig.tags) or distinctive_tags(text, title)
    return {"title": title, "summary": summary, "tags": tags, "paths": list(sig.paths), "questions": questions_of(doc)}


def unnumbered(heading: str) -> str:
    """``heading`` without its section number ("1. 七天无理由退款": "七天无理由退款"), unless that is all it is."""
    rest = _ENUMERATOR.sub("", heading.strip(), count=1)
    return rest or heading


def questions_of(doc: ScannedDoc) -> list[str]:
    """The questions a document answers, as its authors put them: its section headings (not its title)."""
    seen = {doc.title_hint.casefold()}
    out: list[str] = []
    for h in doc.headings:
        h = clean_text(unnumbered(h), QUESTION_MAX)
        if len(h) > 1 and h.casefold() not in seen:
            seen.add(h.casefold())
            out.append(h)
        if len(out) >= QUESTIONS_MAX:
            break
    return out


LANDING_PAGES = ("index.md", "readme.md", "_index.md", "overview.md")
"""A folder's own page, by the names documentation sites give it (letter case aside), first found first: what the
folder calls itself (FastAPI's ``advanced/index.md``: 高级用户指南; GreptimeDB's ``user-guide/overview.md``:
用户指南)."""


def describe_theme(dir_name: str, docs: Sequence[ScannedDoc]) -> dict[str, Any]:
    """A theme entry listing what the folder holds, in the language of its documents, titled as the folder's own
    page (``LANDING_PAGES``) titles itself, else by the folder's name."""
    titles = [d.signals.title or (d.headings[0] if d.headings else d.rel.rsplit("/", 1)[-1]) for d in docs]
    chinese = is_cjk_text(" ".join(titles))
    shown = ("、" if chinese else ", ").join(titles[:8])
    more = len(titles) > 8
    landing = {d.rel.removeprefix(dir_name + "/").casefold(): d for d in docs}
    page = next((landing[n] for n in LANDING_PAGES if n in landing), None)
    title = next((t for t in ((page.signals.title, *page.headings[:1]) if page else ()) if says(t)), dir_name)
    named = dir_name if title == dir_name else f"{title}（{dir_name}/）" if chinese else f"{title} ({dir_name}/)"
    if chinese:
        space = "" if named.endswith("）") else " "
        summary = f"{named}{space}主题，共 {len(docs)} 篇文档：{shown}{' 等' if more else ''}。"
    else:
        summary = f"{named}: {len(docs)} documents: {shown}{', …' if more else ''}."
    counts: Counter[str] = Counter()
    for d in docs:
        counts.update(t for t in d.signals.tags)
    tags = [t for t, _ in counts.most_common(_TAGS)] or titles[:_TAGS]
    return {"title": title, "summary": summary, "tags": tags}


def _prose(text_lines: Sequence[Line]) -> str:
    """What a reader reads of a text: no fenced code, link targets, URLs or file paths. A code block's names
    (``div``, ``localhost``) and a URL's parts (``https``, ``com``, a user name) repeat without being what the
    document is about, and a tag is a word someone would search with.

    Chinese is written without spaces, so a URL is cut out of its run of Latin characters, not with the whole
    space-separated token (which may be a whole Chinese line)."""
    kept: list[str] = []
    for line in _readable(text_lines):
        for token in line.split():
            pieces = _CJK_RUN.split(without_link_targets(token))
            kept.append("".join(p for p in pieces if "://" not in p and "/" not in p))
    return " ".join(kept)


def _template_tag(text: str) -> bool:
    """Whether a line is only a template or shortcode tag (``{% tab title="Bash" %}``, ``{{< note >}}``,
    ``{{% /tab %}}``): its arguments (tab, endtab, title) made tags of pages that say nothing about them."""
    stripped = text.strip()
    return stripped.startswith(("{%", "{{<", "{{%")) and stripped.endswith(("%}", ">}}", "%}}"))


def _readable(text_lines: Sequence[Line]) -> Iterator[str]:
    """The lines a reader reads, HTML tags taken out: no fenced code, no ``<style>`` or ``<script>`` block (a page's
    CSS is not its summary)."""
    for line in outside_raw_blocks(text_lines):
        if line.fence is None and not _template_tag(line.text):
            yield readable_inline(line.text)  # its text stays: <abbr title="…">CLI</abbr> reads CLI


SUMMARY_SCAN_CHARS = 64 * 1024
"""How far into a document its first paragraph is looked for: parsing all of a 2 MB page of headings for it took
seconds, and a page whose first 64 KB hold no prose is summarised by its headings."""


def first_paragraph(text: str) -> str:
    """The first paragraph that reads as prose (within ``SUMMARY_SCAN_CHARS``), cut at a sentence boundary near
    ``SUMMARY_TARGET``."""
    if len(text) > SUMMARY_SCAN_CHARS:
        text = text[: text.rfind("\n", 0, SUMMARY_SCAN_CHARS) + 1 or SUMMARY_SCAN_CHARS]
    para: list[str] = []
    for line in _readable(lines(text)):
        stripped = line.strip()
        if not stripped:
            if para:
                break
            continue
        if _NOISE_LINE.match(stripped):
            if para:
                break
            continue
        # A link reads as its text. Not a regex: "[" repeated without "]" made one backtrack quadratically.
        text = without_link_targets(stripped).replace("![", "").replace("[", "").replace("]", "")
        para.append(text.replace("**", "").replace("`", ""))
    joined = clean_text(" ".join(para), 10 * SUMMARY_MAX)
    return cut_sentence(joined, SUMMARY_TARGET)


def cut_sentence(text: str, target: int) -> str:
    """``text`` cut after the last sentence end at or before ``target`` characters (or hard-cut with …)."""
    if len(text) <= target:
        return text
    cut = 0
    for m in _SENTENCE_END.finditer(text):
        if m.start() > target:
            break
        cut = m.start()
    if cut >= target // 3:
        return text[:cut].strip()
    return text[: target - 1].rstrip() + "…"


def distinctive_tags(text: str, title: str) -> list[str]:
    """Section headings and repeated code names or Latin terms: the words a reader would search with."""
    tags: list[str] = []
    seen = {title.casefold()}
    text_lines = lines(text)
    for h in [line.heading for line in text_lines if line.heading][1:]:
        h = clean_text(unnumbered(h), TITLE_MAX)
        if 1 < len(h) <= TAG_MAX // 2 and h.casefold() not in seen:
            seen.add(h.casefold())
            tags.append(h)
        if len(tags) >= _TAGS // 2:
            break
    prose = _prose(text_lines)
    counts: Counter[str] = Counter()
    counts.update(m.strip() for m in _CODE_SPAN.findall(prose))
    counts.update(w for w in _LATIN_WORD.findall(prose) if w.casefold() not in _STOP)
    for term, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if n < 2 or len(tags) >= _TAGS:
            break
        if term.casefold() not in seen and len(term) <= TAG_MAX:
            seen.add(term.casefold())
            tags.append(term)
    return tags
