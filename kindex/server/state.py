"""What the routes share: the server's state (agents' folder, token, tasks, KB handles) and the guards every
request passes (the token, or without one: this machine only)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request

from kindex.errors import BusyError, ForbiddenError, UnauthorizedError, UsageError
from kindex.hosts import loopback, token_refusal
from kindex.kb import CALLS_PER_AGENT, MAX_LOADED_AGENTS, AgentGate, Handles, KnowledgeBase, agent_folder
from kindex.llm import LLMClient
from kindex.scan import scan
from kindex.server.tasks import TaskEngine
from kindex.store import refuse_theme_folder
from kindex.watch import Pending, Update, Watcher


@dataclass
class ServerState:
    """One app's state, kept on ``app.state.kindex``."""

    root: Path
    token: str | None
    tasks: TaskEngine
    flags: dict[str, Any] = field(default_factory=dict)
    """Settings the server was started with; they win over each agent's environment and ``kindex.toml``."""
    client: LLMClient | None = None
    queued: bool = False
    """Steps run on queue workers (``kindex serve --queue``), not in this process."""
    watchers: dict[str, AgentWatch] = field(default_factory=dict)
    left: dict[str, Pending] = field(default_factory=dict)
    """Per agent no longer watched: the batch its watcher had yet to try again (at most one per agent folder)."""
    stopping: dict[str, AgentWatch] = field(default_factory=dict)
    """Watchers told to stop whose thread has not ended yet (a step in flight)."""
    stopped: dict[str, AgentWatch] = field(default_factory=dict)
    """Per agent whose watch was stopped: what it did, said by a status request until the agent is watched again
    (one per agent folder)."""
    gates: dict[str, AgentGate] = field(default_factory=dict)
    """Per agent whose folder exists (so bounded by the folders), made on the event loop of its first request."""
    _handles: Handles | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._handles = Handles(MAX_LOADED_AGENTS, flags=self.flags, client=self.client)

    def gate(self, agent_id: str) -> AgentGate:
        """The agent's :class:`AgentGate`; call on the event loop, after the agent's folder was checked. An app
        served by a new event loop (a test client's) gets new gates: a semaphore that waited once is bound to its
        loop."""
        gate = self.gates.get(agent_id)
        if gate is None or gate.loop is not asyncio.get_running_loop():
            gate = self.gates[agent_id] = AgentGate(CALLS_PER_AGENT)
        return gate

    def handle(self, agent_id: str) -> KnowledgeBase:
        """The agent's KB handle (its tables stay loaded between requests, within :data:`MAX_LOADED_AGENTS`)."""
        assert self._handles is not None
        return self._handles.get(agent_kb(self, agent_id))

    def watch(self, agent_id: str) -> AgentWatch:
        """Start watching the agent's folder (a no-op when it is watched already); a broken ``kindex.toml`` is
        refused here, not found later by the watcher."""
        if self.queued:
            # A watcher writes from this replica, outside the queue's one-writer lease.
            raise UsageError(
                "in queue mode the service does not watch folders: POST …/reindex/sub/doc for each changed "
                "document, or run `kindex watch` on the machine that holds the folder when no worker writes it"
            )
        kb = self.handle(agent_id)
        scan(kb.path)  # reads kindex.toml (its exclude): InvalidFileError answers 422 at once
        refuse_theme_folder(kb.path)  # no step could ever succeed there: 409 at once, not a watcher failing
        with self._lock:
            current = self.watchers.get(agent_id)
            if current is not None and current.thread.is_alive():
                return current
            stopping = self.stopping.get(agent_id)
            if stopping is not None and stopping.thread.is_alive():
                # Two watchers of one folder would both write; the batch it was on is handed on when it ends.
                raise BusyError(
                    f"agent {agent_id!r}'s previous watch is still stopping (a step in flight ends at its next "
                    "model answer): try again in a moment"
                )
            self.stopping.pop(agent_id, None)
            self.stopped.pop(agent_id, None)
            holder: list[AgentWatch] = []
            # What a watcher stopped before left to try again is tried when due. No reindex at the start, unlike
            # the CLI's: the service's generator may not be the one that indexed the KB, and a PUT must not rewrite
            # it.
            watcher = Watcher(kb, lambda u: holder[0].record(u), resume=self.left.get(agent_id))
            watcher.claim()  # a `kindex watch` of this folder elsewhere: 409 now, not a thread that dies
            self.left.pop(agent_id, None)

            def run() -> None:
                try:
                    watcher.run()
                finally:  # only once the thread ends is its pending batch final (a step may be ending)
                    with self._lock:
                        if watcher.pending is not None:
                            self.left[agent_id] = watcher.pending
                        self.stopping.pop(agent_id, None)

            thread = threading.Thread(target=run, name=f"kindex-watch-{agent_id}", daemon=True)
            entry = AgentWatch(watcher, thread)
            holder.append(entry)
            self.watchers[agent_id] = entry
            thread.start()
        # Answer once the folder is watched, so a change made after the answer is never missed.
        watcher.ready.wait(30)
        return entry

    def unwatch(self, agent_id: str, timeout: float = 30.0) -> AgentWatch | None:
        """Stop watching the agent's folder; a step in flight stops before its next write. The watch stopped, with
        what it did (``None`` when the folder was not watched)."""
        with self._lock:
            entry = self.watchers.pop(agent_id, None)
            if entry is not None:
                self.stopping[agent_id] = self.stopped[agent_id] = entry
        if entry is not None:
            entry.watcher.stop()
            entry.thread.join(timeout)
        return entry

    def unwatch_all(self) -> None:
        for agent_id in list(self.watchers):
            self.unwatch(agent_id)


