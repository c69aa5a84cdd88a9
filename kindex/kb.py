"""The KB handle: one knowledge folder with its settings, its loaded tables, its skills and its write lock.

:class:`KnowledgeBase` is what an application keeps per KB: retrieval reuses the tables it loaded (and reloads them
when the index changes on disk), skill searches reuse the skills it read, and writers of one handle take turns.
Every method has an ``async`` twin (``acontext``, ``areindex``…) that runs the work on a worker thread, so it can be
awaited inside a running event loop without blocking it. The module-level functions (``kindex.build_context``,
``kindex.search``, ``kindex.find_skills``) are thin wrappers over a small, bounded set of handles.

Long because every operation of the handle has a sync method and an async twin, and :class:`Step` (a generation
step as a task names it) runs through those same methods.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from kindex import config, generate, skills
from kindex.errors import InvalidFileError, KBNotFoundError, NotFoundError, UsageError
from kindex.files import identity, regular_file, unopenable
from kindex.generate import Options
from kindex.llm import LLMClient, LLMSettings
from kindex.records import INDEX_FILE
from kindex.results import (
    Context,
    ContextItem,
    ImportResult,
    Plan,
    Preview,
    Ranking,
    RunReport,
    SkillHit,
    SyncResult,
)
from kindex.retrieve import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_FALLBACK_DOCS,
    DEFAULT_MAX_DOCS,
    DEFAULT_MIN_RELEVANCE,
    Retriever,
    check_context_options,
)
from kindex.skillmodel import Closure, Problem, Skill, SkillShelf, closure, is_skill_library, library_folder
from kindex.validate import validate

T = TypeVar("T")

AGENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""An agent id: its KB is ``<kb_root>/<agent_id>/`` for the HTTP service and the MCP server alike."""
MAX_HANDLES = 32
"""KBs whose tables the module-level functions keep loaded at once (least recently used ones are dropped)."""
MAX_LOADED_AGENTS = 64
"""Agents whose tables a service (HTTP or MCP over ``--kb-root``) keeps loaded at once; the least recently asked
are dropped and reloaded when asked. MCP kept 32, and at 50 active agents every call reloaded one (10 calls/s)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """How a KB is indexed (``generation``: model, concurrency…) and how its context is built by default."""

    generation: Options = field(default_factory=Options)
    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    max_docs: int = DEFAULT_MAX_DOCS
    fallback_docs: tuple[str, ...] = DEFAULT_FALLBACK_DOCS
    min_relevance: float = DEFAULT_MIN_RELEVANCE

    def __post_init__(self) -> None:
        self.check()  # Settings(budget_tokens=10) is refused where it is written, not at the first call

    def check(self) -> None:
        """:class:`kindex.UsageError` for a setting that cannot be meant."""
        if not isinstance(self.generation, Options):
            raise UsageError(f"generation must be kindex.Options, got {type(self.generation).__name__}")
        if not isinstance(self.fallback_docs, (tuple, list)) or not all(isinstance(x, str) for x in self.fallback_docs):
            raise UsageError(f"fallback_docs must be a list of strings, got {self.fallback_docs!r}"[:300])
        self.generation.check()
        check_context_options(self.budget_tokens, self.max_docs, self.min_relevance)

    @classmethod
    def resolved(
        cls,
        kb: str | os.PathLike[str] | None,
        flags: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        client: LLMClient | None = None,
    ) -> Settings:
        """The settings in force for ``kb``: ``flags`` > ``KINDEX_*`` environment > ``kb/kindex.toml`` > defaults
        (:func:`kindex.config.resolve`). ``client`` replaces the litellm adapter (``Options.client``)."""
        return cls._of(config.resolve(kb, flags, env), client)

    @classmethod
    def for_answers(
        cls, kb: str | os.PathLike[str], flags: Mapping[str, Any] | None = None, client: LLMClient | None = None
    ) -> tuple[Settings, str | None]:
        """The settings a question is answered with, and what was left out of them (a broken ``kindex.toml``, a
        ``KINDEX_*`` variable that does not parse), said instead of failing the answer."""
        eff = config.resolve(kb, flags, for_reading=True)
        return cls._of(eff, client), eff.problem

    @classmethod
    def _of(cls, eff: config.Effective, client: LLMClient | None) -> Settings:
        llm = LLMSettings.from_settings(eff)
        return cls(
            generation=Options(llm=llm, client=client, concurrency=eff["concurrency"]),
            budget_tokens=eff["budget_tokens"],
            max_docs=eff["max_docs"],
            fallback_docs=tuple(eff["fallback_docs"]),
            min_relevance=eff["min_relevance"],
        )


def _usable(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``path``, or :class:`KBNotFoundError` for one no file system can open (a NUL, a character it cannot encode):
    the ``ValueError`` of ``os.path`` was a traceback, and a 500 from a service."""
    try:
        usable = b"\0" not in os.fsencode(path)
    except ValueError:  # (UnicodeEncodeError) a lone surrogate the file system encoding cannot hold
        usable = False
    if not usable:
        raise KBNotFoundError(
            f"knowledge folder {os.fspath(path)!r:.300} cannot be opened ({unopenable(ValueError())})"
        )
    return path


