"""The routes: knowledge steps and BuildContext, skills, tasks and health. Each takes what it needs from the
app's state through ``Depends`` (:class:`kindex.server.app.ServerState`)."""

from __future__ import annotations

import asyncio
import io
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from python_multipart import parse_form
from starlette.concurrency import run_in_threadpool

from kindex.errors import IndexMissingError, InvalidFileError, NotFoundError, UsageError, status_of
from kindex.kb import KnowledgeBase, Step, check_agent_id
from kindex.records import INDEX_FILE, Index
from kindex.results import Context, ImportResult, Preview, Ranking, RunReport, SkillHit, TaskModel
from kindex.scan import scan
from kindex.server.errors import UNREADABLE_BODY, for_http
from kindex.server.schemas import (
    ContextRequest,
    DocRequest,
    FindRequest,
    HealthModel,
    SearchRequest,
    SubRequest,
    SyncRequest,
    WatchModel,
    WatchUpdateModel,
)
from kindex.server.state import AgentWatch, ServerState, agent_kb, authorize, server_state, strict_request
from kindex.store import listed_theme_index, read_index_file, refuse_theme_folder

_WAIT = Query(True, description="Answer when the step is done; false: 202 with a task to poll.")
_STEP_RESPONSES: dict[int | str, dict[str, Any]] = {200: {"model": RunReport}, 202: {"model": TaskModel}}
_JSON = "application/json"

# The token first: a caller without it learns nothing of a route's parameters.
_GUARDS = [Depends(authorize), Depends(strict_request)]
knowledge = APIRouter(prefix="/v1/agents/{agent_id}/knowledge", dependencies=_GUARDS)
skills_router = APIRouter(prefix="/v1/agents/{agent_id}/skills", dependencies=_GUARDS)
tasks_router = APIRouter(prefix="/v1/tasks", dependencies=_GUARDS)
health = APIRouter()


def _for_tenant(task: TaskModel, root: Path) -> TaskModel:
    """``task`` as its tenant reads it: a step's error worded for HTTP as the routes' own errors are (no server
    path, the route to call instead of the command to type: :func:`for_http`). Both engines record the core's
    message as raised, in a thread or on a worker that knows nothing of HTTP."""
    if task.error is None:
        return task
    message = for_http(task.error.message, root, task.agent_id, task.error.code)
    return task.model_copy(update={"error": task.error.model_copy(update={"message": message})})


async def _run_step(state: ServerState, agent_id: str, step: Step, wait: bool) -> Response:
    kb = state.handle(agent_id)
    task = await state.tasks.submit(agent_id, step, kb)
    if not wait:
        return Response(
            task.model_dump_json(), status_code=202, media_type=_JSON, headers={"Location": f"/v1/tasks/{task.id}"}
        )
    task = _for_tenant(await state.tasks.wait(task.id), state.root)
    if task.error is not None:
        body = {"error": task.error.model_dump(exclude_none=True)}
        return JSONResponse(body, status_code=status_of(task.error.code))
    assert task.report is not None
    return Response(task.report.model_dump_json(), media_type=_JSON)


T = TypeVar("T")


async def _in_turn(state: ServerState, agent_id: str, work: Callable[[], T]) -> T:
    """``work`` on a worker thread behind the agent's gate: every route that scans, reads index files or unpacks
    waits its agent's turn, as /context does. A flood of previews (a full scan each) held every worker of the
    shared pool and stalled another agent's 6 ms context call for 28 s. The agent's folder is checked first, so
    gates are kept only for agents that have one."""
    agent_kb(state, agent_id)
    async with state.gate(agent_id):
        return await run_in_threadpool(work)


@knowledge.get("/reindex/preview", response_model=Preview, summary="Scan only: steps, themes, skipped")
async def preview(agent_id: str, request: Request) -> Any:
    state = server_state(request)
    kb = state.handle(agent_id)
    # The agent's folder by its id: where the server keeps it is no business of a tenant's.
    return (await _in_turn(state, agent_id, kb.preview)).model_copy(update={"kb": agent_id})


@knowledge.post("/reindex/root", responses=_STEP_RESPONSES, summary="Write the root index.json")
async def reindex_root(agent_id: str, request: Request, wait: bool = _WAIT) -> Response:
    return await _run_step(server_state(request), agent_id, Step("root"), wait)


@knowledge.post("/reindex/sub", responses=_STEP_RESPONSES, summary="Write one theme's index.json")
async def reindex_sub(agent_id: str, body: SubRequest, request: Request, wait: bool = _WAIT) -> Response:
    state = server_state(request)
    kb = agent_kb(state, agent_id)
    # A scan of a large KB takes a while: off the event loop, so context requests are not held up.
    await _in_turn(state, agent_id, lambda: scan(kb).theme_docs(body.dir))
    return await _run_step(state, agent_id, Step("sub", body.dir), wait)


