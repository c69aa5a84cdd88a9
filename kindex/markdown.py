"""Markdown structure in one linear pass: fenced code blocks (CommonMark's rules) and ATX headings.

The scan reads headings with it and BuildContext cuts documents with it, so both agree on what is code: a line
that looks like a heading inside a fenced block is code, and a block opened with ``~~~`` or four backticks is
closed only by the same kind of fence, at least as long. No regex here can backtrack: documents are untrusted.

Long because the scan, the offline generator, the search tables and the context cut all read the one line model
here (fences, headings, links, raw HTML blocks, the bound on a long text), so that they agree on what is code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

INLINE_TAG = re.compile(r"</[A-Za-z][^<>\n]*>|(?<![A-Za-z0-9_\\])<[A-Za-z][^<>\n]*>")
"""An inline HTML or MDX tag (``<a name="x">``, ``</abbr>``, ``<TabItem value="y">``). An opening tag right after a
letter or digit is a type's parameter, not a tag: ``Vec<T>`` and ``List<String>`` stay as they are; after a
backslash it is escaped text (``\\<script setup>``). No "<", ">" or line break inside: a scan for it never goes past
the next "<", and the search is one forward pass."""
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")


def readable_inline(text: str) -> str:
    """``text`` as a reader sees it: inline tags (``INLINE_TAG``) taken out and backslash escapes read (``\\<`` is
    ``<``), outside code spans, whose text is literal: `` `<script setup>` `` and `` `<KeepAlive>` `` are the subject
    of Vue's pages, and were dropped from their titles and summaries. An odd number of backticks opens no span."""
    if "<" not in text and "\\" not in text:
        return text
    parts = text.split("`") if "`" in text and text.count("`") % 2 == 0 else [text]
    for i in range(0, len(parts), 2):
        parts[i] = _ESCAPED.sub(r"\1", INLINE_TAG.sub("", parts[i]))
    return "`".join(parts)


@dataclass(slots=True)  # not frozen: made by the hundred thousand for a long page, where frozen's __init__ costs 3.6×
class Line:
    """One line of a document (its text keeps the line break). Not changed once :func:`lines` made it."""

    start: int
    text: str
    fence: str | None
    """The opening fence of the code block this line belongs to (its delimiters included, after the block quote
    markers and the list item's indent it stands in: ``> ````, ``   ````), else ``None``."""
    heading: str | None
    """The title of an ATX, HTML or setext heading outside code blocks, else ``None``."""
    open_after: bool = False
    """A code block is open after this line: a cut right after it would land inside the block."""
    level: int = 0
    """A setext heading's level (1 under ``===``, 2 under ``---``); 0 for any other line (an ATX heading's level is
    its hashes)."""

    @property
    def blank(self) -> bool:
        return not self.text.strip()


def _indent_ok(line: str) -> tuple[str, bool]:
    stripped = line.lstrip(" ")
    return stripped, len(line) - len(stripped) <= 3


def fence_opening(line: str) -> str | None:
    """The fence (three or more backticks or tildes) that ``line`` opens a code block with, else ``None``."""
    stripped, ok = _indent_ok(line)
    if not ok or not stripped.startswith(("```", "~~~")):
        return None
    char = stripped[0]
    run = len(stripped) - len(stripped.lstrip(char))
    if char == "`" and "`" in stripped[run:]:  # a backtick fence's info string holds no backtick
        return None
    return char * run


def closes(line: str, opening: str) -> bool:
    """Whether ``line`` closes a block opened by ``opening``: the same character, at least as many, nothing after."""
    stripped, ok = _indent_ok(line)
    char = opening[0]
    run = len(stripped) - len(stripped.lstrip(char))
    return ok and run >= len(opening) and not stripped[run:].strip()


def without_link_targets(text: str) -> str:
    """``text`` with each Markdown link or image ``[text](target)`` read as its text; a ``](target)`` without its
    ``[`` loses the target only. One forward pass: each search starts where the last one ended."""
    out: list[str] = []
    pos = 0
    while (start := text.find("](", pos)) >= 0:
        end = text.find(")", start + 2)
        if end < 0:
            break
        opening = text.rfind("[", pos, start)
        if opening < 0:
            out.append(text[pos : start + 1])
        else:
            image = opening > pos and text[opening - 1] == "!"
            out.append(text[pos : opening - image])
            out.append(text[opening + 1 : start])
        pos = end + 1
    out.append(text[pos:])
    joined = "".join(out)
    return _without_reference_labels(joined) if "][" in joined else joined


