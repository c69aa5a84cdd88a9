"""The index records (SPEC §3): the schema of ``index.json``, its field bounds, and its JSON form.

Everything that enters an index goes through the ``clean_*`` helpers, so neither a model answer nor a hand-edited
file can bloat an entry or smuggle in a field the contract does not have.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from kindex.errors import InvalidFileError
from kindex.globs import normalize_path, usable_glob

INDEX_VERSION: Literal[1] = 1
INDEX_FILE = "index.json"

TITLE_MAX = 80
SUMMARY_MAX = 400
# A theme's summary may be a skill's description, which Agent Skills allows up to 1024 characters.
THEME_SUMMARY_MAX = 1024
TAG_MAX = 32
TAGS_MAX = 12
# A skill's theme carries its tags and its allowed tools.
THEME_TAGS_MAX = 24
GLOB_MAX = 200
GLOBS_MAX = 16
QUESTION_MAX = 100
QUESTIONS_MAX = 6
PATH_MAX = 4096

_SPACE = re.compile(r"\s+")
# Unicode category Cc (C0 and C1 controls) except the white space that _SPACE folds, and the invisible format
# characters that hide or reorder text (zero-width space, direction marks, embeddings and overrides, isolates, word
# joiner, BOM): an entry shown to an agent or a person reads as what it says. The joiners U+200C/U+200D stay:
# scripts and emoji are written with them. And lone surrogates (half an emoji, from a frontmatter's "\ud83d" escape
# or a model's answer): no UTF-8 encodes them, and one in a title stopped every step of its KB.
_CONTROL = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\ud800-\udfff]"
)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# A terminal's colour and cursor sequences (ESC [ parameters, intermediates, a final byte): their ESC alone dropped
# left "[31mred[0m" in a summary. Disjoint classes in a row: one pass, no backtracking.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# Tags often arrive as one string ("退款, 发票、refund"); these are the separators people actually use.
_TAG_SPLIT = re.compile(r"[,，、;；|\n]+")


def clean_text(value: object, limit: int) -> str:
    """A single-line string with runs of white space folded, control characters dropped, cut to ``limit``."""
    if not isinstance(value, str):
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                value = str(value)
            except ValueError:  # an int past Python's digit limit for conversion: no title or tag is one
                return ""
        else:
            return ""
    value = _SPACE.sub(" ", _CONTROL.sub("", _ANSI.sub("", value) if "\x1b" in value else value)).strip()
    if not value.strip("\u200c\u200d "):  # only joiners: nothing a reader sees (a heading "# \u200c\u200d")
        return ""
    if len(value) > limit:
        value = value[: limit - 1].rstrip() + "…"
    return value


def clean_tags(value: object, *, limit: int = TAGS_MAX) -> tuple[str, ...]:
    """Tags from a list or a separated string: trimmed, bounded, de-duplicated case-insensitively, in order."""
    if isinstance(value, str):
        items: Iterable[object] = _TAG_SPLIT.split(value)
    elif isinstance(value, list | tuple):
        items = value
    else:
        return ()
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        tag = clean_text(item, TAG_MAX).strip("#").strip()
        key = tag.casefold()
        if tag and key not in seen:
            seen.add(key)
            out.append(tag)
        if len(out) >= limit:
            break
    return tuple(out)


def _clean_list(value: object, clean: Callable[[object], str], limit: int) -> tuple[str, ...]:
    """A string or a list of them, each cleaned (empty: dropped), de-duplicated in order, at most ``limit``."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return ()
    out: list[str] = []
    for item in items:
        cleaned = clean(item)
        if cleaned and cleaned not in out:
            out.append(cleaned)
            if len(out) >= limit:
                break
    return tuple(out)


def clean_questions(value: object) -> tuple[str, ...]:
    """``questions``: single-line strings, bounded in length and number, de-duplicated, in order."""
    return _clean_list(value, lambda item: clean_text(item, QUESTION_MAX), QUESTIONS_MAX)


def _clean_glob(item: object) -> str:
    if not isinstance(item, str):
        return ""
    glob = normalize_path(item)
    if (
        len(glob) > GLOB_MAX
        or "\x00" in glob
        or _SURROGATE.search(glob)
        or ".." in glob.split("/")
        or not usable_glob(glob)
    ):
        return ""
    return glob


def clean_globs(value: object) -> tuple[str, ...]:
    """``paths`` globs: strings without NUL or ``..`` segments, leading ``./`` dropped, bounded, de-duplicated.

    A glob the matcher cannot use within its bounds (more than two ``**``, a brace bomb) is dropped too.
    """
    return _clean_list(value, _clean_glob, GLOBS_MAX)


_TEXT = r"^[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$"
"""Single-line text that does not start with white space: what ``clean_text`` makes of anything non-empty."""
# defer_build: a schema is built when a model is first used, so a process pays only for the records it touches.
_RECORD = ConfigDict(frozen=True, extra="forbid", defer_build=True)


