"""The search index of a KB: analysed fields of every document in BM25F postings, saved under ``.kindex/``.

Generation writes it (:func:`update`), retrieval reads it (:func:`load`); neither imports the other.

Each field (title, tags, summary, questions, headings, path, anchors, body) is one postings table: per term, the
documents holding it and how often. Terms are stored as 64-bit hashes in a sorted array, so a cold process loads the
tables with a few array reads instead of parsing a vocabulary (a collision between two real terms is a 1-in-10^19
event and would cost one spurious match). Scores are computed at query time from raw frequencies (BM25F: field-weighted,
length-normalised frequencies summed before one saturation, rarity from the documents holding the term in any
field), so field weights can change without a rebuild.

Updating is per document: a document whose entry and body are unchanged keeps its postings as they are (remapped
with vectorised array operations); only a changed document is read and analysed again.

The ``anchors`` field of a document holds the texts of the links other documents of the KB make to it
(``[限流](plugins/limit-req.md)``): how other pages name it, often in other words than its own (anchor text, a
field of web search since Craswell, Hawking & Robertson, SIGIR 2001). Each document's outgoing links are kept with
its record, so a changed document costs its own reading and the anchors field of the pages it links to (or linked
to before), not the KB's.

Long because building, saving, loading (validating a possibly hostile file) and the per-document update
share the tables' layout; split apart they would have to publish it.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import stat
import threading
import unicodedata
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import numpy.typing as npt
import orjson

from kindex.analysis import ANALYZER_VERSION, analyze, title_key, vocabulary
from kindex.errors import IndexMissingError, InvalidFileError, KBNotFoundError, KindexError
from kindex.gcpause import collector_paused
from kindex.globs import without_dot_folders
from kindex.markdown import MAX_LINK_TARGET, MAX_LINK_TEXT, links
from kindex.records import INDEX_FILE, DocItem
from kindex.scan import Scan, document_digest, headings_of, own_title, scan
from kindex.store import STATE_DIR, atomic_write, index_digest, read_index_digest, refusal

SEARCH_FILE = "search.npz"
FORMAT = 6
"""3: the theme entries' terms are saved too (see ``SearchIndex.theme_terms``); 4: the index files' digests;
5: the anchors field, and each document's links; 6: a document's own title where its entry gives another."""
MAX_OWN_TITLE = 200
"""Characters of a document's own title kept: a longer one is no title a person types."""
FIELDS = ("title", "tags", "summary", "questions", "headings", "path", "anchors", "body")
_ANCHORS = FIELDS.index("anchors")
MAX_LINKS_PER_DOC = 1_000
"""Links kept of one document (in order): a real page links to tens; a generated link farm is bounded."""
MAX_TARGETS_PER_TEXT = 3
"""Pages one link text of one page may name and still count (see :func:`_anchors`)."""
_MAX_TARGET = 2 * MAX_LINK_TARGET
"""A link's target joined to its page's folder: longer than any path a KB holds."""
MAX_ANCHORS_PER_DOC = 200
"""Link texts a document's anchors field takes (distinct per linking page, the linking pages in path order): a hub
that every page links to is named by them long before the 200th, and the work stays bounded."""
BODY_TERMS_PER_DOC = 20_000
"""A document keeps at most its most frequent body terms: bounds the table whatever the documents' length. Real pages
stay well under it (FastAPI's release notes, the largest of the corpora: 8,775 terms); at 5,000 (format 1) their
rarest words, the identifiers mentioned once among them, were not searchable."""

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int32]
HashArray = npt.NDArray[np.uint64]


def term_hash(term: str) -> int:
    """The stable 64-bit key of a term in the saved tables."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class DocRecord:
    """What retrieval needs of one document without opening the index files."""

    path: str
    """KB-relative path."""
    theme: str | None
    entry: Mapping[str, Any]
    """The entry's JSON form (:meth:`DocItem.to_dict`); type-checked when loaded."""
    key: str
    """Hash of everything its terms came from (entry, headings, body, analyzer version), its anchors aside."""
    anchors_key: str = ""
    """Hash of the link texts its anchors field was analysed from."""
    own_title: str = ""
    """The :func:`~kindex.analysis.title_key` of the title the document gives itself (frontmatter ``title``, else its
    first heading) where its entry's title is another (a model writes ``测试 TestClient`` for the page titled 测试):
    a person typing a page's title types the one the page shows."""

    @property
    def item(self) -> DocItem:
        """The entry as a record, made when asked for: a question touches a few entries, a load 10,000."""
        e = self.entry
        return DocItem.model_construct(
            path=e["path"],
            title=e["title"],
            summary=e["summary"],
            tags=tuple(e.get("tags", ())),
            paths=tuple(e.get("paths", ())),
            questions=tuple(e.get("questions", ())),
        )

    @property
    def globs(self) -> tuple[str, ...]:
        """The entry's ``paths`` globs (empty: the document applies whatever files the user works on)."""
        return tuple(self.entry.get("paths", ()))


