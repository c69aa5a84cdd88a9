"""The MCP server (``kindex mcp``, extra ``kindex[mcp]``): a KB's search, context and documents as MCP tools.

One KB (``kindex mcp KB``) or every agent under a folder (``kindex mcp --kb-root DIR``: each tool then takes the
``agent``), over stdio or streamable HTTP. Tools have typed inputs and structured outputs (the same records the
library returns); a failure is a tool error whose text starts with the HTTP service's code (``kb_not_found: …``)
and whose structured content is ``{"error": {"code", "message"}}``. Only documents the index lists can be read:
a path with ``..``, an absolute path or a path outside the index is refused. Tools are plain functions, which the
SDK runs on worker threads, so a slow search never stalls the transport.

Long because each tool's typed signature is its input schema and its docstring the description a model chooses
tools by; the tools read best side by side, with the output records they return.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import mcp.types as types
import orjson
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, ConfigDict, Field

import kindex
from kindex.config import MAX_BUDGET_TOKENS, MAX_DOCS_LIMIT, MIN_BUDGET_TOKENS
from kindex.errors import (
    IndexMissingError,
    InvalidFileError,
    KBNotFoundError,
    KindexError,
    NotAThemeError,
    NotFoundError,
    UsageError,
)
from kindex.fitting import cut_to_budget
from kindex.globs import normalize_path
from kindex.hosts import loopback, token_refusal
from kindex.kb import (
    AGENT_ID,
    CALLS_PER_AGENT,
    MAX_LOADED_AGENTS,
    AgentGate,
    Handles,
    KnowledgeBase,
    agent_folder,
)
from kindex.markdown import headings, section
from kindex.records import INDEX_FILE
from kindex.results import ContextItem, Ranking, SkillClosure, SkillHit
from kindex.retrieve import MAX_FALLBACK_DOCS, MAX_PATHS, MAX_SEARCH_LIMIT
from kindex.scan import document_text
from kindex.skillmodel import SKILL_FILE, package_files
from kindex.store import listed_theme_index, read_index_file


class ResourceMissing(NotFoundError, ResourceNotFoundError):
    """A resource that does not exist: a kindex error that the SDK answers as "resource not found" (-32602)."""


P = ParamSpec("P")
R = TypeVar("R")

INSTRUCTIONS = (
    "kindex serves a knowledge base of Markdown documents. To answer a question from it, call get_context with the "
    "user's message: it returns the relevant documents' text within a token budget, or the KB's overview when "
    "the question is off topic (fallback=true). Use search to see which documents match before reading, "
    "read_document to read one of them (or one section), and list_topics for what the KB covers. In a skill "
    "library, find_skills names the skills that fit a task and read_skill returns a skill's instructions."
)
DEFAULT_READ_TOKENS = 4000


class _Output(BaseModel):
    model_config = ConfigDict(frozen=True)


class ContextSources(_Output):
    """What ``get_context`` returns beside its text (the tool's text content): where the text came from."""

    items: tuple[ContextItem, ...] = Field(description="The documents in the text, in order, with why each was chosen.")
    fallback: bool = Field(description="No document matched: the text is the KB's overview.")
    reason: str
    missing: tuple[str, ...] = Field(description="Indexed documents that could not be read (reindex the KB).")
    tokens: int = Field(description="Estimated tokens of the text.")
    budget_tokens: int
    skills: tuple[SkillClosure, ...] = Field(description="In a skill library: the chosen skills and what they need.")
    warnings: tuple[str, ...] = Field(
        description="What the answer could not use (a broken kindex.toml, an index file that cannot be read, a "
        "fallback document that cannot serve): fix it and ask again."
    )


class DocumentOutput(_Output):
    path: str
    title: str
    text: str = Field(description="The document (or the section) as written, within the budget.")
    section: str | None = Field(description="The heading read, when a section was asked for.")
    truncated: bool = Field(description="The text was cut to fit the budget; ask for a section to read the rest.")
    headings: tuple[str, ...] = Field(description="Every heading of the document, to ask for a section.")


class Topic(_Output):
    dir: str
    title: str
    summary: str
    documents: int


class TopicEntry(_Output):
    path: str
    title: str
    summary: str


class TopicsOutput(_Output):
    themes: tuple[Topic, ...] = Field(description="The KB's topic folders with what each covers.")
    documents: tuple[TopicEntry, ...] = Field(description="Documents at the top of the KB (overviews).")


class SkillsOutput(_Output):
    skills: tuple[SkillHit, ...] = Field(description="One best hit per skill, best first, with its dependencies.")


class SkillOutput(_Output):
    name: str
    description: str
    instructions: str = Field(description="The skill's SKILL.md, frontmatter and all.")
    files: tuple[str, ...] = Field(description="The package's files (read them with read_document).")
    skill_dependencies: tuple[str, ...]
    tool_dependencies: tuple[str, ...]
    mcp_dependencies: tuple[str, ...]


MAX_TOOL_MESSAGE_CHARS = 256 * 1024
"""The longest message the tools take (the HTTP service's are bounded by its 256 KiB body): a chat backend passes
pastes longer than the 20,000 characters analysed on, and the library answers them from their start and end, as
it does for the CLI. Refusing them took the agent's context away on exactly the long messages."""
MAX_TOOL_PATHS = 4096
"""The most attachment paths a tool call lists (the HTTP service's are bounded by its body): the library answers
from the first 50 and says so, and a conversation's attachments past 50 should not cost it its context."""
Agent = Annotated[
    str, Field(description="The agent whose knowledge base to use: only when the server serves several (--kb-root).")
]
MinRelevance = Annotated[
    float | None,
    Field(
        description="On topic when a document covers this share of the question's informative weight; 0: any match "
        "is on topic (a long paste, a log). Default: the KB's setting.",
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
    ),
]


class Library:
    """The KBs a server answers for: one KB, or every agent folder under a root (bounded handles)."""

    def __init__(self, kb: str | os.PathLike[str] | None = None, kb_root: str | os.PathLike[str] | None = None):
        if (kb is None) == (kb_root is None):
            raise UsageError("serve one KB or a folder of agents' KBs (--kb-root), not both or neither")
        self.single = KnowledgeBase(kb) if kb is not None else None
        self.root = Path(kb_root).resolve() if kb_root is not None else None
        self._agents = Handles(MAX_LOADED_AGENTS)

    def serves(self, agent: str) -> bool:
        """Whether ``agent`` names a KB this server answers for (one stat; what the gates are kept for, so their
        number is bounded by the folders, not by the names callers send)."""
        if self.single is not None:
            return not agent
        assert self.root is not None
        return bool(AGENT_ID.fullmatch(agent)) and (self.root / agent).is_dir()

    def get(self, agent: str) -> KnowledgeBase:
        if self.single is not None:
            if agent:  # answering from the one KB would pass it off as the agent asked for
                raise UsageError(
                    f"this server serves one knowledge folder, not agents: leave out `agent` (got {agent[:64]!r})"
                )
            if not self.single.path.is_dir():
                raise KBNotFoundError(f"the knowledge folder {self.single.path.name!r} is gone")
            return self.single
        assert self.root is not None
        if not agent:
            raise UsageError("this server serves several agents: pass `agent`")
        return self._agents.get(agent_folder(self.root, agent))


def _error_result(exc: KindexError) -> types.CallToolResult:
    """A kindex failure as an MCP tool error: the code first in the text, and ``{"error": {code, message}}``."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{exc.code}: {exc.message}")],
        structured_content={"error": {"code": exc.code, "message": exc.message}},
        is_error=True,
    )


def _tool_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """The tool's kindex failures as :func:`_error_result`."""

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except KindexError as exc:
            return _error_result(exc)  # type: ignore[return-value]  # the SDK passes an error result through

    return call


class _UnknownArguments:
    """Refuses a tool call that passes an argument the tool does not take, as the HTTP service refuses a misspelt
    body field: the SDK's argument models drop unknown keys, so ``read_document`` given ``section`` (for
    ``section_heading``) returned the whole document, and a stdio server given ``agent`` answered from its one KB.
    And gives an argument the SDK's models refuse (a budget out of bounds) the code the HTTP service gives it,
    ``invalid_request``: the SDK's own error had no code."""

    def __init__(self, server: MCPServer, one_kb: bool) -> None:
        self.server = server
        self.one_kb = one_kb
        """A server of one KB: ``agent`` is not said to be taken (it is refused, saying why, by the tool)."""
        self.takes: dict[str, tuple[str, ...]] | None = None

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        params = ctx.params
        if ctx.method == "tools/call" and isinstance(params, dict):
            name, arguments = params.get("name"), params.get("arguments")
            if isinstance(name, str) and isinstance(arguments, dict):
                if self.takes is None:
                    tools = await self.server.list_tools()
                    self.takes = {t.name: tuple(t.input_schema.get("properties", {})) for t in tools}
                takes = self.takes.get(name)
                unknown = [str(k)[:100] for k in arguments if takes is not None and k not in takes]
                if unknown and takes is not None:
                    close = difflib.get_close_matches(unknown[0], takes, n=1, cutoff=0.6)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    said = [t for t in takes if not (self.one_kb and t == "agent")]
                    message = f"{name} takes no argument {unknown[0]!r}{hint}: it takes {', '.join(said)}"
                    return _error_result(UsageError(message))
                return _coded(name, await call_next(ctx))
        return await call_next(ctx)


_REFUSED = "Error executing tool {name}: "
"""How the SDK's error text starts when a tool's arguments fail its model, or the tool raised past
:func:`_tool_errors` (which a ``KindexError`` never does)."""


def _coded(name: str, result: Any) -> Any:
    """``result``, or when it is the SDK's uncoded refusal of the arguments (``N validation error(s) for
    <name>Arguments``), that refusal as :func:`_error_result` of :class:`UsageError`: one line per argument,
    ``budget_tokens: Input should be less than or equal to 200000``."""
    if not (isinstance(result, dict) and result.get("isError") and "structuredContent" not in result):
        return result
    content = result.get("content")
    text = content[0].get("text") if isinstance(content, list) and content and isinstance(content[0], dict) else None
    start = _REFUSED.format(name=name)
    if not isinstance(text, str) or not text.startswith(start) or f"for {name}Arguments" not in text[:300]:
        return result
    said: list[str] = []
    field = None
    # pydantic's layout: the argument's name, its reason indented 2, maybe a URL indented 4.
    for line in text[len(start) :].splitlines()[1:]:
        if not line.startswith(" "):
            field = line.strip()
        elif field is not None and not line.startswith("    "):
            said.append(f"{field}: {line.strip().partition(' [type=')[0]}")
            field = None
    return _error_result(UsageError(f"{name}: {'; '.join(said) or 'invalid arguments'}"))


async def _one_kb_tools(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """On a server of one KB, tools are listed without ``agent``, which only a server of several agents takes (the
    call is refused there): a client shown the argument fills it in."""
    result = await call_next(ctx)
    # The SDK answers tools/list with the result as it goes on the wire (a dict, camelCase keys).
    if ctx.method == "tools/list" and isinstance(result, dict) and isinstance(result.get("tools"), list):
        tools = [
            {**t, "inputSchema": _without_agent(t["inputSchema"])} if isinstance(t.get("inputSchema"), dict) else t
            for t in result["tools"]
        ]
        return {**result, "tools": tools}
    return result


def _without_agent(schema: dict[str, Any]) -> dict[str, Any]:
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "agent"}
    required = [r for r in schema.get("required", []) if r != "agent"]
    return {**schema, "properties": properties, **({"required": required} if "required" in schema else {})}


_AGENT_RESOURCE = "kindex://agents/"


def _agent_of(method: str, params: Any) -> str | None:
    """The agent a tool call or a resource read is for ("" for a server of one KB), ``None`` for other requests."""
    if not isinstance(params, dict):
        return None
    if method == "tools/call":
        arguments = params.get("arguments")
        agent = arguments.get("agent", "") if isinstance(arguments, dict) else None
        return agent if isinstance(agent, str) else None
    if method == "resources/read":
        uri = params.get("uri")
        if not isinstance(uri, str):
            return None
        return uri[len(_AGENT_RESOURCE) :].split("/", 1)[0] if uri.startswith(_AGENT_RESOURCE) else ""
    return None


class _AgentTurns:
    """At most :data:`kindex.kb.CALLS_PER_AGENT` tool calls and resource reads of one agent computing at once; more
    wait on the event loop, holding no worker thread (the SDK runs each tool on one of a shared pool's). 48 long
    searches of one agent put another's 6 ms search at 1.3 s, 48 reads of its 25 MB index 55 s; the HTTP service's
    routes wait the same way."""

    def __init__(self, library: Library) -> None:
        self.library = library
        self.gates: dict[str, AgentGate] = {}

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        agent = _agent_of(ctx.method, ctx.params)
        if agent is None or not self.library.serves(agent):
            return await call_next(ctx)  # refused by the tool itself, at once
        gate = self.gates.get(agent)
        if gate is None or gate.loop is not asyncio.get_running_loop():
            gate = self.gates[agent] = AgentGate(CALLS_PER_AGENT)
        async with gate:
            return await call_next(ctx)


def build_server(library: Library) -> MCPServer:
    """The MCP server for ``library``: tools, and the index files as resources."""
    server = MCPServer(name="kindex", version=kindex.__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    server.middleware.append(_UnknownArguments(server, library.single is not None))
    server.middleware.append(_AgentTurns(library))
    if library.single is not None:
        server.middleware.append(_one_kb_tools)

    @server.tool(title="Search the knowledge base")
    @_tool_errors
    def search(
        question: Annotated[
            str, Field(description="What the user asks, in their words.", max_length=MAX_TOOL_MESSAGE_CHARS)
        ],
        limit: Annotated[int, Field(description="Entries to return.", ge=1, le=MAX_SEARCH_LIMIT)] = 10,
        paths: Annotated[
            tuple[str, ...],
            Field(
                description=f"Files the user is working on (for path-scoped entries; of more than {MAX_PATHS}, the "
                "first).",
                max_length=MAX_TOOL_PATHS,
            ),
        ] = (),
        min_relevance: MinRelevance = None,
        agent: Agent = "",
    ) -> Ranking:
        """Rank the knowledge base's documents for a question, without their text: path, title, summary, score
        and the words that matched. Empty with off_topic=true when the KB does not cover the question."""
        return library.get(agent).ranking(question, paths=paths, limit=limit, min_relevance=min_relevance)

    @server.tool(title="Get the context for a message")
    @_tool_errors
    def get_context(
        message: Annotated[
            str,
            Field(
                description="The user's chat message (of one over 20,000 characters, its first and last 10,000 are "
                "used).",
                max_length=MAX_TOOL_MESSAGE_CHARS,
            ),
        ],
        budget_tokens: Annotated[
            int | None,
            Field(
                description="Token budget of the text (default: the KB's).", ge=MIN_BUDGET_TOKENS, le=MAX_BUDGET_TOKENS
            ),
        ] = None,
        max_docs: Annotated[
            int | None, Field(description="At most this many documents.", ge=1, le=MAX_DOCS_LIMIT)
        ] = None,
        paths: Annotated[
            tuple[str, ...],
            Field(
                description=f"Files the user is working on (of more than {MAX_PATHS}, the first).",
                max_length=MAX_TOOL_PATHS,
            ),
        ] = (),
        min_relevance: MinRelevance = None,
        fallback_docs: Annotated[
            tuple[Annotated[str, Field(min_length=1, max_length=1024)], ...] | None,
            Field(
                description="Overview documents for off-topic messages (KB-relative); default: the KB's setting.",
                max_length=MAX_FALLBACK_DOCS,
            ),
        ] = None,
        agent: Agent = "",
    ) -> Annotated[types.CallToolResult, ContextSources]:
        """The documents a chat message is about, as prompt-ready text under headers naming each source, within
        a token budget. When no document matches, the KB's overview (fallback=true, with the reason)."""
        ctx = library.get(agent).context(
            message,
            paths=paths,
            budget_tokens=budget_tokens,
            max_docs=max_docs,
            min_relevance=min_relevance,
            fallback_docs=fallback_docs,
        )
        sources = ContextSources.model_construct(**{k: getattr(ctx, k) for k in ContextSources.model_fields})
        return _text_and_record(ctx.text, sources)

    @server.tool(title="Read a document")
    @_tool_errors
    def read_document(
        path: Annotated[
            str, Field(description="The document's KB-relative path, as search returns it.", max_length=1024)
        ],
        section_heading: Annotated[
            str | None, Field(description="Read only the section under this heading.", max_length=200)
        ] = None,
        budget_tokens: Annotated[
            int, Field(description="Token budget of the text.", ge=MIN_BUDGET_TOKENS, le=MAX_BUDGET_TOKENS)
        ] = DEFAULT_READ_TOKENS,
        agent: Agent = "",
    ) -> Annotated[types.CallToolResult, DocumentOutput]:
        """Read one document of the knowledge base (or one of its sections) as written, within a token budget.
        Only documents the index lists can be read."""
        kb = library.get(agent)
        rel = _indexed_path(kb, path)
        text = document_text(kb.path, rel)
        if text is None:
            raise InvalidFileError(f"{rel} is in the index but cannot be read: reindex the KB")
        part = section(text, section_heading) if section_heading else text
        if part is None:
            names = ", ".join(repr(h) for h in headings(text)[:20]) or "none"
            raise NotFoundError(f"{rel} has no heading {section_heading!r}; its headings: {names}")
        cut = cut_to_budget(part, budget_tokens)
        entry = kb.retriever.loaded().index.docs[kb.retriever.loaded().by_path[rel]].entry
        page = DocumentOutput(
            path=rel,
            title=str(entry.get("title", "")),
            text=cut or "",
            section=section_heading,
            truncated=cut != part,
            headings=headings(text),
        )
        return _text_and_record(page.text, page)

    @server.tool(title="List the topics")
    @_tool_errors
    def list_topics(agent: Agent = "") -> TopicsOutput:
        """What the knowledge base covers: its topic folders with their summaries and document counts, and the
        documents at its top."""
        index = library.get(agent).retriever.loaded().index
        counts: dict[str, int] = {}
        for d in index.docs:
            if d.theme:
                counts[d.theme] = counts.get(d.theme, 0) + 1
        return TopicsOutput(
            themes=tuple(
                Topic(dir=t.dir, title=t.item.title, summary=t.item.summary, documents=counts.get(t.dir, 0))
                for t in index.themes
            ),
            documents=tuple(
                TopicEntry(path=d.path, title=str(d.entry["title"]), summary=str(d.entry["summary"]))
                for d in index.docs
                if d.theme is None
            ),
        )

    @server.tool(title="Find skills for a task")
    @_tool_errors
    def find_skills(
        task: Annotated[str, Field(description="What needs doing, in the user's words.", max_length=20_000)],
        limit: Annotated[int, Field(description="Skills to return.", ge=1, le=50)] = 5,
        agent: Agent = "",
    ) -> SkillsOutput:
        """In a skill library: the skills that fit a task, one best hit each, with the skills, tools and MCP
        servers each needs. Load a skill's instructions with read_skill."""
        kb = _library_of(library.get(agent))
        return SkillsOutput(skills=tuple(kb.find_skills(task, limit=limit)))

    @server.tool(title="Read a skill")
    @_tool_errors
    def read_skill(
        name: Annotated[str, Field(description="The skill's name, as find_skills returns it.", max_length=64)],
        agent: Agent = "",
    ) -> SkillOutput:
        """In a skill library: a skill's instructions (its SKILL.md), its files and what it needs."""
        kb = _library_of(library.get(agent))
        skill = kb.skill(name)
        folder = kb.path / skill.folder
        text = document_text(kb.path, f"{skill.folder}/{SKILL_FILE}") or ""
        closure = kb.skill_closure(name)
        return SkillOutput(
            name=skill.name,
            description=skill.shown_description,
            instructions=text,
            files=tuple(f"{skill.folder}/{rel}" for rel, _ in package_files(folder)),
            **closure.as_fields(),
        )

    if library.single is not None:

        @server.resource("kindex://index.json", name="root_index", mime_type="application/json")
        def root_resource() -> str:
            """The KB's root index: its topics and top documents with their summaries."""
            return _index_json(library.get(""), None)

        @server.resource("kindex://themes/{dir}/index.json", name="theme_index", mime_type="application/json")
        def theme_resource(dir: str) -> str:
            """One topic folder's index: its documents with their summaries."""
            return _index_json(library.get(""), dir)

    else:

        @server.resource("kindex://agents/{agent}/index.json", name="root_index", mime_type="application/json")
        def agent_root_resource(agent: str) -> str:
            """An agent's root index: its topics and top documents with their summaries."""
            return _index_json(_resource_kb(library, agent), None)

        @server.resource(
            "kindex://agents/{agent}/themes/{dir}/index.json", name="theme_index", mime_type="application/json"
        )
        def agent_theme_resource(agent: str, dir: str) -> str:
            """One topic folder's index of an agent: its documents with their summaries."""
            return _index_json(_resource_kb(library, agent), dir)

    return server


def _text_and_record(text: str, record: BaseModel) -> types.CallToolResult:
    # The model reads the text itself (not the record re-encoded as indented JSON, the SDK's default, which would
    # double what crosses the transport); clients that want the fields read the structured content.
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=record.model_dump(mode="json")
    )


_DRIVE = re.compile(r"[A-Za-z]:[\\/]")


def _indexed_path(kb: KnowledgeBase, path: str) -> str:
    rel = normalize_path(path)
    # A drive (C:/, C:\\) is absolute; a colon elsewhere is part of a name ("Q: billing.md"), as search returns it.
    if not rel or ".." in rel.split("/") or path.startswith(("/", "\\")) or _DRIVE.match(path):
        raise UsageError(f"{path!r} is not a KB-relative path: use a path that search returns")
    if rel not in kb.retriever.loaded().by_path:
        raise NotFoundError(f"{rel!r} is not a document of this KB's index: use a path that search returns")
    return rel


def _library_of(kb: KnowledgeBase) -> KnowledgeBase:
    if not kb.is_skill_library:
        raise NotFoundError("this KB is not a skill library (no folder holds a SKILL.md)")
    return kb


def _resource_kb(library: Library, agent: str) -> KnowledgeBase:
    try:
        return library.get(agent)
    except KindexError as exc:
        raise ResourceMissing(f"{exc.code}: {exc.message}") from None


def _index_json(kb: KnowledgeBase, dir_name: str | None) -> str:
    try:
        root, _ = read_index_file(kb.path / INDEX_FILE)
        if dir_name is None:
            return root.to_json().decode()
        try:
            path = listed_theme_index(kb.path, root, dir_name)
        except NotAThemeError:
            raise ResourceMissing(f"not_a_theme: {dir_name!r} is not a topic of this KB") from None
        theme, _ = read_index_file(path, kb.path)
        return theme.to_json().decode()
    except (OSError, InvalidFileError, IndexMissingError):
        raise ResourceMissing("index_missing: this KB has no index yet: run `kindex reindex` on it") from None


# -- HTTP ---------------------------------------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def http_app(server: MCPServer, *, token: str | None, host: str, port: int) -> ASGIApp:
    """The streamable HTTP app at ``/mcp``: a bearer token when one is set; without one, this machine only
    (refused for a non-loopback ``host``; Host and Origin must name this machine)."""
    if token is None and not loopback(host):
        raise UsageError(f"refusing to serve MCP on {host} without KINDEX_API_TOKEN: set a token, or use 127.0.0.1")
    if token is None or loopback(host):
        names = ["127.0.0.1", "localhost", "[::1]"]
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[f"{n}:{p}" for n in names for p in ("*", str(port))],
            allowed_origins=[f"http://{n}:{p}" for n in names for p in ("*", str(port))],
        )
    else:  # a public bind: the token is the guard
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(
        streamable_http_path="/mcp", transport_security=security, json_response=True, stateless_http=True
    )
    return app if token is None else _BearerGuard(app, token)


class _BearerGuard:
    """Requests without ``Authorization: Bearer <token>`` get 401; lifespan events pass (the SDK's session manager
    starts in the app's lifespan)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] == "http":
            # The first Authorization header, as kindex serve reads it (a dict would keep the last of several).
            sent = next((v for k, v in scope.get("headers") or [] if k.lower() == b"authorization"), b"")
            refusal = token_refusal(sent, self.token)
            if refusal is not None:
                body = orjson.dumps({"error": {"code": "unauthorized", "message": refusal}})
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