class KnowledgeBase:
    """One knowledge folder: index it, build contexts from it, and (for a skill library) manage its skills."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        settings: Settings | None = None,
        *,
        flags: Mapping[str, Any] | None = None,
        client: LLMClient | None = None,
    ) -> None:
        """``settings`` as given, or (``None``) the KB's own: ``flags`` > environment > ``kindex.toml`` > defaults,
        read again whenever ``kindex.toml`` changes."""
        self._as_given = os.path.abspath(_usable(path))
        self._given = settings
        self._flags = dict(flags or {})
        self._client = client
        self._state = threading.Lock()
        self._writing = threading.Lock()
        """Writers of this handle take turns; other processes are kept out by the KB's file lock."""
        real = os.path.realpath(self._as_given)
        self._follows = real != self._as_given
        """Whether the path given passes a symlink, which may be switched; a folder replaced under its own name (a
        deploy's ``mv``) needs no rebinding: the tables and settings are stat-checked by path on every call."""
        self._bind(real)

    def _bind(self, real: str) -> None:
        """Hold the folder ``real`` and forget what was loaded from another one."""
        self._path = Path(real)
        self._identity = identity(real)
        self._settings: Settings | None = None
        self._config_stamp: tuple[int, int] | None = None
        self._config_file = os.path.join(real, config.CONFIG_FILE)  # a string: stat-ed on every call
        self._retriever: Retriever | None = None
        self._skills = SkillShelf(self._path)

    def _follow(self) -> None:
        """Rebind when the path the handle was given leads to another folder now: a symlink switched to a new
        release of the KB (``current -> releases/N``) is served from the new release, not the first one forever
        (and a release deleted under a dangling link is "gone", not "no index yet"). One ``stat`` a call: a
        ``realpath`` only when the folder's identity changed."""
        if not self._follows:
            return
        now = identity(self._as_given)
        if now != self._identity or now is None:
            real = os.path.realpath(self._as_given)
            with self._state:
                if real != str(self._path) or identity(real) != self._identity:
                    self._bind(real)

    @property
    def path(self) -> Path:
        """The knowledge folder (resolved: where the path given leads now)."""
        self._follow()
        return self._path

    def __repr__(self) -> str:
        return f"KnowledgeBase({str(self._path)!r})"

    @property
    def settings(self) -> Settings:
        """The settings in force (the KB's own ones are re-read when ``kindex.toml`` changes: one ``stat``)."""
        if self._given is not None:
            return self._given
        self._follow()
        try:
            st = os.stat(self._config_file)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        with self._state:
            if self._settings is None or stamp != self._config_stamp:
                self._settings = Settings.resolved(self._path, self._flags, client=self._client)
                self._config_stamp = stamp
            return self._settings

    def _for_reading(self, **given: Any) -> tuple[Settings, str | None]:
        """The settings a question is answered with, and what to warn of: as :attr:`settings`, but a broken
        ``kindex.toml`` is left out (and said) instead of failing the answer: one typo in the file took every chat
        turn's knowledge away. Steps still refuse it. ``given``: the call's own options (``None``: not given), which
        win as flags do: a bad variable the call overrides is not said, as the CLI's flags do not say it."""
        try:
            return self.settings, None
        except (InvalidFileError, UsageError):  # the file or a variable: flags were checked when the handle was made
            flags = {**self._flags, **{k: v for k, v in given.items() if v is not None}}
            return Settings.for_answers(self.path, flags, self._client)

    # -- retrieval ------------------------------------------------------------------------------------------------

    @property
    def retriever(self) -> Retriever:
        """The KB's loaded search tables (loaded on first use; :class:`kindex.KBNotFoundError` without a folder)."""
        self._follow()
        with self._state:
            if self._retriever is None:
                self._retriever = Retriever(self._path)
            return self._retriever

    def context(
        self,
        message: str,
        *,
        paths: Sequence[str] = (),
        budget_tokens: int | None = None,
        max_docs: int | None = None,
        fallback_docs: Sequence[str] | None = None,
        min_relevance: float | None = None,
    ) -> Context:
        """BuildContext: the documents ``message`` is about, as prompt text (see :meth:`Retriever.context`).

        Options left ``None`` come from the handle's settings. In a skill library the result also names each
        chosen skill with what it needs (skills, tools, MCP servers).
        """
        s, problem = self._for_reading(
            budget_tokens=budget_tokens, max_docs=max_docs, fallback_docs=fallback_docs, min_relevance=min_relevance
        )
        ctx = self.retriever.context(
            message,
            paths=paths,
            budget_tokens=s.budget_tokens if budget_tokens is None else budget_tokens,
            max_docs=s.max_docs if max_docs is None else max_docs,
            fallback_docs=s.fallback_docs if fallback_docs is None else fallback_docs,
            min_relevance=s.min_relevance if min_relevance is None else min_relevance,
        )
        if problem is not None:
            ctx = ctx.model_copy(update={"warnings": (*ctx.warnings, problem)})
        return self._skills.attach(ctx) if self.retriever.skill_library else ctx

    def search(
        self,
        message: str,
        *,
        paths: Sequence[str] = (),
        limit: int | None = 10,
        themes: bool = False,
        explain: bool = True,
        min_relevance: float | None = None,
    ) -> list[ContextItem]:
        """The ranked entries for ``message`` without reading documents (see :meth:`Retriever.search`)."""
        return self.retriever.search(
            message,
            paths=paths,
            limit=limit,
            themes=themes,
            explain=explain,
            min_relevance=self._for_reading()[0].min_relevance if min_relevance is None else min_relevance,
        )

    def ranking(
        self, message: str, *, paths: Sequence[str] = (), limit: int = 10, min_relevance: float | None = None
    ) -> Ranking:
        """:meth:`search`'s entries with what a caller that does not hold the library should be told: whether the
        question is off topic, and the warnings (a broken ``kindex.toml`` left out, an index file that cannot be
        read, a listed document gone from the folder)."""
        s, problem = self._for_reading(min_relevance=min_relevance)
        relevance = s.min_relevance if min_relevance is None else min_relevance
        return self.retriever.ranking(message, paths=paths, limit=limit, min_relevance=relevance, problem=problem)

    # -- generation -----------------------------------------------------------------------------------------------

    def preview(self) -> Preview:
        """The scan and the size of a full run; no model call."""
        return generate.preview(self.path, self.settings.generation)

    def dry_run(self) -> Plan:
        """What :meth:`reindex` would send to the model, without sending it."""
        return generate.dry_run(self.path, self.settings.generation)

    def reindex(self, options: Options | None = None) -> RunReport:
        """The whole pipeline: root index, every theme's documents, the theme indexes."""
        return self._write(lambda o: generate.reindex(self.path, o), options)

    def root(self, options: Options | None = None) -> RunReport:
        """Write the root ``index.json`` only."""
        return self._write(lambda o: generate.root(self.path, o), options)

    def sub(self, dir_name: str, options: Options | None = None) -> RunReport:
        """Write one theme's ``index.json``."""
        return self._write(lambda o: generate.sub(self.path, dir_name, o), options)

    def doc(self, dir_name: str, path: str, *, clear_dir: bool = False, options: Options | None = None) -> RunReport:
        """Merge one document's entry into its theme's ``index.json``."""
        return self._write(lambda o: generate.doc(self.path, dir_name, path, o, clear_dir=clear_dir), options)

    def validate(self) -> list[str]:
        """Every way the KB's index files break the contract; empty when all is well."""
        return validate(self.path)

    # -- skills ---------------------------------------------------------------------------------------------------

    @property
    def is_skill_library(self) -> bool:
        return is_skill_library(self.path)

    def find_skills(self, query: str, *, limit: int = 10, levels: Iterable[int] | None = None) -> list[SkillHit]:
        """One best hit per skill for ``query``, best first (see :func:`kindex.skills.find_skills`);
        :class:`NotFoundError` for a KB that is no skill library (`kindex find` said "no skill matches" of it)."""
        known, _ = self._skills.load()
        if not known:
            library_folder(self._path)  # a folder gone, or no library: said as such (it said "no skill matches")
        return skills.find_skills(self.retriever, known, query, limit=limit, levels=levels)

    def skill(self, name: str) -> Skill:
        """The library's skill ``name``; :class:`NotFoundError` when it has none of that name."""
        known, _ = self._skills.load()
        if name not in known:
            raise NotFoundError(f"no skill named {name!r} in this library")
        return known[name]

    def skill_closure(self, name: str) -> Closure:
        """What loading skill ``name`` brings: its dependencies (in load order), their tools and MCP servers."""
        known, _ = self._skills.load()
        self.skill(name)
        return closure(known, name)

    def validate_skills(self) -> list[Problem]:
        """Every Agent Skills rule the library breaks, with the file."""
        known, problems = self._skills.load()
        if not known and not problems:
            library_folder(self._path)
        return problems

    def import_skill(self, data: bytes, *, replace: bool = False, **limits: int) -> ImportResult:
        """Install a one-skill ZIP and index it (see :func:`kindex.skills.import_skill`)."""
        return self._write(lambda o: skills.import_skill(self.path, data, replace=replace, options=o, **limits))

    def export_skill(self, name: str) -> bytes:
        """The skill ``name`` as a ZIP."""
        return skills.export_skill(self.path, name)

    def delete_skill(self, name: str) -> None:
        """Remove a skill and its entries."""
        self._write(lambda o: skills.delete_skill(self.path, name, o))

    def sync_skills(
        self,
        dest: str | os.PathLike[str] | None,
        *,
        only: Sequence[str] = (),
        zip_out: str | os.PathLike[str] | None = None,
        previous: Mapping[str, Any] | None = None,
    ) -> SyncResult:
        """Copy changed skills to ``dest`` or a ZIP (see :func:`kindex.skills.sync_skills`)."""
        return skills.sync_skills(self.path, dest, only=only, zip_out=zip_out, previous=previous)

    # -- async twins ----------------------------------------------------------------------------------------------

    async def acontext(
        self,
        message: str,
        *,
        paths: Sequence[str] = (),
        budget_tokens: int | None = None,
        max_docs: int | None = None,
        fallback_docs: Sequence[str] | None = None,
        min_relevance: float | None = None,
    ) -> Context:
        """:meth:`context` on a worker thread: awaitable inside a running event loop."""
        return await asyncio.to_thread(
            lambda: self.context(
                message,
                paths=paths,
                budget_tokens=budget_tokens,
                max_docs=max_docs,
                fallback_docs=fallback_docs,
                min_relevance=min_relevance,
            )
        )

    async def asearch(
        self,
        message: str,
        *,
        paths: Sequence[str] = (),
        limit: int | None = 10,
        themes: bool = False,
        explain: bool = True,
        min_relevance: float | None = None,
    ) -> list[ContextItem]:
        """:meth:`search` on a worker thread."""
        return await asyncio.to_thread(
            lambda: self.search(
                message, paths=paths, limit=limit, themes=themes, explain=explain, min_relevance=min_relevance
            )
        )

    async def afind_skills(self, query: str, *, limit: int = 10, levels: Iterable[int] | None = None) -> list[SkillHit]:
        """:meth:`find_skills` on a worker thread."""
        return await asyncio.to_thread(lambda: self.find_skills(query, limit=limit, levels=levels))

    async def areindex(self, options: Options | None = None) -> RunReport:
        """:meth:`reindex` on a worker thread. Cancelling the awaiting task cancels the run: it stops before its
        next write, so every index file stays as it was or complete (``options.cancel`` is replaced for that)."""
        return await self._awrite(lambda o: generate.reindex(self.path, o), options)

    async def aroot(self, options: Options | None = None) -> RunReport:
        """:meth:`root` on a worker thread (cancellable like :meth:`areindex`)."""
        return await self._awrite(lambda o: generate.root(self.path, o), options)

    async def asub(self, dir_name: str, options: Options | None = None) -> RunReport:
        """:meth:`sub` on a worker thread (cancellable like :meth:`areindex`)."""
        return await self._awrite(lambda o: generate.sub(self.path, dir_name, o), options)

    async def adoc(
        self, dir_name: str, path: str, *, clear_dir: bool = False, options: Options | None = None
    ) -> RunReport:
        """:meth:`doc` on a worker thread (cancellable like :meth:`areindex`)."""
        return await self._awrite(lambda o: generate.doc(self.path, dir_name, path, o, clear_dir=clear_dir), options)

    # -- plumbing -------------------------------------------------------------------------------------------------

    def _write(self, step: Callable[[Options], T], options: Options | None = None) -> T:
        with self._writing:
            return step(options or self.settings.generation)

    async def _awrite(self, step: Callable[[Options], T], options: Options | None = None) -> T:
        cancel = threading.Event()
        options = replace(options or self.settings.generation, cancel=cancel)
        running = asyncio.ensure_future(asyncio.to_thread(self._write, step, options))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            cancel.set()  # the thread cannot be interrupted; it stops before its next model call or write
            raise


