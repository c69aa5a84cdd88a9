"""Reading what a knowledge folder holds, whatever it holds: a read that never blocks on a FIFO nor runs on past
a bound, a walk that never recurses, a file test that never raises. Documents, index files and skill packages
are read through these: the folder is the user's, and anything may be in it or replace it mid-run."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from kindex.errors import InvalidFileError

MAX_FOLDER_DEPTH = 32
"""Folders nested deeper below the KB are not scanned (said in ``skipped``): no documentation tree is that deep,
and a generated or hostile one (1,000 levels) must not exhaust the walk."""


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit + 1`` of them (the caller tells too large).

    A special file is never opened, and one swapped in between the look and the open is not read. Raises
    :class:`InvalidFileError` for a folder or a special file (a FIFO would block, ``/dev/zero`` never ends) or more
    than ``limit`` bytes, ``OSError`` when it cannot be read.
    """
    # Looked at before it is opened (opening a device can act: /dev/ptmx makes a terminal, a tape rewinds), and
    # again once open, without waiting for a FIFO's writer: what is read is what was checked.
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise InvalidFileError(f"{path.name} is not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidFileError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise InvalidFileError(f"{path.name} is larger than {limit // 2**20} MiB")
        with open(fd, "rb", closefd=False) as fh:
            return fh.read(limit + 1)
    finally:
        os.close(fd)


def walk(
    top: Path, max_depth: int = MAX_FOLDER_DEPTH, on_error: Callable[[Path, OSError], None] | None = None
) -> Iterator[tuple[Path, int, list[str], list[str], set[str]]]:
    """``os.walk(top, followlinks=False)`` top-down without recursion, as (folder, its depth below ``top``, its
    folder names, its file names, which of those folders are symlinks), never below ``max_depth``. Pruning the
    folder names in place prunes the walk, as with ``os.walk``; a symlinked folder is listed but not entered; a
    folder that cannot be listed is passed to ``on_error``. Python 3.11's ``os.walk`` recurses once per level, so a
    tree 1,000 folders deep raised ``RecursionError``."""
    stack = [(top, 0)]
    while stack:
        here, depth = stack.pop()
        dirnames: list[str] = []
        filenames: list[str] = []
        links: set[str] = set()
        try:
            with os.scandir(here) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir()
                        if is_dir and entry.is_symlink():
                            links.add(entry.name)
                    except OSError:
                        is_dir = False
                    (dirnames if is_dir else filenames).append(entry.name)
        except OSError as exc:
            if on_error is not None:
                on_error(here, exc)
            continue
        yield here, depth, dirnames, filenames, links
        if depth < max_depth:
            stack.extend((here / name, depth + 1) for name in reversed(dirnames) if name not in links)


def regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (through symlinks). ``False`` when it cannot be looked at: Python
    3.11's ``Path.is_file`` raises for a file in a folder without the permission to enter it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