@dataclass(frozen=True, slots=True)
class ThemeRecord:
    dir: str
    item: DocItem


@dataclass(frozen=True, slots=True)
class Source:
    """One document as generation hands it to :func:`build`: its entry, headings and a way to read its body."""

    path: str
    theme: str | None
    item: DocItem
    headings: tuple[str, ...]
    body_sha: str
    read_body: Callable[[], str]
    read_exactly: Callable[[], bool] = lambda: True
    """After ``read_body``: whether it gave the body of ``body_sha`` (a scan's stand-in excerpt does not: its
    postings are saved under no key, so the next build reads the document again)."""
    own_title: str = ""
    """The title the document gives itself (``ScannedDoc.own_title``)."""


class FieldTable:
    """Postings of one field: sorted term hashes, their document lists and term frequencies."""

    __slots__ = ("docs", "hashes", "offsets", "tfs")

    def __init__(self, hashes: HashArray, offsets: npt.NDArray[np.int64], docs: IntArray, tfs: FloatArray) -> None:
        self.hashes = hashes
        self.offsets = offsets
        self.docs = docs
        self.tfs = tfs

    @classmethod
    def empty(cls) -> FieldTable:
        return cls(np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))

    def postings(self, h: int) -> tuple[IntArray, FloatArray] | None:
        i = int(np.searchsorted(self.hashes, np.uint64(h)))
        if i >= len(self.hashes) or int(self.hashes[i]) != h:
            return None
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.docs[lo:hi], self.tfs[lo:hi]

    @classmethod
    def merge(cls, old: FieldTable, mapping: IntArray, new: Sequence[tuple[int, Mapping[int, float]]]) -> FieldTable:
        """``old`` with document ``i`` renumbered ``mapping[i]`` (``-1`` drops it), plus ``new`` (doc, {hash: tf})."""
        old_hash = np.repeat(old.hashes, np.diff(old.offsets))
        old_doc = mapping[old.docs] if len(old.docs) else old.docs
        keep = old_doc >= 0
        n_new = sum(len(row) for _, row in new)
        new_hash = np.fromiter((h for _, row in new for h in row), np.uint64, n_new)
        new_doc = np.fromiter((d for d, row in new for _ in row), np.int32, n_new)
        new_tf = np.fromiter((tf for _, row in new for tf in row.values()), np.float32, n_new)
        hashes = np.concatenate([old_hash[keep], new_hash])
        docs = np.concatenate([old_doc[keep], new_doc]).astype(np.int32)
        tfs = np.concatenate([old.tfs[keep], new_tf]).astype(np.float32)
        # Two sorted runs (the kept postings, then the new ones sorted below): a stable sort merges them in
        # linear time.
        order = np.argsort(hashes, kind="stable")
        hashes, docs, tfs = hashes[order], docs[order], tfs[order]
        if len(hashes):
            starts = np.concatenate(([0], np.nonzero(hashes[1:] != hashes[:-1])[0] + 1))
            offsets = np.concatenate((starts, [len(hashes)])).astype(np.int64)
            unique = hashes[starts]
        else:
            offsets, unique = np.zeros(1, np.int64), hashes
        return cls(unique, offsets, docs, tfs)


DocLinks = tuple[tuple[str, str], ...]
"""A document's links to other pages of the KB, as ``(target, link text)``: the target KB-relative, normalised, not
yet matched against the documents (:func:`_link_target`); read from the body its record's key was made from."""


class Links:
    """Every document's links, in the order of the documents. Only a build reads them: a loaded index keeps the
    saved bytes and parses them when a build asks (:meth:`get`), so a cold load for a question parses none (a KB
    of a thousand links a page would otherwise pay for them on every first call)."""

    __slots__ = ("_parsed", "_raw", "_size")

    def __init__(self, parsed: tuple[DocLinks, ...] | None, raw: bytes = b"", size: int = 0) -> None:
        self._parsed, self._raw, self._size = parsed, raw, size

    @classmethod
    def saved(cls, raw: bytes, size: int) -> Links:
        return cls(None, raw, size)

    def get(self) -> tuple[DocLinks, ...]:
        """The links of each document; :class:`InvalidFileError` when the saved bytes are not what a save wrote."""
        if self._parsed is None:
            self._parsed = _parse_links(self._raw, self._size)
        return self._parsed

    def same(self, other: Links) -> bool:
        """Whether both hold the same links (``False`` when either cannot be read: it is to be written again)."""
        try:
            return self.get() == other.get()
        except InvalidFileError:
            return False

    def dump(self) -> bytes:
        """The saved form: ``{"document index": [[target, text], ...]}`` for the documents that link somewhere."""
        parsed = self.get()
        return orjson.dumps({str(i): doc for i, doc in enumerate(parsed) if doc})


