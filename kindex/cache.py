"""The answer cache: model answers already paid for, in an SQLite database under ``<kb>/.kindex/``.

Every answer received is committed the moment it arrives, so a killed run loses nothing it paid for, and no crash
can tear a record. Beside them, in a table of their own, the offline generator's entries: free, but deriving them
again for every unchanged document was most of a no-op offline reindex (67 s at 20,000 documents). Only generation
opens it: the read path never imports SQLite.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from kindex.errors import KBNotFoundError, KindexError, StorageError
from kindex.files import regular_file
from kindex.store import STATE_DIR

CACHE_FILE = "answers.sqlite"
LEGACY_CACHE_FILE = "cache.jsonl"


_LOW_SPACE = 1 << 20
"""Free bytes under which a failed cache operation is blamed on a full disk."""
_LOW_INODES = 16
"""Free inodes under which it is blamed on their end (SQLite's journal is one more file)."""


def _foreign(exc: sqlite3.DatabaseError) -> bool:
    """Whether the file is not an answer cache kindex can use (not a database, or one with other tables), as
    against a folder, a locked or a read-only database."""
    text = str(exc)
    return "not a database" in text or "no such column" in text or "malformed" in text


class Cache:
    """Model answers already paid for, keyed by what determines them (content, model, prompt, settings).

    An SQLite database in WAL mode under ``.kindex/``: each answer is committed the moment it arrives, so a killed
    run loses nothing it paid for, and a crash mid-write cannot tear a record (an append-only log could, and then
    lost the next answer too). Answers are labelled by document: a new answer for a document replaces its older
    ones, so ``doc`` and ``sub`` steps do not grow the cache without bound.

    The offline generator's entries are kept apart (:meth:`derived`), one a document: sharing the answers' labels,
    an offline run would have dropped the model answers it does not use.
    """

    def __init__(self, kb: Path) -> None:
        self.path = kb / STATE_DIR / CACHE_FILE
        self._entries: dict[str, dict[str, Any]] = {}
        self._db: sqlite3.Connection | None = None
        self._pending: dict[str, tuple[str, dict[str, Any]]] = {}
        self.set_aside: Path | None = None
        """Where a cache that could not be read (damaged, or another program's database) was moved: a run says so."""
        # SQLite fails on anything else there, or blocks on a FIFO (its journal too): said before the run pays for
        # a first answer it could not keep.
        for path in (self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm", "-journal"))):
            # A link is no file of this KB's either: SQLite wrote through it (another agent's cache, its answers
            # dropped by this KB's labels).
            if os.path.lexists(path) and (os.path.islink(path) or not regular_file(path)):
                raise StorageError(f"{path} is not a regular file: remove it (it holds only answers already paid for)")
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
            try:
                db = self._open()
            except sqlite3.DatabaseError as exc:
                if not _foreign(exc) or self.set_aside is not None:
                    # Unopenable: a folder in .kindex's place, a read-only disk.
                    raise StorageError(f"cannot open the answer cache {self.path}: {exc}{self._space()}") from None
                self._set_aside()  # another program's database, or not one at all: only money already spent
                db = self._open()
            self._db = db
        return self._db

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, label TEXT, value BLOB NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS answers_label ON answers (label)")
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _set_aside(self) -> None:
        self.close()
        self.set_aside = self.path.with_suffix(".damaged")
        with contextlib.suppress(OSError):
            self.path.rename(self.set_aside)

    def _read(self) -> None:
        try:
            rows = self._connect().execute("SELECT key, value FROM answers").fetchall()
        except (sqlite3.DatabaseError, StorageError) as exc:
            if isinstance(exc, StorageError) and self.set_aside is None:
                raise
            # A damaged cache is only money already spent: start a new one rather than fail the run.
            if self.set_aside is None:
                self._set_aside()
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

    def __len__(self) -> int:
        """How many answers are kept (only model answers are: the offline generator's cost nothing)."""
        return len(self._entries)

    def put(self, key: str, value: Mapping[str, Any], label: str = "") -> None:
        """Record an answer and commit it at once; older answers with the same non-empty ``label`` are dropped."""
        self._entries[key] = dict(value)
        db = self._connect()
        try:
            with db:  # one transaction: the new answer and the removal of the ones it supersedes
                db.execute("BEGIN IMMEDIATE")
                if label:
                    db.execute("DELETE FROM answers WHERE label = ? AND key != ?", (label, key))
                db.execute(
                    "INSERT OR REPLACE INTO answers (key, label, value) VALUES (?, ?, ?)",
                    (key, label, orjson.dumps(value)),
                )
        except sqlite3.OperationalError as exc:  # a full disk, a locked or read-only database: a storage problem
            raise StorageError(f"could not record a model answer in {self.path}: {exc}{self._space()}") from exc

    def derived(self, key: str, label: str) -> dict[str, Any] | None:
        """The offline entry kept for ``label`` if it was made from what ``key`` names, else ``None``.

        A memo, not money spent: any trouble reading it is a miss (the entry is derived again), and a KB with no
        cache file gets none made by looking."""
        if label in self._pending:
            held_key, value = self._pending[label]
            return dict(value) if held_key == key else None
        if self._db is None and not self.path.is_file():
            return None
        try:
            row = self._connect().execute("SELECT key, value FROM derived WHERE label = ?", (label,)).fetchone()
            obj = orjson.loads(row[1]) if row is not None and row[0] == key else None
        except (sqlite3.DatabaseError, KindexError, orjson.JSONDecodeError):
            return None
        return obj if isinstance(obj, dict) else None

    def keep_derived(self, key: str, label: str, value: Mapping[str, Any]) -> None:
        """Hold an offline entry until :meth:`flush`: written in one transaction then, not one commit each."""
        self._pending[label] = (key, dict(value))

    def flush(self, live: set[str] | None = None) -> None:
        """Write the offline entries held; ``live``: every label a whole offline run described, the others' rows
        (deleted documents) dropped. Best effort: an entry not kept is derived again next time, so a full disk or a
        locked database here must not fail a step whose index files are written."""
        pending, self._pending = self._pending, {}
        if not pending and live is None:
            return
        try:
            db = self._connect()
            with db:
                db.execute("BEGIN IMMEDIATE")
                # One row a document (its label): made here, not on opening, so that a cache written before this
                # table existed still opens on a read-only disk.
                db.execute(
                    "CREATE TABLE IF NOT EXISTS derived "
                    "(label TEXT PRIMARY KEY, key TEXT NOT NULL, value BLOB NOT NULL)"
                )
                db.executemany(
                    "INSERT OR REPLACE INTO derived (label, key, value) VALUES (?, ?, ?)",
                    [(label, key, orjson.dumps(value)) for label, (key, value) in pending.items()],
                )
                if live is not None:
                    gone = [(label,) for (label,) in db.execute("SELECT label FROM derived") if label not in live]
                    db.executemany("DELETE FROM derived WHERE label = ?", gone)
        except (sqlite3.DatabaseError, KindexError):  # a full disk, a KB removed meanwhile: the step says its own
            return

    def _space(self) -> str:
        """A hint when the disk, its inodes or this process's file descriptors have run out: SQLite then says only
        "disk I/O error" or "unable to open database file"."""
        try:
            os.close(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                return " (this process has run out of open files: raise its limit, `ulimit -n`, or lower --concurrency)"
        try:
            free = shutil.disk_usage(self.path.parent).free
            inodes = os.statvfs(self.path.parent) if hasattr(os, "statvfs") else None
        except OSError:
            return ""
        if free < _LOW_SPACE:
            return f" (the disk holding it has {free // 1024} KiB free: it is probably full)"
        if inodes is not None and inodes.f_files and inodes.f_favail < _LOW_INODES:
            return f" (the disk holding it has {inodes.f_favail} free inodes: no file can be made there)"
        return ""

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