MAX_LABEL_CHARS = 100
"""A reference link's label is a short name (``[安装指南][install]``); a longer bracket run is text."""


def _without_reference_labels(text: str) -> str:
    """``text`` with each reference-style link ``[text][label]`` (or ``[text][]``, an image ``![alt][label]``) read
    as its text: the label glued to it (安装指南install) made a tag of ``install``. Not after a letter, digit, ``_``,
    ``)`` or ``]``: ``m[i][j]`` indexes. One forward pass."""
    out: list[str] = []
    pos = 0
    while (start := text.find("][", pos)) >= 0:
        end = text.find("]", start + 2, start + 2 + MAX_LABEL_CHARS)
        opening = text.rfind("[", pos, start)
        before = text[opening - 1] if opening > 0 else " "
        indexing = before.isascii() and (before.isalnum() or before in "_)]")
        if end < 0 or opening < 0 or indexing or "\n" in text[start:end]:
            out.append(text[pos : start + 1])
            pos = start + 1
            continue
        image = before == "!" and opening > pos
        out.append(text[pos : opening - image])
        out.append(text[opening + 1 : start])
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


MAX_LINK_TEXT = 200
"""A longer link text is a paragraph someone bracketed, not a name for the page it links to."""
MAX_LINK_TARGET = 500


def links(text: str) -> Iterator[tuple[str, str]]:
    """The inline links ``[text](target)`` of ``text`` outside code blocks, in order: (link text, target as
    written, without an angle-bracketed form's brackets or a title). Images are not links; a link whose text or
    target is longer than a name or a path would be is skipped. A link does not span lines here. Each line is one
    forward pass (as :func:`without_link_targets`), and only lines holding ``](`` are looked at."""
    if "](" not in text:
        return
    # Only a fenced block is code to :func:`lines`; without a fence, every line is read as it is (most pages).
    fenced = "```" in text or "~~~" in text
    for raw in (line.text for line in lines(text) if line.fence is None) if fenced else physical_lines(text):
        if "](" not in raw:
            continue
        low = pos = 0  # where this link's "[" may start; where to look for the next "]("
        end = -1  # the first ")" after the current "](": found once for every "](" before it
        while (start := raw.find("](", pos)) >= 0:
            if end < start + 2:
                end = raw.find(")", start + 2)
                if end < 0:
                    break
            further = raw.find("](", start + 2, end)
            if further >= 0:  # "[a](b and [c](d)": the first is no link (its target would hold a "](")
                low = pos = start + 2
                continue
            opening = raw.rfind("[", low, start)
            low = pos = end + 1
            if opening < 0 or (opening > 0 and raw[opening - 1] in "!\\"):  # an image, or an escaped bracket
                continue
            label, target = raw[opening + 1 : start].strip(), raw[start + 2 : end].strip()
            if target.startswith("<") and ">" in target:
                target = target[1 : target.index(">")]
            elif target.startswith(("{{", "{%")):
                target = _template_target(target)
            elif target:
                target = target.split()[0]
            if label and target and len(label) <= MAX_LINK_TEXT and len(target) <= MAX_LINK_TARGET:
                yield label, target


_LINK_TAGS = (("{{<", ">}}"), ("{{%", "%}}"), ("{%", "%}"))


def _template_target(written: str) -> str:
    """The page a site generator's link tag names (Hugo's ``{{< ref "install.md" >}}`` or ``relref``, with or
    without spaces inside its brackets; Jekyll's ``{% link docs/install.md %}``, read from the site's root), or ""
    for any other template."""
    for opening, closing in _LINK_TAGS:
        if written.startswith(opening) and written.endswith(closing):
            words = written[len(opening) : len(written) - len(closing)].split(None, 1)
            break
    else:
        return ""
    if len(words) < 2 or words[0] not in ("ref", "relref", "link"):
        return ""
    argument = words[1].strip()
    # A quoted name may hold spaces; an unquoted one ends at the first.
    name = argument[1:].split(argument[0], 1)[0] if argument[0] in "\"'" else argument.split()[0]
    if words[0] == "link":
        return "/" + name.lstrip("/") if name else ""
    return name


