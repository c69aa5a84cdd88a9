"""Reading what a knowledge folder holds, whatever it holds: a read that never blocks on a FIFO nor runs on past
a bound, a walk that never recurses, a file test that never raises, a decoding that says why bytes are no text.
Documents, index files and skill packages are read through these: the folder is the user's, and anything may be
in it or replace it mid-run."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from kindex.errors import InvalidFileError

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None  # type: ignore[assignment]

MAX_FOLDER_DEPTH = 32
"""Folders nested deeper below the KB are not scanned (said in ``skipped``): no documentation tree is that deep,
and a generated or hostile one (1,000 levels) must not exhaust the walk."""


def read_regular(path: Path, limit: int, *, inside: Path | None = None, exactly: str | None = None) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit + 1`` of them (the caller tells too large).

    A special file is never opened, and one swapped in between the look and the open is not read. With ``inside``
    (a resolved folder), the file opened must be one that folder holds; with ``exactly`` (a resolved path), it must
    be that very file, reached through no link. Both are checked on the open file, where the kernel found it, so a
    link swapped in after the caller looked (to another tenant's file, to /etc/passwd), for the file or for a folder
    on its way, is not read. Raises :class:`InvalidFileError` for a folder or a special file (a FIFO would block,
    ``/dev/zero`` never ends), more than ``limit`` bytes or a file elsewhere, ``OSError`` when it cannot be read.
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
        if inside is not None or exactly is not None:
            where = _opened_path(fd, path, st)
            if (exactly is not None and where != exactly) or (inside is not None and not _holds(inside, where)):
                raise InvalidFileError(f"{path.name} leads outside the knowledge folder: not read")
        with open(fd, "rb", closefd=False) as fh:
            return fh.read(limit + 1)
    finally:
        os.close(fd)


def _holds(folder: Path, where: str | None) -> bool:
    return where is not None and Path(where).is_relative_to(folder)


def _opened_path(fd: int, path: Path, st: os.stat_result) -> str | None:
    """Where the file open on ``fd`` is, as the kernel resolved the open (Linux's /proc, macOS's F_GETPATH): no
    later look at the name can be raced. Elsewhere, where the name leads now if that is the file open (a swap
    between the open and this look shows as another file), else ``None``."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    getpath = getattr(fcntl, "F_GETPATH", None)  # macOS names the path of a descriptor
    if getpath is not None:
        with contextlib.suppress(OSError):
            raw = fcntl.fcntl(fd, getpath, bytes(1024))
            return os.fsdecode(raw.split(b"\0", 1)[0])
    real = os.path.realpath(path)
    return real if identity(real) == (st.st_dev, st.st_ino) else None


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


def identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """The device and inode ``path`` leads to (through symlinks), ``None`` when nothing is there: what tells a
    folder replaced under its name (a deploy's ``mv``, a symlink switched to a new release) from the same one."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_UTF32_BOMS = (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")


def _looks_utf16(head: bytes) -> bool:
    """Whether bytes holding NULs read as lines of UTF-16 text in either byte order: NULs are common (every ASCII
    character brings one), and a line break decodes where no NUL does. Any byte pair is some character, so the
    line break is what tells."""
    if head.count(0) * 20 < len(head):
        return False
    for order in ("utf-16-le", "utf-16-be"):
        text = head[: len(head) // 2 * 2].decode(order, errors="replace")
        if "\x00" not in text and "\n" in text:
            return True
    return False


def decode_document(data: bytes) -> str:
    """A document's text from its bytes: UTF-8 (a leading BOM dropped), or UTF-16 when it opens with that byte order
    mark (what Windows Notepad saves as "Unicode"), or UTF-32 with its mark. :class:`InvalidFileError` saying why
    it is no text."""
    # UTF-32's little-endian mark begins with UTF-16's: the longer one is looked for first.
    bom = data[:4] if data[:4] in _UTF32_BOMS else data[:2] if data[:2] in _UTF16_BOMS else b""
    encoding = "utf-32" if len(bom) == 4 else "utf-16" if bom else None
    if encoding is not None:
        try:
            text = data.decode(encoding)  # the mark says which byte order, and is dropped
        except UnicodeDecodeError as exc:
            raise InvalidFileError(
                f"content is not valid {encoding.upper()} (byte {exc.start}): save it as UTF-8"
            ) from None
        if "\x00" in text:
            raise InvalidFileError("contains NUL characters: not a text document")
        if b"\x00" not in data[len(bom) :]:
            # Every line break (and every ASCII character) of UTF-16 or UTF-32 text holds a NUL byte: bytes without
            # one are UTF-8 or another 8-bit text behind a stray mark, which would read as gibberish.
            raise InvalidFileError(f"content does not read as {encoding.upper()} text: save it as UTF-8")
        return text.lstrip("\ufeff")
    if b"\x00" in data:
        if _looks_utf16(data[:4096]):
            raise InvalidFileError("content looks like UTF-16 without a byte order mark: save it as UTF-8")
        raise InvalidFileError("contains NUL bytes: not a text document")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidFileError(f"content is not valid UTF-8 (byte {exc.start}): save it as UTF-8") from None
    return text.lstrip("\ufeff")  # a mark saved twice over (an editor's round trip) is no text either


def unopenable(exc: BaseException) -> str:
    """Why a path could not be opened, in words and without the path (an ``OSError`` carries the absolute one)."""
    if isinstance(exc, RuntimeError):
        return "a symbolic link loop"
    if isinstance(exc, ValueError):
        return "not a usable path: a NUL byte or a character the file system cannot encode"
    strerror = getattr(exc, "strerror", None)
    return strerror or type(exc).__name__
