"""Scanning a knowledge folder (SPEC §2): which Markdown documents exist, their excerpts and their signals.

A scan walks the whole folder every time, but reads only the documents that changed since a step last remembered
them: what a step's scan read is kept in ``.kindex/scan.json`` under each file's stat signature, so a ``doc`` step
on one edited document of 10,000 costs that document's read, not the KB's.

Long because the scan, its memory of what it read and the readers of one document share ``ScannedDoc``'s layout.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import functools
import hashlib
import os
import re
import stat
import time
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kindex import config
from kindex.errors import (
    InvalidFileError,
    KBNotFoundError,
    KindexError,
    NotAThemeError,
    PathNotInThemeError,
    UsageError,
)
from kindex.files import MAX_FOLDER_DEPTH, decode_document, read_regular, unopenable, walk
from kindex.gcpause import collector_paused
from kindex.globs import Compiled, any_match, normalize_path, split_globs
from kindex.markdown import headings, lines, may_hold_raw_blocks, outside_raw_blocks, within
from kindex.records import GLOBS_MAX, INDEX_FILE, clean_globs, clean_tags, clean_text
from kindex.results import Skipped
from kindex.store import STATE_DIR, atomic_write
from kindex.version import __version__

DEFAULT_EXCERPT_CHARS = 1200
MAX_DOC_BYTES = 5 * 1024 * 1024
UNREADABLE_FOLDER = "cannot be read"
"""How ``skipped`` describes a file or folder kindex may not read (a folder's is a problem to ``validate``)."""
PATH_TOO_LONG = " (its path is longer than the system can open: shorten the folder names on the way to it)"
"""Said of a folder no access right would open: ``validate`` then gives this advice, not to grant access."""
_HTML_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
# Any Markdown line ending, lone CR included (classic Mac files): CR-only frontmatter was read as body text.
_FRONTMATTER = re.compile(r"\A---[ \t]*(?:\r\n?|\n)(.*?)(?<=[\r\n])(?:---|\.\.\.)[ \t]*(?:\r\n?|\n|\Z)", re.DOTALL)
# Hugo's TOML frontmatter, between lines of "+++": the format its archetypes write.
_TOML_FRONTMATTER = re.compile(r"\A\+\+\+[ \t]*(?:\r\n?|\n)(.*?)(?<=[\r\n])\+\+\+[ \t]*(?:\r\n?|\n|\Z)", re.DOTALL)
_BLANK_RUNS = re.compile(r"\n{3,}")
SCAN_FILE = "scan.json"
_SCAN_FORMAT = 10  # 2: CR-only frontmatter read, headings without inline marks; 3: no <head> or MDX imports; 4: TOML
# frontmatter read; 5: headings keep tags written in code spans or escaped (`<KeepAlive>`, \<script setup>); 6: HTML
# headings on one line (<h1>Title</h1>); 7: headings without attribute lists ({ id="x" }); 8: reference
# links read as their text; 9: VitePress and VuePress home pages' hero and features; 10: setext headings
_MAX_SCAN_FILE_BYTES = 256 * 2**20
_RACY_NS = 2 * 10**9
"""A file changed less than this before it was read may change again within its file system's timestamp step
(a tick, a second, two on FAT) without its stat signature changing: remembered, but read again next time."""


@dataclass(frozen=True, slots=True)
class Signals:
    """What the author said about the document in its YAML frontmatter."""

    title: str = ""
    description: str = ""
    tags: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScannedDoc:
    """One Markdown document found by the scan."""

    rel: str
    """KB-relative path with ``/`` separators."""
    theme: str | None
    """First path segment, or ``None`` for a document directly under the KB."""
    excerpt: str
    signals: Signals
    headings: tuple[str, ...]
    sha256: str
    chars: int

    @property
    def path_in_theme(self) -> str:
        """The path as an index entry names it: relative to its theme folder (a bare name at the root)."""
        return self.rel if self.theme is None else self.rel[len(self.theme) + 1 :]

    @property
    def title_hint(self) -> str:
        """The best title the document itself offers: frontmatter, first heading, or file name."""
        return self.own_title or Path(self.rel).stem

    @property
    def own_title(self) -> str:
        """The title the document gives itself (:func:`own_title`)."""
        return own_title(self.signals.title, self.headings)


def own_title(frontmatter_title: str, headings: Sequence[str]) -> str:
    """The title a document gives itself, the one a reader sees: its frontmatter ``title``, else its first heading;
    empty when it has neither (a file name is no title a person types: two ``index.md``)."""
    return frontmatter_title or (headings[0] if headings else "")


@dataclass(frozen=True, slots=True)
class Scan:
    """The documents of a KB, grouped as the index is: root documents and first-level themes."""

    kb: Path
    root_docs: tuple[ScannedDoc, ...]
    themes: Mapping[str, tuple[ScannedDoc, ...]]
    skipped: tuple[Skipped, ...] = ()
    warnings: tuple[Skipped, ...] = ()
    excerpt_chars: int = DEFAULT_EXCERPT_CHARS
    stand_ins: set[str] = field(default_factory=set)
    """Documents :meth:`read_text` answered with the scan's excerpt (changed or unreadable since): what is made
    of that text must not be kept under the document's scanned digest."""
    memory: _Memory | None = field(default=None, repr=False, compare=False)

    def remember(self, indexed: Callable[[str], bool] = lambda rel: True) -> None:
        """Write what this scan read to ``.kindex/scan.json`` (best effort), so that the next scan reads only what
        changed: a step calls it once it has written the KB's index, with ``indexed`` telling the documents whose
        entries it wrote from this scan. Of any other document, and of one :meth:`read_text` found changed since
        the scan, the read its entry was made from stays remembered: the next scan reads it again, and
        :meth:`changed` names it until a step indexes it."""
        if self.memory is not None:
            self.memory.settle(self.kb, indexed, self.stand_ins)
            self.memory.save(self.kb)

    def changed(self) -> tuple[str, ...]:
        """Documents whose text differs from what the step that last indexed them read (their entries may be out of
        date), as far as ``.kindex/scan.json`` tells: nothing without it (a first run, another kindex version,
        Windows)."""
        if self.memory is None:
            return ()
        rows, seen = self.memory.rows, self.memory.seen
        return tuple(rel for rel, row in seen.items() if (old := rows.get(rel)) is not None and old[5] != row[5])

    @property
    def unreadable(self) -> bool:
        """Whether a file or folder could not be read (permissions): the scan may miss documents that exist."""
        return any(x.reason.startswith((UNREADABLE_FOLDER, f"folder {UNREADABLE_FOLDER}")) for x in self.skipped)

    @property
    def documents(self) -> tuple[ScannedDoc, ...]:
        """Every scanned document, root first, then themes in name order."""
        out = list(self.root_docs)
        for name in sorted(self.themes):
            out.extend(self.themes[name])
        return tuple(out)

    def theme_docs(self, dir_name: str) -> tuple[ScannedDoc, ...]:
        """The documents of theme ``dir_name``; :class:`NotAThemeError` when it is not a theme of this scan."""
        docs = self.themes.get(dir_name)
        if docs is None and normalize_path(dir_name) in ("", "."):
            raise NotAThemeError(
                f"'{dir_name}' is the knowledge folder itself, not a theme: the documents directly under it are in "
                "the root index, which `kindex root` writes"
            )
        if docs is None:
            known = ", ".join(sorted(self.themes)) or "none"
            raise NotAThemeError(
                f"'{dir_name}' is not a theme of {self.kb}: a theme is a first-level folder holding Markdown "
                f"(themes here: {known})"
            )
        return docs

    def theme_doc(self, dir_name: str, path: str) -> ScannedDoc:
        """The document ``path`` (relative to the theme) of theme ``dir_name``, from the closed scan list."""
        docs = self.theme_docs(dir_name)
        doc = next((d for d in docs if d.path_in_theme == path), None)
        if doc is None:  # typed as NFC, named on disk as NFD (macOS), or the other way: the same name to a reader
            nfc = unicodedata.normalize("NFC", path)
            doc = next((d for d in docs if unicodedata.normalize("NFC", d.path_in_theme) == nfc), None)
        if doc is None:
            names = sorted(d.path_in_theme for d in docs)
            inner = path.removeprefix(f"{dir_name}/")
            if inner != path and inner in names:
                hint = f"drop the theme: '{inner}'"
            else:
                close = difflib.get_close_matches(path, names, n=3, cutoff=0.5) or names[:3]
                more = ", …" if len(names) > len(close) else ""
                hint = f"documents here: {', '.join(close)}{more}"
            raise PathNotInThemeError(
                f"'{path}' is not a scanned document of theme '{dir_name}': give its .md path relative to "
                f"'{dir_name}/' ({hint}); the entry of a document deleted or moved goes with a sub step on the "
                f"theme (`kindex sub KB {dir_name}`)"
            )
        return doc

    def read_text(self, doc: ScannedDoc) -> str:
        """The document's meaningful text (frontmatter and HTML comments dropped) as the scan saw it: read again
        from disk, or, when it changed, vanished or became unreadable since (an editor's save, a ``git
        checkout`` during a run), the excerpt the scan kept. One changed document must not end a run; the next
        run (or the watcher) indexes it as it is now."""
        try:
            text, digest = _decode(self.kb / doc.rel, self.kb)
        except (OSError, InvalidFileError):
            digest = ""
        if digest != doc.sha256:
            self.stand_ins.add(doc.rel)
            return doc.excerpt
        # The scan parsed the frontmatter already; the body is the same without parsing it again (YAML took a
        # third of an offline reindex when every read of a document parsed it).
        return clean_body(strip_frontmatter(text))


def kb_folder(kb: str | os.PathLike[str], holds: str = "your Markdown files") -> Path:
    """``kb`` resolved, or :class:`KBNotFoundError` saying to pass the folder that ``holds`` what is needed."""
    if not os.fspath(kb):  # Path("") is the working folder: `kindex reindex ""` indexed whatever that held
        raise KBNotFoundError(f"the knowledge folder's path is empty: pass the folder that holds {holds}")
    root = Path(kb)
    try:
        if not root.is_dir():
            what = (
                "is not a folder"
                if root.exists()
                else "is a symbolic link that leads nowhere (a loop, or a target gone)"
                if root.is_symlink()
                else "does not exist"
            )
            raise KBNotFoundError(f"knowledge folder '{kb}' {what}: pass the folder that holds {holds}")
        return root.resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        # A folder kindex may not enter, a name too long, a link loop (RuntimeError from pathlib), a NUL or an
        # unencodable character (ValueError), a working folder deleted under a relative path: a traceback, and a
        # 500 from the service, where every other path problem is named.
        raise KBNotFoundError(
            f"knowledge folder {os.fspath(kb)!r:.300} cannot be opened ({unopenable(exc)}): pass the folder that "
            f"holds {holds}"
        ) from None


@collector_paused()
def scan(
    kb: str | os.PathLike[str],
    *,
    excerpt_chars: int = DEFAULT_EXCERPT_CHARS,
    reuse: bool = True,
    read_again: str | None = None,
) -> Scan:
    """Walk ``kb`` and return its documents; unusable files are listed in ``skipped`` with their reason.

    Documents matching the KB's ``exclude`` globs (``[index] exclude`` in ``kindex.toml``, or ``KINDEX_EXCLUDE``)
    are left out, so every step, ``validate`` and retrieval see the same documents.

    A document whose size, modification and change times and inode are those of the last scan is taken from
    ``.kindex/scan.json`` instead of being read, unless ``reuse`` is false or ``read_again`` names it or its
    folder (KB-relative). A step writes what its scan read there (:meth:`Scan.remember`); a scan alone writes
    nothing.
    """
    root = kb_folder(kb)
    if root == Path(root.anchor):
        # Every file of the machine: hours of walking before anything is said. No one's Markdown lives there.
        raise UsageError(f"'{kb}' is the file system's root: pass the folder that holds your Markdown files")
    exclude = config.excluded(root)
    memory = _Memory.load(root, excerpt_chars, reuse)
    again = None if read_again is None else read_again.strip("/")
    compiled = Compiled(bounded=False)
    skipped: list[Skipped] = []
    warnings: list[Skipped] = []
    root_docs: list[ScannedDoc] = []
    themes: dict[str, list[ScannedDoc]] = {}

    def unreadable(folder: Path, exc: OSError) -> None:
        rel = _show(folder.relative_to(root).as_posix())
        why = f"folder {UNREADABLE_FOLDER}: {exc.strerror or exc}"
        skipped.append(
            Skipped(path=rel or ".", reason=why + (PATH_TOO_LONG if exc.errno == errno.ENAMETOOLONG else ""))
        )

    for here, depth, dirnames, filenames, links in walk(root, on_error=unreadable):
        rel_dir = here.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        kept_dirs = []
        for name in sorted(dirnames):
            if name.startswith("."):
                continue
            if not _utf8(name):
                skipped.append(Skipped(path=_show(rel_dir + name), reason="folder name is not valid UTF-8"))
            elif name in links:
                skipped.append(Skipped(path=rel_dir + name, reason="symlinked folder: not followed"))
            elif name == INDEX_FILE and depth <= 1:
                # Where kindex writes the root or a theme index: its documents could never get an entry.
                reason = f"a folder named {INDEX_FILE} stands where kindex writes an index: rename it"
                skipped.append(Skipped(path=_show(rel_dir + name), reason=reason))
            elif depth >= MAX_FOLDER_DEPTH:
                reason = f"folder nested deeper than {MAX_FOLDER_DEPTH} levels: not scanned"
                skipped.append(Skipped(path=_show(rel_dir + name), reason=reason))
            else:
                kept_dirs.append(name)
        dirnames[:] = kept_dirs
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            if not name.endswith(".md"):
                folded = name.casefold()
                if folded.endswith((".md", ".markdown")):
                    skipped.append(
                        Skipped(path=_show(rel_dir + name), reason="only *.md files are documents: rename it to .md")
                    )
                elif folded.endswith(".mdx"):  # a Docusaurus page: Markdown with JSX, which a reader may expect read
                    skipped.append(
                        Skipped(path=_show(rel_dir + name), reason="an MDX page: only *.md files are documents")
                    )
                continue
            if not _utf8(name):
                skipped.append(Skipped(path=_show(rel_dir + name), reason="file name is not valid UTF-8"))
                continue
            rel = rel_dir + name
            rule = any_match(exclude, [rel], compiled) if exclude else None
            if rule is not None:
                skipped.append(Skipped(path=rel, reason=f"excluded by the setting exclude ({rule})"))
                continue
            fresh = again is not None and (again in ("", rel) or rel.startswith(again + "/"))
            doc = _scan_file(root, rel, excerpt_chars, skipped, warnings, memory, trust=not fresh)
            if doc is None:
                continue
            if doc.theme is None:
                root_docs.append(doc)
            else:
                themes.setdefault(doc.theme, []).append(doc)
    return Scan(
        kb=root,
        root_docs=tuple(sorted(root_docs, key=lambda d: d.rel)),
        themes={k: tuple(sorted(v, key=lambda d: d.rel)) for k, v in sorted(themes.items())},
        skipped=tuple(skipped),
        warnings=tuple(warnings),
        excerpt_chars=excerpt_chars,
        memory=memory,
    )


def _scan_file(
    root: Path,
    rel: str,
    excerpt_chars: int,
    skipped: list[Skipped],
    warnings: list[Skipped],
    memory: _Memory,
    *,
    trust: bool,
) -> ScannedDoc | None:
    path = root / rel
    try:  # a folder listed but not entered (read without execute permission) lets no file in it be looked at
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            target = Path(os.path.realpath(path))
            if not target.is_relative_to(root):
                skipped.append(Skipped(path=rel, reason="symlink points outside the knowledge folder: not followed"))
                return None
            if _hidden(target.relative_to(root)):
                skipped.append(Skipped(path=rel, reason="symlink points to a hidden file or folder: not followed"))
                return None
            st = os.stat(path)
    except OSError as exc:
        skipped.append(Skipped(path=rel, reason=f"{UNREADABLE_FOLDER}: {exc.strerror or exc}"))
        return None
    if not stat.S_ISREG(st.st_mode):
        skipped.append(Skipped(path=rel, reason="not a regular file"))
        return None
    size = st.st_size
    if size > MAX_DOC_BYTES:
        skipped.append(
            Skipped(path=rel, reason=f"larger than {MAX_DOC_BYTES // (1024 * 1024)} MiB: not a document to index")
        )
        return None
    signature = _stat_signature(st)
    if trust and os.access(path, os.R_OK, effective_ids=os.access in os.supports_effective_ids):
        known = memory.get(rel, signature, excerpt_chars)
        if known is not None:
            doc, problem = known
            if problem:
                warnings.append(Skipped(path=rel, reason=problem))
            return doc
    try:
        text, digest = _decode(path, root)
    except InvalidFileError as exc:
        skipped.append(Skipped(path=rel, reason=exc.message))
        return None
    except OSError as exc:
        skipped.append(Skipped(path=rel, reason=f"{UNREADABLE_FOLDER}: {exc.strerror or exc}"))
        return None
    meta, body, problem = split_frontmatter(text, toml=True)
    signals, glob_problem = signals_from(meta)
    problem = "; ".join(p for p in (problem, glob_problem) if p) or None
    if problem:
        warnings.append(Skipped(path=rel, reason=problem))
    body = clean_body(body)
    if not body.strip() and not signals.title and not signals.description:
        skipped.append(Skipped(path=rel, reason="empty document: nothing to index"))
        return None
    theme = rel.split("/", 1)[0] if "/" in rel else None
    text = body.strip()
    doc = ScannedDoc(
        rel=rel,
        theme=theme,
        excerpt=text[:excerpt_chars],
        signals=signals,
        headings=headings_of(body),
        sha256=digest,
        chars=len(body),
    )
    memory.put(doc, signature, text[: memory.excerpt_chars], problem)
    return doc


class _Memory:
    """What the scans of a KB read, by document: ``.kindex/scan.json``.

    A row is trusted while the file's stat signature (modification and change times in ns, size, inode) is the one
    it was read under and the file may still be read: on a local POSIX file system the change time cannot be set
    back by any tool (``touch``, ``cp -p``, ``git checkout``), and an editor's save-by-rename changes the inode. A
    file changed within ``_RACY_NS`` of its read is read again next time; so is one a step found changed anyway
    (:meth:`forget`). Not used where the change time is no such thing (Windows: the creation time).

    The file is a cache anyone with write access to the KB could have replaced, tagged with the kindex version
    that wrote it (a release may read documents differently): a row a scan could not have made (wrong shape,
    values beyond the scan's bounds) discards it all, and a scan reads every document, as without it. Its rows hold
    the excerpts of documents, so it is written readable by its owner only. Steps write it (:meth:`Scan.remember`);
    commands that only read (``validate``, ``preview``, a service's checks) use it without writing.
    """

    def __init__(self, excerpt_chars: int, rows: dict[str, list[Any]], trusted: bool = True) -> None:
        self.excerpt_chars = excerpt_chars
        """The excerpt length of the rows: the longest any scan asked for, so a shorter one is cut from them."""
        self.rows = rows
        self.trusted = trusted
        """Whether rows may stand in for reads; untrusted ones only tell which documents changed since."""
        self.seen: dict[str, list[Any]] = {}
        self.changed = False

    @classmethod
    def load(cls, kb: Path, excerpt_chars: int, reuse: bool) -> _Memory:
        if os.name == "nt":
            return cls(excerpt_chars, {})
        try:
            obj = orjson.loads(read_regular(kb / STATE_DIR / SCAN_FILE, _MAX_SCAN_FILE_BYTES))
        except (OSError, ValueError, InvalidFileError):  # missing, unreadable, too large or not JSON: read all
            return cls(excerpt_chars, {})
        if type(obj) is not dict or obj.get("format") != _SCAN_FORMAT or obj.get("kindex") != __version__:
            return cls(excerpt_chars, {})
        length, rows = obj.get("excerpt_chars"), obj.get("docs")
        if type(length) is not int or type(rows) is not dict:
            return cls(excerpt_chars, {})
        if not all(_valid_row(row, length) for row in rows.values()):
            return cls(excerpt_chars, {})
        if not reuse or length < excerpt_chars:  # every document is read; the rows still tell what changed since
            # Rows kept from them may hold longer excerpts than this scan's: the length stays the longer one.
            return cls(max(length, excerpt_chars), rows, trusted=False)
        return cls(length, rows)

    def get(
        self, rel: str, signature: tuple[int, int, int, int], excerpt_chars: int
    ) -> tuple[ScannedDoc, str | None] | None:
        """The remembered document at ``rel`` if its file still has ``signature``, and its frontmatter problem."""
        row = self.rows.get(rel)
        if row is None or not self.trusted or row[4] or tuple(row[:4]) != signature:
            return None
        self.seen[rel] = row
        _, _, _, _, _, sha, excerpt, title, description, tags, paths, heads, chars, problem = row
        theme = rel.split("/", 1)[0] if "/" in rel else None
        signals = _signals(title, description, tags, paths) if title or description or tags or paths else Signals()
        doc = ScannedDoc(rel, theme, excerpt[:excerpt_chars], signals, tuple(heads), sha, chars)
        return doc, problem

    def put(self, doc: ScannedDoc, signature: tuple[int, int, int, int], excerpt: str, problem: str | None) -> None:
        """Remember ``doc``, just read from a file of ``signature``; ``excerpt``: its excerpt of the rows' length."""
        s = doc.signals
        racy = time.time_ns() - max(signature[0], signature[1]) < _RACY_NS
        row = [*signature, racy, doc.sha256, excerpt, s.title, s.description]
        row += [list(s.tags), list(s.paths), list(doc.headings), doc.chars, problem]
        self.changed = self.changed or self.rows.get(doc.rel) != row
        self.seen[doc.rel] = row

    def settle(self, kb: Path, indexed: Callable[[str], bool], stand_ins: Collection[str]) -> None:
        """Before :meth:`save`: of a document not ``indexed`` or found changed during the step (``stand_ins``), the
        row its entry was made from, when its text was another, replaces this scan's: the next scan reads it again
        (its file's times are others) and :meth:`Scan.changed` names it. A stand-in whose file still has the times
        of its row has a row that is wrong about its text (a damaged memory): dropped, so it is read again."""
        for rel, row in list(self.seen.items()):
            if indexed(rel) and rel not in stand_ins:
                continue
            old = self.rows.get(rel)
            if old is not None and old[5] != row[5]:
                self.seen[rel] = old
            elif rel in stand_ins and _signature(kb / rel) == tuple(row[:4]):
                del self.seen[rel]
                self.changed = True

    def save(self, kb: Path) -> None:
        """Write what this scan saw when it differs from what was remembered (best effort: a KB kindex may not
        write is read in full each time)."""
        if not (self.changed or self.seen.keys() != self.rows.keys()) or os.name == "nt":
            return
        meta = {"format": _SCAN_FORMAT, "kindex": __version__, "excerpt_chars": self.excerpt_chars}
        data = orjson.dumps({**meta, "docs": self.seen})
        if len(data) <= _MAX_SCAN_FILE_BYTES:
            with contextlib.suppress(KindexError, OSError):
                atomic_write(kb / STATE_DIR / SCAN_FILE, data, mode=0o600)
                self.rows, self.changed = dict(self.seen), False


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    """The stat signature of the file at ``path``, ``None`` when it cannot be stat-ed."""
    try:
        return _stat_signature(os.stat(path))
    except OSError:
        return None


def _stat_signature(st: os.stat_result) -> tuple[int, int, int, int]:
    """A file's stat signature as the memory keys its rows: modification and change times in ns, size, inode."""
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino


def _valid_row(row: object, excerpt_chars: int) -> bool:
    """Whether ``row`` is one a scan could have made: the types, and the scan's bounds (a document's at most
    ``MAX_DOC_BYTES``; signals are bounded again as they are read, through the scan's own cleaning)."""
    if not (
        type(row) is list
        and len(row) == 14
        and all(type(x) is int for x in row[:4])
        and type(row[4]) is bool
        and all(type(x) is str for x in row[5:9])
        and all(type(x) is list and all(type(y) is str for y in x) for x in row[9:12])
        and type(row[12]) is int
        and (row[13] is None or (type(row[13]) is str and len(row[13]) <= 500))
    ):
        return False
    heads: list[str] = row[11]
    return (
        _SHA256.fullmatch(row[5]) is not None
        and len(row[6]) <= excerpt_chars
        and 0 <= row[12] <= MAX_DOC_BYTES
        and sum(map(len, row[7:9])) + sum(map(len, row[9])) + sum(map(len, row[10])) <= MAX_DOC_BYTES
        and sum(map(len, heads)) <= MAX_DOC_BYTES
        and not any("\n" in h or "\r" in h for h in heads)
    )


def _decode(path: Path, kb: Path) -> tuple[str, str]:
    data = read_regular(path, MAX_DOC_BYTES, inside=kb)  # a link swapped in since the scan looked is not followed out
    if len(data) > MAX_DOC_BYTES:
        raise InvalidFileError(f"larger than {MAX_DOC_BYTES // (1024 * 1024)} MiB: not a document to index")
    return decode_document(data), hashlib.sha256(data).hexdigest()


MAX_FRONTMATTER_CHARS = 16 * 1024
"""A frontmatter block longer than this is not parsed: the longest of 3,361 real ones (the corpora, TiDB's docs,
the skills) is 1.2 KB, and YAML parsing costs about 12 s and 350 MB per MB of a flow list."""


def split_frontmatter(text: str, toml: bool = False) -> tuple[dict[str, Any], str, str | None]:
    """Split YAML frontmatter from the body: ``(meta, body, problem)``; a broken block is dropped and reported.
    ``toml``: a document's TOML frontmatter between ``+++`` lines (Hugo's) is read too (a skill's is YAML only).

    Bounded: a block over ``MAX_FRONTMATTER_CHARS`` is not parsed, and one using YAML aliases (``*name``) is
    refused: merge keys over aliases (``<<: [*m0, *m0]``) double the work with every line, and under 1 KB of them
    took minutes and gigabytes. No page's metadata needs them."""
    m = _FRONTMATTER.match(text)
    if m is None:
        t = _TOML_FRONTMATTER.match(text) if toml and text.startswith("+++") else None
        return ({}, text, None) if t is None else _toml_frontmatter(t.group(1), text[t.end() :])
    body = text[m.end() :]
    if len(m.group(1)) > MAX_FRONTMATTER_CHARS:
        return {}, body, f"frontmatter is longer than {MAX_FRONTMATTER_CHARS // 1024} KiB: ignored, the body is indexed"
    import yaml  # here, not at the top: the read path serves documents without parsing frontmatter (~20 ms)

    try:
        meta = _yaml(m.group(1))
        if meta is _ALIASED:
            return {}, body, "frontmatter uses YAML aliases (*name): ignored, the body is indexed"
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 2}" if where is not None else ""
        return {}, body, f"frontmatter is not valid YAML{line}: ignored, the body is indexed"
    except RecursionError:  # the pure-Python parser, on a block nested hundreds of levels deep
        return {}, body, DEEP_FRONTMATTER
    except (ValueError, TypeError, OverflowError):  # a tagged value PyYAML cannot build (!!int of 5,000 digits)
        return {}, body, "frontmatter holds a value that cannot be read: ignored, the body is indexed"
    if meta is None:
        return {}, body, None
    if not isinstance(meta, dict):
        return {}, body, "frontmatter is not a YAML mapping: ignored, the body is indexed"
    if _deeper_than(meta, MAX_FRONTMATTER_DEPTH):
        return {}, body, DEEP_FRONTMATTER
    return {str(k): v for k, v in meta.items()}, body, None