def _parse_links(raw: bytes, size: int) -> tuple[DocLinks, ...]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidFileError("bad links") from None
    if type(obj) is not dict:
        raise InvalidFileError("bad links")
    out: list[DocLinks] = [()] * size
    for at, doc in obj.items():
        i = int(at) if at.isdigit() else -1
        if not 0 <= i < size or type(doc) is not list or len(doc) > MAX_LINKS_PER_DOC:
            raise InvalidFileError("bad links")
        out[i] = tuple(map(_link, doc))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class SearchIndex:
    """Everything retrieval needs of a KB: documents, themes, vocabulary and the postings of every field."""

    docs: tuple[DocRecord, ...]
    themes: tuple[ThemeRecord, ...]
    vocab: frozenset[str]
    fields: Mapping[str, FieldTable]
    lengths: FloatArray
    """Terms per document and field, shape (documents, fields)."""
    signature: tuple[tuple[str, int, int], ...]
    """(index file, mtime_ns, size) of every index file the entries were read from."""
    digests: tuple[str, ...]
    """The digest of each of those files' bytes (``store.index_digest``), in the same order: a KB copied with new
    times (``cp -r``, a checkout, a restore) is still one these tables were built from."""
    theme_terms: tuple[Mapping[str, int], ...]
    """Per theme, in order: the terms of its entry (title, tags, summary) and their counts. Analysed when the index
    is built, so a cold load cuts no text: a KB's theme entries run to thousands of characters, past what the
    segmenter's light path takes, and analysing them at load built the full segmenter (0.15 s) in every process
    that answered one question."""
    links: Links

    def postings(self, field: str, term: str) -> tuple[IntArray, FloatArray] | None:
        return self.fields[field].postings(term_hash(term))

    def save(self, kb: Path) -> None:
        """Write the index atomically as one ``.npz`` of plain arrays (no pickle: a hostile file cannot run code)."""
        meta = {
            "format": FORMAT,
            "analyzer": ANALYZER_VERSION,
            "signature": self.signature,
            "digests": self.digests,
            "vocab": sorted(self.vocab),
            # A document no page links to is saved without its empty anchors key: 10,000 of them parse measurably
            # faster at a cold load.
            "docs": [
                [d.path, d.theme, d.key, d.entry, d.anchors_key, d.own_title]
                if d.own_title
                else [d.path, d.theme, d.key, d.entry, d.anchors_key]
                if d.anchors_key
                else [d.path, d.theme, d.key, d.entry]
                for d in self.docs
            ],
            "themes": [[t.dir, t.item.to_dict()] for t in self.themes],
            "theme_terms": self.theme_terms,
        }
        arrays: dict[str, Any] = {
            "meta": np.frombuffer(orjson.dumps(meta), dtype=np.uint8),
            "links": np.frombuffer(self.links.dump(), dtype=np.uint8),
            "lengths": self.lengths,
        }
        for name, table in self.fields.items():
            arrays[f"{name}.hashes"] = table.hashes
            arrays[f"{name}.offsets"] = table.offsets
            arrays[f"{name}.docs"] = table.docs
            arrays[f"{name}.tfs"] = table.tfs
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write(kb / STATE_DIR / SEARCH_FILE, buf.getvalue())


def load(kb: Path) -> SearchIndex | None:
    """The saved search index of ``kb``, or ``None`` when it is missing, damaged or of another version.

    The file is a cache that anyone with write access to the KB could have replaced, so every array is checked
    before use (shapes, types, bounds, order): a bad file means a rebuild, never a crash or a wrong answer.
    """
    path = kb / STATE_DIR / SEARCH_FILE
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block the reader
            return None
        with open(path, "rb") as fh:
            with zipfile.ZipFile(fh) as zf:
                # np.savez stores arrays uncompressed: a compressed member can only be a decompression bomb.
                if any(i.compress_type != zipfile.ZIP_STORED or i.file_size > st.st_size for i in zf.infolist()):
                    return None
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as data:
                meta = orjson.loads(data["meta"].tobytes())
                if meta.get("format") != FORMAT or meta.get("analyzer") != ANALYZER_VERSION:
                    return None
                arrays = {
                    name: (data[f"{name}.hashes"], data[f"{name}.offsets"], data[f"{name}.docs"], data[f"{name}.tfs"])
                    for name in FIELDS
                }
                lengths = data["lengths"]
                raw_links = data["links"]
                if raw_links.dtype != np.uint8 or raw_links.ndim != 1:
                    return None
                links_bytes = raw_links.tobytes()
        docs = tuple(_record(row) for row in meta["docs"])
        themes = tuple(ThemeRecord(str(d), _item(obj)) for d, obj in meta["themes"])
        signature = tuple((str(p), int(m), int(s)) for p, m, s in meta["signature"])
        digests = tuple(str(d) for d in meta["digests"])
        if len(digests) != len(signature):
            return None
        vocab = frozenset(str(v) for v in meta["vocab"])
        theme_terms = tuple(_counts(c) for c in meta["theme_terms"])
        if len(theme_terms) != len(themes):
            return None
        fields = {name: _checked_table(h, o, d, t, len(docs)) for name, (h, o, d, t) in arrays.items()}
        if lengths.dtype != np.float32 or lengths.shape != (len(docs), len(FIELDS)) or not _finite(lengths):
            return None
    except Exception:  # zip, numpy, JSON and shape errors of every kind: the cache is rebuilt
        return None
    return SearchIndex(
        docs, themes, vocab, fields, lengths, signature, digests, theme_terms, Links.saved(links_bytes, len(docs))
    )