@knowledge.post("/reindex/sub/doc", responses=_STEP_RESPONSES, summary="Merge one document's entry")
async def reindex_doc(agent_id: str, body: DocRequest, request: Request, wait: bool = _WAIT) -> Response:
    state = server_state(request)
    kb = agent_kb(state, agent_id)
    await _in_turn(state, agent_id, lambda: scan(kb).theme_doc(body.dir, body.path))
    return await _run_step(state, agent_id, Step("doc", body.dir, body.path, body.clear_dir), wait)


@knowledge.post("/reindex", responses=_STEP_RESPONSES, summary="The whole pipeline")
async def reindex(agent_id: str, request: Request, wait: bool = _WAIT) -> Response:
    return await _run_step(server_state(request), agent_id, Step("reindex"), wait)


@knowledge.post("/context", response_model=Context, summary="BuildContext for one chat message")
async def context(agent_id: str, body: ContextRequest, request: Request) -> Response:
    # Off the event loop: a warm call is a few ms, but the first call after a reindex loads the tables (and a KB
    # whose tables are missing is analysed in full), which must not stall other agents' requests.
    state = server_state(request)
    kb = state.handle(agent_id)
    async with state.gate(agent_id):  # one agent's flood waits its turn; other agents find workers free
        ctx = await run_in_threadpool(
            kb.context,
            body.message,
            paths=body.paths,
            budget_tokens=body.budget_tokens,
            max_docs=body.max_docs,
            min_relevance=body.min_relevance,
            fallback_docs=body.fallback_docs,
        )
    return Response(ctx.model_dump_json(), media_type=_JSON)


@knowledge.post("/search", response_model=Ranking, summary="The ranking for a question, without the text")
async def search(agent_id: str, body: SearchRequest, request: Request) -> Response:
    # As /context: off the event loop, one agent's flood behind its own gate.
    state = server_state(request)
    kb = state.handle(agent_id)
    async with state.gate(agent_id):
        ranking = await run_in_threadpool(
            kb.ranking, body.question, paths=body.paths, limit=body.limit, min_relevance=body.min_relevance
        )
    return Response(ranking.model_dump_json(), media_type=_JSON)


@knowledge.get("/index", response_model=Index, summary="The root index")
async def root_index(agent_id: str, request: Request) -> Response:
    return await _index_response(server_state(request), agent_id, None)


@knowledge.get("/index/{dir}", response_model=Index, summary="One theme's index")
async def theme_index(agent_id: str, dir: str, request: Request) -> Response:
    return await _index_response(server_state(request), agent_id, dir)


async def _index_response(state: ServerState, agent_id: str, dir_name: str | None) -> Response:
    kb = agent_kb(state, agent_id)
    body = await _in_turn(state, agent_id, lambda: _read_index(kb, dir_name).to_json())
    return Response(body, media_type=_JSON)


def _read_index(kb: Path, dir_name: str | None) -> Index:
    refuse_theme_folder(kb, reading=True)  # a theme's index is no root index, as /context refuses it too
    try:
        root, _ = read_index_file(kb / INDEX_FILE)
    except (OSError, InvalidFileError, IndexMissingError):
        raise IndexMissingError("this KB has no index yet: POST …/knowledge/reindex first") from None
    if dir_name is None:
        return root
    path = listed_theme_index(kb, root, dir_name)
    try:
        sub, _ = read_index_file(path, kb)
    except (OSError, InvalidFileError, IndexMissingError):
        raise IndexMissingError(f"theme {dir_name!r} has no index yet: POST …/knowledge/reindex/sub") from None
    return sub


@knowledge.put("/watch", response_model=WatchModel, summary="Reindex the agent's folder whenever it changes")
async def watch_on(agent_id: str, request: Request) -> Any:
    state = server_state(request)
    return _watch_model(agent_id, await _in_turn(state, agent_id, lambda: state.watch(agent_id)))


@knowledge.get("/watch", response_model=WatchModel, summary="Whether the folder is watched, and the last update")
def watch_status(agent_id: str, request: Request) -> Any:
    # By id alone: a watcher whose folder was removed is still reported (and can be stopped).
    state = server_state(request)
    check_agent_id(agent_id)
    watching = state.watchers.get(agent_id)
    # A stopped watch is said as it ended (its updates, the last one) until the agent is watched again.
    return _watch_model(agent_id, watching or state.stopped.get(agent_id), watched=watching is not None)


@knowledge.delete("/watch", response_model=WatchModel, summary="Stop watching the agent's folder")
async def watch_off(agent_id: str, request: Request) -> Any:
    state = server_state(request)
    check_agent_id(agent_id)
    # What the watch did stays in the answer (its updates, the last one): stopping it must not hide it.
    return _watch_model(agent_id, await asyncio.to_thread(state.unwatch, agent_id))


def _watch_model(agent_id: str, entry: AgentWatch | None, *, watched: bool = True) -> WatchModel:
    """``watched``: whether ``entry`` is the agent's current watch, not the last one stopped."""
    last = entry.last if entry is not None else None
    return WatchModel(
        agent_id=agent_id,
        watching=watched and entry is not None and entry.thread.is_alive(),
        updates=entry.updates if entry is not None else 0,
        last=None
        if last is None
        else WatchUpdateModel(
            changed=list(last.changed),
            removed=list(last.removed),
            steps=list(last.steps),
            calls=last.calls,
            written=list(last.written),
            error=last.error,
            retry_in=last.retry_in,
            retry_at=last.retry_at,
        ),
    )


