"""One writer per KB (SPEC §5), and one watch: OS file locks under ``<kb>/.kindex/``, with the holder named for
humans."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import orjson

from kindex.errors import BusyError, CancelledRun, InvalidFileError, StorageError
from kindex.files import read_regular
from kindex.store import STATE_DIR, atomic_write

LOCK_FILE = "write.lock"
HOLDER_FILE = "write.holder.json"
WATCH_LOCK_FILE = "watch.lock"
WATCH_HOLDER_FILE = "watch.holder.json"


_held = threading.local()


@dataclass(frozen=True, slots=True)
class HeldLock:
    """The writer lock a step holds: what it checks before each write (see :meth:`check`)."""

    path: Path
    identity: tuple[int, int]
    """(device, inode) of the lock file the lock was taken on."""

    def check(self) -> None:
        """Raise :class:`StorageError` when this is no longer the KB's lock: its file was deleted or replaced
        (``rm -rf KB/.kindex`` during a step), so another writer may be running beside this one, and a write now
        could undo what that one wrote."""
        try:
            st = os.stat(self.path)
            now: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            now = None
        if now != self.identity:
            raise StorageError(
                f"the writer lock {self.path} was {'deleted' if now is None else 'replaced'} while this step ran, so "
                "another writer may have run beside it: nothing more was written. Run the step again (and leave "
                f"{STATE_DIR}/ alone while kindex writes: deleting it is safe only when no step runs)"
            )


CANCEL_POLL_S = 0.2
"""How often a wait for the lock looks at its cancel event."""


@contextmanager
def write_lock(kb: Path, what: str, *, wait: float = 0.0, cancel: threading.Event | None = None) -> Iterator[HeldLock]:
    """Hold the KB's writer lock while the block runs; :class:`BusyError` naming the holder after ``wait`` s,
    :class:`CancelledRun` as soon as ``cancel`` is set while waiting (a watcher told to stop must not wait out
    another writer's step).

    The lock is the kernel's (released when the holder dies, even by SIGKILL), so no stale lock survives a crash.
    It is re-entrant within a thread: a step that runs other steps (a skill import indexing what it installed)
    keeps the one lock it took.
    """
    held: dict[Path, list[Any]] = _held.__dict__.setdefault("kbs", {})
    if kb in held:
        held[kb][0] += 1
        try:
            yield held[kb][1]
        finally:
            held[kb][0] -= 1
        return
    state = _state_folder(kb)
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
                    f"another kindex run is writing {kb} ({_holder(state, HOLDER_FILE)}); wait for it to finish, or "
                    "pass --wait SECONDS"
                ) from None
        except OSError as exc:  # a folder, a link loop or a device in place of the lock file
            raise _lock_error(kb, state / LOCK_FILE, exc, "writer lock") from None
    try:
        st = os.stat(state / LOCK_FILE)
        mine = HeldLock(state / LOCK_FILE, (st.st_dev, st.st_ino))
        held[kb] = [1, mine]
        _write_holder(state / HOLDER_FILE, what)
        yield mine
    finally:
        held.pop(kb, None)
        _drop_holder(state / HOLDER_FILE)
        lock.release()


class WatchLock:
    """A KB's watch lock, held from :func:`watch_lock` until :meth:`release` (from any thread)."""

    def __init__(self, lock: filelock.FileLock, holder: Path) -> None:
        self._lock = lock
        self._holder = holder

    def release(self) -> None:
        """Let another watch start; releasing twice does nothing."""
        if self._lock.is_locked:
            _drop_holder(self._holder)
            self._lock.release()


def watch_lock(kb: Path, what: str = "watch") -> WatchLock:
    """Take the KB's watch lock at once, or :class:`BusyError` naming the watch that holds it.

    Two watches of one folder (two terminals, a ``kindex watch`` beside the service watching the same agent) saw
    every change twice: the second waited for the first's writer lock in silence, then did each step again. Like
    the writer lock, it is the kernel's: a watch that dies holds nothing.
    """
    state = _state_folder(kb)
    lock = filelock.FileLock(str(state / WATCH_LOCK_FILE), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise BusyError(
            f"{kb} is watched already ({_holder(state, WATCH_HOLDER_FILE)}): that watch keeps its index current; "
            "stop it first to watch from here"
        ) from None
    except OSError as exc:
        raise _lock_error(kb, state / WATCH_LOCK_FILE, exc, "watch lock") from None
    try:
        _write_holder(state / WATCH_HOLDER_FILE, what)
    except BaseException:
        lock.release()
        raise
    return WatchLock(lock, state / WATCH_HOLDER_FILE)


def _state_folder(kb: Path) -> Path:
    """``<kb>/.kindex``, made when missing; :class:`StorageError` when it cannot be (read-only, a file, a link)."""
    state = kb / STATE_DIR
    if state.is_symlink():  # writing through it would put the caches, excerpts and tables outside the KB
        raise StorageError(
            f"{STATE_DIR} in {kb} is a symbolic link: kindex writes its state only into a folder of that name, never "
            "through a link (which could lead out of the knowledge folder); replace it with a folder (it holds only "
            "kindex's caches)"
        )
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in _NOT_WRITABLE:
            raise StorageError(_not_writable(kb, exc)) from None
        what_is = "a file, not kindex's state folder" if state.is_file() else f"not usable ({exc.strerror or exc})"
        raise StorageError(
            f"{STATE_DIR} in {kb} is {what_is}: remove or rename it (it holds only kindex's caches)"
        ) from None
    return state


def _lock_error(kb: Path, path: Path, exc: OSError, name: str) -> StorageError:
    """What an ``OSError`` taking a lock file means: a read-only folder, or something else in the file's place (a
    folder, a link loop, a device)."""
    if exc.errno in _NOT_WRITABLE:
        return StorageError(_not_writable(kb, exc))
    return StorageError(f"cannot take the {name} {path}: {exc.strerror or exc}: remove it and run again")


def _write_holder(path: Path, what: str) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "what": what,
        "since": time.time(),
        "process": _process(),
    }
    atomic_write(path, orjson.dumps(holder))


def _drop_holder(path: Path) -> None:
    """Remove this process's holder record. It goes before the lock: a run refused after this one ends must not be
    told of it (one refused between the next holder's lock and its record is told the holder is starting: see
    :func:`_holder`)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, InvalidFileError):
        if orjson.loads(read_regular(path, 64 * 1024))["pid"] == os.getpid():
            os.unlink(path)


_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _not_writable(kb: Path, exc: OSError) -> str:
    # Not "remove it": a read-only folder cannot be changed, and removing a lock file someone holds is what lets
    # two writers in (see check_held).
    return (
        f"cannot write in {kb / STATE_DIR} ({exc.strerror or exc}): indexing needs write access to the knowledge "
        "folder (answering questions does not); make it writable, or index a writable copy"
    )


def _holder(state: Path, name: str) -> str:
    try:
        info = orjson.loads(read_regular(state / name, 64 * 1024))
        since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        if info["host"] == socket.gethostname() and not _alive(int(info["pid"])):
            return "a run that is just starting"  # the record is an ended run's, not yet replaced
        process = info.get("process")
        if isinstance(process, str) and process and process != f"kindex {info['what']}":
            # A step of a server or a script (`kindex serve`'s reindex): "`kindex reindex`" sent a person looking
            # for a command line that was never typed.
            kind = "" if info["what"] == "watch" else " step"  # a watch is no step
            return f"a {info['what']}{kind} of `{process}`, pid {info['pid']} on {info['host']}, since {since}"
        return f"`kindex {info['what']}`, pid {info['pid']} on {info['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError, InvalidFileError):
        return "a run that is just starting" if not (state / name).exists() else "holder unknown"


def _process() -> str:
    """This process as a person would find it in ``ps``: the program's name and its first argument (``kindex serve``,
    ``worker.py``), printable characters only."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("kindex."):  # ``python -m kindex``
        program = "kindex"
    else:
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    shown = " ".join([program or "python", *sys.argv[1:2]])[:80]
    return "".join(c if c.isprintable() else "?" for c in shown)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process, or not a pid this system can test: assume it runs
    return True