def _finite(a: npt.NDArray[Any]) -> bool:
    return bool(np.isfinite(a).all() and (a >= 0).all())


def _checked_table(
    hashes: npt.NDArray[Any], offsets: npt.NDArray[Any], docs: npt.NDArray[Any], tfs: npt.NDArray[Any], n_docs: int
) -> FieldTable:
    """A field table whose arrays hold together; ``ValueError`` when they do not."""
    ok = (
        hashes.dtype == np.uint64
        and offsets.dtype == np.int64
        and docs.dtype == np.int32
        and tfs.dtype == np.float32
        and hashes.ndim == offsets.ndim == docs.ndim == tfs.ndim == 1
        and len(offsets) == len(hashes) + 1
        and len(docs) == len(tfs) == int(offsets[-1])
        and int(offsets[0]) == 0
        and bool((np.diff(offsets) > 0).all())
        and bool((np.diff(hashes) > 0).all())
        and (len(docs) == 0 or (int(docs.min()) >= 0 and int(docs.max()) < n_docs))
        and _finite(tfs)
    )
    if not ok:
        raise InvalidFileError("inconsistent search table")
    return FieldTable(hashes, offsets, docs, tfs)


_ENTRY_LISTS = ("tags", "paths", "questions")
_NONE: list[str] = []


def _entry(obj: object) -> Mapping[str, Any]:
    """An entry as :meth:`SearchIndex.save` wrote it, its types checked (it was cleaned when it was built, and
    validating 10,000 entries' bounds again would cost the cold load more than everything else it does)."""
    # Exact type tests, not isinstance: orjson gives exactly dict, list and str, and the loop runs 10,000 times
    # on a cold load (this way it costs a third of what the generic checks did).
    if type(obj) is not dict:
        raise InvalidFileError("bad entry")
    get = obj.get
    if type(get("path")) is not str or type(get("title")) is not str or type(get("summary")) is not str:
        raise InvalidFileError("bad entry")
    for key in _ENTRY_LISTS:
        x = get(key, _NONE)
        if type(x) is not list or (x and not all(type(v) is str for v in x)):
            raise InvalidFileError("bad entry")
    return obj


def _counts(obj: object) -> Mapping[str, int]:
    """A theme entry's saved term counts, their types checked."""
    if type(obj) is not dict or not all(type(k) is str and type(v) is int and v > 0 for k, v in obj.items()):
        raise InvalidFileError("bad theme terms")
    return obj


def _theme_terms(theme: ThemeRecord, vocab: frozenset[str]) -> dict[str, int]:
    item = theme.item
    return dict(Counter(analyze(" \n".join((item.title, *item.tags, item.summary)), vocab)))


def _item(obj: object) -> DocItem:
    return DocRecord("", None, _entry(obj), "").item


def _record(row: Sequence[Any]) -> DocRecord:
    if type(row) is not list or not 4 <= len(row) <= 6:
        raise InvalidFileError("bad document record")
    path, theme, key, obj, anchors_key, own_title = (*row, "", "")[:6]
    if (
        type(path) is not str
        or type(key) is not str
        or type(anchors_key) is not str
        or type(own_title) is not str
        or len(own_title) > MAX_OWN_TITLE
        or not (theme is None or type(theme) is str)
    ):
        raise InvalidFileError("bad document record")
    return DocRecord(path, theme, _entry(obj), key, anchors_key, own_title)


def _link(obj: object) -> tuple[str, str]:
    if type(obj) is not list or len(obj) != 2:
        raise InvalidFileError("bad link")
    target, label = obj
    if type(target) is not str or type(label) is not str or len(target) > _MAX_TARGET or len(label) > MAX_LINK_TEXT:
        raise InvalidFileError("bad link")
    return target, label


def _file_signature(kb: Path, rel: str) -> tuple[str, int, int]:
    try:
        st = (kb / rel).stat()
    except (OSError, ValueError):  # ValueError: a NUL in a hand-edited name
        return (rel, 0, -1)
    return (rel, st.st_mtime_ns, st.st_size)


def signature_of(kb: Path, themes: Iterable[str]) -> tuple[tuple[str, int, int], ...]:
    """(file, mtime_ns, size) of the root index and each theme's index; (file, 0, -1) for one that is missing."""
    return tuple(_file_signature(kb, rel) for rel in (INDEX_FILE, *(f"{t}/{INDEX_FILE}" for t in themes)))


def still_current(kb: Path, index: SearchIndex) -> SearchIndex | None:
    """``index`` stamped with its index files' current signature when their bytes are still those it was built
    from (a KB copied with ``cp -r``, checked out or restored: new times, the same files), else ``None``. Each
    file is stat-ed before it is read: one changed in between differs at the next check."""
    now = signature_of(kb, [t.dir for t in index.themes])
    if now == index.signature:
        return index
    sizes = [size for _, _, size in now]
    if sizes != [size for _, _, size in index.signature] or -1 in sizes:
        return None
    digests = tuple(index_digest(kb / rel, kb) for rel, _, _ in now)
    return replace(index, signature=now) if digests == index.digests and "" not in digests else None


