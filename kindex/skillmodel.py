"""The skill model (SPEC §8): reading and checking Agent Skills folders, and skill dependency closures.

A skill is a first-level folder holding ``SKILL.md`` whose YAML frontmatter names it (``name``) and says what it is
for (``description``). Its theme entry is that frontmatter, verbatim. This module only reads: the library service
(:mod:`kindex.skills`) finds, imports, exports, deletes and syncs skills on top of generation and retrieval.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kindex.errors import InvalidFileError, NotFoundError, SkillError
from kindex.files import MAX_FOLDER_DEPTH, read_regular, regular_file, walk
from kindex.records import INDEX_FILE, THEME_TAGS_MAX, ThemeItem, clean_tags, clean_text
from kindex.results import Context, SkillClosure
from kindex.scan import MAX_DOC_BYTES, kb_folder, split_frontmatter

SKILL_FILE = "SKILL.md"
NAME = re.compile(r"^[a-z0-9-]{1,64}$")
DESCRIPTION_MAX = 1024
OVERVIEW_NAMES = ("readme.md", "index.md", "overview.md")


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill's frontmatter, as its author wrote it."""

    name: str
    description: str
    folder: str
    tags: tuple[str, ...] = ()
    allowed_tools: tuple[str, ...] = ()
    skill_dependencies: tuple[str, ...] = ()
    tool_dependencies: tuple[str, ...] = ()
    mcp_dependencies: tuple[str, ...] = ()

    @property
    def shown_description(self) -> str:
        """The description as a listing shows it: one line, without control characters (an ESC or a NUL in a
        SKILL.md reached `find --json` and the HTTP service as written)."""
        return clean_text(self.description, DESCRIPTION_MAX)

    def theme_item(self) -> ThemeItem:
        """The skill's theme entry: name and description verbatim (never the model's words)."""
        return ThemeItem(
            dir=self.folder,
            title=clean_text(self.name, 80),
            summary=self.shown_description,
            tags=clean_tags([*self.tags, *self.allowed_tools], limit=THEME_TAGS_MAX),
        )


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    rule: str

    def __str__(self) -> str:
        return f"{self.file}: {self.rule}"


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, list | tuple):
        return ()
    return tuple(str(v).strip() for v in value if isinstance(v, str | int) and str(v).strip())


def read_skill(folder: Path, problems: list[Problem] | None = None, *, folder_name: str | None = None) -> Skill | None:
    """The skill in ``folder``, or ``None`` (with the reasons appended to ``problems``) when it breaks a rule.

    ``folder_name`` is the name the folder will have (for a package still being unpacked elsewhere).
    """
    problems = [] if problems is None else problems
    folder_name = folder_name or folder.name
    rel = f"{folder_name}/{SKILL_FILE}"
    try:
        # Bounded, never a FIFO, and only the folder's own file, whatever was swapped in since it was listed.
        text = read_regular(folder / SKILL_FILE, MAX_DOC_BYTES, inside=Path(os.path.realpath(folder))).decode()
    except (OSError, UnicodeDecodeError, InvalidFileError) as exc:
        problems.append(Problem(rel, f"cannot be read as UTF-8 ({exc.__class__.__name__})"))
        return None
    meta, _, broken = split_frontmatter(text.removeprefix("\ufeff"))
    if broken is not None:  # a skill is its frontmatter: not "ignored, the body is indexed", as for a document
        broken = broken.split(": ignored,", 1)[0]
    if broken or not meta:
        problems.append(Problem(rel, broken or "has no YAML frontmatter (--- name: … description: … ---)"))
        return None
    before = len(problems)
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        problems.append(Problem(rel, "name must be 1 to 64 characters of a-z, 0-9 and -"))
    elif name != folder_name:
        problems.append(Problem(rel, f"name {name!r} must equal the folder name {folder_name!r}"))
    if not isinstance(description, str) or not 1 <= len(description.strip()) <= DESCRIPTION_MAX:
        problems.append(Problem(rel, f"description must be 1 to {DESCRIPTION_MAX} characters"))
    if len(problems) > before:
        return None
    raw_metadata = meta.get("metadata")
    metadata: Mapping[str, Any] = raw_metadata if isinstance(raw_metadata, Mapping) else {}
    assert isinstance(name, str) and isinstance(description, str)
    return Skill(
        name=name,
        description=description.strip(),
        folder=folder_name,
        tags=_strings(meta.get("tags") or metadata.get("tags")),
        allowed_tools=_strings(meta.get("allowed-tools") or meta.get("allowed_tools")),
        skill_dependencies=_strings(meta.get("skill_dependencies")),
        tool_dependencies=_strings(meta.get("tool_dependencies")),
        mcp_dependencies=_strings(meta.get("mcp_dependencies")),
    )


