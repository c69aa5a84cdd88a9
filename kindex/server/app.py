"""The application: :func:`create_app` wires the state, the routes, the error handlers and the body limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import FastAPI

import kindex
from kindex.errors import KindexError, UsageError, missing_extra
from kindex.hosts import loopback
from kindex.kb import Settings
from kindex.llm import LLMClient, LLMSettings
from kindex.server import routes
from kindex.server.errors import MAX_BODY_BYTES, BodyLimit, install_handlers, log
from kindex.server.schemas import ErrorResponse
from kindex.server.state import ServerState, authorize
from kindex.server.tasks import DEFAULT_TASK_WORKERS, TaskEngine, Tasks

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": desc}
    for status, desc in (
        (401, "Missing or wrong bearer token (`unauthorized`)."),
        (403, "Without a token: a request not to and from this machine (`forbidden`)."),
        (404, "Unknown KB, theme, document or task."),
        (409, "The agent's KB is busy, has no index, or the task was cancelled."),
        (405, "A method the path does not take (`method_not_allowed`; the `Allow` header lists the ones it does)."),
        (413, "Request body too large."),
        (
            422,
            "A body that is not a JSON object in UTF-8, a field of the wrong type or out of bounds, or one the route "
            "does not take (`invalid_request`); a broken `kindex.toml` or skill package (`invalid_file`, "
            "`invalid_skill`).",
        ),
        (500, "An error of the server's own (`internal_error`; the details are in its log, not in the answer)."),
        (502, "The model could not be used (`model_error`)."),
        (503, "Queue mode: the queue's Redis cannot be reached (`queue_unavailable`)."),
    )
}
_UNGUARDED: dict[int | str, dict[str, Any]] = {status: _ERRORS[status] for status in (405, 500)}
"""What ``/healthz``, which needs no token, can answer besides its own."""


def create_app(
    kb_root: str | Path,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    llm: LLMSettings | None = None,
    client: LLMClient | None = None,
    concurrency: int | None = None,
    task_workers: int = DEFAULT_TASK_WORKERS,
    queue: str | None = None,
) -> FastAPI:
    """The FastAPI application serving the KBs under ``kb_root`` (``<kb_root>/<agent_id>/``).

    Without a ``token`` the app serves this machine only: it refuses to be created for a non-loopback ``host``
    (the address it will be bound to), and it answers 403 to a request that arrives on a non-loopback socket or
    names another host, whatever server runs it. ``llm`` and ``concurrency``, when given, win over every agent's
    own settings (environment, ``kindex.toml``); ``client`` replaces the litellm adapter for every step (an
    in-process model, a test double), as ``Options.client`` does for the library.

    ``queue`` (a ``redis://`` URL, extra ``kindex[queue]``) sends every step to ``kindex worker`` processes and keeps
    the tasks in that Redis, so any replica started with the same URL answers for any task; without it the steps
    run in this process (``task_workers`` at once).
    """
    if token is None and not loopback(host):
        raise UsageError(f"refusing to serve on {host} without an API token: set a token, or bind to 127.0.0.1")
    if token is not None and not token.strip():
        raise UsageError("the API token is empty: set a real token, or none to serve this machine only")
    root = Path(kb_root).resolve()
    tasks: TaskEngine
    if queue is None:
        tasks = Tasks(task_workers)
    else:
        if client is not None:
            raise UsageError("a model client object cannot travel to queue workers: configure the workers' model")
        try:
            from kindex.server.queued import QueuedTasks
        except ImportError as exc:
            raise missing_extra("queue mode", "queue", exc) from None
        tasks = QueuedTasks(queue)
    # Each agent's settings: these flags > the environment > the agent's kindex.toml > defaults.
    flags: dict[str, Any] = {k: v for k, v in asdict(llm).items() if v is not None} if llm is not None else {}
    if concurrency is not None:
        flags["concurrency"] = concurrency
    Settings.resolved(None, flags, env={})  # a bad flag fails here, not on the first request
    # A KINDEX_* variable that does not parse is the environment's, as in the CLI: answers leave it out and say so,
    # steps fail on it. Refusing to start took every agent's knowledge away for one typo.
    try:
        Settings.resolved(None, flags)
    except KindexError as exc:
        log.warning("%s: steps fail on it, and answers leave it out and say so, until it is fixed", exc.message)

    state = ServerState(root=root, token=token, tasks=tasks, flags=flags, client=client, queued=queue is not None)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(state.unwatch_all)
        await asyncio.to_thread(tasks.shutdown)

    app = FastAPI(
        title="kindex",
        version=kindex.__version__,
        description="Two-layer index and retrieval over each agent's Markdown knowledge folder.",
        lifespan=lifespan,
    )
    app.state.kindex = state
    app.state.tasks = tasks
    app.state.kb_root = root
    for router in (routes.knowledge, routes.skills_router, routes.tasks_router):
        app.include_router(router, responses=_ERRORS)
    app.include_router(routes.health, responses=_UNGUARDED)
    install_handlers(app, authorize)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    return app