StepName = Literal["reindex", "root", "sub", "doc"]
STEPS: tuple[str, ...] = get_args(StepName)


@dataclass(frozen=True, slots=True)
class Step:
    """One generation step as a request names it: what a task runs, in the server's threads or on a queue worker
    (where it travels as :meth:`to_dict` and is checked again by :meth:`from_dict`)."""

    name: StepName
    dir: str | None = None
    path: str | None = None
    clear_dir: bool = False

    def run(self, kb: KnowledgeBase, options: Options) -> RunReport:
        """Run the step on ``kb`` with ``options`` (progress, cancel and model as the caller set them)."""
        if self.name == "reindex":
            return kb.reindex(options)
        if self.name == "root":
            return kb.root(options)
        assert self.dir is not None  # from_dict and the routes guarantee it
        if self.name == "sub":
            return kb.sub(self.dir, options)
        assert self.path is not None
        return kb.doc(self.dir, self.path, clear_dir=self.clear_dir, options=options)

    @property
    def waits_its_turn(self) -> bool:
        """Whether the step, sent while another step holds the KB, waits for it instead of being refused: one
        document merged into its theme (SPEC §5: concurrent ``sub/doc`` calls lose no update). It reads its
        document when it runs, so it may run after anything; ``clear_dir`` starts a theme afresh, which is not
        something to do at an unknown later moment. In-process only: queue mode refuses it like any other step
        (:mod:`kindex.queue.jobs`)."""
        return self.name == "doc" and not self.clear_dir

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dir": self.dir, "path": self.path, "clear_dir": self.clear_dir}

    @classmethod
    def from_dict(cls, data: Any) -> Step:
        """The step a task record names; :class:`UsageError` for anything that is not one."""
        if not isinstance(data, dict) or data.get("name") not in STEPS:
            raise UsageError(f"not a generation step: {str(data)[:200]}")
        name, dir_name, path = data["name"], data.get("dir"), data.get("path")
        needs_dir, needs_path = name in ("sub", "doc"), name == "doc"
        ok_dir = isinstance(dir_name, str) if needs_dir else dir_name is None
        ok_path = isinstance(path, str) if needs_path else path is None
        if not (ok_dir and ok_path):
            raise UsageError(f"step {name!r} has the wrong arguments: {str(data)[:200]}")
        return cls(name, dir_name, path, data.get("clear_dir") is True)