def _doc_fields(src: Source, vocab: frozenset[str]) -> tuple[dict[str, Counter[str]], DocLinks]:
    """Every field's terms but the anchors', and the document's links."""
    item = src.item
    path_words = src.path.removesuffix(".md").replace("/", " ").replace("_", " ").replace("-", " ")
    text = src.read_body()
    out: list[tuple[str, str]] = []
    for label, written in links(text):
        target = _link_target(src.path, written)
        if target is not None:
            out.append((target, label))
            if len(out) >= MAX_LINKS_PER_DOC:
                break
    body = Counter(analyze(text, vocab))
    if len(body) > BODY_TERMS_PER_DOC:
        body = Counter(dict(sorted(body.items(), key=lambda kv: (-kv[1], kv[0]))[:BODY_TERMS_PER_DOC]))
    fields = {
        "title": Counter(analyze(item.title, vocab)),
        "tags": Counter(analyze(" \n".join(item.tags), vocab)),
        "summary": Counter(analyze(item.summary, vocab)),
        "questions": Counter(analyze(" \n".join(item.questions), vocab)),
        "headings": Counter(analyze(" \n".join(src.headings), vocab)),
        "path": Counter(analyze(path_words, vocab)),
        "body": body,
    }
    return fields, tuple(out)


def _link_target(source: str, written: str) -> str | None:
    """Where a link of document ``source`` points inside the KB, KB-relative and normalised (``../a/./b.md#x`` →
    ``a/b.md``), or ``None`` for an address elsewhere (a scheme, a page anchor only, a path out of the KB). A target
    starting with ``/`` is read from the KB's root, as documentation sites serve it; one ending with ``/`` names a
    folder, and keeps its ``/`` (``guide/`` is ``guide/index.md``, not ``guide.md``). NFC, as file names compare."""
    target = written.split("#", 1)[0].split("?", 1)[0]
    if not target or ":" in target or "\\" in target or target.startswith("//"):  # "//host/x": another site
        return None
    target = unicodedata.normalize("NFC", unquote(target))
    joined = target.lstrip("/") if target.startswith("/") else posixpath.join(posixpath.dirname(source), target)
    norm = posixpath.normpath(joined) if joined else ""
    if not norm or norm == "." or norm == ".." or norm.startswith("../") or len(norm) >= _MAX_TARGET:
        return None
    return norm + "/" if target.endswith("/") else norm


def _anchors(docs: Sequence[tuple[str, DocLinks]]) -> dict[str, list[str]]:
    """Per document path, the texts of the links other documents make to it: each linking page's distinct texts,
    the pages in path order, at most ``MAX_ANCHORS_PER_DOC``. A target is a document's path, or names it without
    its ``.md``, with ``.html`` for it (a built site's address, as VuePress and docsify pages link), or as a folder
    holding it as ``index.md`` or ``README.md`` (how MkDocs and Docusaurus link).

    A text one page gives to more than ``MAX_TARGETS_PER_TEXT`` pages names none of them (``here``, ``文档``, or a
    farm of links that would give every page the same words) and is left out."""
    paths = {unicodedata.normalize("NFC", path): path for path, _ in docs}
    out: dict[str, list[str]] = {}
    for path, doc_links in sorted(docs):
        resolved: dict[str, set[str]] = {}  # per text, the pages it links to
        for target, label in doc_links:
            base = target.rstrip("/")
            # A built site's address (``guide/start.html``) names the page its ``.md`` became.
            base = base if target.endswith("/") else base.removesuffix(".html")
            inside = (f"{base}/index.md", f"{base}/README.md")
            forms = inside if target.endswith("/") else (base, f"{base}.md", *inside)
            found = next((paths[c] for c in forms if c in paths), None)
            if found is not None and found != path:
                resolved.setdefault(label, set()).add(found)
        for label, targets in resolved.items():
            if len(targets) > MAX_TARGETS_PER_TEXT:
                continue
            for found in sorted(targets):
                texts = out.setdefault(found, [])
                if len(texts) < MAX_ANCHORS_PER_DOC:
                    texts.append(label)
    return out


def _key(src: Source) -> str:
    data = orjson.dumps(
        [ANALYZER_VERSION, src.path, src.item.to_dict(), list(src.headings), src.body_sha, src.own_title]
    )
    return hashlib.sha256(data).hexdigest()


def _own_title(src: Source) -> str:
    """:attr:`DocRecord.own_title` of ``src``: empty where it is its entry's title."""
    own = title_key(src.own_title[:MAX_OWN_TITLE]) if src.own_title else ""
    return "" if own == title_key(src.item.title) else own