@dataclass
class AgentWatch:
    """One agent's watcher, running on its own thread, and what it did last."""

    watcher: Watcher
    thread: threading.Thread
    updates: int = 0
    last: Update | None = None

    def record(self, update: Update) -> None:
        self.updates += 1
        self.last = update


def server_state(request: Request) -> ServerState:
    state = request.app.state.kindex
    assert isinstance(state, ServerState)
    return state


def agent_kb(state: ServerState, agent_id: str) -> Path:
    """The agent's knowledge folder; 422 for an id that cannot be one, 404 when there is none."""
    return agent_folder(state.root, agent_id)


def authorize(request: Request) -> None:
    """The bearer token when one is set; without one, only requests to and from this machine."""
    token = server_state(request).token
    if token is None:
        # Without a token only this machine may call: the socket the request came in on must be a loopback one
        # (an app embedded and bound to a public address refuses), and a browser page of another site must not
        # reach the server through the user's browser: a DNS-rebound name fails the Host check, a cross-site
        # request (form post, fetch) the Origin check.
        server = request.scope.get("server")
        host = request.headers.get("host", "")
        origin = request.headers.get("origin")
        if (
            (server is not None and not loopback(str(server[0])))
            or not loopback(host)
            or (origin is not None and not loopback(urlsplit(origin).netloc))
        ):
            raise ForbiddenError(
                "without KINDEX_API_TOKEN this server answers only requests to and from this machine "
                "(Host and Origin must be localhost); set a token to serve others"
            )
        return
    refusal = token_refusal(request.headers.get("authorization", "").encode("latin-1"), token)
    if refusal is not None:
        raise UnauthorizedError(refusal)


_EMPTY_BODIES = frozenset({b"", b"{}", b"null"})


async def strict_request(request: Request) -> None:
    """Refuse what a route would otherwise ignore: a query parameter it does not take (``?wiat=false`` ran the
    step and waited) and a body on a route that takes none (``{"force": true}`` did not force). An empty body,
    ``{}`` or ``null`` is what HTTP clients send by default: accepted."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = _query_names(route)
    unknown = sorted(k for k in request.query_params if k not in known)
    if unknown:
        takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
        raise UsageError(f"unknown query parameter {unknown[0][:100]!r}: {takes}")
    twice = sorted(k for k in known if len(request.query_params.getlist(k)) > 1)
    if twice:  # ?wait=true&wait=false: the last one would win, unseen
        raise UsageError(f"query parameter {twice[0]!r} is given more than once: give it once")
    # A route that reads its body itself (the skill upload, parsed off the event loop) declares it for OpenAPI.
    reads_body = getattr(route, "body_field", None) is not None or "requestBody" in (
        getattr(route, "openapi_extra", None) or {}
    )
    if not reads_body and not _empty(await request.body()):
        options = f" (its options are query parameters: {', '.join(sorted(known))})" if known else ""
        raise UsageError(f"this route takes no body{options}")


def _empty(body: bytes) -> bool:
    """Whether ``body`` says nothing: empty, or JSON ``{}`` or ``null`` however spaced, after any BOMs."""
    return b"".join(body.replace(b"\xef\xbb\xbf", b" ").split()) in _EMPTY_BODIES


_QUERY_NAMES: dict[int, frozenset[str]] = {}


def _query_names(route: Any) -> frozenset[str]:
    """The query parameters ``route`` declares, its dependencies' included (worked out once per route)."""
    names = _QUERY_NAMES.get(id(route))
    if names is None:
        found: set[str] = set()
        todo = [route.dependant]
        while todo:  # the route's own dependency tree: a few nodes
            dependant = todo.pop()
            found.update(p.alias for p in dependant.query_params)
            todo.extend(dependant.dependencies)
        names = _QUERY_NAMES[id(route)] = frozenset(found)
    return names
