"""The skill library service (SPEC §8): find, import, export, delete and sync the skills of an Agent Skills KB.

Search returns one best hit per skill. Packages move in and out as ZIP files, checked before anything touches the
KB, and a workspace can be synced with only what changed. What a skill is, and how one is read and checked, is
:mod:`kindex.skillmodel`.

Long because ZIP import (with its checks against hostile archives), export and sync are one service over the
same package rules.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
import shutil
import stat
import time
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from kindex import generate
from kindex.errors import (
    IndexMissingError,
    InvalidFileError,
    KindexError,
    NotFoundError,
    SkillError,
    StorageError,
    UsageError,
)
from kindex.files import read_regular
from kindex.lock import write_lock
from kindex.records import INDEX_FILE
from kindex.results import ImportResult, RunReport, SkillHit, SyncResult
from kindex.retrieve import Retriever
from kindex.scan import split_frontmatter
from kindex.skillmodel import (
    NAME,
    OVERVIEW_NAMES,
    SKILL_FILE,
    Problem,
    Skill,
    closure,
    holds_skill,
    library_folder,
    load_skills,
    package_files,
    read_skill,
)
from kindex.store import atomic_write, index_bytes, state_folder

MANIFEST = ".sync-manifest.json"
DEFAULT_MAX_ZIP_BYTES = 50 * 1024 * 1024
MAX_MANIFEST_BYTES = 16 * 2**20
"""A sync manifest lists names and 16-character versions: 10,000 skills take under 1 MB; a 10 GB one took 19 GB."""
DEFAULT_MAX_ZIP_FILES = 2000
MAX_ZIP_DEPTH = 32
"""Folders deep a package member may lie: deeper is no skill package (and would exhaust path limits)."""


# -- search -------------------------------------------------------------------------------------------------------


def level_of(uri: str) -> int:
    """0 for the skill itself (its entry, SKILL.md), 1 for a folder overview (README/index), 2 for other files."""
    parts = uri.split("/")
    if len(parts) == 1 or parts[1:] == [SKILL_FILE]:
        return 0
    return 1 if parts[-1].casefold() in OVERVIEW_NAMES else 2


def find_skills(
    retriever: Retriever,
    skills: Mapping[str, Skill],
    query: str,
    *,
    limit: int = 10,
    levels: Iterable[int] | None = None,
) -> list[SkillHit]:
    """The ``limit`` skills that best match ``query``, each once, with its single best entry.

    Every entry is scored (skill summaries, folder overviews, files); a ``levels`` filter applies before the
    grouping; skills are ordered by their best score (ties by uri). ``skills`` are the library's valid skills
    (:func:`kindex.skillmodel.load_skills`); :meth:`kindex.KnowledgeBase.find_skills` passes both for you.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise UsageError(f"limit must be a whole number of at least 1, got {limit!r}")
    wanted = set(levels) if isinstance(levels, Iterable) and not isinstance(levels, (str, bytes)) else None
    if levels is None:
        wanted = {0, 1, 2}
    elif wanted is None or not wanted <= {0, 1, 2} or any(isinstance(x, bool) for x in wanted):
        raise UsageError(f"levels must be a list of the levels 0, 1 and 2, got {levels!r}")
    by_folder = {s.folder: s for s in skills.values()}
    best: dict[str, SkillHit] = {}
    # The ranking is best first (ties by path), so a skill's first entry in it is its best hit; candidates are
    # drawn until `limit` distinct skills are found or the ranking is exhausted.
    for item in retriever.search(query, limit=None, themes=True, explain=False):
        folder = item.path.split("/", 1)[0]
        skill = by_folder.get(folder)
        level = level_of(item.path)
        if skill is None or level not in wanted or skill.name in best:
            continue
        best[skill.name] = SkillHit(
            name=skill.name,
            description=skill.shown_description,
            root_uri=f"{folder}/",
            skill_md_uri=f"{folder}/{SKILL_FILE}",
            uri=item.path if item.level != "theme" else f"{folder}/",
            level=level,
            score=item.score,
            abstract=item.abstract,
            **closure(skills, skill.name).as_fields(),
        )
        if len(best) >= limit:
            break
    return sorted(best.values(), key=lambda h: (-h.score, h.uri))