def build(
    sources: Sequence[Source],
    themes: Sequence[ThemeRecord],
    signature: tuple[tuple[str, int, int], ...],
    previous: SearchIndex | None = None,
    digests: tuple[str, ...] = (),
) -> SearchIndex:
    """The search index of ``sources``, reusing ``previous``'s postings of every document that did not change.

    The vocabulary grows with the KB: terms of a changed document's entry are added, and documents analysed before
    a term existed keep their postings (they still match by the term's words) until a full rebuild, which happens
    when the analyzer changes or no previous index is given. An unchanged document's names are in ``previous``'s
    vocabulary already: only the changed ones' are looked at, so one edited document costs its own analysis.
    """
    digests = digests or ("",) * len(signature)
    old_links: tuple[DocLinks, ...] = ()
    if previous is not None:
        try:
            old_links = previous.links.get()
        except InvalidFileError:  # a damaged saved file: everything is analysed afresh
            previous = None
    old_docs = previous.docs if previous is not None else ()
    old_at = {d.path: i for i, d in enumerate(old_docs)}
    keys = [_key(src) for src in sources]
    # Where each source's unchanged postings are in ``previous`` (None: it is analysed afresh).
    kept: list[int | None] = []
    for src, key in zip(sources, keys, strict=True):
        old = old_at.get(src.path)
        kept.append(old if old is not None and old_docs[old].key == key else None)
    if previous is not None and tuple(themes) == previous.themes and kept == list(range(len(old_docs))):
        # Nothing the tables are made of changed (a no-op reindex, an index file written again as it was):
        # building them again merged every table and re-derived every anchor (2.5 s at 20,000 documents).
        return replace(previous, signature=signature, digests=digests)
    names: list[str] = []
    for t in themes:
        names.extend((t.item.title, *t.item.tags))
    for src, old in zip(sources, kept, strict=True):
        if old is None:
            names.extend((src.item.title, *src.item.tags, *src.headings))
    vocab = vocabulary(names)
    if previous is not None:
        vocab = vocab | previous.vocab
    mapping = np.full(len(old_docs), -1, dtype=np.int32)
    lengths = np.zeros((len(sources), len(FIELDS)), dtype=np.float32)
    fresh: dict[str, list[tuple[int, dict[int, float]]]] = {f: [] for f in FIELDS}
    hashes: dict[str, int] = {}
    column = {name: f for f, name in enumerate(FIELDS)}

    def add(name: str, i: int, counts: Counter[str]) -> None:
        lengths[i, column[name]] = sum(counts.values())
        row: dict[int, float] = {}
        for term, n in counts.items():
            h = hashes.get(term)
            if h is None:
                h = hashes[term] = term_hash(term)
            row[h] = float(n)
        fresh[name].append((i, row))

    doc_links: list[DocLinks] = []
    for i, (src, old) in enumerate(zip(sources, kept, strict=True)):
        if old is not None and previous is not None:
            mapping[old] = i
            lengths[i] = previous.lengths[old]
            doc_links.append(old_links[old])
            continue
        analysed, found = _doc_fields(src, vocab)
        if not src.read_exactly():
            keys[i] = ""
        for name, counts in analysed.items():
            add(name, i, counts)
        doc_links.append(found)
    # The anchors field: whatever else changed, a document's anchors come from the other documents' links now.
    # When no link changed (the same documents in the same order, an edited one linking as before) they are what
    # they were: deriving them again from every document's links was 0.7 s of a doc step at 20,000 documents.
    same_links = (
        previous is not None
        and [src.path for src in sources] == [d.path for d in old_docs]
        and doc_links == list(old_links)
    )
    anchors = {} if same_links else _anchors([(src.path, found) for src, found in zip(sources, doc_links, strict=True)])
    anchors_mapping = np.full(len(old_docs), -1, dtype=np.int32)
    records: list[DocRecord] = []
    for i, src in enumerate(sources):
        texts = anchors.get(src.path, [])
        if same_links:
            anchors_key = old_docs[i].anchors_key
        else:
            anchors_key = hashlib.sha256(orjson.dumps([ANALYZER_VERSION, texts])).hexdigest() if texts else ""
        before = old_at.get(src.path)
        if before is not None and previous is not None and old_docs[before].anchors_key == anchors_key:
            anchors_mapping[before] = i
            lengths[i, _ANCHORS] = previous.lengths[before, _ANCHORS]
        elif texts:
            add("anchors", i, Counter(analyze(" \n".join(texts), vocab)))
        else:
            lengths[i, _ANCHORS] = 0.0
        own = old_docs[k].own_title if (k := kept[i]) is not None else _own_title(src)
        records.append(DocRecord(src.path, src.theme, src.item.to_dict(), keys[i], anchors_key, own))
    empty = FieldTable.empty()
    fields = {
        f: FieldTable.merge(
            previous.fields[f] if previous else empty, anchors_mapping if f == "anchors" else mapping, fresh[f]
        )
        for f in FIELDS
    }
    known: dict[ThemeRecord, Mapping[str, int]] = {}
    if previous is not None and previous.vocab == vocab:  # its theme terms were cut with the same vocabulary
        known = dict(zip(previous.themes, previous.theme_terms, strict=True))
    theme_terms = tuple(known.get(t) or _theme_terms(t, vocab) for t in themes)
    return SearchIndex(
        tuple(records), tuple(themes), vocab, fields, lengths, signature, digests, theme_terms, Links(tuple(doc_links))
    )


