"""Reading and writing index files and kindex's own state under ``<kb>/.kindex/``.

Index files are always replaced atomically (SPEC §3): a reader sees the old file or the new one. The answer
cache is an SQLite database in WAL mode: every answer received is committed the moment it arrives, so a killed
run loses nothing it paid for, and no crash can tear a record.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from kindex.errors import IndexMissingError, InvalidFileError, KBNotFoundError, StorageError
from kindex.records import INDEX_FILE, Index, parse_index

STATE_DIR = ".kindex"
CACHE_FILE = "answers.sqlite"
LEGACY_CACHE_FILE = "cache.jsonl"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsync, rename, fsync the folder.

    The file keeps the mode it had; a new one gets the mode the umask allows (the kernel applies it to 0o666), so
    a chat backend running as another user can read what kindex writes, as it could read what was there before.
    """
    if path.is_dir():
        raise StorageError(
            f"{path.name} in {path.parent.name or path.parent} is a folder, not a file: remove or rename it"
        )
    try:
        _write_replace(path, data)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(
            f"cannot write {path.name} in {path.parent.name or path.parent}: {exc.strerror or exc} "
            "(is the disk full or the folder read-only?); the previous file is unchanged"
        ) from None


def _write_replace(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        keep_mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        keep_mode = None
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            if keep_mode is not None:
                os.fchmod(fh.fileno(), keep_mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def root_index_path(kb: Path) -> Path:
    return kb / INDEX_FILE


def theme_index_path(kb: Path, dir_name: str) -> Path:
    return kb / dir_name / INDEX_FILE


MAX_INDEX_BYTES = 64 * 1024 * 1024
"""An index file larger than this is no index kindex wrote (a 100,000-document theme is ~30 MB)."""


def index_bytes(path: Path) -> bytes:
    """An index file's bytes, refusing what is not a regular file (a FIFO would block) or is absurdly large.

    Raises ``FileNotFoundError`` (or ``NotADirectoryError``) when there is none, :class:`IndexMissingError` for a
    folder in its place, :class:`InvalidFileError` for a special file or an absurd size, another ``OSError``
    when it cannot be read.
    """
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IndexMissingError(f"{path.name} is a folder, not an index: remove it")
    if not stat.S_ISREG(st.st_mode):
        raise InvalidFileError(f"{path.name} is not a regular file")
    if st.st_size > MAX_INDEX_BYTES:
        raise InvalidFileError(f"{path.name} is larger than {MAX_INDEX_BYTES // 2**20} MiB")
    with open(path, "rb") as fh:
        return fh.read(MAX_INDEX_BYTES + 1)


def read_index_file(path: Path) -> tuple[Index, list[str]]:
    """The one reader of index files: the index at ``path`` (read leniently) and what in it made no sense.

    Raises ``OSError`` as :func:`index_bytes` does, and :class:`InvalidFileError` when the file holds no JSON
    object; each caller decides what that means for it (start afresh, report it, answer 409).
    """
    return parse_index(index_bytes(path))


def read_index(path: Path) -> Index | None:
    """The index at ``path``, or ``None`` when there is none or it cannot be read as an index."""
    try:
        index, _ = read_index_file(path)
    except (OSError, InvalidFileError, IndexMissingError):
        return None
    return index


def write_index(path: Path, index: Index) -> bool:
    """Replace ``path`` with ``index`` unless it already holds exactly that; whether it was written.

    Leaving an identical file alone keeps its mtime, so long-lived readers keep their cached index.
    """
    data = index.to_json()
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    atomic_write(path, data)
    return True


class Cache:
    """Model answers already paid for, keyed by what determines them (content, model, prompt, settings).

    An SQLite database in WAL mode under ``.kindex/``: each answer is committed the moment it arrives, so a killed
    run loses nothing it paid for, and a crash mid-write cannot tear a record (an append-only log could, and then
    lost the next answer too). Answers are labelled by document: a new answer for a document replaces its older
    ones, so ``doc`` and ``sub`` steps do not grow the cache without bound.
    """

    def __init__(self, kb: Path) -> None:
        self.path = kb / STATE_DIR / CACHE_FILE
        self._entries: dict[str, dict[str, Any]] = {}
        self._db: sqlite3.Connection | None = None
        if self.path.is_file():
            self._read()
        legacy = kb / STATE_DIR / LEGACY_CACHE_FILE
        if legacy.is_file():
            self._import_legacy(legacy)

    def _import_legacy(self, legacy: Path) -> None:
        """Answers from the JSON-lines log of earlier versions, moved in once: they were paid for."""
        try:
            lines = legacy.read_bytes().splitlines()
        except OSError:
            return
        for line in lines:
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line torn by a killed run
            if isinstance(rec, dict) and isinstance(rec.get("key"), str) and isinstance(rec.get("value"), dict):
                self.put(rec["key"], rec["value"])
        with contextlib.suppress(OSError):
            legacy.unlink()

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                # Only .kindex itself: creating its parents would recreate a KB deleted during the run.
                self.path.parent.mkdir(exist_ok=True)
            except FileNotFoundError:
                raise KBNotFoundError(
                    "the knowledge folder disappeared during the run: nothing more was written"
                ) from None
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, label TEXT, value BLOB NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS answers_label ON answers (label)")
            self._db = db
        return self._db

    def _read(self) -> None:
        try:
            rows = self._connect().execute("SELECT key, value FROM answers").fetchall()
        except sqlite3.DatabaseError:
            # A damaged cache is only money already spent: start a new one rather than fail the run.
            self.close()
            with contextlib.suppress(OSError):
                self.path.rename(self.path.with_suffix(".damaged"))
            return
        for key, value in rows:
            try:
                obj = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                self._entries[key] = obj

    def get(self, key: str) -> dict[str, Any] | None:
        return self._entries.get(key)

    def put(self, key: str, value: Mapping[str, Any], label: str = "") -> None:
        """Record an answer and commit it at once; older answers with the same non-empty ``label`` are dropped."""
        self._entries[key] = dict(value)
        db = self._connect()
        with db:  # one transaction: the new answer and the removal of the ones it supersedes
            db.execute("BEGIN IMMEDIATE")
            if label:
                db.execute("DELETE FROM answers WHERE label = ? AND key != ?", (label, key))
            db.execute(
                "INSERT OR REPLACE INTO answers (key, label, value) VALUES (?, ?, ?)", (key, label, orjson.dumps(value))
            )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def compact(self, live: set[str]) -> None:
        """Keep only the ``live`` keys, dropping superseded and orphaned answers."""
        dead = [k for k in self._entries if k not in live]
        if not dead:
            return
        db = self._connect()
        with db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("DELETE FROM answers WHERE key = ?", [(k,) for k in dead])
        for k in dead:
            del self._entries[k]
        self.close()