def holds_skill(folder: Path) -> bool:
    """Whether ``folder`` is a skill package: a folder (not a symlink: the scan does not follow it either, and export
    or sync must not hand out what it points to) holding a regular ``SKILL.md`` of its own (a ``SKILL.md`` linked
    out of it served the frontmatter of a file elsewhere, another agent's skill or any file, as this skill)."""
    if folder.is_symlink() or not folder.is_dir() or folder.name.startswith("."):
        return False
    path = folder / SKILL_FILE
    return regular_file(path) and (
        not path.is_symlink() or Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
    )


def skill_folders(kb: Path) -> list[Path]:
    """First-level folders of ``kb`` that are skill packages (:func:`holds_skill`)."""
    if not kb.is_dir():
        return []
    return sorted(p for p in kb.iterdir() if holds_skill(p))


def is_skill_library(kb: Path) -> bool:
    return bool(skill_folders(kb))


def library_folder(kb: str | os.PathLike[str]) -> Path:
    """``kb`` resolved when it is an Agent Skills library: :class:`kindex.KBNotFoundError` without the folder,
    :class:`kindex.NotFoundError` when no folder of it holds a ``SKILL.md``. `kindex skills validate` said "skills
    are valid" of a folder that does not exist, a file and a plain KB (a CI check passing on a wrong path), and a
    sync from a plain KB reported success."""
    root = kb_folder(kb, holds=f"your skills (a folder per skill, each holding a {SKILL_FILE})")
    if not is_skill_library(root):
        # (Without the path: the service's tenants never see where their folder is.)
        raise NotFoundError(f"this folder is not a skill library (no folder of it holds a {SKILL_FILE})")
    return root


def load_skills(kb: str | os.PathLike[str]) -> tuple[dict[str, Skill], list[Problem]]:
    """The valid skills of a library by name, and every rule broken (frontmatter and dependencies)."""
    return _load_skills(skill_folders(Path(kb).resolve()))


class SkillShelf:
    """One library's skills, read once and kept until a ``SKILL.md`` changes (one ``stat`` each per call).

    A :class:`kindex.KnowledgeBase` owns one, so searching a library does not re-read its skills.
    """

    def __init__(self, kb: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(kb))  # (Path.resolve raises on a link loop; the KB's checks say it)
        self._signature: tuple[Any, ...] | None = None
        self._loaded: tuple[dict[str, Skill], list[Problem]] = ({}, [])
        self._lock = threading.Lock()

    def load(self) -> tuple[dict[str, Skill], list[Problem]]:
        """Like :func:`load_skills`, from memory while no ``SKILL.md`` changed."""
        folders = skill_folders(self.root)
        signature = tuple(
            (f.name, (f / SKILL_FILE).stat().st_mtime_ns, (f / SKILL_FILE).stat().st_size) for f in folders
        )
        with self._lock:
            if signature != self._signature:
                self._loaded, self._signature = _load_skills(folders), signature
            skills, problems = self._loaded
        return dict(skills), list(problems)

    def attach(self, ctx: Context) -> Context:
        """``ctx`` naming, for each skill its documents belong to, what that skill needs (skills, tools, MCP)."""
        return ctx.model_copy(update={"skills": self.closures(i.path for i in ctx.items)}) if ctx.items else ctx

    def closures(self, paths: Iterable[str]) -> tuple[SkillClosure, ...]:
        """The skills the KB-relative ``paths`` belong to, in order, each with its dependency closure."""
        known, _ = self.load()
        by_folder = {s.folder: s for s in known.values()}
        out: list[SkillClosure] = []
        for folder in dict.fromkeys(p.split("/", 1)[0] for p in paths if "/" in p):
            skill = by_folder.get(folder)
            if skill is not None:
                out.append(SkillClosure(name=skill.name, **closure(known, skill.name).as_fields()))
        return tuple(out)