def _html_heading(stripped: str) -> tuple[int, str] | None:
    """An HTML heading written on one line (``<h1>青禾记账</h1>``, ``<h2 id="limits">接口限流</h2>``, as READMEs
    open inside a centred ``<div>``): its level and what is between its tags. String searches only."""
    if (
        len(stripped) < 9
        or stripped[:2] not in ("<h", "<H")
        or stripped[2] not in "123456"
        or stripped[3] not in " \t>"
    ):
        return None
    body = stripped.rstrip()
    close = f"</h{stripped[2]}>"
    start = body.find(">")
    if body[-len(close) :].lower() != close or start + 1 > len(body) - len(close):
        return None
    return int(stripped[2]), body[start + 1 : len(body) - len(close)]


_ATTRIBUTE = re.compile(r"""#[^\s{}]+|\.[^\s{}]+|[A-Za-z_:][\w:.-]*=(?:"[^"]*"|'[^']*'|[^\s{}"']+)""")
MAX_ATTRIBUTES_CHARS = 200
"""A heading's ``{ … }`` longer than this is text, not attributes: the check stays cheap on a 5 MB heading."""


def _attributes(inner: str) -> bool:
    """Whether ``inner`` (what a heading's trailing braces hold) is an attribute list (Python-Markdown's attr_list,
    Pandoc's): ``#id``, ``.class`` and ``key=value`` items separated by spaces, the first an id (``#id``) or a
    ``key=value``, as a reader of the heading never sees them. ``{ 1, 2 }`` or ``{name}`` in a title stays."""
    inner = inner.strip()
    if not inner or len(inner) > MAX_ATTRIBUTES_CHARS or inner[0] == ".":
        return False
    pos = 0
    while pos < len(inner):
        m = _ATTRIBUTE.match(inner, pos)
        if m is None:
            return False
        pos = m.end()
        rest = len(inner) - len(inner[pos:].lstrip())
        if rest == pos and pos < len(inner):
            return False  # items are separated by white space
        pos = rest
    return True


def heading_title(line: str) -> str | None:
    """The title of an ATX heading line (``## Title ##``), without its closing hashes or ``{ #id }`` attribute, or of
    an HTML heading written on one line (``<h1>Title</h1>``)."""
    stripped, ok = _indent_ok(line.rstrip("\r\n"))
    if ok and stripped[:2] in ("<h", "<H"):
        html = _html_heading(stripped)
        if html is None:
            return None
        return _as_read(html[1]) or None
    if not ok or not stripped.startswith("#"):
        return None
    level = len(stripped) - len(stripped.lstrip("#"))
    rest = stripped[level:]
    if level > 6 or (rest and rest[0] not in " \t"):
        return None
    title = rest.strip(" \t")
    # A closing sequence is hashes preceded by a space (or nothing else): "C#" keeps its hash.
    without = title.rstrip("#")
    if without != title and (not without or without[-1] in " \t"):
        title = without.rstrip(" \t")
    # MkDocs / Docusaurus attributes such as "{ #tutorial }", '{ id="9.7.6" }' or "{ .new data-toc-label=x }" carry
    # no meaning for a reader.
    if title.endswith("}"):
        brace = title.rfind("{")
        if brace >= 0 and _attributes(title[brace + 1 : -1]):
            title = title[:brace].rstrip(" \t")
    # A heading that is only tags stays as written: it is still a heading.
    return _as_read(title) or title or None


def _as_read(title: str) -> str:
    """A heading's title as a reader reads it, white space folded. Without inline tags or link targets: Microsoft's
    docs open nearly every heading with an anchor, <a name="slug"></a>; <dfn title="…">转换</dfn> reads 转换,
    [Django](https://…) reads Django; and without code-span backticks and emphasis."""
    plain = (
        title
        if "<" not in title and "](" not in title and "][" not in title and "\\" not in title
        else without_link_targets(readable_inline(title))
    )
    return " ".join(_without_inline_marks(plain).split())