def _toml_frontmatter(block: str, body: str) -> tuple[dict[str, Any], str, str | None]:
    """A TOML frontmatter ``block`` parsed as :func:`split_frontmatter` parses YAML: bounded, a broken one reported."""
    if len(block) > MAX_FRONTMATTER_CHARS:
        return {}, body, f"frontmatter is longer than {MAX_FRONTMATTER_CHARS // 1024} KiB: ignored, the body is indexed"
    import tomllib  # here, not at the top: most KBs have no TOML frontmatter

    try:
        meta = tomllib.loads(block)
    except tomllib.TOMLDecodeError as exc:
        return {}, body, f"frontmatter is not valid TOML ({exc}): ignored, the body is indexed"
    except RecursionError:  # arrays nested hundreds of levels deep
        return {}, body, DEEP_FRONTMATTER
    if _deeper_than(meta, MAX_FRONTMATTER_DEPTH):
        return {}, body, DEEP_FRONTMATTER
    return meta, body, None


MAX_FRONTMATTER_DEPTH = 64
"""Nesting a frontmatter value may have: libyaml builds 8,000 levels where the pure-Python parser ran out of stack,
and whatever reads the values (a repr, a JSON encoder, a recursive cleaner) should not have to."""
DEEP_FRONTMATTER = "frontmatter is nested too deeply: ignored, the body is indexed"