def _load_skills(folders: list[Path]) -> tuple[dict[str, Skill], list[Problem]]:
    problems: list[Problem] = []
    skills: dict[str, Skill] = {}
    for folder in folders:
        skill = read_skill(folder, problems)
        if skill is not None:
            skills[skill.name] = skill
    for skill in skills.values():
        rel = f"{skill.folder}/{SKILL_FILE}"
        for dep in skill.skill_dependencies:
            if dep == skill.name:
                problems.append(Problem(rel, "a skill cannot depend on itself"))
            elif dep not in skills:
                problems.append(Problem(rel, f"skill_dependencies names an unknown skill {dep!r}"))
    return skills, problems


def validate_skills(kb: str | os.PathLike[str]) -> list[Problem]:
    """Every Agent Skills rule the library breaks, with the file (see :func:`library_folder` for a folder that is
    none)."""
    return load_skills(library_folder(kb))[1]


@dataclass(frozen=True, slots=True)
class Closure:
    """What loading a skill brings: its dependencies (transitively, in order) and their tools and MCP servers."""

    skills: tuple[str, ...]
    tools: tuple[str, ...]
    mcp: tuple[str, ...]

    def as_fields(self) -> dict[str, tuple[str, ...]]:
        """The closure as the result records name it (``skill_dependencies``, ``tool_dependencies``, …)."""
        return {"skill_dependencies": self.skills, "tool_dependencies": self.tools, "mcp_dependencies": self.mcp}


def closure(skills: Mapping[str, Skill], name: str) -> Closure:
    """The dependency closure of ``name``: depth-first, de-duplicated, order-preserving, safe against cycles."""
    order: list[str] = []
    seen = {name}
    stack = list(reversed(skills[name].skill_dependencies)) if name in skills else []
    while stack:
        dep = stack.pop()
        if dep in seen or dep not in skills:
            continue
        seen.add(dep)
        order.append(dep)
        stack.extend(reversed(skills[dep].skill_dependencies))
    tools: list[str] = []
    mcp: list[str] = []
    for s in [name, *order]:
        if s in skills:
            tools += [t for t in skills[s].tool_dependencies if t not in tools]
            mcp += [m for m in skills[s].mcp_dependencies if m not in mcp]
    return Closure(tuple(order), tuple(tools), tuple(mcp))


def package_files(folder: Path) -> list[tuple[str, Path]]:
    """The files that make up a skill package, as (relative path, file), in a stable order.

    Index files and hidden files are kindex's own or the author's scratch; symbolic links are never followed.
    """
    if folder.is_symlink():
        return []
    out = []
    for here, depth, dirnames, filenames, _ in walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if dirnames and depth >= MAX_FOLDER_DEPTH:  # the walk goes no deeper: a package missing files is no package
            raise SkillError(f"{folder.name}: folders nested deeper than {MAX_FOLDER_DEPTH} levels cannot be packaged")
        for name in filenames:
            path = here / name
            if name.startswith(".") or name == INDEX_FILE or path.is_symlink() or not path.is_file():
                continue
            out.append((path.relative_to(folder).as_posix(), path))
    return sorted(out)