def _without_inline_marks(title: str) -> str:
    """``title`` without code-span backticks and emphasis asterisks: a reader sees "使用 TestClient", not
    "使用 `TestClient`", and the extractive generator made tags and questions of the marked text (1,100 of 32,643
    headings in the corpora hold a code span, 109 emphasis). One pass, no pattern to backtrack: a heading may be a
    5 MB line. Underscores stay (``__init__``, ``response_model``); an odd number of backticks opens no span."""
    if "`" not in title and "*" not in title:
        return title
    parts = title.split("`") if title.count("`") % 2 == 0 else [title]
    for i in range(0, len(parts), 2):  # outside code spans: their text is literal
        outside = parts[i].replace("**", "")
        parts[i] = _without_emphasis(outside) if "*" in outside else outside
    return "".join(parts)


def _without_emphasis(text: str) -> str:
    """``text`` without the asterisks of ``*emphasis*``: an opener followed by text, then a closer preceded by
    text. Others are the text (``2 * 3``, ``C*``)."""
    padded = f" {text} "
    dropped: set[int] = set()
    opener = -1
    for j, c in enumerate(text):
        if c != "*":
            continue
        before, after = padded[j], padded[j + 2]
        if opener >= 0 and not before.isspace():
            dropped.update((opener, j))
            opener = -1
        elif not after.isspace():
            opener = j
    return "".join(c for j, c in enumerate(text) if j not in dropped)


LONG_LINE_CHARS = 20_000
"""A longer line (an inline base64 image, a minified blob) keeps this much of itself in a text cut to a bound
(:func:`within`): a 400 KB screenshot pasted near the top of a long page took the room of every section after it."""


def within(text: str, max_chars: int) -> str:
    """``text`` within ``max_chars`` characters, whole lines, where it is longer: each line longer than
    ``LONG_LINE_CHARS`` shortened to its start and an ellipsis; a first line past the bound cut at a character."""
    if len(text) <= max_chars:
        return text
    kept: list[str] = []
    room = max_chars
    for line in text.split("\n"):
        if len(line) > LONG_LINE_CHARS:
            line = line[:LONG_LINE_CHARS] + "…"
        if len(line) + 1 > room:
            if not kept:
                kept.append(line[:room])
            break
        kept.append(line)
        room -= len(line) + 1
    return "\n".join(kept) + "\n"


_LINE_END = re.compile(r"\r\n|\r|\n")


def physical_lines(text: str) -> list[str]:
    """``text`` split after each Markdown line ending (``\\n``, ``\\r\\n``, ``\\r``), endings kept.

    Not ``str.splitlines``: it also breaks at U+2028, U+0085, form feeds and the like, which Markdown renders inside
    a line, so a document could start a "heading" no reader sees.
    """
    out: list[str] = []
    start = 0
    for end in _LINE_END.finditer(text):
        out.append(text[start : end.end()])
        start = end.end()
    if start < len(text):
        out.append(text[start:])
    return out


_LIST_MARKER = re.compile(r"(?:[-*+]|[0-9]{1,9}[.)])( +|$)")
_MARKERS = re.compile(r"[-*+]|[0-9]{1,9}[.)]")
_BREAK = re.compile(r" {0,3}(?:(?:- *){3,}|(?:\* *){3,}|(?:_ *){3,})")
"""A thematic break (``- - -``, ``***``): no list item, though it starts like one. Each repetition consumes its
character first, so the match is linear."""
"""A list item's marker and the spaces after it (bounded and possessive in effect: one pass, no backtracking)."""


def _quoted(line: str) -> tuple[int, str]:
    """How many block quote markers (``>``, each after at most three spaces) open ``line``, and what follows them.
    Each marker consumed moves on by at least one character: linear."""
    depth = pos = 0
    while True:
        i = pos
        while i < len(line) and i - pos < 4 and line[i] == " ":
            i += 1
        if i - pos > 3 or i >= len(line) or line[i] != ">":
            return depth, line[pos:]
        depth += 1
        pos = i + 1 + (i + 1 < len(line) and line[i + 1] == " ")


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip(" "))


_MAY_OPEN = frozenset(">#`~-*+_0123456789")
"""The characters a line's first may be for it to open a block quote, heading, fence, list item or thematic break
(after spaces, which are not :func:`_plain` either)."""