# -- ZIP import and export ----------------------------------------------------------------------------------------


def _zip_members(
    archive: zipfile.ZipFile, max_bytes: int, max_files: int
) -> tuple[list[tuple[zipfile.ZipInfo, str]], str]:
    """The archive's files (member, path inside the skill) and the skill folder prefix, after every check."""
    infos = [i for i in archive.infolist() if not i.is_dir()]
    if len(infos) > max_files:
        raise SkillError(f"archive: {len(infos)} files, more than the limit of {max_files}")
    declared = sum(i.file_size for i in infos)
    if declared > max_bytes:
        raise SkillError(f"archive: unpacks to {declared} bytes, more than the limit of {max_bytes}")
    seen: set[str] = set()
    names: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
    for info in infos:
        raw = info.filename
        mode = info.external_attr >> 16
        if "\x00" in raw or raw.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", raw):
            raise SkillError(f"archive: {raw!r} is an absolute path")
        path = PurePosixPath(raw.replace("\\", "/"))
        if ".." in path.parts:
            raise SkillError(f"archive: {raw!r} climbs out of the package (..)")
        if len(path.parts) > MAX_ZIP_DEPTH or any(len(part.encode()) > 255 for part in path.parts):
            raise SkillError(
                f"archive: {raw[:80]!r}… is nested deeper than {MAX_ZIP_DEPTH} folders or has a name over 255 bytes"
            )
        if stat.S_ISLNK(mode):
            raise SkillError(f"archive: {raw!r} is a symbolic link")
        kind = stat.S_IFMT(mode)  # many archivers store permission bits only: no type means a plain file
        if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
            raise SkillError(f"archive: {raw!r} is a device, pipe or socket, not a file")
        key = str(path).casefold()
        if key in seen:
            raise SkillError(f"archive: {raw!r} appears twice")
        seen.add(key)
        names.append((info, path))
    files = {str(p).casefold() for i, p in names if not i.is_dir()}
    for _, path in names:
        for parent in list(path.parents)[:-1]:
            if str(parent).casefold() in files:
                raise SkillError(f"archive: {str(parent)!r} is both a file and a folder")
    roots = [p for _, p in names if p.name == SKILL_FILE]
    top = [p for p in roots if len(p.parts) <= 2]
    if not top:
        raise SkillError(f"archive: no {SKILL_FILE} at its top or in its single top folder")
    prefix = str(top[0].parent) if len(top[0].parts) == 2 else ""
    members = []
    for info, path in names:
        if prefix and path.parts[0] != prefix:
            raise SkillError(f"archive: {info.filename!r} is outside the skill folder {prefix!r} (one skill per ZIP)")
        inner = PurePosixPath(*path.parts[1:]) if prefix else path
        if any(part.startswith(".") for part in inner.parts) or inner.name == INDEX_FILE:
            continue  # hidden files and index files are kindex's to write
        members.append((info, str(inner)))
    return members, prefix


def _check_entry_count(data: bytes, max_files: int) -> None:
    """Refuse an archive whose central directory lists more than twice ``max_files`` entries (folders are entries
    too; files are counted exactly once it is open), counted from its raw bytes: ``zipfile.ZipFile`` builds an
    object per entry before anyone can count them, and 20 MB of minimal entries is 380,000 of them (268 MB; 1.2 GB
    for 16 uploads at once). The directory is found exactly as ``zipfile`` finds it (its own end-record reader:
    a lookalike elsewhere must not send this count to another place than ``zipfile`` reads), then its headers are
    walked as ``zipfile`` walks them, whatever the end record's total claims."""
    z: Any = zipfile  # its private names, as ZipFile._RealGetContents uses them
    try:
        end = z._EndRecData(io.BytesIO(data))  # ZipFile's own first step
        if not end:
            return  # zipfile refuses it
        size, offset = end[z._ECD_SIZE], end[z._ECD_OFFSET]
        concat = end[z._ECD_LOCATION] - size - offset
        if end[z._ECD_SIGNATURE] == z.stringEndArchive64:
            concat -= z.sizeEndCentDir64 + z.sizeEndCentDir64Locator
    except (OSError, AttributeError, TypeError, IndexError):
        return  # zipfile refuses the archive itself, or this Python's zipfile reads differently: it counts
    at, stop, count, limit = offset + concat, offset + concat + size, 0, 2 * max_files
    while at >= 0 and at + 46 <= min(stop, len(data)) and data[at : at + 4] == b"PK\x01\x02":
        count += 1
        if count > limit:
            raise SkillError(f"archive: lists more than {limit} entries, for a limit of {max_files} files")
        lengths = (int.from_bytes(data[at + k : at + k + 2], "little") for k in (28, 30, 32))
        at += 46 + sum(lengths)


