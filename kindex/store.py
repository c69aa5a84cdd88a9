"""Reading and writing index files and kindex's own state under ``<kb>/.kindex/``.

Index files are always replaced atomically (SPEC §3): a reader sees the old file or the new one. The answer cache
is :mod:`kindex.cache`.

Long because the one reader of index files comes with what every reader needs of it (telling kindex's files from a
user's, the KB above a theme, the theme rule of the services) and the state kept beside them (stand-ins, work
folders held open).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from kindex.errors import (
    IndexMissingError,
    InvalidFileError,
    KindexError,
    NotAThemeError,
    StorageError,
    ThemeFolderError,
)
from kindex.files import read_regular, regular_file
from kindex.records import BOM, INDEX_FILE, INDEX_VERSION, Index, clean_text, parse_index

STATE_DIR = ".kindex"
_MAX_PARENT_INDEX_BYTES = 16 * 2**20
"""A root index larger than this is no KB's (10,000 root documents' entries take about 3 MB): not parsed to tell
whether a folder below is one of its themes."""
STAND_INS_FILE = "stand_ins.json"
_STAND_INS_FORMAT = 1
_MAX_STAND_INS_BYTES = 16 * 2**20
_MAX_REASON_CHARS = 300
_MAX_MODEL_CHARS = 200


def atomic_write(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsync, rename, fsync the folder.

    The file keeps the mode it had; a new one gets the mode the umask allows (the kernel applies it to 0o666), so
    a chat backend running as another user can read what kindex writes, as it could read what was there before.
    ``mode``: this mode whatever the file had (a cache holding documents' text is its owner's only).
    """
    if path.is_dir():
        raise StorageError(
            f"{path.name} in {path.parent.name or path.parent} is a folder, not a file: remove or rename it"
        )
    try:
        _write_replace(path, data, mode)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(
            f"cannot write {path.name} in {path.parent.name or path.parent}: {exc.strerror or exc} "
            "(is the disk full or the folder read-only?); the previous file is unchanged"
        ) from None


def _write_replace(path: Path, data: bytes, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keep_mode = mode
    with contextlib.suppress(OSError):
        st = os.stat(path)
        # A regular file's mode, through a symlink too (a link to a 0600 file stays 0600); a device's (/dev/zero:
        # 0o666) would open the index to everyone.
        if mode is None and stat.S_ISREG(st.st_mode):
            keep_mode = stat.S_IMODE(st.st_mode)
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


def index_bytes(path: Path, kb: Path | None = None) -> bytes:
    """An index file's bytes, refusing what is not a regular file (a FIFO would block) or is absurdly large.

    The file is read only where it is, through no link: at ``path`` in its folder, and with ``kb`` (the KB that holds
    ``path``) through no link below ``kb`` either, which a theme's index needs (a theme folder swapped for a link to
    another agent's served that agent's titles and summaries, the first paragraphs of its documents).

    Raises ``FileNotFoundError`` (or ``NotADirectoryError``) when there is none, :class:`IndexMissingError` for a
    folder in its place, :class:`InvalidFileError` for a special file, an absurd size or a file reached through a
    link, another ``OSError`` when it cannot be read.
    """
    if path.is_dir():
        raise IndexMissingError(f"{path.name} is a folder, not an index: remove it")
    base = kb if kb is not None else path.parent
    exactly = os.path.join(os.path.realpath(base), path.relative_to(base))
    return read_regular(path, MAX_INDEX_BYTES, exactly=exactly)


_OWN_START = re.compile(rb'\{\s*"version"\s*:\s*1\b')
_AS_WRITTEN = re.compile(rb'\{\s*"version"\s*:\s*1\s*,\s*"themes"\s*:\s*\[')
"""How every index file kindex writes starts (its keys in this order): another tool's file starting so is not
likely, and the step reads the file again anyway; anything else is parsed to be told apart."""
_OWN_KEYS = {"version", "themes", "documents"}


def refuse_foreign(path: Path, label: str) -> None:
    """:class:`InvalidFileError` unless ``path`` may be replaced by a step: nothing there, a special file, or what
    kindex writes (``{"version": 1, …}``, ``{}``, an object of only ``themes``/``documents`` lists, a damaged
    file that starts as kindex's do, an empty one). Anything else is the user's (an OpenAPI document, a package
    manifest with its own "version", a site's search data, JSON with NaN or a BOM): replacing it would lose it."""
    if not regular_file(path):
        return  # none, a FIFO or a device (replaced), a folder (the write says so)
    if path.is_symlink() and not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(path.parent)):
        return  # a link out of the folder, never read as this KB's index: the write replaces the link, not its file
    try:
        data = index_bytes(path)
    except OSError:
        return  # unreadable: the write says so
    except InvalidFileError:
        data = None  # larger than any index kindex writes
    if data is not None and data.startswith(BOM):  # kindex's file saved again by an editor is still kindex's
        data = data[len(BOM) :]
    if data is not None and (not data.strip() or _AS_WRITTEN.match(data)):
        return  # empty, or as kindex writes it (whole or cut short): no parse of a 30 MB index on every step
    try:
        obj = orjson.loads(data or b"")
    except orjson.JSONDecodeError:
        if data is not None and _OWN_START.match(data):
            return  # kindex's own, damaged (cut short by a full disk, say)
        what = "larger than any kindex index" if data is None else "no JSON kindex reads"
    else:
        version = obj.get("version") if isinstance(obj, dict) else None
        if type(version) is int and version > INDEX_VERSION and obj.keys() <= _OWN_KEYS:
            raise InvalidFileError(
                f"{label} was written by a newer kindex (index version {version}; this one writes "
                f"{INDEX_VERSION}): upgrade kindex to index this folder, or move that file away to index it afresh"
            )
        # Only kindex's keys: an API tool's manifest may well start with `{"version": 1` too. Its lists make it
        # kindex's whatever a hand edit did to the version ("1", 1.0): "not a kindex index (an object with the keys
        # documents, themes, version)" refused the one fix the answers advised.
        lists = [obj[k] for k in ("themes", "documents") if k in obj] if isinstance(obj, dict) else []
        if (
            isinstance(obj, dict)
            and obj.keys() <= _OWN_KEYS
            and (version == 1 or (len(lists) > 0 and all(isinstance(v, list) for v in lists)) or not obj)
        ):
            return
        what = f"an object with the keys {', '.join(sorted(obj)[:5])}" if isinstance(obj, dict) else "no object"
    raise InvalidFileError(
        f"{label} holds a file that is not a kindex index ({what}): kindex writes its index there; move that "
        "file away and run again"
    )