@dataclass(frozen=True, slots=True)
class Entries:
    """The entries of a KB's index files: what the search index is built from."""

    docs: tuple[tuple[str, str | None, DocItem], ...]
    """(KB-relative path, theme or ``None``, entry) of every document entry."""
    themes: tuple[ThemeRecord, ...]
    signature: tuple[tuple[str, int, int], ...]
    digests: tuple[str, ...]
    """The digest of each file of ``signature``, of the bytes read (empty for a file that could not be)."""
    problems: tuple[str, ...]


def read_entries(kb: Path) -> Entries:
    """Read the root index and every theme index it lists; :class:`IndexMissingError` without a root index.

    A theme index that is missing or unreadable is reported in ``problems`` and contributes no documents.
    """
    # Each file is stat-ed before it is read: a file replaced in between then differs from its signature (one
    # reload too many), never the other way round (new stamps on old entries, which no check would see again).
    signature = [_file_signature(kb, INDEX_FILE)]
    root_path = kb / INDEX_FILE
    try:
        root, problems, digest = read_index_digest(root_path)
    except (FileNotFoundError, NotADirectoryError):
        if not kb.is_dir():  # deleted (or unmounted) since it was opened: no reindex would help
            raise KBNotFoundError(
                f"knowledge folder '{kb.name or kb}' does not exist (any more): pass the folder that holds your "
                "Markdown files"
            ) from None
        raise IndexMissingError(f"{kb.name or kb} has no index yet: run `kindex reindex` on it first") from None
    except IndexMissingError:
        raise IndexMissingError(f"{INDEX_FILE} of {kb.name or kb} is a folder, not an index: remove it") from None
    except (OSError, InvalidFileError) as exc:
        label = f"{INDEX_FILE} of {kb.name or kb}"
        raise IndexMissingError(
            _refusal(root_path, label) or f"{label} is unreadable ({exc}): run `kindex reindex`"
        ) from None
    empty = not root.themes and not root.documents  # (a newer kindex's index with entries is still read)
    if problems and empty and (refused := _refusal(root_path, f"{INDEX_FILE} of {kb.name or kb}")):
        # Another tool's JSON (an OpenAPI document) read as an index of nothing: "holds no documents yet" on
        # every question, where a step refuses to replace the file.
        raise IndexMissingError(refused)
    problems = [f"{INDEX_FILE}: {p}" for p in problems]
    digests = [digest]
    # Each document by its one name (`./a.md`, `a//b.md` in a hand-edited index are `a.md`, `a/b.md`): listed as
    # written, the same file was searched and served twice.
    docs: list[tuple[str, str | None, DocItem]] = [
        (without_dot_folders(d.path), None, d) for d in root.documents if "/" not in without_dot_folders(d.path)
    ]
    seen_themes: set[str] = set()
    themes: list[ThemeRecord] = []
    for t in root.themes:
        if "/" in t.dir or t.dir.startswith(".") or t.dir in ("", ".."):
            problems.append(f"theme {t.dir!r} is not a first-level folder: ignored")
            continue
        if t.dir in seen_themes:
            problems.append(f"theme {t.dir!r} has a second entry: ignored")
            continue
        if (kb / t.dir).is_symlink():
            # The scan never indexes a linked folder; a hand-edited root index naming one had the index behind the
            # link read, wherever it led, and its entries listed.
            problems.append(f"theme {t.dir!r} is a symbolic link: ignored (kindex reads no index through a link)")
            continue
        seen_themes.add(t.dir)
        themes.append(
            ThemeRecord(
                t.dir,  # a theme's summary may be longer than a document's: its entry was validated as a ThemeItem
                DocItem.model_construct(path=t.dir, title=t.title, summary=t.summary, tags=t.tags, paths=t.paths),
            )
        )
        signature.append(_file_signature(kb, f"{t.dir}/{INDEX_FILE}"))
        digests.append("")
        try:
            sub, sub_problems, digests[-1] = read_index_digest(kb / t.dir / INDEX_FILE, kb)
        except (OSError, InvalidFileError, IndexMissingError) as exc:
            # The reason without the absolute path an OSError carries: this reaches an HTTP service's tenants.
            why = "missing" if isinstance(exc, FileNotFoundError) else getattr(exc, "strerror", None) or str(exc)
            label = f"{t.dir}/{INDEX_FILE}"
            refused = _refusal(kb / t.dir / INDEX_FILE, label)
            fix = f": {refused}" if refused else ": its documents are not searched until `kindex reindex` writes it"
            problems.append(f"{label} cannot be read ({why}){fix}")
            continue
        problems.extend(f"{t.dir}/{INDEX_FILE}: {p}" for p in sub_problems)
        docs.extend(
            (without_dot_folders(f"{t.dir}/{d.path}"), t.dir, d) for d in sub.documents if ".." not in d.path.split("/")
        )
    # A hand-edited index may list a document twice: it is one document, searched and served once.
    unique = list({rel: (rel, theme, item) for rel, theme, item in reversed(docs)}.values())[::-1]
    if len(unique) < len(docs):
        problems.append(f"{len(docs) - len(unique)} duplicate document entries ignored")
    return Entries(tuple(unique), tuple(themes), tuple(signature), tuple(digests), tuple(problems))