def _extract(
    archive: zipfile.ZipFile, members: Sequence[tuple[zipfile.ZipInfo, str]], dest: Path, max_bytes: int
) -> None:
    total = 0
    for info, inner in members:
        target = dest / inner
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(info) as src, target.open("wb") as out:
            while chunk := src.read(1 << 16):
                total += len(chunk)  # counted as written: a header that lies about sizes does not get past
                if total > max_bytes:
                    raise SkillError(f"archive: unpacks to more than the limit of {max_bytes} bytes")
                out.write(chunk)


_NAME_LINE = re.compile(r"name:[ \t]*(?:'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"#][^\n#]*)?[ \t]*(?:#.*)?$")


def _set_name(skill_md: Path, name: str) -> None:
    """Rewrite the ``name:`` line of ``SKILL.md``'s frontmatter, and only there: the body may hold a ``name:``
    line of its own (a YAML example). A name written any other way (a quoted key, a flow mapping, a folded
    scalar) is refused rather than guessed at: the result is checked by parsing it again."""
    with open(skill_md, encoding="utf-8", newline="") as fh:  # line endings as written: CRLF stays CRLF
        text = fh.read()
    lines = text.split("\n")
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() in ("---", "...")), 0)
    at = next((i for i in range(1, end) if _NAME_LINE.match(lines[i])), None) if lines[0].rstrip() == "---" else None
    if at is not None:
        lines[at] = f"name: {name}" + ("\r" if lines[at].endswith("\r") else "")
        new = "\n".join(lines)
        if split_frontmatter(new)[0].get("name") == name:
            with open(skill_md, "w", encoding="utf-8", newline="") as fh:
                fh.write(new)
            return
    raise SkillError(
        f"{SKILL_FILE}: cannot rename the skill to {name!r}: its frontmatter does not write the name as a plain "
        "`name: …` line; rename it in the archive, or import with replace"
    )