# -- skills -------------------------------------------------------------------------------------------------------


def _library(state: ServerState, agent_id: str) -> KnowledgeBase:
    kb = state.handle(agent_id)
    if not kb.is_skill_library:
        # The KB is there (kb_not_found said it was not): what it lacks is a skill, as the MCP tool says.
        raise NotFoundError(
            f"the knowledge folder of agent {agent_id!r} is not a skill library (no folder holds a SKILL.md)"
        )
    return kb


@skills_router.post("/find", response_model=list[SkillHit], summary="Skills matching a query, one hit each")
async def find(agent_id: str, body: FindRequest, request: Request) -> Any:
    state = server_state(request)
    return await _in_turn(
        state, agent_id, lambda: _library(state, agent_id).find_skills(body.query, limit=body.limit, levels=body.levels)
    )


_UPLOAD = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "The skill package (.zip)."}
                    },
                }
            }
        },
    }
}


@skills_router.post(
    "/import",
    response_model=ImportResult,
    summary="Install a one-skill ZIP (multipart `file`)",
    openapi_extra=_UPLOAD,
)
async def import_skill(
    agent_id: str,
    request: Request,
    replace: bool = Query(False, description="Replace a skill of the same name instead of adding NAME-v2."),
) -> Any:
    state = server_state(request)
    kb = state.handle(agent_id)
    # Received here, parsed on a worker in the agent's turn: FastAPI parsed a form on the event loop before the
    # route ran, and 24 uploads of 20 MiB put another agent's context call at 2.3 s.
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    return await _in_turn(state, agent_id, lambda: kb.import_skill(_uploaded(content_type, body), replace=replace))


def _uploaded(content_type: str, body: bytes) -> bytes:
    """The ``file`` field of a multipart form."""
    found: list[bytes] = []

    def on_file(part: Any) -> None:
        if part.field_name == b"file" and not found:
            part.file_object.seek(0)
            found.append(part.file_object.read())
        part.close()

    try:
        parse_form({"Content-Type": content_type.encode("latin-1")}, io.BytesIO(body), None, on_file)
    except Exception:  # python-multipart's assorted errors for a body that is no form
        raise UsageError(UNREADABLE_BODY) from None
    if not found:
        raise UsageError("send the skill package as the multipart form field `file`")
    return found[0]


@skills_router.get(
    "/{name}/export",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}}, "description": "The skill as a ZIP."}},
    summary="Download a skill as a ZIP",
)
async def export_skill(agent_id: str, name: str, request: Request) -> Response:
    state = server_state(request)
    data = await _in_turn(state, agent_id, lambda: _library(state, agent_id).export_skill(name))
    headers = {"Content-Disposition": f'attachment; filename="{name}.zip"'}
    return Response(data, media_type="application/zip", headers=headers)


@skills_router.delete("/{name}", status_code=204, response_class=Response, summary="Remove a skill and its entries")
async def delete_skill(agent_id: str, name: str, request: Request) -> Response:
    state = server_state(request)
    await _in_turn(state, agent_id, lambda: _library(state, agent_id).delete_skill(name))
    return Response(status_code=204)


@skills_router.post(
    "/sync",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}}, "description": "Changed skills and the manifest."}},
    summary="Sync package for a remote workspace",
)
async def sync_package(agent_id: str, body: SyncRequest, request: Request) -> Response:
    state = server_state(request)

    def package() -> bytes:
        kb = _library(state, agent_id)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "sync.zip"
            kb.sync_skills(None, only=body.only, zip_out=out, previous=body.manifest or {})
            return out.read_bytes()

    return Response(await _in_turn(state, agent_id, package), media_type="application/zip")


# -- tasks and health ---------------------------------------------------------------------------------------------


@tasks_router.get("/{task_id}", response_model=TaskModel, summary="A task's state, progress and report")
async def get_task(task_id: str, request: Request) -> Response:
    state = server_state(request)
    task = _for_tenant(await state.tasks.get(task_id), state.root)
    return Response(task.model_dump_json(), media_type=_JSON)


@tasks_router.delete("/{task_id}", response_model=TaskModel, summary="Cancel a task")
async def cancel_task(task_id: str, request: Request) -> Response:
    state = server_state(request)
    task = _for_tenant(await state.tasks.cancel(task_id), state.root)
    return Response(task.model_dump_json(), media_type=_JSON)


@health.get(
    "/healthz",
    response_model=HealthModel,
    responses={503: {"model": HealthModel, "description": "Queue mode: the queue's Redis cannot be reached."}},
    summary="Liveness, and in queue mode the queue's reachability (no token needed)",
)
async def healthz(request: Request) -> JSONResponse:
    body = await server_state(request).tasks.health()
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)