def refusal(path: Path, label: str) -> str | None:
    """Why a step would refuse to replace the index file at ``path`` (:func:`refuse_foreign`: another tool's, or a
    newer kindex's), which says what to do instead; ``None`` when a step replaces it. Answers and ``validate`` tell
    which, so that they never advise a step that will refuse."""
    try:
        refuse_foreign(path, label)
    except InvalidFileError as exc:
        return exc.message
    return None


def read_index_file(path: Path, kb: Path | None = None) -> tuple[Index, list[str]]:
    """The one reader of index files: the index at ``path`` (read leniently) and what in it made no sense. ``kb``:
    the KB holding ``path``, for a theme's index (:func:`index_bytes`).

    Raises ``OSError`` as :func:`index_bytes` does, and :class:`InvalidFileError` when the file holds no JSON
    object; each caller decides what that means for it (start afresh, report it, answer 409).
    """
    index, problems, _ = read_index_digest(path, kb)
    return index, problems


def read_index_digest(path: Path, kb: Path | None = None) -> tuple[Index, list[str], str]:
    """:func:`read_index_file`, and the digest of the bytes read (:func:`index_digest` of the same bytes)."""
    data = index_bytes(path, kb)
    return (*parse_index(data), _digest(data))


def index_digest(path: Path, kb: Path | None = None) -> str:
    """A digest of the index file's bytes: what search tables built from it were built from, however its times
    changed since (a copy, a checkout, a restore); empty when it cannot be read."""
    try:
        return _digest(index_bytes(path, kb))
    except (OSError, KindexError):
        return ""


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


_LISTS_THEMES = re.compile(_AS_WRITTEN.pattern + rb"\s*\{")
"""The start of a root index that lists themes, as kindex writes it: a theme index lists none."""