Title = Annotated[str, StringConstraints(min_length=1, max_length=TITLE_MAX, pattern=_TEXT)]
Summary = Annotated[str, StringConstraints(min_length=1, max_length=SUMMARY_MAX, pattern=_TEXT)]
ThemeSummary = Annotated[str, StringConstraints(min_length=1, max_length=THEME_SUMMARY_MAX, pattern=_TEXT)]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=TAG_MAX, pattern=_TEXT)]
Question = Annotated[str, StringConstraints(min_length=1, max_length=QUESTION_MAX, pattern=_TEXT)]
Glob = Annotated[str, StringConstraints(min_length=1, max_length=GLOB_MAX, pattern=_TEXT)]
RelPath = Annotated[str, StringConstraints(min_length=1, max_length=PATH_MAX)]
# A theme is a first-level folder the scan takes: one name, not hidden, so never "." or ".." (a hand-edited index
# must not send a reader out of its folder), and without the NUL no file name holds (os.stat raises on it).
ThemeDir = Annotated[str, StringConstraints(min_length=1, max_length=PATH_MAX, pattern=r"^[^./\x00][^/\x00]*$")]


class DocItem(BaseModel):
    """One document's entry. ``path`` is relative to the folder of the index file that holds it."""

    model_config = _RECORD

    path: RelPath
    title: Title
    summary: Summary
    tags: Annotated[tuple[Tag, ...], Field(max_length=TAGS_MAX)] = ()
    paths: Annotated[tuple[Glob, ...], Field(max_length=GLOBS_MAX)] = ()
    """Globs of the files a conversation must touch for this entry to apply (SPEC §6.4); empty: always."""
    questions: Annotated[tuple[Question, ...], Field(max_length=QUESTIONS_MAX)] = ()
    """Questions a user would ask that the document answers (SPEC §3): written for retrieval, never required."""

    def to_dict(self) -> dict[str, Any]:
        """The entry as the contract writes it: ``paths`` and ``questions`` only when non-empty."""
        out: dict[str, Any] = {
            "path": self.path,
            "title": self.title,
            "summary": self.summary,
            "tags": list(self.tags),
        }
        if self.paths:
            out["paths"] = list(self.paths)
        if self.questions:
            out["questions"] = list(self.questions)
        return out


class ThemeItem(BaseModel):
    """One first-level topic folder's entry in the root index."""

    model_config = _RECORD

    dir: ThemeDir
    title: Title
    summary: ThemeSummary
    tags: Annotated[tuple[Tag, ...], Field(max_length=THEME_TAGS_MAX)] = ()
    index_file: str = ""
    """Always ``<dir>/index.json`` (SPEC §3), whatever was given."""
    paths: Annotated[tuple[Glob, ...], Field(max_length=GLOBS_MAX)] = ()

    @model_validator(mode="before")
    @classmethod
    def _normalise_index_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("dir"), str):
            data = {**data, "index_file": f"{data['dir']}/{INDEX_FILE}"}
        return data

    def to_dict(self) -> dict[str, Any]:
        """The entry as the contract writes it: ``paths`` only when non-empty."""
        out: dict[str, Any] = {
            "dir": self.dir,
            "title": self.title,
            "summary": self.summary,
            "tags": list(self.tags),
            "index_file": self.index_file,
        }
        if self.paths:
            out["paths"] = list(self.paths)
        return out


class Index(BaseModel):
    """A root index (themes and root documents) or a theme index (documents only): the schema of ``index.json``."""

    model_config = _RECORD

    version: Literal[1] = INDEX_VERSION
    themes: tuple[ThemeItem, ...] = ()
    documents: tuple[DocItem, ...] = ()

    def sorted(self) -> Index:
        """The same index in the contract's stable order: themes by dir, documents by path."""
        return Index(
            themes=tuple(sorted(self.themes, key=lambda t: t.dir)),
            documents=tuple(sorted(self.documents, key=lambda d: d.path)),
        )

    def to_dict(self) -> dict[str, Any]:
        ordered = self.sorted()
        return {
            "version": INDEX_VERSION,
            "themes": [t.to_dict() for t in ordered.themes],
            "documents": [d.to_dict() for d in ordered.documents],
        }

    def to_json(self) -> bytes:
        """UTF-8 JSON with readable non-ASCII, 2-space indent and a final newline."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2) + b"\n"

    def document(self, path: str) -> DocItem | None:
        return next((d for d in self.documents if d.path == path), None)


def doc_fields(obj: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The fields of a DocItem cleaned from loose data (title or summary may be empty); ``path`` is the caller's."""
    return {
        "path": path,
        "title": clean_text(obj.get("title"), TITLE_MAX),
        "summary": clean_text(obj.get("summary") or obj.get("description"), SUMMARY_MAX),
        "tags": clean_tags(obj.get("tags") if obj.get("tags") is not None else obj.get("keywords")),
        "paths": clean_globs(obj.get("paths")),
        "questions": clean_questions(obj.get("questions")),
    }


