"""The HTTP service (SPEC §7): the reindex steps, BuildContext and tasks, for chat backends in any language.

Each agent's KB is ``<kb-root>/<agent_id>/``. Every route but ``/healthz`` needs ``Authorization: Bearer <token>``
when a token is configured; without one, ``kindex serve`` listens on loopback only. Long steps run as tasks in
worker threads: ``wait=true`` (default) answers when the step is done, ``wait=false`` answers 202 with a task id.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import re
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import orjson
from fastapi import APIRouter, Depends, FastAPI, File, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from kindex import generate, skills
from kindex.errors import KindexError
from kindex.llm import LLMSettings
from kindex.model import INDEX_FILE, parse_index
from kindex.retrieve import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_FALLBACK_DOCS,
    DEFAULT_MAX_DOCS,
    DEFAULT_MIN_RELEVANCE,
    build_context,
)
from kindex.scan import scan

DEFAULT_TASK_WORKERS = 8
"""Generation steps that run at once in one server; more wait queued (each runs its own model calls concurrently)."""
AGENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_BODY_BYTES = 256 * 1024
MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # skill ZIP uploads; what they unpack to is limited separately
TASKS_KEPT = 1000
access_log = logging.getLogger("kindex.access")
log = logging.getLogger("kindex.server")

_STATUS = {
    "invalid_request": 422,
    "unauthorized": 401,
    "forbidden": 403,
    "kb_not_found": 404,
    "not_a_theme": 404,
    "path_not_in_theme": 404,
    "not_found": 404,
    "task_not_found": 404,
    "method_not_allowed": 405,
    "index_missing": 409,
    "busy": 409,
    "cancelled": 409,
    "interrupted": 409,
    "payload_too_large": 413,
    "invalid_skill": 422,
    "model_error": 502,
    "internal_error": 500,
}


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message"}}`` with the status of its code."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra


# -- request and response models (they are the OpenAPI schema) ---------------------------------------------------


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. kb_not_found, not_a_theme, busy.")
    message: str = Field(description="What was wrong and what to do.")
    task_id: str | None = Field(default=None, description="With `busy`: the task that holds the agent's KB.")


class ErrorResponse(BaseModel):
    error: ErrorBody


class ProgressModel(BaseModel):
    completed: int
    total: int


class FailureModel(BaseModel):
    path: str
    reason: str


class RunReportModel(BaseModel):
    step: str
    generator: str = Field(description="`extractive` (offline) or `llm:<model>`.")
    offline: bool
    progress: ProgressModel
    calls: int = Field(description="Model calls made.")
    cache_hits: int = Field(description="Answers reused from the cache (not paid again).")
    retries: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None = Field(description="USD, when litellm knows the model's price.")
    failures: list[FailureModel] = Field(description="Documents whose model answers failed; they got a stand-in.")
    notes: list[str]
    written: list[str] = Field(description="Index files replaced (KB-relative).")
    wall_seconds: float


class TaskModel(BaseModel):
    id: str
    agent_id: str
    step: str
    state: Literal["queued", "running", "done", "failed", "cancelled"]
    progress: ProgressModel
    report: RunReportModel | None = None
    error: ErrorBody | None = None
    created_at: float
    finished_at: float | None = None


class SkippedModel(BaseModel):
    path: str
    reason: str


class TokenEstimate(BaseModel):
    prompt: int
    completion: int
    calls: int


class PreviewModel(BaseModel):
    kb: str
    steps_total: int = Field(description="1 (root) + the number of theme documents.")
    top_dirs: list[str]
    top_dir_docs: dict[str, list[str]]
    root_docs: list[str]
    llm_configured: bool
    model: str | None
    skipped: list[SkippedModel]
    warnings: list[SkippedModel]
    estimated_tokens: TokenEstimate


class SubRequest(BaseModel):
    dir: str = Field(min_length=1, max_length=255, description="A theme: a first-level folder of the KB.")


class DocRequest(BaseModel):
    dir: str = Field(min_length=1, max_length=255)
    path: str = Field(min_length=1, max_length=1024, description="The document's path relative to `dir`.")
    clear_dir: bool = Field(default=False, description="Start `dir/index.json` afresh (the theme's first document).")


class ContextRequest(BaseModel):
    message: str = Field(max_length=20_000, description="The user's chat message.")
    paths: list[str] = Field(default=[], max_length=50, description="Attachment paths (files the user works on).")
    budget_tokens: int = Field(default=DEFAULT_BUDGET_TOKENS, ge=50, le=200_000)
    max_docs: int = Field(default=DEFAULT_MAX_DOCS, ge=1, le=50)
    min_relevance: float = Field(
        default=DEFAULT_MIN_RELEVANCE,
        strict=True,
        ge=0.0,
        le=1.0,
        description="On topic when a document covers this share of the question's informative weight.",
    )
    fallback_docs: list[Annotated[str, Field(min_length=1, max_length=1024)]] | None = Field(
        default=None,
        max_length=20,
        description="Overview documents for off-topic messages (KB-relative); default: the KB's usual overview.",
    )


class ContextItemModel(BaseModel):
    path: str
    level: str
    score: float
    title: str
    abstract: str
    reason: str = Field(description="`matched`, `scope glob <glob>` or `fallback`.")
    matched: list[str]
    truncated: bool
    tokens: int


class SkillClosureModel(BaseModel):
    name: str
    skill_dependencies: list[str]
    tool_dependencies: list[str]
    mcp_dependencies: list[str]


class ContextModel(BaseModel):
    text: str = Field(description="The prompt text: each chosen document under a header naming its path.")
    items: list[ContextItemModel]
    fallback: bool
    reason: str
    missing: list[str]
    tokens: int
    budget_tokens: int
    skills: list[SkillClosureModel] = Field(description="In a skill library: chosen skills and what they need.")


class EntryModel(BaseModel):
    path: str
    title: str
    summary: str
    tags: list[str]
    paths: list[str] | None = None


class ThemeModel(BaseModel):
    dir: str
    title: str
    summary: str
    tags: list[str]
    index_file: str
    paths: list[str] | None = None


class IndexModel(BaseModel):
    version: int
    themes: list[ThemeModel]
    documents: list[EntryModel]


class FindRequest(BaseModel):
    query: str = Field(max_length=20_000)
    limit: int = Field(default=10, ge=1, le=200, description="Distinct skills to return.")
    levels: list[Annotated[int, Field(strict=True, ge=0, le=2)]] | None = Field(
        default=None, description="Only hits of these levels: 0 skill summary, 1 folder overview, 2 file."
    )


class SkillHitModel(BaseModel):
    name: str
    description: str
    root_uri: str
    skill_md_uri: str
    uri: str = Field(description="KB-relative path of the best-matching entry of this skill.")
    level: int
    score: float
    abstract: str
    skill_dependencies: list[str] = Field(description="Transitive skill dependencies, in load order.")
    tool_dependencies: list[str]
    mcp_dependencies: list[str]


class ImportModel(BaseModel):
    name: str
    replaced: bool
    renamed_from: str | None
    files: int
    report: RunReportModel | None


class SyncRequest(BaseModel):
    only: list[str] = Field(default=[], max_length=1000, description="Skills to include (default: all).")
    manifest: dict[str, Any] | None = Field(
        default=None, description="The `.sync-manifest.json` the client holds: only changed skills are sent."
    )


class HealthModel(BaseModel):
    status: Literal["ok"]
    running_tasks: int


# -- tasks --------------------------------------------------------------------------------------------------------


@dataclass
class Task:
    """One generation step running (or run) in a worker thread."""

    id: str
    agent_id: str
    step: str
    state: str = "queued"
    completed: int = 0
    total: int = 0
    report: generate.RunReport | None = None
    error: ApiError | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)
    _waiters_lock: threading.Lock = field(default_factory=threading.Lock)

    async def wait(self) -> None:
        """Wait for the task without holding a thread: the worker wakes this coroutine when it finishes."""
        event = asyncio.Event()
        with self._waiters_lock:
            if self.done.is_set():
                return
            self._waiters.append((asyncio.get_running_loop(), event))
        await event.wait()

    def finish(self) -> None:
        with self._waiters_lock:
            self.done.set()
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agent_id": self.agent_id,
            "step": self.step,
            "state": self.state,
            "progress": {"completed": self.completed, "total": self.total},
            "report": self.report.to_dict() if self.report else None,
            "error": _error_body(self.error) if self.error else None,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }


class Tasks:
    """The server's tasks: at most one writer task per agent (a second one is refused with 409 ``busy``)."""

    def __init__(self, workers: int = DEFAULT_TASK_WORKERS) -> None:
        self._tasks: dict[str, Task] = {}
        self._running: dict[str, str] = {}
        # Steps run in their own bounded pool: more tasks than workers wait "queued", and neither they nor the
        # requests waiting for them take a thread from the pool that serves other requests.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kindex-task")
        self._lock = threading.Lock()

    def start(
        self,
        agent_id: str,
        step: str,
        body: Callable[[generate.Options], generate.RunReport],
        options: generate.Options,
    ) -> Task:
        with self._lock:
            holder = self._running.get(agent_id)
            if holder is not None:
                raise ApiError("busy", f"agent {agent_id!r} is being reindexed by task {holder}", task_id=holder)
            task = Task(uuid.uuid4().hex, agent_id, step)
            self._tasks[task.id] = task
            self._running[agent_id] = task.id
            self._forget_old()
        opts = generate.Options(
            llm=options.llm,
            concurrency=options.concurrency,
            on_progress=lambda p: self._progress(task, p),
            cancel=task.cancel,
        )
        self._pool.submit(self._run, task, body, opts)
        return task

    @staticmethod
    def _progress(task: Task, p: generate.Progress) -> None:
        task.completed, task.total = p.completed, p.total

    def _run(self, task: Task, body: Callable[[generate.Options], generate.RunReport], opts: generate.Options) -> None:
        task.state = "running"
        try:
            task.report = body(opts)
            task.completed, task.total = task.report.completed, task.report.total
            task.state = "done"
        except KindexError as exc:
            task.error = ApiError(exc.code, exc.message)
            task.state = "cancelled" if exc.code == "cancelled" else "failed"
        except Exception:
            log.exception("task %s (%s of agent %s) crashed", task.id, task.step, task.agent_id)
            task.error = ApiError("internal_error", "the task failed on a server fault; see the server log")
            task.state = "failed"
        finally:
            task.finished_at = time.time()
            with self._lock:
                if self._running.get(task.agent_id) == task.id:
                    del self._running[task.agent_id]
            task.finish()

    def get(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None:
            raise ApiError("task_not_found", f"no task {task_id!r} (tasks are kept until the server restarts)")
        return task

    def running(self) -> int:
        return len(self._running)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel what runs and wait for it: each task stops before its next write, so the index stays valid."""
        for task in list(self._tasks.values()):
            if not task.done.is_set():
                task.cancel.set()
        deadline = time.monotonic() + timeout
        self._pool.shutdown(wait=False, cancel_futures=False)
        for task in list(self._tasks.values()):
            task.done.wait(max(0.0, deadline - time.monotonic()))

    def _forget_old(self) -> None:
        finished = [t for t in self._tasks.values() if t.done.is_set()]
        for t in sorted(finished, key=lambda t: t.created_at)[: max(0, len(self._tasks) - TASKS_KEPT)]:
            del self._tasks[t.id]


# -- the app ------------------------------------------------------------------------------------------------------


_PID_HOST = re.compile(r", pid \d{1,10} on [^,;)]{1,255}")
_CLI_ADVICE = re.compile(r"`kindex (reindex|root|sub|doc)[^`]{0,300}`")


def _for_http(message: str, root: Path, agent_id: str | None) -> str:
    """A core error message as an HTTP client should read it: paths relative to the agents' folder, no process id
    or host name of the server, and the route to call instead of the command to type."""
    message = message[:2000].replace(f"{root}/", "").replace(str(root), "the agents' folder")
    message = _PID_HOST.sub("", message)
    agent = agent_id if isinstance(agent_id, str) and AGENT_ID.fullmatch(agent_id) else "{agent_id}"
    routes = {"reindex": "reindex", "root": "reindex/root", "sub": "reindex/sub", "doc": "reindex/sub/doc"}
    return _CLI_ADVICE.sub(lambda m: f"POST /v1/agents/{agent}/knowledge/{routes[m.group(1)]}", message)


def _error_body(err: ApiError) -> dict[str, Any]:
    return {"code": err.code, "message": err.message, **err.extra}


def _error_response(err: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.code == "unauthorized" else None
    return JSONResponse({"error": _error_body(err)}, status_code=_STATUS.get(err.code, 400), headers=headers)


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": desc}
    for status, desc in (
        (400, "Malformed request body (`invalid_request`)."),
        (401, "Missing or wrong bearer token (`unauthorized`)."),
        (403, "Without a token: a request not to and from this machine (`forbidden`)."),
        (404, "Unknown KB, theme, document or task."),
        (409, "The agent's KB is busy, has no index, or the task was cancelled."),
        (413, "Request body too large."),
        (422, "Invalid request (`invalid_request`)."),
        (502, "The model could not be used (`model_error`)."),
    )
}


def _loopback(netloc: str) -> bool:
    """Whether a Host header or an origin's host:port names this machine (localhost, 127.0.0.0/8, ::1)."""
    if netloc.startswith("["):
        host = netloc[1 : netloc.find("]")] if "]" in netloc else ""
    else:
        host = netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(
    kb_root: str | Path,
    *,
    token: str | None = None,
    llm: LLMSettings | None = None,
    concurrency: int = generate.DEFAULT_CONCURRENCY,
) -> FastAPI:
    """The FastAPI application serving the KBs under ``kb_root`` (``<kb_root>/<agent_id>/``)."""
    root = Path(kb_root).resolve()
    settings = llm or LLMSettings.from_env()
    tasks = Tasks()
    base_options = generate.Options(llm=settings, concurrency=concurrency)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(tasks.shutdown)

    app = FastAPI(
        title="kindex",
        version="0.1.0",
        description="Two-layer index and retrieval over each agent's Markdown knowledge folder.",
        lifespan=lifespan,
        responses=_ERRORS,
    )
    app.state.tasks = tasks
    app.state.kb_root = root

    def authorize(request: Request) -> None:
        if token is None:
            # Without a token only this machine may call, and a browser page of another site must not reach the
            # server through the user's browser: a DNS-rebound name fails the Host check, a cross-site request
            # (form post, fetch) the Origin check.
            host = request.headers.get("host", "")
            origin = request.headers.get("origin")
            if not _loopback(host) or (origin is not None and not _loopback(urlsplit(origin).netloc)):
                raise ApiError(
                    "forbidden",
                    "without KINDEX_API_TOKEN this server answers only requests to and from this machine "
                    "(Host and Origin must be localhost); set a token to serve others",
                )
            return
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
            raise ApiError("unauthorized", "send the API token as `Authorization: Bearer <token>`")

    def agent_kb(agent_id: str) -> Path:
        if not AGENT_ID.fullmatch(agent_id):
            raise ApiError("invalid_request", "agent_id must be 1 to 64 characters of A-Z, a-z, 0-9, _ and -")
        kb = (root / agent_id).resolve()
        if not kb.is_relative_to(root) or not kb.is_dir():
            raise ApiError("kb_not_found", f"agent {agent_id!r} has no knowledge folder")
        return kb

    async def run_step(
        agent_id: str, step: str, wait: bool, body: Callable[[Path, generate.Options], generate.RunReport]
    ) -> Response:
        kb = agent_kb(agent_id)
        task = tasks.start(agent_id, step, lambda opts: body(kb, opts), base_options)
        if not wait:
            return JSONResponse(task.to_dict(), status_code=202, headers={"Location": f"/v1/tasks/{task.id}"})
        await task.wait()
        if task.error is not None:
            return _error_response(task.error)
        assert task.report is not None
        return JSONResponse(task.report.to_dict())

    wait_param = Query(True, description="Answer when the step is done; false: 202 with a task to poll.")
    knowledge = APIRouter(prefix="/v1/agents/{agent_id}/knowledge", dependencies=[Depends(authorize)])
    step_responses: dict[int | str, dict[str, Any]] = {200: {"model": RunReportModel}, 202: {"model": TaskModel}}

    @knowledge.get("/reindex/preview", response_model=PreviewModel, summary="Scan only: steps, themes, skipped")
    def preview(agent_id: str) -> Any:
        return generate.preview(agent_kb(agent_id), base_options).to_dict()

    @knowledge.post("/reindex/root", responses=step_responses, summary="Write the root index.json")
    async def reindex_root(agent_id: str, wait: bool = wait_param) -> Response:
        return await run_step(agent_id, "root", wait, lambda kb, o: generate.root(kb, o))

    @knowledge.post("/reindex/sub", responses=step_responses, summary="Write one theme's index.json")
    async def reindex_sub(agent_id: str, body: SubRequest, wait: bool = wait_param) -> Response:
        kb = agent_kb(agent_id)
        # A scan of a large KB takes a while: off the event loop, so context requests are not held up.
        await asyncio.to_thread(lambda: scan(kb).theme_docs(body.dir))
        return await run_step(agent_id, "sub", wait, lambda kb, o: generate.sub(kb, body.dir, o))

    @knowledge.post("/reindex/sub/doc", responses=step_responses, summary="Merge one document's entry")
    async def reindex_doc(agent_id: str, body: DocRequest, wait: bool = wait_param) -> Response:
        kb = agent_kb(agent_id)
        await asyncio.to_thread(lambda: scan(kb).theme_doc(body.dir, body.path))
        return await run_step(
            agent_id, "doc", wait, lambda kb, o: generate.doc(kb, body.dir, body.path, o, clear_dir=body.clear_dir)
        )

    @knowledge.post("/reindex", responses=step_responses, summary="The whole pipeline")
    async def reindex(agent_id: str, wait: bool = wait_param) -> Response:
        return await run_step(agent_id, "reindex", wait, lambda kb, o: generate.reindex(kb, o))

    @knowledge.post(
        "/context",
        response_model=ContextModel,
        responses={200: {"model": ContextModel}},
        summary="BuildContext for one chat message",
    )
    async def context(agent_id: str, body: ContextRequest) -> Response:
        # Off the event loop: a warm call is a few ms, but the first call after a reindex loads the tables (and a
        # KB whose tables are missing is analysed in full), which must not stall other agents' requests. The answer
        # is serialised directly (the dataclass is the contract; re-validating it would double the cost).
        ctx = await run_in_threadpool(
            build_context,
            agent_kb(agent_id),
            body.message,
            paths=body.paths,
            budget_tokens=body.budget_tokens,
            max_docs=body.max_docs,
            min_relevance=body.min_relevance,
            fallback_docs=DEFAULT_FALLBACK_DOCS if body.fallback_docs is None else body.fallback_docs,
        )
        return Response(orjson.dumps(ctx.to_dict()), media_type="application/json")

    @knowledge.get("/index", response_model=IndexModel, summary="The root index")
    def root_index(agent_id: str) -> Any:
        return _read_index(agent_kb(agent_id), None)

    @knowledge.get("/index/{dir}", response_model=IndexModel, summary="One theme's index")
    def theme_index(agent_id: str, dir: str) -> Any:
        return _read_index(agent_kb(agent_id), dir)

    app.include_router(knowledge)
    app.include_router(_skills_router(agent_kb, base_options, authorize))

    tasks_router = APIRouter(prefix="/v1/tasks", dependencies=[Depends(authorize)])

    @tasks_router.get("/{task_id}", response_model=TaskModel, summary="A task's state, progress and report")
    def get_task(task_id: str) -> Any:
        return tasks.get(task_id).to_dict()

    @tasks_router.delete("/{task_id}", response_model=TaskModel, summary="Cancel a task")
    def cancel_task(task_id: str) -> Any:
        task = tasks.get(task_id)
        task.cancel.set()
        return task.to_dict()

    app.include_router(tasks_router)

    @app.get("/healthz", response_model=HealthModel, summary="Liveness (no token needed)")
    def healthz() -> Any:
        return {"status": "ok", "running_tasks": tasks.running()}

    _install_handlers(app)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    return app


def _skills_router(
    agent_kb: Callable[[str], Path], base_options: generate.Options, authorize: Callable[[Request], None]
) -> APIRouter:
    router = APIRouter(prefix="/v1/agents/{agent_id}/skills", dependencies=[Depends(authorize)])

    def library(agent_id: str) -> Path:
        kb = agent_kb(agent_id)
        if not skills.is_skill_library(kb):
            raise ApiError("kb_not_found", f"agent {agent_id!r} has no skill library (no folder with a SKILL.md)")
        return kb

    @router.post("/find", response_model=list[SkillHitModel], summary="Skills matching a query, one hit each")
    def find(agent_id: str, body: FindRequest) -> Any:
        hits = skills.find_skills(library(agent_id), body.query, limit=body.limit, levels=body.levels)
        return [h.to_dict() for h in hits]

    @router.post("/import", response_model=ImportModel, summary="Install a one-skill ZIP (multipart `file`)")
    def import_skill(
        agent_id: str,
        file: UploadFile = File(description="The skill package (.zip)."),  # noqa: B008 - FastAPI's idiom
        replace: bool = Query(False, description="Replace a skill of the same name instead of adding NAME-v2."),
    ) -> Any:
        kb = agent_kb(agent_id)
        return skills.import_skill(kb, file.file.read(), replace=replace, options=base_options).to_dict()

    @router.get(
        "/{name}/export",
        response_class=Response,
        responses={200: {"content": {"application/zip": {}}, "description": "The skill as a ZIP."}},
        summary="Download a skill as a ZIP",
    )
    def export_skill(agent_id: str, name: str) -> Response:
        data = skills.export_skill(library(agent_id), name)
        headers = {"Content-Disposition": f'attachment; filename="{name}.zip"'}
        return Response(data, media_type="application/zip", headers=headers)

    @router.delete("/{name}", status_code=204, response_class=Response, summary="Remove a skill and its entries")
    def delete_skill(agent_id: str, name: str) -> Response:
        skills.delete_skill(library(agent_id), name, base_options)
        return Response(status_code=204)

    @router.post(
        "/sync",
        response_class=Response,
        responses={200: {"content": {"application/zip": {}}, "description": "Changed skills and the manifest."}},
        summary="Sync package for a remote workspace",
    )
    def sync_package(agent_id: str, body: SyncRequest) -> Response:
        kb = library(agent_id)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "sync.zip"
            skills.sync_skills(kb, None, only=body.only, zip_out=out, previous=body.manifest or {})
            return Response(out.read_bytes(), media_type="application/zip")

    return router


def _read_index(kb: Path, dir_name: str | None) -> dict[str, Any]:
    root_path = kb / INDEX_FILE
    try:
        root, _ = parse_index(root_path.read_bytes())
    except (FileNotFoundError, ValueError):
        raise ApiError("index_missing", "this KB has no index yet: POST …/knowledge/reindex first") from None
    if dir_name is None:
        return root.to_dict()
    if dir_name not in {t.dir for t in root.themes}:
        raise ApiError("not_a_theme", f"{dir_name!r} is not a theme of this KB's index")
    try:
        sub, _ = parse_index((kb / dir_name / INDEX_FILE).read_bytes())
    except (FileNotFoundError, ValueError):
        raise ApiError("index_missing", f"theme {dir_name!r} has no index yet: POST …/knowledge/reindex/sub") from None
    return sub.to_dict()


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(KindexError)
    async def kindex_error(request: Request, exc: KindexError) -> JSONResponse:
        message = _for_http(exc.message, request.app.state.kb_root, request.path_params.get("agent_id"))
        return _error_response(ApiError(exc.code, message))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()))
        return _error_response(ApiError("invalid_request", f"{where}: {first.get('msg', 'invalid')}"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names only the first route that matched the path; a path can have several (GET, DELETE).
            methods: set[str] = set()
            for route in request.app.router.routes:
                if route.matches(request.scope)[0] != Match.NONE:
                    methods |= getattr(route, "methods", None) or set()
            headers["Allow"] = ", ".join(sorted(methods))
        return JSONResponse(
            {"error": {"code": code, "message": str(exc.detail)}}, status_code=exc.status_code, headers=headers
        )

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error_response(ApiError("internal_error", "internal error; see the server log"))

    @app.middleware("http")
    async def access(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        client = request.client.host if request.client else None
        _log_access(request.method, request.url.path, response.status_code, started, client)
        return response


def _log_access(method: str, path: str, status: int, started: float, client: str | None) -> None:
    access_log.info(
        orjson.dumps(
            {
                "ts": round(time.time(), 3),
                "method": method,
                "path": path,
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 2),
                "client": client,
            }
        ).decode()
    )


class JsonLines(logging.Formatter):
    """Every log record as one JSON object per line (uvicorn's own lines included), so the log stays parseable."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == access_log.name:
            return message  # already a JSON object
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": JsonLines}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
    "loggers": {
        "uvicorn": {"handlers": [], "level": "INFO", "propagate": True},
        "uvicorn.error": {"handlers": [], "level": "INFO", "propagate": True},
        "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": True},
    },
}
"""Logging for ``kindex serve``: JSON lines on stderr for kindex and uvicorn alike."""


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, whether or not they declare a Content-Length.

    The body is read (up to the limit) before the app sees it, so an oversized chunked upload is refused as such
    rather than surfacing as a parse error.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_path = bytes(scope.get("raw_path") or b"").lower()
        if b"%2f" in raw_path or b"%5c" in raw_path:
            # An encoded slash would be decoded before routing: "demo%2Fknowledge%2Findex" must not become a path.
            error = ApiError("not_found", "no such route: agent ids, folders and paths never contain an encoded slash")
            await _error_response(error)(scope, receive, send)
            return
        limit = MAX_UPLOAD_BYTES if str(scope.get("path", "")).endswith("/skills/import") else self.limit
        started = time.perf_counter()
        client = (scope.get("client") or (None,))[0]
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _error_response(_too_large(limit))(scope, receive, send)
            _log_access(scope.get("method", ""), str(scope.get("path", "")), 413, started, client)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > limit:
                await _error_response(_too_large(limit))(scope, receive, send)
                _log_access(scope.get("method", ""), str(scope.get("path", "")), 413, started, client)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _too_large(limit: int) -> ApiError:
    return ApiError("payload_too_large", f"request body over {limit} bytes")