def _plain(first: str) -> bool:
    """Whether a line starting with ``first`` is plain text whatever follows: a letter, or a mark that opens nothing
    (``=``, ``|``, ``<``, ``!``…; a page of setext underlines or table rows went through the whole line parse, line
    by line, three times per scan). Not a blank line: it leaves the list items open."""
    return first.isalpha() or (bool(first) and first not in _MAY_OPEN and not first.isspace())


def lines(text: str) -> list[Line]:
    """Every line of ``text`` with its code-block membership and heading title.

    Fences count inside block quotes (``> ````) and list items (``- ````, or indented under an item's text) as
    CommonMark reads them, approximately: list items are followed by their content's indent alone, and a block in a
    container ends with a closing fence or with the container (a line with fewer quote markers, or one indented
    less than the item's text).
    """
    out: list[Line] = []
    opening: str | None = None
    depth = base = 0  # the open block's quote depth and its list indent (in the text after the quote markers)
    lead = ""  # what its lines start with before the fence: the prefix of a closing fence
    items: list[int] = []  # the text columns of the list items open at the current quote depth
    items_depth = 0
    pos = 0
    for raw in physical_lines(text):
        if opening is None and raw[:1] in ("=", "-") and out and (level := _setext_level(raw, out[-1])):
            under = out[-1]
            title = heading_title("# " + under.text.strip())
            out[-1] = Line(under.start, under.text, None, title, under.open_after, level)
            out.append(Line(pos, raw, None, None))
            items, items_depth = [], 0
            pos += len(raw)
            continue
        # Most lines: prose, which opens no block, heading or item (an HTML heading aside).
        if opening is None and _plain(raw[:1]) and raw[:2] not in ("<h", "<H"):
            out.append(Line(pos, raw, None, None))
            items, items_depth = [], 0
            pos += len(raw)
            continue
        body = raw.rstrip("\r\n").expandtabs(4)  # a tab indents to the next multiple of four, as CommonMark reads it
        quotes, rest = _quoted(body)
        if opening is not None and (quotes < depth or (rest.strip() and _indent(rest) < base)):
            opening = None  # its container ended: so did the block, after the line before
            out[-1] = replace(out[-1], open_after=False)
        if opening is not None:
            inner = rest[base:] if _indent(rest) >= base else rest
            closing = closes(inner, opening)
            out.append(Line(pos, raw, lead + opening, None, not closing))
            if closing:
                opening = None
            pos += len(raw)
            continue
        fence = None
        if rest.strip():
            if quotes != items_depth:
                items, items_depth = [], quotes
            ind = _indent(rest)
            while items and ind < items[-1]:
                items.pop()
            col = items[-1] if items else 0
            marker = _LIST_MARKER.match(rest, ind) if ind - col <= 3 and not _BREAK.fullmatch(rest) else None
            if marker is not None:
                spaces = len(marker.group(1))
                # An empty item's text would start one space after its marker; five spaces or more: code after one.
                col = marker.end() + (1 if not spaces else -(spaces - 1) if spaces > 4 else 0)
                items.append(col)
                fence = fence_opening(rest[col:])
            else:
                fence = fence_opening(rest[col:] if ind >= col else rest)
            if fence is not None:
                opening, depth, base = fence, quotes, col
                lead = _lead(body, fence)
        if fence is not None:
            out.append(Line(pos, raw, lead + fence, None, True))
        else:
            out.append(Line(pos, raw, None, heading_title(raw)))
        pos += len(raw)
    return out


def _lead(body: str, fence: str) -> str:
    """What the line opening ``fence`` holds before it, list markers as spaces (``- ```js``: two spaces; ``  > ````:
    ``  > ``): what a closing fence in the same container starts with."""
    return _MARKERS.sub(lambda m: " " * len(m.group()), body[: body.index(fence)])


