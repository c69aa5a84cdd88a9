"""Errors as the HTTP service answers them: ``{"error": {"code", "message"}}`` with the status the error class
carries (:mod:`kindex.errors`), core messages rewritten for an HTTP client, and the body size limit."""

from __future__ import annotations

import difflib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from kindex.errors import (
    BusyError,
    InternalError,
    KindexError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    RouteNotFoundError,
    ThemeFolderError,
    UnauthorizedError,
    UsageError,
)
from kindex.kb import AGENT_ID, without_root
from kindex.records import INDEX_FILE
from kindex.server import schemas
from kindex.server.logs import log_access

MAX_BODY_BYTES = 256 * 1024
UNREADABLE_BODY = (
    "the body could not be read: send a JSON object in UTF-8 (or, to upload a skill, a multipart form with its ZIP "
    "as `file`)"
)
MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # skill ZIP uploads; what they unpack to is limited separately
log = logging.getLogger("kindex.server")

_PID_HOST = re.compile(r", pid \d{1,10} on [^,;)]{1,255}")
_CLI_ADVICE = re.compile(r"`kindex (reindex|root|sub|doc)[^`]{0,300}`")


def for_http(message: str, root: Path, agent_id: str | None, code: str | None = None) -> str:
    """A core error message (of error ``code``) as an HTTP client should read it: paths relative to the agents'
    folder, no process id or host name of the server, and the route to call instead of the command to type."""
    agent = agent_id if isinstance(agent_id, str) and AGENT_ID.fullmatch(agent_id) else "{agent_id}"
    if code == ThemeFolderError.code:
        # The folder above an agent's is --kb-root itself (or, through a link, a folder outside it): the fix is
        # the service's command line or the folder's layout, not a command or route the tenant could send.
        return (
            f"the folder of agent {agent!r} is a theme of the knowledge folder above it (that folder's {INDEX_FILE} "
            "lists it): served or indexed on its own it would break that index. When that folder is the service's "
            "--kb-root, start the service with --kb-root set to the folder that holds one knowledge folder per agent"
        )
    message = without_root(message[:2000], root)
    message = _PID_HOST.sub("", message)
    if code == BusyError.code:
        # The holder named is another writer (a command typed on the server, a watcher), not advice: read as a
        # route, it told the client another request of its own was running; and --wait is no field of a request.
        message = _CLI_ADVICE.sub(lambda m: f"a command-line {m.group(0)}", message)
        return message.replace("or pass --wait SECONDS", "or send the request again once it has finished")
    routes = {"reindex": "reindex", "root": "reindex/root", "sub": "reindex/sub", "doc": "reindex/sub/doc"}
    return _CLI_ADVICE.sub(lambda m: f"POST /v1/agents/{agent}/knowledge/{routes[m.group(1)]}", message)


def error_fields(err: KindexError, message: str | None = None) -> dict[str, Any]:
    """The ``error`` object of a response: its code, its message, and the task that holds a busy KB."""
    out: dict[str, Any] = {"code": err.code, "message": err.message if message is None else message}
    if isinstance(err, BusyError) and err.task_id is not None:
        out["task_id"] = err.task_id
    return out


def error_response(err: KindexError, message: str | None = None) -> JSONResponse:
    """The response for ``err`` (reworded as ``message`` if given), with the HTTP status its class carries."""
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(err, UnauthorizedError) else None
    return JSONResponse({"error": error_fields(err, message)}, status_code=err.http_status, headers=headers)


_BODY_FIELDS = sorted(
    {
        name
        for model in vars(schemas).values()
        if isinstance(model, type) and issubclass(model, BaseModel) and model.model_config.get("extra") == "forbid"
        for name in model.model_fields
    }
)
"""Every field a request body may hold, for the "did you mean" of a field no body takes."""