def import_skill(
    kb: str | os.PathLike[str],
    package: str | os.PathLike[str] | bytes,
    *,
    replace: bool = False,
    options: generate.Options | None = None,
    max_bytes: int = DEFAULT_MAX_ZIP_BYTES,
    max_files: int = DEFAULT_MAX_ZIP_FILES,
) -> ImportResult:
    """Install a one-skill ZIP into the library ``kb`` and index it.

    The archive is checked and unpacked into a temporary folder first; only a valid skill is moved into place. A
    name already taken becomes ``NAME-v2`` (``-v3`` …, its ``SKILL.md`` rewritten to match) unless ``replace``:
    then the old package is backed up, replaced and re-indexed, and restored with its index entries if anything
    fails.
    """
    root = Path(kb).resolve()
    root.mkdir(parents=True, exist_ok=True)
    opts = options or generate.Options()
    data = package if isinstance(package, bytes) else Path(package).read_bytes()
    _check_entry_count(data, max_files)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise SkillError("archive: not a ZIP file") from None
    with archive, write_lock(root, "skills import", wait=opts.wait), state_folder(root, "import") as work:
        members, _ = _zip_members(archive, max_bytes, max_files)
        _clear_debris(work)
        # Not mkdtemp: its 0700 stayed with the installed folder, which other users (a chat backend) could not
        # read; mkdir gives what the umask allows, as every other folder of the library has.
        staging = work / f"skill-{secrets.token_hex(8)}"
        staging.mkdir()
        try:
            try:
                _extract(archive, members, staging, max_bytes)
            except SkillError:
                raise
            except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError, EOFError, zlib.error) as exc:
                # Bad CRC, sizes that lie, encrypted members, unknown compression: the archive is damaged.
                raise SkillError(f"archive: cannot be unpacked ({exc})") from None
            problems: list[Problem] = []
            staged = _read_staged(staging, problems)
            if staged is None:
                raise SkillError("; ".join(str(p).replace(staging.name + "/", "") for p in problems))
            name, renamed_from = staged.name, None
            if not replace and _holds_same(root / name, staging):
                # The package again (a retry after an import killed while indexing, a script run twice): a second
                # copy as NAME-v2 helps no one; what the first left unindexed is indexed now.
                report = _reindex_skill(root, name, opts)
                return ImportResult(
                    name=name, replaced=False, renamed_from=None, files=len(members), report=report, same=True
                )
            if replace and (root / name).exists() and not holds_skill(root / name):
                raise SkillError(
                    f"'{name}' is a folder of ordinary documents, not a skill: replacing it is refused "
                    "(rename the skill, or move that folder first)"
                )
            if (root / name).exists() and not replace:
                version = 2
                while (root / f"{name}-v{version}").exists():
                    version += 1
                renamed_from, name = name, f"{name}-v{version}"
                _set_name(staging / SKILL_FILE, name)
            replaced = (root / name).exists()
            report = _install(root, staging, name, opts)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return ImportResult(name=name, replaced=replaced, renamed_from=renamed_from, files=len(members), report=report)


def _holds_same(folder: Path, staging: Path) -> bool:
    """Whether ``folder`` is a skill package with the very files of ``staging`` (:func:`skill_version`)."""
    return holds_skill(folder) and skill_version(folder) == skill_version(staging)


def _read_staged(staging: Path, problems: list[Problem]) -> Skill | None:
    """The unpacked skill, checked as if its folder were already named after it."""
    meta, _, _ = split_frontmatter((staging / SKILL_FILE).read_text(encoding="utf-8", errors="replace"))
    name = meta.get("name")
    return read_skill(staging, problems, folder_name=name if isinstance(name, str) and name else "(unnamed)")


def _clear_debris(work: Path) -> None:
    """Remove what imports killed before their clean-up left in ``work`` (the lock: none runs now)."""
    for entry in os.listdir(work):
        if entry.startswith("skill-"):
            shutil.rmtree(work / entry, ignore_errors=True)


def _install(root: Path, staging: Path, name: str, opts: generate.Options) -> RunReport:
    """Move ``staging`` into ``root/name`` and index it; on any failure put back what was there."""
    target = root / name
    try:  # the root index as it was, to put back on failure; what kindex did not write is not read (a FIFO)
        saved_root_index: bytes | None = index_bytes(root / INDEX_FILE)
    except FileNotFoundError:
        saved_root_index = None
    except (OSError, InvalidFileError, IndexMissingError) as exc:
        message = exc.message if isinstance(exc, KindexError) else exc.strerror or str(exc)
        raise SkillError(f"the library's {INDEX_FILE} cannot be kept ({message}): remove it and import again") from None
    with state_folder(root, "backup") as backups:
        backup_dir = backups / f"{name}-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
        had_old = target.exists()
        if had_old:
            os.replace(target, backup_dir)
        try:
            os.replace(staging, target)
            return _reindex_skill(root, name, opts)
        except BaseException as exc:
            shutil.rmtree(target, ignore_errors=True)
            if had_old:
                os.replace(backup_dir, target)  # its own index.json comes back with it
            if saved_root_index is not None:
                atomic_write(root / INDEX_FILE, saved_root_index)
            elif (root / INDEX_FILE).exists():
                (root / INDEX_FILE).unlink()
            if isinstance(exc, KindexError):
                raise SkillError(
                    f"installing {name!r} failed and the previous state was restored: {exc.message}"
                ) from exc
            raise
    # The replaced package stays in the backup folder (.kindex/backup/): a replace can be undone by hand.