def _deeper_than(value: object, limit: int) -> bool:
    """Whether lists and mappings nest more than ``limit`` levels below ``value`` (a walk with a stack, no
    recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


_ALIASED = object()


def _yaml(block: str) -> object:
    """``block`` parsed (``_ALIASED`` if it uses an alias), by libyaml where PyYAML has it (an eighth of the
    pure-Python parser's time, which was two thirds of a scan), else, or when libyaml refuses the block, by the
    pure-Python parser (which reads what libyaml does not: a ``"\\ud83d"`` escape costs that character, not the
    page's metadata). Its errors are the last parser's."""
    import yaml

    *first, last = _loaders()
    for loader in first:
        with contextlib.suppress(yaml.YAMLError):
            return _parsed(block, loader)
    return _parsed(block, last)


def _parsed(block: str, loader: type) -> object:
    import yaml

    # An alias is written with "*": only then are the block's events looked through (linear, and never expanded:
    # merge keys over aliases double the work with every line).
    if "*" in block and any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(block, Loader=loader)):
        return _ALIASED
    return yaml.load(block, Loader=loader)


@functools.cache
def _loaders() -> tuple[type, ...]:
    """PyYAML's safe loaders, libyaml's first where PyYAML has it, reading YAML 1.1's booleans, numbers and dates
    as the text written (``title: 2020-01-01`` and ``tags: [yes, no]`` were dropped as not text, ``title: 12:30``
    became 750, ``0755`` 493; a 5,000-digit number raised past Python's conversion limit); made once, on the first
    frontmatter."""
    import yaml

    as_text = {f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float", "timestamp")}
    resolvers = {
        first: [(tag, rx) for tag, rx in found if tag not in as_text]
        for first, found in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    bases = (yaml.CSafeLoader, yaml.SafeLoader) if yaml.__with_libyaml__ else (yaml.SafeLoader,)
    return tuple(type(f"Text{base.__name__}", (base,), {"yaml_implicit_resolvers": resolvers}) for base in bases)


def strip_frontmatter(text: str) -> str:
    """The text without its frontmatter block (not parsed: for serving a document, not for reading it)."""
    m = _FRONTMATTER.match(text) or (_TOML_FRONTMATTER.match(text) if text.startswith("+++") else None)
    return text if m is None else text[m.end() :]


def clean_body(body: str) -> str:
    """The body without HTML comments (licence headers and the like), ``<style>`` and ``<script>`` blocks outside
    code (a landing page's CSS spent a small budget before its first word), and long runs of blank lines."""
    body = _HTML_COMMENT.sub("", body)
    if may_hold_raw_blocks(body):  # most pages have none: no line pass for them
        body = "".join(line.text for line in outside_raw_blocks(lines(body)))
    return _BLANK_RUNS.sub("\n\n", body)


def signals_from(meta: Mapping[str, Any]) -> tuple[Signals, str | None]:
    """Frontmatter fields kindex uses: title, description/summary, tags/keywords, paths/globs; and what to warn of
    the globs (an author's glob dropped makes the page unconditional: shown for every message)."""

    def first(*names: str) -> Any:
        return next((meta[n] for n in names if meta.get(n) not in (None, "", [])), None)

    paths = first("paths", "globs")
    if isinstance(paths, str):
        paths = split_globs(paths)
    home = _home_page(meta)
    signals = _signals(
        first("title", "name") or home[0],
        first("description", "summary") or home[1],
        first("tags", "keywords") or home[2],
        paths,
    )
    written = [p for p in paths if isinstance(p, str) and p.strip()] if isinstance(paths, list) else []
    dropped = [p for p in written if normalize_path(p) not in signals.paths]
    if not dropped or len(signals.paths) >= GLOBS_MAX:  # the same glob twice, or past the bound on their number
        return signals, None
    unconditional = "; the page is shown for every message, as one without paths" if not signals.paths else ""
    return signals, (
        f"frontmatter paths: {len(dropped)} glob(s) cannot be used ({', '.join(repr(p[:80]) for p in dropped[:3])}; "
        f"at most two ** and eight * in all, 64 brace expansions, no .. segment): dropped{unconditional}"
    )


def _home_page(meta: Mapping[str, Any]) -> tuple[object, object, object]:
    """The title, description and tags a VitePress or VuePress home page writes only in its frontmatter's hero and
    features (``hero: {name, text, tagline}``, VuePress's ``heroText`` and ``tagline``, ``features: [{title}]``):
    such a page has no body, and was skipped as empty, its theme left without its landing page."""
    hero = meta.get("hero")
    hero = hero if isinstance(hero, dict) else {}
    name = hero.get("name") or hero.get("text") or meta.get("heroText")
    tagline = hero.get("tagline") or meta.get("tagline") or (hero.get("text") if hero.get("name") else None)
    features = meta.get("features")
    titles = [f.get("title") for f in features[:32] if isinstance(f, dict)] if isinstance(features, list) else []
    return name, tagline, [t for t in titles if isinstance(t, str)]


def _signals(title: object, description: object, tags: object, paths: object) -> Signals:
    """The signals of these frontmatter values, cleaned and bounded (the scan's one rule: the memory's rows too)."""
    return Signals(
        title=clean_text(title, 200),
        description=clean_text(description, 1000),
        tags=clean_tags(tags, limit=32),
        paths=clean_globs(paths),
    )


def headings_of(body: str) -> tuple[str, ...]:
    """Markdown ATX headings outside code fences, attribute suffixes removed."""
    return headings(body)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _show(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _hidden(rel: Path) -> bool:
    """Whether a KB-relative path passes through a name starting with "." (kindex's state, secrets, VCS data)."""
    return any(part.startswith(".") for part in rel.parts)


def servable(kb: Path, rel: str) -> bool:
    """Whether ``rel`` names a regular ``.md`` file inside ``kb`` that may be read at query time: never a FIFO or
    a device (they would block the reader), never a file outside the KB through a symlink or ``..``, never one
    larger than the scan takes."""
    if not rel.endswith(".md") or ".." in rel.split("/") or rel.startswith("/") or "\x00" in rel:
        return False
    try:
        real = Path(os.path.realpath(kb / rel))
        st = os.stat(real)
    except (OSError, ValueError):  # missing, a name too long, a loop of links
        return False
    return (
        real.is_relative_to(kb)
        and not _hidden(real.relative_to(kb))
        and stat.S_ISREG(st.st_mode)
        and st.st_size <= MAX_DOC_BYTES
    )


def document_text(kb: Path, rel: str) -> str | None:
    """A document's text as it is served (frontmatter and HTML comments dropped, not parsed), or ``None`` when it
    cannot be served (see :func:`servable`) or is no text (see :func:`decode_document`)."""
    got = document_start(kb, rel, None)
    return None if got is None else got[0]


def document_digest(kb: Path, rel: str) -> tuple[str, str, str] | None:
    """:func:`document_text`, the SHA-256 of the file's bytes (the scan's digest of it) and the title its frontmatter
    gives (parsed as the scan parses it; empty without one), from one read."""
    got = _served(kb, rel)
    if got is None:
        return None
    title = signals_from(split_frontmatter(got[2], toml=True)[0])[0].title if got[2].startswith(("---", "+++")) else ""
    return clean_body(got[1]).strip(), hashlib.sha256(got[0]).hexdigest(), title


_STUB_CHARS = 4096
"""A body shorter than this is looked at for anything to read once comments are dropped."""


def _served(kb: Path, rel: str) -> tuple[bytes, str, str] | None:
    """The bytes of a document that may be served, its text without frontmatter, and its whole text."""
    if not servable(kb, rel):
        return None
    try:
        # servable() looked by name; the read checks the file it opened (a symlink swapped in between is not read).
        data = read_regular(kb / rel, MAX_DOC_BYTES, inside=kb)
        text = decode_document(data)
    except (OSError, InvalidFileError):
        return None
    body = strip_frontmatter(text)
    # A page that is only its frontmatter (a title and a description, a stub) is served as written: search found it
    # by its entry, and context dropped it as unreadable, saying "run kindex reindex", which changed nothing.
    if len(body) < _STUB_CHARS and not clean_body(body).strip():
        front = text[: len(text) - len(body)]
        if any(c.isalnum() for c in front[:_STUB_CHARS]):  # an empty block ("---\n---") says nothing either
            return data, text, text
    return data, body, text


def document_start(kb: Path, rel: str, max_chars: int | None) -> tuple[str, bool] | None:
    """:func:`document_text` of the first ``max_chars`` characters of the body (to a line break), and whether
    more follows: what a request that hands over at most that much needs to clean, not a 5 MB page each time."""
    got = _served(kb, rel)
    if got is None:
        return None
    text = got[1]
    more = max_chars is not None and len(text) > max_chars
    if max_chars is not None and more:
        text = within(text, max_chars)
    return clean_body(text).strip(), more
