"""One writer per KB (SPEC §5): an OS file lock under ``<kb>/.kindex/``, with the holder named for humans."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock
import orjson

from kindex.errors import BusyError
from kindex.store import STATE_DIR, atomic_write

LOCK_FILE = "write.lock"
HOLDER_FILE = "write.holder.json"


_held = threading.local()


@contextmanager
def write_lock(kb: Path, what: str, *, wait: float = 0.0) -> Iterator[None]:
    """Hold the KB's writer lock while the block runs; :class:`BusyError` naming the holder after ``wait`` s.

    The lock is the kernel's (released when the holder dies, even by SIGKILL), so no stale lock survives a crash.
    It is re-entrant within a thread: a step that runs other steps (a skill import indexing what it installed)
    keeps the one lock it took.
    """
    held: dict[Path, int] = _held.__dict__.setdefault("kbs", {})
    if held.get(kb):
        held[kb] += 1
        try:
            yield
        finally:
            held[kb] -= 1
        return
    state = kb / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(state / LOCK_FILE), thread_local=False)
    try:
        lock.acquire(timeout=wait)
    except filelock.Timeout:
        raise BusyError(
            f"another kindex run is writing {kb} ({_holder(state)}); wait for it to finish, or pass --wait SECONDS"
        ) from None
    held[kb] = 1
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": time.time()}
        atomic_write(state / HOLDER_FILE, orjson.dumps(holder))
        yield
    finally:
        held.pop(kb, None)
        lock.release()


def _holder(state: Path) -> str:
    try:
        info = orjson.loads((state / HOLDER_FILE).read_bytes())
        since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        return f"`kindex {info['what']}`, pid {info['pid']} on {info['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