def theme_fields(obj: Mapping[str, Any], dir_name: str) -> dict[str, Any]:
    """The fields of a ThemeItem cleaned from loose data (title or summary may be empty); ``dir`` is kindex's."""
    return {
        "dir": dir_name,
        "title": clean_text(obj.get("title"), TITLE_MAX),
        "summary": clean_text(obj.get("summary") or obj.get("description"), THEME_SUMMARY_MAX),
        "tags": clean_tags(
            obj.get("tags") if obj.get("tags") is not None else obj.get("keywords"), limit=THEME_TAGS_MAX
        ),
        "paths": clean_globs(obj.get("paths")),
    }


def _filled(fields: dict[str, Any], name: str) -> dict[str, Any]:
    # An entry always has a title and a summary: a blank one becomes the file's name, then the title.
    title = fields["title"] or clean_text(name.rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0], TITLE_MAX) or "?"
    return {**fields, "title": title, "summary": fields["summary"] or title}


def doc_item_from(obj: Mapping[str, Any], path: str) -> DocItem:
    """A bounded DocItem from loose data; ``path`` is always the caller's, never the data's."""
    return DocItem(**_filled(doc_fields(obj, path), path))


def theme_item_from(obj: Mapping[str, Any], dir_name: str) -> ThemeItem:
    """A bounded ThemeItem from loose data; ``dir`` and ``index_file`` are always kindex's."""
    return ThemeItem(**_filled(theme_fields(obj, dir_name), dir_name))


BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte-order mark some editors put before a file they save."""


def parse_index(data: bytes) -> tuple[Index, list[str]]:
    """Read an index file's bytes leniently: the entries that make sense, and a list of what did not.

    A file that holds to the schema is read as it is; any other is cleaned entry by entry. Raises
    :class:`InvalidFileError` when the bytes are not a JSON object at all.
    """
    problems: list[str] = []
    if data.startswith(BOM):  # saved again by an editor that marks UTF-8 (Notepad): the agent lost its context
        data = data[len(BOM) :]
        problems.append("starts with a byte-order mark (an editor's): read without it; the next step rewrites it")
    try:
        return Index.model_validate_json(data), problems
    except ValidationError:
        pass
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidFileError(f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InvalidFileError("not a JSON object")
    if obj.get("version") != INDEX_VERSION:
        problems.append(f"version is {obj.get('version')!r}, expected {INDEX_VERSION}")
    themes: list[ThemeItem] = []
    for i, raw in enumerate(_list_field(obj, "themes", problems)):
        name = raw.get("dir") if isinstance(raw, dict) else None
        if not isinstance(name, str) or not name:
            problems.append(f"themes[{i}] has no dir")
            continue
        try:
            themes.append(theme_item_from(raw, name))
        except ValidationError:  # beyond the schema's bounds (a dir of 5,000 characters): no entry to clean
            problems.append(f"themes[{i}] is not a usable entry")
    documents: list[DocItem] = []
    for i, raw in enumerate(_list_field(obj, "documents", problems)):
        path = raw.get("path") if isinstance(raw, dict) else None
        if not isinstance(path, str) or not path:
            problems.append(f"documents[{i}] has no path")
            continue
        try:
            documents.append(doc_item_from(raw, path))
        except ValidationError:  # beyond the schema's bounds (a path of 5,000 characters): no entry to clean
            problems.append(f"documents[{i}] is not a usable entry")
    return Index(themes=tuple(themes), documents=tuple(documents)), problems


def _list_field(obj: Mapping[str, Any], name: str, problems: list[str]) -> list[Any]:
    value = obj.get(name)
    if value is None:
        problems.append(f"missing {name!r}")
        return []
    if not isinstance(value, list):
        problems.append(f"{name!r} is not a list")
        return []
    return value


def schema_errors(data: bytes) -> list[str]:
    """Every way ``data`` breaks the schema of ``index.json`` (:class:`Index`), as readable sentences."""
    try:
        Index.model_validate_json(data)
    except ValidationError as exc:
        return [_sentence(e["loc"], e["type"], e["msg"]) for e in exc.errors()]
    return []


def _sentence(loc: tuple[int | str, ...], kind: str, message: str) -> str:
    where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".")
    if kind == "extra_forbidden":
        parent = where.rsplit(".", 1)[0] if "." in where else "the file"
        return f"{parent}: a key the contract does not have: {str(loc[-1])!r}"
    return f"{where or 'the file'} breaks the contract: {message}"
