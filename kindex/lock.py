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

from kindex.errors import BusyError, CancelledRun, InvalidFileError, StorageError
from kindex.files import read_regular
from kindex.store import STATE_DIR, atomic_write

LOCK_FILE = "write.lock"
HOLDER_FILE = "write.holder.json"


_held = threading.local()


CANCEL_POLL_S = 0.2
"""How often a wait for the lock looks at its cancel event."""


@contextmanager
def write_lock(kb: Path, what: str, *, wait: float = 0.0, cancel: threading.Event | None = None) -> Iterator[None]:
    """Hold the KB's writer lock while the block runs; :class:`BusyError` naming the holder after ``wait`` s,
    :class:`CancelledRun` as soon as ``cancel`` is set while waiting (a watcher told to stop must not wait out
    another writer's step).

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
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what_is = "a file, not kindex's state folder" if state.is_file() else f"not usable ({exc.strerror or exc})"
        raise StorageError(
            f"{STATE_DIR} in {kb} is {what_is}: remove or rename it (it holds only kindex's caches)"
        ) from None
    lock = filelock.FileLock(str(state / LOCK_FILE), thread_local=False)
    deadline = time.monotonic() + wait
    waited = False
    while True:
        if cancel is not None and cancel.is_set():
            # Cancelled during the scan before the lock, with no other writer: "waiting for another" was untrue.
            during = "while waiting for another writer" if waited else "before it started"
            raise CancelledRun(f"the run was cancelled {during}; nothing was written")
        try:
            lock.acquire(timeout=max(0.0, min(deadline - time.monotonic(), CANCEL_POLL_S if cancel else wait)))
            break
        except filelock.Timeout:
            waited = True
            if time.monotonic() >= deadline:
                raise BusyError(
                    f"another kindex run is writing {kb} ({_holder(state)}); wait for it to finish, or pass --wait "
                    "SECONDS"
                ) from None
        except OSError as exc:  # a folder, a link loop or a device in place of the lock file
            raise StorageError(
                f"cannot take the writer lock {state / LOCK_FILE}: {exc.strerror or exc}: remove it and run again"
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
        info = orjson.loads(read_regular(state / HOLDER_FILE, 64 * 1024))
        since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        return f"`kindex {info['what']}`, pid {info['pid']} on {info['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError, InvalidFileError):
        return "holder unknown"