def refuse_knowledge_folders(kb: Path, themes: Iterable[str]) -> None:
    """:class:`ThemeFolderError` when a folder of ``kb`` that would be indexed as a theme is a knowledge folder of
    its own (it holds kindex's state folder, or a root index listing themes): indexing a folder of agents' KBs
    (a server's ``--kb-root``) replaced every agent's root index with a theme index, and reported success. A stat
    and the first bytes of one file per theme."""
    for name in themes:
        folder = kb / name
        if (folder / STATE_DIR).is_dir():
            holds = f"its own {STATE_DIR}/ folder"
        else:
            start = b""
            if regular_file(folder / INDEX_FILE):  # never opened otherwise: a FIFO there would block
                with contextlib.suppress(OSError), open(folder / INDEX_FILE, "rb") as fh:
                    start = fh.read(256)
            if not _LISTS_THEMES.match(start):
                continue
            holds = f"a root {INDEX_FILE} listing themes"
        raise ThemeFolderError(
            f"'{name}' is a knowledge folder of its own (it holds {holds}), not a theme of '{kb.name}': indexing "
            f"'{kb.name}' would replace its root index with a theme index. Index '{name}' on its own (a folder that "
            f"holds one knowledge folder per agent is the service's --kb-root, not a knowledge folder); if '{name}' "
            f"is a theme of '{kb.name}' after all, remove {holds.removeprefix('its own ')} from it"
        )


@contextlib.contextmanager
def state_folder(kb: Path, name: str) -> Iterator[Path]:
    """``KB/.kindex/<name>``, made when missing and held open while the caller works in it: the path given leads to
    the folder opened (through ``/proc/self/fd`` where there is one), so a link swapped in for it, or for
    ``.kindex``, meanwhile leads nowhere else. :class:`StorageError` when something else is there: a link there led a
    skill import's clean-up and unpacking, its backups and the trash into another agent's folder (deleting folders
    there, planting a package in it)."""
    nofollow = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        state = os.open(kb / STATE_DIR, nofollow)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=state)
            fd = os.open(name, nofollow, dir_fd=state)
        finally:
            os.close(state)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StorageError(
                f"{STATE_DIR}/{name} in the knowledge folder is not a folder (a symbolic link or a file): kindex keeps "
                "its own work there; remove it and run again"
            ) from None
        raise StorageError(f"{STATE_DIR}/{name} cannot be made: {exc.strerror or exc}") from None
    try:
        held = Path(f"/proc/self/fd/{fd}")
        yield held if held.is_dir() else kb / STATE_DIR / name  # elsewhere, the name (checked, not held)
    finally:
        os.close(fd)


def listed_theme_index(kb: Path, root: Index, dir_name: str) -> Path:
    """The index file of theme ``dir_name``, which ``root`` (the KB's root index) lists: the scan's rule for a
    theme, without a scan (a whole KB read per request): a folder directly in the KB, not hidden, not a symlink. A
    hand-edited root index listing "..", "a/b" or a link leads nowhere else (a link to another agent's folder served
    its index). :class:`NotAThemeError` otherwise."""
    folder = kb / dir_name
    if (
        dir_name not in {t.dir for t in root.themes}
        or dir_name.startswith(".")
        or folder.parent != kb
        or folder.is_symlink()
        or not folder.is_dir()
    ):
        raise NotAThemeError(f"{dir_name!r} is not a theme of this KB's index")
    return folder / INDEX_FILE


def refuse_theme_folder(kb: Path, *, reading: bool = False) -> None:
    """:class:`ThemeFolderError` when the root index of the folder above ``kb`` lists ``kb`` as one of its themes:
    ``kindex reindex KB/billing`` would otherwise write a root index over ``billing/index.json`` (its theme index)
    and index ``billing``'s subfolders as themes of their own, which breaks the KB above it without a word.
    ``reading``: the folder is to be searched or checked, not indexed (its theme index would pass for a root index
    without search tables, and its paths would lack the theme)."""
    parent = kb.parent
    if parent == kb or not regular_file(parent / INDEX_FILE):
        return
    # Every search of a KB looks here: the bytes are searched for the name before anything is parsed, a parent
    # index larger than any root index is not parsed, and only kindex's own form counts (another tool's
    # index.json listing "themes" is no KB above).
    try:
        data = read_regular(parent / INDEX_FILE, _MAX_PARENT_INDEX_BYTES)
    except (OSError, KindexError):
        return  # not an index kindex can read: nothing of it to break
    try:
        name = orjson.dumps(kb.name)
    except orjson.JSONEncodeError:  # a folder name that is not UTF-8: no index kindex writes can list it
        return
    if len(data) > _MAX_PARENT_INDEX_BYTES or name not in data:
        return
    try:
        above = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    themes = above.get("themes") if isinstance(above, dict) and above.get("version") == 1 else None
    if isinstance(themes, list) and any(isinstance(t, dict) and t.get("dir") == kb.name for t in themes):
        # Names, not paths, as every core message: this one reaches an HTTP service's tenants too. And no quoted
        # command, which the service rewords as this agent's route: the folder meant is not an agent.
        if reading:
            raise ThemeFolderError(
                f"'{kb.name}' is a theme of the knowledge folder above it, '{parent.name}' (its {INDEX_FILE} lists "
                f"it): pass '{parent.name}', whose index and search tables cover this theme's documents"
            )
        raise ThemeFolderError(
            f"'{kb.name}' is a theme of the knowledge folder above it, '{parent.name}' (its {INDEX_FILE} lists it), "
            f"and indexing it on its own would replace its theme index: index '{parent.name}' instead (kindex "
            f"reindex), or only this theme of it (kindex sub '{parent.name}' '{kb.name}')"
        )