def check_agent_id(agent_id: str) -> None:
    """:class:`UsageError` unless ``agent_id`` can name an agent (1 to 64 of ``A-Z a-z 0-9 _ -``)."""
    if not AGENT_ID.fullmatch(agent_id):
        raise UsageError("agent_id must be 1 to 64 characters of A-Z, a-z, 0-9, _ and -")


def without_root(message: str, kb_root: Path) -> str:
    """``message`` without the path of ``kb_root`` (as given and resolved): an agent's folder named from the agents'
    folder, that folder itself as "the agents' folder". What a service's tenants read holds no path of its machine;
    a worker started on a path of its own words its task errors so before it records them."""
    # The longer first: one path may hold the other (/srv and /srv/real), whose rest would be left behind.
    for root in sorted({str(kb_root), str(kb_root.resolve())}, key=len, reverse=True):
        message = message.replace(f"{root}/", "").replace(root, "the agents' folder")
    return message


def agent_folder(kb_root: Path, agent_id: str) -> Path:
    """The knowledge folder of ``agent_id`` under ``kb_root``: :class:`UsageError` for an id that cannot be one,
    :class:`KBNotFoundError` when the agent has no folder. A symlink counts only if it leads to a folder directly
    under ``kb_root`` (another agent's name for the same KB): one to ``kb_root`` itself would index and serve every
    agent's folder, one into another agent's folder a part of it, one out of ``kb_root`` anything."""
    check_agent_id(agent_id)
    try:
        root = kb_root.resolve()
        kb = (root / agent_id).resolve()
    except (OSError, RuntimeError) as exc:  # a link loop for an agent's folder was a 500 on every route
        raise KBNotFoundError(f"the folder of agent {agent_id!r} cannot be opened ({unopenable(exc)})") from None
    if kb.parent != root and kb.is_dir():
        # A folder is there, behind a link: "has no knowledge folder" sent its operator looking for a missing one.
        raise KBNotFoundError(
            f"the folder of agent {agent_id!r} is a symbolic link to a folder that is not directly under the agents' "
            "folder (--kb-root): it is not served; move the knowledge folder under --kb-root, or link only to another "
            "agent's folder"
        )
    if kb.parent != root or not kb.is_dir():
        # The service's root path stays out of an answer its tenants read; the hint says what to check.
        hint = (
            " (the service's --kb-root holds an index.json itself: it should be the folder that holds one knowledge"
            " folder per agent, not a knowledge folder)"
            if regular_file(root / INDEX_FILE)
            else ""
        )
        raise KBNotFoundError(f"agent {agent_id!r} has no knowledge folder{hint}")
    return kb