def _reindex_skill(root: Path, name: str, opts: generate.Options) -> RunReport:
    report = generate.sub(root, name, opts)  # the KB lock is already this thread's: taking it again is free
    generate.root(root, opts)
    return report


def export_skill(kb: str | os.PathLike[str], name: str, out: str | os.PathLike[str] | None = None) -> bytes:
    """The skill ``name`` as a ZIP (``name/…``, index files and hidden files left out); written to ``out`` if given."""
    _check_name(name)
    folder = library_folder(kb) / name
    if not NAME.fullmatch(name) or not holds_skill(folder):
        raise NotFoundError(f"no skill named {name!r} in {kb}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, path in package_files(folder):
            info = zipfile.ZipInfo(f"{name}/{rel}", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    data = buf.getvalue()
    if out is not None:
        atomic_write(_written_outside(out, {"library": Path(kb)}), data)
    return data


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise UsageError(f"a skill's name is a string, got {type(name).__name__}")


def _written_outside(out: str | os.PathLike[str], folders: Mapping[str, str | os.PathLike[str] | None]) -> Path:
    """``out`` resolved, or :class:`SkillError` when it lies in one of ``folders`` (a library, a workspace): a ZIP
    written there replaced the file of that name (``-o lib/pdf-tools/SKILL.md``, ``--zip lib/index.json``)."""
    try:
        kind: int | None = os.stat(out).st_mode
    except OSError:
        kind = None
    if kind is not None and not stat.S_ISREG(kind):
        # A device, a pipe or standard output behind a link (``/dev/stdout``): a ZIP goes into a file of its own.
        raise SkillError(f"{out} is not a regular file: give the path of the ZIP file to write")
    target = Path(out).resolve()
    for what, folder in folders.items():
        if folder is not None and target.is_relative_to(Path(folder).resolve()):
            raise SkillError(f"{out} is inside the {what} {folder}: write the ZIP elsewhere")
    return target


def delete_skill(kb: str | os.PathLike[str], name: str, options: generate.Options | None = None) -> None:
    """Remove the skill ``name`` and its entries (the root index is rewritten without it)."""
    _check_name(name)
    root = Path(kb).resolve()
    folder = root / name
    if not NAME.fullmatch(name) or not holds_skill(folder):
        raise NotFoundError(f"no skill named {name!r} in {kb}")
    opts = options or generate.Options()
    with write_lock(root, "skills delete", wait=opts.wait), state_folder(root, "trash") as bin_:
        trash = bin_ / f"{name}-{os.getpid()}"
        os.replace(folder, trash)  # atomic: the skill is gone at once for readers
        generate.root(root, opts)
        shutil.rmtree(trash, ignore_errors=True)


# -- workspace sync -----------------------------------------------------------------------------------------------


def skill_version(folder: Path) -> str:
    """A content hash of the package: every file's relative path and bytes (index and hidden files excluded)."""
    digest = hashlib.sha256()
    for rel, path in package_files(folder):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _manifest_versions(manifest: object) -> dict[str, str]:
    """Skill name → version from a sync manifest; :class:`SkillError` when it is not shaped like one."""
    if manifest is None:
        return {}
    entries = manifest.get("skills", []) if isinstance(manifest, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("version"), str) for e in entries
    ):
        raise SkillError("the sync manifest is malformed: expected {'skills': [{'name', 'version'}, …]}")
    # A name no skill can have (``../victim``, ``/tmp/x``) is no skill of the library: not "removed" back to a client
    # that might delete what it names.
    return {e["name"]: e["version"] for e in entries if NAME.fullmatch(e["name"])}


def sync_skills(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str] | None,
    *,
    only: Sequence[str] = (),
    zip_out: str | os.PathLike[str] | None = None,
    previous: Mapping[str, Any] | None = None,
) -> SyncResult:
    """Copy the selected skills of library ``src`` into workspace ``dest`` (or into one ZIP), sending only changes.

    ``dest/.sync-manifest.json`` records ``syncedAt`` and each skill's ``name`` and ``version`` (content hash). The
    next sync copies only skills whose version changed, deletes skills no longer selected and lists them in
    ``removed``. Each skill is swapped in whole (copied beside, then renamed), and the manifest is written last,
    so an interrupted sync leaves the previous skills intact. With ``zip_out`` the changed skills and the manifest
    go into that ZIP instead (``previous`` is then the manifest the remote side holds).
    """
    skills, _ = load_skills(library_folder(src))  # a skill breaking the rules is not synced (validate says why)
    unknown = [n for n in only if n not in skills]
    if unknown:
        raise NotFoundError(f"no skill named {', '.join(map(repr, unknown))} in {src}")
    selected = sorted(only) if only else sorted(skills)
    src_root = Path(src).resolve()
    dest_root = Path(dest).resolve() if dest is not None else None
    if dest_root is not None and (dest_root.is_relative_to(src_root) or src_root.is_relative_to(dest_root)):
        # Swapping a skill in over itself deletes what sync does not copy (.git/, .env, its index.json).
        raise SkillError(f"the workspace {dest} is the library {src}, or inside it, or holds it: sync elsewhere")
    if previous is None and dest_root is not None and (dest_root / MANIFEST).exists():
        try:
            previous = orjson.loads(read_regular(dest_root / MANIFEST, MAX_MANIFEST_BYTES))  # bounded: its error says
        except (OSError, orjson.JSONDecodeError, KindexError) as exc:
            reason = exc.message if isinstance(exc, KindexError) else exc
            raise SkillError(
                f"{MANIFEST} in the destination is unreadable ({reason}): remove it to sync afresh"
            ) from None
    before = _manifest_versions(previous)
    versions = {name: skill_version(src_root / skills[name].folder) for name in selected}
    changed = [n for n in selected if before.get(n) != versions[n] or (dest_root and not (dest_root / n).is_dir())]
    removed = sorted(set(before) - set(selected))
    manifest = {
        "syncedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "skills": [{"name": n, "version": versions[n]} for n in selected],
        "removed": removed,
    }
    if zip_out is not None:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in changed:
                for rel, path in package_files(src_root / skills[name].folder):
                    archive.writestr(f"{name}/{rel}", path.read_bytes())
            archive.writestr(MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        atomic_write(_written_outside(zip_out, {"library": src_root, "workspace": dest_root}), buf.getvalue())
    if dest_root is not None:
        try:
            dest_root.mkdir(parents=True, exist_ok=True)
            for name in changed:
                _swap_in(src_root / skills[name].folder, dest_root, name)
            for name in removed:
                if NAME.fullmatch(name):
                    _remove(dest_root / name)
        except StorageError:
            raise
        except OSError as exc:  # DEST under a file, in /proc, a read-only disk: the manifest is left as it was
            where = f" ({exc.filename})" if exc.filename else ""
            raise StorageError(f"cannot sync into the workspace {dest}: {exc.strerror or exc}{where}") from None
        atomic_write(dest_root / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return SyncResult(
        synced=tuple(changed),
        unchanged=tuple(n for n in selected if n not in changed),
        removed=tuple(removed),
        manifest=manifest,
    )


def _swap_in(source: Path, dest_root: Path, name: str) -> None:
    fresh = dest_root / f".sync-new-{name}"
    old = dest_root / f".sync-old-{name}"
    shutil.rmtree(fresh, ignore_errors=True)
    for rel, path in package_files(source):
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, fresh / rel)
    target = dest_root / name
    if target.exists() or target.is_symlink():
        _remove(old)
        os.replace(target, old)
    os.replace(fresh, target)
    _remove(old)


def _remove(path: Path) -> None:
    """Remove a skill's folder from a workspace, or the link a person put in its place (only the link: the folder it
    leads to is theirs). A file of that name is theirs too: left."""
    if path.is_symlink():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