# The start and end of an HTML block that holds no prose: a line indented three spaces at most that opens <style>,
# <script> or <head> (the tag name whole: not <styled-component>, not <scripts>, not <header>), and the first line
# after it that closes it. Docusaurus pages open with a <head> of canonical links and meta tags.
_RAW_TAGS = ("style", "script", "head")
_RAW_START = re.compile(r" {0,3}<(style|script|head)(?:[ \t\r>]|$)", re.IGNORECASE)
_RAW_START_ANYWHERE = re.compile(
    r"^(?: {0,3}<(?:style|script|head)(?:[ \t\r>]|$)|import[ \t])", re.IGNORECASE | re.MULTILINE
)
_RAW_END = {name: re.compile(rf"</{name}>", re.IGNORECASE) for name in _RAW_TAGS}
MAX_IMPORT_LINE = 1_000
"""An MDX import statement longer than this is not taken for one (a real one names a component and a module)."""
_NAME = r"[A-Za-z_$][\w$]*"
# What an ES import binds: `Tabs`, `{Tabs, TabItem}`, `* as Icons`, `Tabs, {TabItem}`, TypeScript's `type X`. No
# quantifier nests in another, and the clause is bounded by MAX_IMPORT_LINE.
_IMPORT_CLAUSE = re.compile(
    rf"(?:type\s+)?(?:{_NAME}(?:\s*,\s*(?:\{{[^{{}}]*\}}|\*\s*as\s+{_NAME}))?|\{{[^{{}}]*\}}|\*\s*as\s+{_NAME})"
)


def mdx_import(text: str) -> bool:
    """Whether a line is an MDX import statement (``import Tabs from '@theme/Tabs';``, ``import './x.css';``): a
    build directive of Docusaurus-style pages that says nothing to a reader. What it binds must be an ES import
    clause and its module a quoted name without spaces: prose that starts with "import" (``import the data from
    'the old system'``, ``import your settings from "Settings"``) is none. Code in an indented block does not start
    at the line's first column; where a line stands in its paragraph is :func:`outside_raw_blocks`'s to check."""
    if not text.startswith(("import ", "import\t")) or len(text) > MAX_IMPORT_LINE:
        return False
    line = text.rstrip().removesuffix(";").rstrip()
    if len(line) < 9 or line[-1] not in "'\"":
        return False
    module_start = line.rfind(line[-1], 0, len(line) - 1)
    if module_start < 0 or any(c.isspace() for c in line[module_start:]) or module_start + 2 == len(line):
        return False
    head = line[:module_start].rstrip()
    if head == "import":  # a module imported for its effect (a stylesheet)
        return True
    clause = head.removeprefix("import").removesuffix("from")
    return head.endswith((" from", "\tfrom", "}from")) and _IMPORT_CLAUSE.fullmatch(clause.strip()) is not None


def may_hold_raw_blocks(text: str) -> bool:
    """Whether a line of ``text`` opens a ``<style>``, ``<script>`` or ``<head>`` block or may be an MDX import:
    one regex search, so that most pages (a tag named in prose or inline code included) skip the line pass of
    :func:`outside_raw_blocks`."""
    return _RAW_START_ANYWHERE.search(text) is not None


def _next_blank(text_lines: Sequence[Line]) -> list[int]:
    """Per line, the index of the first blank line after it (``len(text_lines)`` if none): one pass from the end."""
    out = [0] * len(text_lines)
    after = len(text_lines)
    for i in range(len(text_lines) - 1, -1, -1):
        out[i] = after
        if text_lines[i].blank:
            after = i
    return out