CALLS_PER_AGENT = 4
"""Read requests (context, search, skill search; a scan, an index file read) one agent has computing at once in a
service (HTTP or MCP); more wait their turn on the event loop, holding no worker thread. A warm call takes a few ms,
so four serve hundreds a second; but a 20,000-character message over a large KB takes about half a second of CPU,
and 48 of them at once held every worker of the shared pool and stalled another agent's 4 ms call for up to 16 s."""


class AgentGate:
    """At most ``calls`` requests of one agent computing at once (an asyncio semaphore that says how many wait),
    bound to the event loop it was made on."""

    def __init__(self, calls: int) -> None:
        self._free = asyncio.Semaphore(calls)
        self.loop = asyncio.get_running_loop()
        self.waiting = 0

    async def __aenter__(self) -> None:
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc: object) -> None:
        self._free.release()


class Handles:
    """KB handles by folder, at most ``limit`` (least recently used dropped): what the module-level functions and
    the MCP server keep, so a KB's tables stay loaded between calls without memory growing with every KB seen."""

    def __init__(
        self, limit: int = MAX_HANDLES, *, flags: Mapping[str, Any] | None = None, client: LLMClient | None = None
    ) -> None:
        self._handles: OrderedDict[str, KnowledgeBase] = OrderedDict()
        self._limit = limit
        self._flags = dict(flags or {})
        self._client = client
        self._lock = threading.Lock()

    def get(self, path: str | os.PathLike[str]) -> KnowledgeBase:
        # Resolved on every call, so a symlink switched to a new release of the KB is followed; ``realpath`` on the
        # string costs a third of ``Path.resolve()``, which is most of a warm search's overhead here.
        key = os.path.realpath(_usable(path))
        with self._lock:
            handle = self._handles.get(key)
            if handle is None:
                handle = self._handles[key] = KnowledgeBase(key, flags=self._flags, client=self._client)
                while len(self._handles) > self._limit:
                    self._handles.popitem(last=False)
            else:
                self._handles.move_to_end(key)
            return handle

    def clear(self) -> None:
        with self._lock:
            self._handles.clear()


