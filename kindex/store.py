"""Reading and writing index files and kindex's own state under ``<kb>/.kindex/``.

Index files are always replaced atomically (SPEC §3): a reader sees the old file or the new one. The document
cache is an append-only JSON-lines log, so every answer received is on disk the moment it arrives and a killed run
loses nothing it paid for; a torn last line is ignored on reading.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from kindex.errors import KBNotFoundError, StorageError
from kindex.model import INDEX_FILE, Index, parse_index

STATE_DIR = ".kindex"
CACHE_FILE = "cache.jsonl"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsync, rename, fsync the folder.

    The file keeps the mode it had; a new one gets the mode the umask allows (the kernel applies it to 0o666), so
    a chat backend running as another user can read what kindex writes, as it could read what was there before.
    """
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


def read_index(path: Path) -> Index | None:
    """The index at ``path``, or ``None`` when there is none or it cannot be read as an index."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        index, _ = parse_index(data)
    except ValueError:
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
    """Model answers already paid for, keyed by what determines them (content, model, prompt, settings)."""

    def __init__(self, kb: Path) -> None:
        self.path = kb / STATE_DIR / CACHE_FILE
        self._entries: dict[str, dict[str, Any]] = {}
        self._lines = 0
        self._fh: BinaryIO | None = None
        self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.splitlines():
            self._lines += 1
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line torn by a killed run
            if isinstance(rec, dict) and isinstance(rec.get("key"), str) and isinstance(rec.get("value"), dict):
                self._entries[rec["key"]] = rec["value"]

    def get(self, key: str) -> dict[str, Any] | None:
        return self._entries.get(key)

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        """Record an answer and append it to disk at once, so a crash right after loses nothing."""
        self._entries[key] = dict(value)
        if self._fh is None:
            try:
                # Only .kindex itself: creating its parents would recreate a KB deleted during the run.
                self.path.parent.mkdir(exist_ok=True)
                self._fh = self.path.open("ab")
            except FileNotFoundError:
                raise KBNotFoundError(
                    "the knowledge folder disappeared during the run: nothing more was written"
                ) from None
        # One write per record, flushed to the OS at once: a killed process loses at most the line it was writing.
        self._fh.write(orjson.dumps({"key": key, "value": value}) + b"\n")
        self._fh.flush()
        self._lines += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def compact(self, live: set[str]) -> None:
        """Rewrite the log with only the ``live`` keys, dropping superseded and orphaned answers."""
        self.close()
        kept = {k: v for k, v in self._entries.items() if k in live}
        if len(kept) == len(self._entries) and self._lines == len(kept):
            return
        body = b"".join(orjson.dumps({"key": k, "value": v}) + b"\n" for k, v in sorted(kept.items()))
        atomic_write(self.path, body)
        self._entries = kept
        self._lines = len(kept)