def outside_raw_blocks(text_lines: Sequence[Line]) -> Iterator[Line]:
    """The lines outside ``<style>``, ``<script>`` and ``<head>`` blocks (a page's CSS, JavaScript or metadata is
    neither what it says nor worth a reader's tokens), as CommonMark reads such blocks, and outside MDX import
    lines (:func:`mdx_import`) that start a block, as MDX reads them (a run of them, after a blank line or another
    block); lines of fenced code are kept, whatever they show. Unlike CommonMark, a block that never closes is no
    block (prose that opens a line with "<script> tags are stripped" keeps the rest of the page), and what follows
    the closing tag on its line is kept. A ``<head>`` block ends at a blank line, as CommonMark's blocks of its kind
    do: one not closed before it is prose ("<head> holds a page's metadata…", and a ``</head>`` paragraphs later)."""
    next_close: dict[str, list[int]] = {name: [] for name in _RAW_END}  # lines holding each closing tag, in order
    for i, line in enumerate(text_lines):
        if line.fence is None and "</" in line.text:
            for name, end in _RAW_END.items():
                if end.search(line.text):
                    next_close[name].append(i)
    seen = {name: 0 for name in _RAW_END}  # how many of next_close[name] lie before the current line
    blank_after: list[int] | None = None  # made when a <head> is first met
    i, n = 0, len(text_lines)
    block_start = True  # the line begins a block: the first, one after a blank line, an import or a dropped block
    while i < n:
        line = text_lines[i]
        start = _RAW_START.match(line.text) if line.fence is None else None
        if start is None:
            if block_start and line.fence is None and mdx_import(line.text):
                i += 1
                continue
            yield line
            block_start = line.blank
            i += 1
            continue
        name = start.group(1).lower()
        closes = next_close[name]
        while seen[name] < len(closes) and closes[seen[name]] < i:
            seen[name] += 1
        end_line = closes[seen[name]] if seen[name] < len(closes) else n
        if name == "head" and end_line < n:
            if blank_after is None:
                blank_after = _next_blank(text_lines)
            if blank_after[i] < end_line:
                end_line = n
        if end_line == n:  # never closed (a <head> not before a blank line): prose, kept
            yield line
            block_start = False
            i += 1
            continue
        closing = text_lines[end_line]
        match = _RAW_END[name].search(closing.text, start.end() if end_line == i else 0)
        if match is None:  # the closing tag on the opening line comes before the opening itself: kept as prose
            yield line
            block_start = False
            i += 1
            continue
        rest = closing.text[match.end() :]
        if rest.strip():
            yield Line(closing.start + match.end(), rest, None, None)
        block_start = True
        i = end_line + 1


def headings(text: str) -> tuple[str, ...]:
    """The ATX headings of ``text`` outside code blocks, and its HTML headings written on one line, in order."""
    return tuple(line.heading for line in lines(text) if line.heading)


def _setext_level(raw: str, before: Line) -> int:
    """The level of the setext heading that ``raw`` underlines in ``before`` (``标题`` over ``===``: 1, over ``---``:
    2), else 0: an underline of two or more ``=`` or ``-`` at the margin, under a line of paragraph text (not blank,
    code, a heading, a list item, a quote, a table row, HTML or an underline itself). Only that last line is the
    title, where CommonMark takes the whole paragraph. The line before is looked at first: a page of list items
    or underlines pays one test a line."""
    prev = before.text
    if prev[:1] in _NOT_PARAGRAPH or before.heading is not None or before.fence is not None or not prev.strip():
        return 0
    if prev[:1].isdigit() and ". " in prev[:12]:
        return 0
    mark = raw.rstrip()
    if len(mark) < 2 or mark.strip(mark[0]):
        return 0
    return 1 if mark[0] == "=" else 2


_NOT_PARAGRAPH = frozenset(" \t>-*+<|#=")
"""A line starting with one of these is no setext heading's text (indented, a quote, an item, HTML, a table row,
a heading or an underline)."""


def _level(line: Line) -> int:
    if line.level:
        return line.level
    stripped = line.text.lstrip(" ")
    html = _html_heading(stripped) if stripped[:2] in ("<h", "<H") else None
    return html[0] if html is not None else len(stripped) - len(stripped.lstrip("#"))


def section(text: str, heading: str) -> str | None:
    """The section of ``text`` under the first heading named ``heading`` (case-insensitive; else the first that
    contains it), up to the next heading of the same or a higher level; ``None`` when no heading matches.

    ``heading`` may be written as the page writes it (``## 使用 `CORSMiddleware` { #use-corsmiddleware }``): it is
    read as a heading line is, as the headings it is compared with were."""
    all_lines = lines(text)
    asked = heading.strip()
    wanted = (heading_title("# " + asked.lstrip("#").strip()) or asked).casefold()
    marked = [(i, line) for i, line in enumerate(all_lines) if line.heading]
    hit = next((p for p in marked if p[1].heading and p[1].heading.casefold() == wanted), None)
    if hit is None and wanted:
        hit = next((p for p in marked if p[1].heading and wanted in p[1].heading.casefold()), None)
    if hit is None:
        return None
    start, first = hit
    end = next((i for i, line in marked if i > start and _level(line) <= _level(first)), len(all_lines))
    return "".join(line.text for line in all_lines[start:end]).strip()