_HANDLES = Handles()


def build_context(
    kb: str | os.PathLike[str],
    message: str,
    *,
    paths: Sequence[str] = (),
    budget_tokens: int | None = None,
    max_docs: int | None = None,
    fallback_docs: Sequence[str] | None = None,
    min_relevance: float | None = None,
) -> Context:
    """BuildContext on the KB at ``kb`` (:meth:`KnowledgeBase.context`; its tables stay loaded between calls).
    Options left ``None`` come from the KB's settings (``kindex.toml``, ``KINDEX_*``, defaults)."""
    return _HANDLES.get(kb).context(
        message,
        paths=paths,
        budget_tokens=budget_tokens,
        max_docs=max_docs,
        fallback_docs=fallback_docs,
        min_relevance=min_relevance,
    )


def search(
    kb: str | os.PathLike[str],
    message: str,
    *,
    paths: Sequence[str] = (),
    limit: int | None = 10,
    themes: bool = False,
    explain: bool = True,
    min_relevance: float | None = None,
) -> list[ContextItem]:
    """The ranked entries of the KB at ``kb`` for ``message`` (:meth:`KnowledgeBase.search`)."""
    return _HANDLES.get(kb).search(
        message, paths=paths, limit=limit, themes=themes, explain=explain, min_relevance=min_relevance
    )


def find_skills(
    kb: str | os.PathLike[str], query: str, *, limit: int = 10, levels: Iterable[int] | None = None
) -> list[SkillHit]:
    """One best hit per skill of the library at ``kb`` (:meth:`KnowledgeBase.find_skills`)."""
    return _HANDLES.get(kb).find_skills(query, limit=limit, levels=levels)


def clear_cache() -> None:
    """Forget every handle the module-level functions keep (their next call loads from disk)."""
    _HANDLES.clear()