def _did_you_mean(error: Mapping[str, Any], missing: Sequence[str]) -> str:
    """`` (did you mean 'budget_tokens'?)`` for a body field the route does not take: the field it misses, when it
    misses one (``message`` sent to the search route, which takes ``question``: another route's field is no
    answer), else one close to it that some route takes."""
    loc = error.get("loc", ())
    if error.get("type") != "extra_forbidden" or len(loc) != 2 or loc[0] != "body":
        return ""
    name = str(loc[1])[:100]
    if len(missing) == 1:
        return f" (did you mean {missing[0]!r}?)"
    close = difflib.get_close_matches(name, missing or [f for f in _BODY_FIELDS if f != name], n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _documented_methods(request: Request) -> list[str]:
    """The methods the OpenAPI document gives the path of ``request``: of the path templates it matches, the one
    with the most fixed characters (``/skills/find`` before ``/skills/{name}``)."""
    best: tuple[int, list[str]] = (-1, [])
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "".join(re.escape(part) if i % 2 == 0 else "[^/]+" for i, part in enumerate(_PARAM.split(template)))
        if re.fullmatch(pattern, request.url.path):
            fixed = len(_PARAM.sub("", template))
            if fixed > best[0]:
                best = (fixed, [m for m in _METHODS if m.lower() in operations])
    return best[1]


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
_PARAM = re.compile(r"\{([^{}/]*)\}")


def install_handlers(app: FastAPI, guard: Callable[[Request], None]) -> None:
    """Every failure answers in the one error shape; every request is logged as one JSON line. ``guard`` is the
    access check the routes depend on: a body FastAPI cannot parse fails before it runs, so the handler runs it
    first."""

    @app.exception_handler(KindexError)
    async def kindex_error(request: Request, exc: KindexError) -> JSONResponse:
        message = for_http(exc.message, request.app.state.kb_root, request.path_params.get("agent_id"), exc.code)
        return error_response(exc, message)

    def guard_first(request: Request) -> JSONResponse | None:
        """The route's own guard's answer, if it refuses: FastAPI reads and checks a body (JSON or multipart) before
        it runs a route's dependencies, so a caller without the token learnt the body's rules (a 422 naming a
        field, a 400 about multipart) before being told to authenticate."""
        route = request.scope.get("route")
        if any(dep.dependency is guard for dep in getattr(route, "dependencies", ())):
            try:
                guard(request)
            except KindexError as err:
                return error_response(err)
        return None

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        refused = guard_first(request)
        if refused is not None:
            return refused
        first = exc.errors()[0] if exc.errors() else {}
        loc = tuple(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", "JSON decode error")
            return error_response(UsageError(f"the body is not valid JSON ({detail}): send a JSON object"))
        if loc == ("body",) and first.get("type") in ("model_attributes_type", "dict_type"):
            # FastAPI reads a body without Content-Type: application/json as text, which is no object.
            message = "the body must be a JSON object, sent with Content-Type: application/json"
            return error_response(UsageError(message))
        # Every problem, up to three: {"mesage": …} is a missing "message" and an unknown "mesage" together, and
        # naming only the first hides the typo.
        said = []
        missing = [
            str(e["loc"][1])
            for e in exc.errors()
            if e.get("type") == "missing" and tuple(e.get("loc", ()))[:1] == ("body",) and len(e["loc"]) == 2
        ]
        for error in exc.errors()[:3]:
            where = ".".join(str(x) for x in error.get("loc", ()))[:200]  # a made-up field may be any length
            said.append(f"{where}: {error.get('msg', 'invalid')}{_did_you_mean(error, missing)}")
        more = f" (and {len(exc.errors()) - 3} more)" if len(exc.errors()) > 3 else ""
        return error_response(UsageError("; ".join(said) + more))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # a multipart body that does not parse, read before the dependencies ran
            refused = guard_first(request)
            if refused is not None:
                return refused
        err: KindexError
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 404:
            err = RouteNotFoundError(str(exc.detail))
        elif exc.status_code == 405:
            # A path can take several methods (GET, PUT, DELETE): those the API documents for it (a route with a
            # path parameter may match it too, skills/{name} for skills/find, and is another resource).
            methods = _documented_methods(request)
            headers["Allow"] = ", ".join(methods)
            shown = " or ".join(m for m in methods if m != "HEAD")
            err = MethodNotAllowedError(f"{request.method} is not allowed here: use {shown}")
        elif exc.status_code == 400:
            # FastAPI's own words for a body it could not decode: JSON not in UTF-8, or a form that does not parse.
            # invalid_request is 422 everywhere else; a client must not need a second status for it.
            return error_response(UsageError(UNREADABLE_BODY))
        else:
            err = UsageError(str(exc.detail))
        return JSONResponse({"error": error_fields(err)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(InternalError("internal error; see the server log"))

    @app.middleware("http")
    async def access(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        client = request.client.host if request.client else None
        log_access(request.method, request.url.path, response.status_code, started, client)
        return response


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
            error = RouteNotFoundError("no such route: agent ids, folders and paths never contain an encoded slash")
            await error_response(error)(scope, receive, send)
            return
        limit = MAX_UPLOAD_BYTES if str(scope.get("path", "")).endswith("/skills/import") else self.limit
        started = time.perf_counter()
        client = (scope.get("client") or (None,))[0]
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await error_response(_too_large(limit))(scope, receive, send)
            log_access(scope.get("method", ""), str(scope.get("path", "")), 413, started, client)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > limit:
                await error_response(_too_large(limit))(scope, receive, send)
                log_access(scope.get("method", ""), str(scope.get("path", "")), 413, started, client)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"request body over {limit} bytes")
