"""Aligning model answers with the scan (SPEC §3): the model may describe, never decide which paths exist."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kindex.errors import AnswerError
from kindex.records import DocItem, Index, ThemeItem, doc_fields, theme_fields


def doc_entry(obj: Mapping[str, Any], path: str, author_paths: tuple[str, ...] = (), evidence: str = "") -> DocItem:
    """A bounded entry for ``path`` from a model answer; :class:`AnswerError` when it says nothing usable.

    Whatever path the answer names, the entry describes ``path``. Globs the author wrote win over proposed ones;
    a glob the model proposes is kept only when the document's text (``evidence``) names the kind of file it
    targets, since an entry with globs disappears from every conversation without a matching file.
    """
    fields = _said(doc_fields(obj, path))
    missing = [name for name in ("title", "summary") if not fields[name]]
    if missing:
        raise AnswerError(f"the object has no usable {' or '.join(missing)} (non-empty strings are required)")
    fields["paths"] = author_paths or tuple(g for g in fields["paths"] if supported_glob(g, evidence))
    return DocItem(**fields)


def says(text: str) -> bool:
    """Whether ``text`` holds a letter or digit in any script: "..." or "…" says nothing."""
    return any(ch.isalnum() for ch in text)


def _said(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` without the texts that say nothing (:func:`says`: a small model echoes the prompt's placeholders,
    "...", and the entry was kept: "## ..." as the page's header in every context), and a title that is a file
    path."""
    out = dict(fields)
    for name in ("title", "summary"):
        out[name] = fields[name] if says(fields[name]) else ""
    title = out["title"].casefold()
    if "/" in title and title.endswith((".md", ".markdown")) and not any(ch.isspace() for ch in title):
        # A path for a title ("billing/退款政策.md" for the login page) headed another page's text in the context as
        # that document; a weak model's habit, no description.
        out["title"] = ""
    for name in ("tags", "questions"):
        if name in fields:
            out[name] = tuple(t for t in fields[name] if says(t))
    return out


def supported_glob(glob: str, evidence: str) -> bool:
    """Whether a proposed glob targets code files that ``evidence`` itself mentions (``**/*.tsx`` and ".tsx")."""
    name = glob.rsplit("/", 1)[-1]
    if "*" not in glob or "." not in name:
        return False
    ext = "." + name.rsplit(".", 1)[-1].casefold()
    if ext in (".md", ".markdown", ".*", ".") or "*" in ext:
        return False
    # The whole extension: ".js" inside "settings.json", ".c" inside ".com" made a proposed glob stick, and the page
    # was then shown only to chats about files the KB never meant.
    text = evidence.casefold()
    at = text.find(ext)
    while at >= 0:
        after = at + len(ext)
        if after == len(text) or not (text[after].isalnum() or text[after] == "_"):
            return True
        at = text.find(ext, at + 1)
    return False


def root_index(
    obj: Mapping[str, Any],
    *,
    theme_defaults: Mapping[str, ThemeItem],
    doc_defaults: Mapping[str, DocItem],
    fill_lists: bool = True,
) -> tuple[Index, list[str]]:
    """The root index from a model answer, limited to the scanned root files and themes.

    ``theme_defaults`` and ``doc_defaults`` name every scanned theme and root document with the entry it gets
    when the answer leaves it out, so nothing vanishes from navigation; a root document's ``paths`` are its
    default's (its author's). ``fill_lists``: a document's empty tags and questions are its default's too (a model
    that left them out), not for an answer that describes the documents as they are now (the offline generator's,
    whose empty tags are none). Returns the index and notes on what was dropped or filled in. Raises
    :class:`AnswerError` when the answer has neither list.
    """
    require_root_lists(obj)
    raw_themes, raw_docs = obj.get("themes"), obj.get("documents")
    notes: list[str] = []
    themes: dict[str, ThemeItem] = {}
    for i, raw in enumerate(raw_themes if isinstance(raw_themes, list) else []):
        name = raw.get("dir") if isinstance(raw, dict) else None
        name = name.strip().strip("/") if isinstance(name, str) else name
        if not isinstance(name, str) or name not in theme_defaults:
            notes.append(f"dropped themes[{i}]: dir {name!r} is not a scanned theme")
        elif name in themes:
            notes.append(f"dropped themes[{i}]: second entry for dir {name!r}")
        else:
            themes[name] = _fill_theme(_said(theme_fields(raw, name)), theme_defaults[name])
    for name in sorted(set(theme_defaults) - set(themes)):
        notes.append(f"theme {name!r} was missing: default entry added")
        themes[name] = theme_defaults[name]
    docs = _align_docs(raw_docs if isinstance(raw_docs, list) else [], doc_defaults, notes, fill_lists)
    return Index(themes=tuple(themes.values()), documents=docs).sorted(), notes


def require_root_lists(obj: Mapping[str, Any]) -> None:
    """:class:`AnswerError` unless a root answer has a ``themes`` or a ``documents`` list."""
    themes, docs = obj.get("themes"), obj.get("documents")
    if not isinstance(themes, list) and not isinstance(docs, list):
        raise AnswerError('the object has neither a "themes" list nor a "documents" list')
    # Only lists: a cached answer of another shape (``"themes": 5``) crashed every run that read it.
    lists = [x for x in (themes, docs) if isinstance(x, list)]
    entries = [e for entries in lists for e in entries if isinstance(e, dict)]
    said = [_said(theme_fields(e, "-")) for e in entries]
    if entries and not any(f["title"] or f["summary"] for f in said):
        # Every entry a placeholder ("..."): an answer that describes nothing is asked again, not kept (and cached).
        raise AnswerError("no entry of the answer has a title or summary with a letter or digit (placeholders?)")


def theme_index(docs: Sequence[DocItem]) -> Index:
    """A theme index: documents only, ``themes`` always empty."""
    return Index(themes=(), documents=tuple(docs)).sorted()


def _align_docs(
    raw_docs: list[Any], defaults: Mapping[str, DocItem], notes: list[str], fill_lists: bool
) -> tuple[DocItem, ...]:
    docs: dict[str, DocItem] = {}
    for i, raw in enumerate(raw_docs):
        path = raw.get("path") if isinstance(raw, dict) else None
        if not isinstance(path, str) or path not in defaults:
            notes.append(f"dropped documents[{i}]: path {path!r} is not a scanned document")
        elif path in docs:
            notes.append(f"dropped documents[{i}]: second entry for {path!r}")
        else:
            docs[path] = _fill_doc(_said(doc_fields(raw, path)), defaults[path], fill_lists)
    for path in sorted(set(defaults) - set(docs)):
        notes.append(f"document {path!r} was missing: extractive entry added")
        docs[path] = defaults[path]
    return tuple(docs.values())


def _fill_theme(item: dict[str, Any], default: ThemeItem) -> ThemeItem:
    return ThemeItem(
        dir=item["dir"],
        title=item["title"] or default.title,
        summary=item["summary"] or default.summary,
        tags=item["tags"] or default.tags,
        paths=default.paths,  # a theme is navigation, never conditional on the model's say-so
    )


def _fill_doc(item: dict[str, Any], default: DocItem, fill_lists: bool) -> DocItem:
    return DocItem(
        path=item["path"],
        title=item["title"] or default.title,
        summary=item["summary"] or default.summary,
        tags=item["tags"] or (default.tags if fill_lists else ()),
        questions=item["questions"] or (default.questions if fill_lists else ()),
        # Root documents are overviews: only their author can make one conditional (frontmatter globs).
        paths=default.paths,
    )