def read_index(path: Path, kb: Path | None = None) -> Index | None:
    """The index at ``path``, or ``None`` when there is none or it cannot be read as an index."""
    try:
        index, _ = read_index_file(path, kb)
    except (OSError, InvalidFileError, IndexMissingError):
        return None
    return index


def write_index(path: Path, index: Index) -> bool:
    """Replace ``path`` with ``index`` unless it already holds exactly that; whether it was written.

    Leaving an identical file alone keeps its mtime, so long-lived readers keep their cached index.
    """
    data = index.to_json()
    try:
        if index_bytes(path) == data:
            return False
    except (OSError, InvalidFileError, IndexMissingError):
        pass  # none, or nothing kindex wrote (a FIFO, a device): replaced
    atomic_write(path, data)
    return True


@dataclass(frozen=True, slots=True)
class StandIn:
    """An entry a step wrote as a stand-in: why its model call failed, and the model it asked ("" when unknown)."""

    reason: str
    model: str = ""


def read_stand_ins(kb: Path) -> dict[str, StandIn]:
    """The entries steps wrote as stand-ins because their model call failed, each with the call's error: by
    document (its path in the KB), and ``index.json`` for the root index's own call (its theme and root-document
    entries). What ``validate`` reports until a step writes them from an answer. Empty when there is none, and when
    ``.kindex/stand_ins.json`` is missing or damaged: it is bookkeeping, and losing it loses only that report."""
    path = kb / STATE_DIR / STAND_INS_FILE
    try:
        if path.is_symlink():  # kindex writes a file: a link may lead out of the KB
            return {}
        data = read_regular(path, _MAX_STAND_INS_BYTES)
        obj = orjson.loads(data) if len(data) <= _MAX_STAND_INS_BYTES else None
    except (OSError, ValueError, KindexError):
        return {}
    if type(obj) is not dict or type(obj.get("format")) is not int or obj["format"] != _STAND_INS_FORMAT:
        return {}
    entries, models = obj.get("entries"), obj.get("models", {})  # "models": added later, a file may lack it
    if type(entries) is not dict or type(models) is not dict:
        return {}
    # Checked as written (see note_stand_ins): anyone who may write the KB may have written this file.
    return {
        label: StandIn(
            clean_text(reason, _MAX_REASON_CHARS),
            clean_text(model, _MAX_MODEL_CHARS) if type(model := models.get(label)) is str else "",
        )
        for label, reason in entries.items()
        if type(reason) is str
    }


def note_stand_ins(kb: Path, settled: Callable[[str], bool], failed: Mapping[str, str], model: str = "") -> None:
    """Bring ``.kindex/stand_ins.json`` up to date after a step wrote an index file: every label that file's
    entries stand for (``settled``: a theme's documents, one document, the root) is forgotten, then those whose
    call failed this time (``failed``: label → error, asking ``model``) are remembered. Best effort, like the
    scan's memory: a KB kindex cannot write to keeps its index, without this report."""
    old = read_stand_ins(kb)
    new = {label: entry for label, entry in old.items() if not settled(label)}
    asked = clean_text(model, _MAX_MODEL_CHARS)
    new.update((label, StandIn(clean_text(reason, _MAX_REASON_CHARS), asked)) for label, reason in failed.items())
    if new == old:
        return
    path = kb / STATE_DIR / STAND_INS_FILE
    with contextlib.suppress(KindexError, OSError):
        if new:
            ordered = sorted(new.items())
            data = {
                "format": _STAND_INS_FORMAT,
                "entries": {label: e.reason for label, e in ordered},
                "models": {label: e.model for label, e in ordered if e.model},
            }
            # The errors may quote a model's answer, which may quote a document: its owner's only, as the cache is.
            atomic_write(path, orjson.dumps(data, option=orjson.OPT_INDENT_2), mode=0o600)
        else:
            path.unlink()