def _refusal(path: Path, label: str) -> str | None:
    """:func:`kindex.store.refusal`, its advice naming the step to run after (advising the step alone sent its
    reader round in circles)."""
    refused = refusal(path, label)
    return refused and refused.replace(
        "move that file away and run again", "move that file away and run `kindex reindex`"
    )


_UPDATING: dict[Path, threading.Event] = {}
"""The KBs whose tables a step of this process is building and saving, with an event set when it is done."""
_UPDATING_LOCK = threading.Lock()


def wait_for_update(kb: Path, timeout: float) -> bool:
    """Wait (at most ``timeout`` s) for a step of this process that is saving the tables of ``kb``; whether one
    was. A reader that finds the tables stale while a step saves new ones would build the same tables beside it:
    twice the work on a shared CPU (a first reindex of 1,445 pages: every context call 10 s instead of 5)."""
    with _UPDATING_LOCK:
        done = _UPDATING.get(kb)
    return done is not None and done.wait(timeout)


@contextmanager
def saving(kb: Path) -> Iterator[None]:
    """Mark ``kb`` as having its tables saved by this process while the block runs (see :func:`wait_for_update`);
    nested marks of one KB are one."""
    done = threading.Event()
    with _UPDATING_LOCK:
        mine = kb not in _UPDATING  # one writer per KB (its lock): only its own step can have marked it
        if mine:
            _UPDATING[kb] = done
    try:
        yield
    finally:
        if mine:
            with _UPDATING_LOCK:
                _UPDATING.pop(kb, None)
            done.set()


@collector_paused()
def update(kb: Path, scan: Scan) -> int:
    """Bring the saved search index of ``kb`` up to date with its index files and documents; how many documents
    were read and analysed afresh (new, or their entry, headings or content changed).

    Only those are read; the file is not rewritten when nothing changed.
    """
    with saving(kb):
        return _update(kb, scan)


def _update(kb: Path, scan: Scan) -> int:
    entries = read_entries(kb)
    by_rel = {d.rel: d for d in scan.documents}
    sources = []
    for rel, theme, item in entries.docs:
        doc = by_rel.get(rel)
        if doc is not None:
            exact = partial(lambda r: r not in scan.stand_ins, doc.rel)
            sources.append(
                Source(rel, theme, item, doc.headings, doc.sha256, partial(scan.read_text, doc), exact, doc.own_title)
            )
    previous = load(kb)
    index = build(sources, entries.themes, entries.signature, previous, entries.digests)
    before = {(d.path, d.key) for d in previous.docs} if previous is not None else set()
    fresh = sum((d.path, d.key) not in before for d in index.docs)
    if (
        previous is not None
        and previous.signature == index.signature
        and previous.digests == index.digests
        and previous.themes == index.themes
        and [(d.path, d.key, d.anchors_key) for d in previous.docs]
        == [(d.path, d.key, d.anchors_key) for d in index.docs]
        and previous.links.same(index.links)
    ):
        return fresh
    index.save(kb)
    return fresh


@collector_paused()
def from_files(kb: Path, entries: Entries, previous: SearchIndex | None = None) -> SearchIndex:
    """A search index built in memory from the index files and the documents as they are on disk.

    What retrieval falls back to when the saved index is missing or stale (``previous``: the stale one, whose
    postings of unchanged documents are reused, as a step's :func:`update` does); a document that cannot be read is
    searched by its entry alone.
    """
    s: Scan | None = None
    if previous is not None:
        try:
            # The scan's memory gives each unchanged document's digest and headings from a stat (it writes
            # nothing): only the documents whose postings cannot be reused are read.
            s = scan(kb)
        except KindexError:  # a broken kindex.toml: every document is read
            s = None
    by_rel = {d.rel: d for d in s.documents} if s is not None else {}
    sources = []
    for rel, theme, item in entries.docs:
        doc = by_rel.get(rel)
        if s is not None and doc is not None:
            exact = partial(lambda r, seen: r not in seen.stand_ins, rel, s)
            sources.append(
                Source(rel, theme, item, doc.headings, doc.sha256, partial(s.read_text, doc), exact, doc.own_title)
            )
            continue
        # Every document is read anyway: once, with its digest, so that the next build can reuse its postings.
        text, digest, titled = document_digest(kb, rel) or ("", "", "")
        heads = headings_of(text)
        sources.append(Source(rel, theme, item, heads, digest, partial(str, text), own_title=own_title(titled, heads)))
    return build(sources, entries.themes, entries.signature, previous, entries.digests)
