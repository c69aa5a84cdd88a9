"""The MCP server driven by the SDK's own client: over stdio (a `kindex mcp` subprocess) and over streamable HTTP
(the app under uvicorn), every tool, the resources, hostile arguments and the token."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import orjson
import pytest
import uvicorn
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent, TextResourceContents

import kindex
from kindex.mcpserver import Library, build_server, http_app
from tests.conftest import REPO

TOOLS = {"search", "get_context", "read_document", "list_topics", "find_skills", "read_skill"}
TOKEN = "mcp-test-token"


@pytest.fixture
def indexed(sample_kb: Path) -> Path:
    kindex.reindex(sample_kb)
    return sample_kb


@pytest.fixture
def library(tmp_path: Path) -> Path:
    lib = tmp_path / "agents" / "skills"
    for name, desc, extra in (
        ("pdf-tools", "Create, merge and split PDF files.", "skill_dependencies: [file-io]\n"),
        ("file-io", "Read and write files safely.", "tool_dependencies: [cp]\n"),
    ):
        (lib / name).mkdir(parents=True)
        (lib / name / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: {desc}\n{extra}---\n# {name}\n\n{desc}\n", encoding="utf-8"
        )
    kindex.reindex(lib)
    return lib


def stdio(kb: Path, mode: str = "auto") -> Client:
    env = {"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", ""), "HOME": str(kb.parent), "KINDEX_MODEL": ""}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kindex.cli", "mcp", str(kb)], env=env)
    return Client(params, mode=mode)


def text_of(item: object) -> str:
    assert isinstance(item, TextContent | TextResourceContents), item
    return item.text


def error_code(result: Any) -> str:
    assert result.is_error, result
    code = str(result.structured_content["error"]["code"])
    assert text_of(result.content[0]).startswith(f"{code}: ")
    return code


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_every_tool_over_stdio(indexed: Path, mode: str) -> None:
    async def session() -> None:
        async with stdio(indexed, mode) as c:
            assert {t.name for t in (await c.list_tools()).tools} == TOOLS
            found = await c.call_tool("search", {"question": "退款多久到账", "limit": 3})
            results = found.structured_content["results"]
            assert not found.is_error and results[0]["path"] == "billing/退款政策.md" and len(results) <= 3
            off = await c.call_tool("search", {"question": "今天上海会下雨吗"})
            assert off.structured_content == {"results": [], "off_topic": True, "warnings": []}

            ctx = await c.call_tool("get_context", {"message": "退款多久到账", "budget_tokens": 400})
            body = ctx.structured_content
            text = text_of(ctx.content[0])  # the text the model reads; the structured content says where it came from
            assert body["items"][0]["path"] == "billing/退款政策.md" and "(source: billing/退款政策.md)" in text
            assert body["tokens"] <= 400 and body["fallback"] is False and "text" not in body

            doc = await c.call_tool("read_document", {"path": "billing/退款政策.md"})
            page = doc.structured_content
            source = (indexed / "billing" / "退款政策.md").read_text(encoding="utf-8")
            assert page["title"] == "退款政策" and page["headings"] and page["text"].splitlines()[0] in source
            assert text_of(doc.content[0]) == page["text"]
            heading = page["headings"][1]
            part = await c.call_tool("read_document", {"path": "billing/退款政策.md", "section_heading": heading})
            assert part.structured_content["text"].lstrip("# ").startswith(heading)
            assert len(part.structured_content["text"]) < len(page["text"])

            topics = (await c.call_tool("list_topics", {})).structured_content
            assert {t["dir"] for t in topics["themes"]} == {"account", "billing", "developer", "sync"}
            assert "导读.md" in {d["path"] for d in topics["documents"]}

            resources = [r.uri for r in (await c.list_resources()).resources]
            templates = [t.uri_template for t in (await c.list_resource_templates()).resource_templates]
            assert resources == ["kindex://index.json"] and templates == ["kindex://themes/{dir}/index.json"]
            theme = await c.read_resource("kindex://themes/billing/index.json")
            assert text_of(theme.contents[0]) == (indexed / "billing" / "index.json").read_text(encoding="utf-8")
            with pytest.raises(MCPError):
                await c.read_resource("kindex://themes/nowhere/index.json")

    anyio.run(session)


@pytest.mark.slow
def test_hostile_arguments_are_tool_errors_and_nothing_outside_the_index_is_read(indexed: Path) -> None:
    (indexed.parent / "secret.md").write_text("# secret\n\nnot in the KB\n", encoding="utf-8")
    (indexed / "Q: 账单.md").write_text("# 账单问答\n\n账单怎么看。\n", encoding="utf-8")
    kindex.reindex(indexed)
    (indexed / "billing" / "unindexed.md").write_text("# 未索引\n\n还没有索引。\n", encoding="utf-8")

    async def session() -> None:
        async with stdio(indexed) as c:
            for path in ("../secret.md", "/etc/passwd", "billing/../../secret.md", "C:/secret.md", "c:\\secret.md"):
                assert error_code(await c.call_tool("read_document", {"path": path})) == "invalid_request", path
            for path in ("billing/unindexed.md", "billing/index.json", ".kindex/search.npz", "c:secret.md"):
                assert error_code(await c.call_tool("read_document", {"path": path})) == "not_found", path
            # A colon in a name is no drive (C:/), even second: a path search returns was refused.
            faq = await c.call_tool("read_document", {"path": "Q: 账单.md"})
            assert not faq.is_error and faq.structured_content["path"] == "Q: 账单.md"
            missing = await c.call_tool("read_document", {"path": "billing/退款政策.md", "section_heading": "无此标题"})
            assert error_code(missing) == "not_found" and "its headings:" in text_of(missing.content[0])
            huge = await c.call_tool("get_context", {"message": "退款", "budget_tokens": 10**9})
            # Refused by the input schema, with the HTTP service's code (the SDK's own error had none).
            assert error_code(huge) == "invalid_request" and "budget_tokens: Input should be less" in text_of(
                huge.content[0]
            )
            assert error_code(await c.call_tool("find_skills", {"task": "pdf"})) == "not_found"

    anyio.run(session)


@pytest.mark.slow
def test_skill_tools_over_stdio(library: Path) -> None:
    async def session() -> None:
        async with stdio(library) as c:
            hits = (await c.call_tool("find_skills", {"task": "merge two PDF files", "limit": 2})).structured_content
            best = hits["skills"][0]
            assert best["name"] == "pdf-tools" and best["skill_dependencies"] == ["file-io"]
            skill = (await c.call_tool("read_skill", {"name": "pdf-tools"})).structured_content
            assert skill["instructions"].startswith("# pdf-tools") and skill["tool_dependencies"] == ["cp"]
            assert skill["files"] == ["pdf-tools/SKILL.md"]
            assert error_code(await c.call_tool("read_skill", {"name": "nope"})) == "not_found"

    anyio.run(session)


@asynccontextmanager
async def http_client(url: str, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(url, http_client=http)) as c,
    ):
        yield c


@pytest.fixture
def serving(indexed: Path, library: Path) -> Iterator[str]:
    """Every agent under one folder (the KB as `kb`, the skill library as `skills`) over HTTP with a token.

    The socket listens before the server thread starts, so a client's first request waits in its backlog: no
    polling for readiness."""
    indexed.rename(library.parent / "kb")
    root = library.parent
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = http_app(build_server(Library(kb_root=root)), token=TOKEN, host="127.0.0.1", port=port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.mark.slow
def test_every_agent_over_http_with_the_token(serving: str) -> None:
    async def session() -> None:
        async with http_client(serving, TOKEN) as c:
            assert {t.name for t in (await c.list_tools()).tools} == TOOLS
            found = await c.call_tool("search", {"question": "发票怎么开", "agent": "kb"})
            assert found.structured_content["results"][0]["path"] == "billing/发票开具.md"
            page = await c.call_tool("read_document", {"path": "billing/发票开具.md", "agent": "kb"})
            assert page.structured_content["title"] == "发票开具"
            topics = await c.call_tool("list_topics", {"agent": "kb"})
            assert len(topics.structured_content["themes"]) == 4
            skill = await c.call_tool("read_skill", {"name": "file-io", "agent": "skills"})
            assert skill.structured_content["tool_dependencies"] == ["cp"]
            ctx = await c.call_tool("get_context", {"message": "退款多久到账", "agent": "kb"})
            assert not ctx.is_error and ctx.structured_content["items"][0]["path"] == "billing/退款政策.md"
            skills = await c.call_tool("find_skills", {"task": "merge PDF files", "agent": "skills"})
            assert skills.structured_content["skills"][0]["name"] == "pdf-tools"
            assert error_code(await c.call_tool("search", {"question": "退款"})) == "invalid_request"  # no agent
            assert error_code(await c.call_tool("search", {"question": "退款", "agent": "../kb"})) == "invalid_request"
            assert error_code(await c.call_tool("search", {"question": "退款", "agent": "ghost"})) == "kb_not_found"
            index = await c.read_resource("kindex://agents/kb/index.json")
            assert '"themes"' in text_of(index.contents[0])

    anyio.run(session)


@pytest.mark.slow
def test_http_refuses_requests_without_the_token_and_foreign_hosts(serving: str) -> None:
    async def probe() -> None:
        async with httpx2.AsyncClient() as anon:
            denied = await anon.post(serving, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
            wrong = await anon.post(serving, json={}, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and "is not this server's" in wrong.json()["error"]["message"]
            # Of two Authorization headers the first counts, as kindex serve reads them (the last one passed).
            two = [("Authorization", "Bearer nope"), ("Authorization", f"Bearer {TOKEN}")]
            assert (await anon.post(serving, json={}, headers=two)).status_code == 401
            lower = await anon.post(
                serving,
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                headers={"Authorization": f"bearer {TOKEN}", "Accept": "application/json, text/event-stream"},
            )
            assert lower.status_code != 401  # the scheme is case-insensitive, as for kindex serve
            rebound = await anon.post(
                serving,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={
                    "Authorization": f"Bearer {TOKEN}",
                    "Host": "evil.example",
                    "Content-Type": "application/json",
                },
            )
            assert rebound.status_code in (403, 421)  # the SDK's DNS-rebinding guard

    anyio.run(probe)


@pytest.mark.slow
def test_http_keeps_no_session_a_client_must_close(serving: str) -> None:
    # Each session was kept 30 minutes (the SDK's idle reap) unless the client sent DELETE, which a killed client
    # never does: 67 KB a session, up to 10,000 sessions. Every tool is one request and answer, so none is kept: no
    # session id is given, and a call on its own (to another replica behind a balancer) is answered.
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "search", "arguments": {"question": "发票怎么开", "agent": "kb"}},
    }

    async def probe() -> None:
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            opened = await http.post(serving, json=init)
            assert opened.status_code == 200 and "mcp-session-id" not in opened.headers
            alone = await http.post(serving, json=call, headers={"mcp-protocol-version": "2025-06-18"})
            found = alone.json()["result"]["structuredContent"]["results"]
            assert found[0]["path"] == "billing/发票开具.md"

    anyio.run(probe)


def test_a_theme_resource_behind_a_link_is_not_read(indexed: Path, tmp_path: Path) -> None:
    # MCP checked only that the root index listed the theme: a theme folder linked to another agent's served its
    # index (titles, summaries) where the HTTP route answered not_a_theme.
    from kindex.mcpserver import ResourceMissing, _index_json

    bob = tmp_path / "bob"
    bob.mkdir()
    (bob / "index.json").write_bytes(
        orjson.dumps(
            {
                "version": 1,
                "themes": [],
                "documents": [{"path": "plan.md", "title": "收购计划", "summary": "收购 ZEBRACORP"}],
            }
        )
    )
    (indexed / "secret").symlink_to(bob, target_is_directory=True)
    root = orjson.loads((indexed / "index.json").read_bytes())
    root["themes"].append({"dir": "secret", "title": "secret", "summary": "secret"})
    (indexed / "index.json").write_bytes(orjson.dumps(root))
    with pytest.raises(ResourceMissing, match="not_a_theme"):
        _index_json(kindex.KnowledgeBase(indexed), "secret")
    assert "退款政策.md" in _index_json(kindex.KnowledgeBase(indexed), "billing")


def test_one_agents_tool_calls_wait_their_turn_and_other_agents_are_served(
    indexed: Path, library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 48 long searches of one agent put another agent's 6 ms search at 1.3 s: every call took a worker of the SDK's
    # shared pool at once.
    from types import SimpleNamespace

    import kindex.mcpserver as mcpserver

    indexed.rename(library.parent / "kb")
    monkeypatch.setattr(mcpserver, "CALLS_PER_AGENT", 1)
    turns = mcpserver._AgentTurns(Library(kb_root=library.parent))

    def call(agent: object) -> Any:
        return SimpleNamespace(method="tools/call", params={"name": "search", "arguments": {"agent": agent}})

    async def scenario() -> None:
        release = asyncio.Event()

        async def blocked(ctx: Any) -> str:
            await release.wait()
            return "first"

        async def answered(ctx: Any) -> str:
            return "answered"

        first = asyncio.create_task(turns(call("kb"), blocked))
        await asyncio.sleep(0)
        second = asyncio.create_task(turns(call("kb"), answered))
        for _ in range(1000):  # event-loop turns, no clock
            if turns.gates["kb"].waiting:
                break
            await asyncio.sleep(0)
        assert turns.gates["kb"].waiting == 1 and not second.done()
        read = SimpleNamespace(method="resources/read", params={"uri": "kindex://agents/kb/index.json"})
        third = asyncio.create_task(turns(read, answered))  # a resource read (a 25 MB index) waits its turn too
        for _ in range(1000):
            if turns.gates["kb"].waiting == 2:
                break
            await asyncio.sleep(0)
        assert turns.gates["kb"].waiting == 2 and not third.done()
        assert await turns(call("skills"), answered) == "answered"  # another agent meanwhile
        assert await turns(call("../kb"), answered) == "answered"  # no gate for a name that is no agent's folder
        assert set(turns.gates) == {"kb", "skills"}
        release.set()
        assert (await first, await second, await third) == ("first", "answered", "answered")

    asyncio.run(scenario())


def test_mcp_keeps_as_many_agents_loaded_as_the_http_service(tmp_path: Path) -> None:
    # It kept 32 (the module functions' bound), the service 64: at 50 active agents every call reloaded one.
    from kindex.kb import MAX_LOADED_AGENTS

    assert Library(kb_root=tmp_path)._agents._limit == MAX_LOADED_AGENTS == 64


def test_a_public_bind_needs_a_token(indexed: Path) -> None:
    server = build_server(Library(kb=indexed))
    with pytest.raises(kindex.UsageError, match="without KINDEX_API_TOKEN"):
        http_app(server, token=None, host="0.0.0.0", port=8766)
    http_app(server, token="t", host="0.0.0.0", port=8766)


def test_a_removed_kb_is_kb_not_found(indexed: Path) -> None:
    import shutil

    server = build_server(Library(kb=indexed))

    async def session() -> None:
        async with Client(server) as c:
            assert not (await c.call_tool("search", {"question": "退款"})).is_error
            shutil.rmtree(indexed)
            assert error_code(await c.call_tool("search", {"question": "退款"})) == "kb_not_found"

    anyio.run(session)


def test_an_argument_a_tool_does_not_take_is_refused(indexed: Path) -> None:
    # The SDK's argument models dropped unknown keys: `section` for `section_heading` returned the whole document,
    # and `agent` given to a server of one KB answered from that KB as if it were the agent asked for.
    server = build_server(Library(kb=indexed))

    async def session() -> None:
        async with Client(server) as c:
            wrong = await c.call_tool("read_document", {"path": "billing/退款政策.md", "section": "退款时效"})
            assert wrong.is_error and wrong.structured_content == {
                "error": {
                    "code": "invalid_request",
                    "message": "read_document takes no argument 'section' (did you mean 'section_heading'?): it "
                    "takes path, section_heading, budget_tokens",
                }
            }
            other = await c.call_tool("get_context", {"message": "退款", "agent": "other"})
            assert error_code(other) == "invalid_request"
            assert "this server serves one knowledge folder, not agents: leave out `agent`" in text_of(other.content[0])
            right = await c.call_tool("read_document", {"path": "billing/退款政策.md"})
            assert not right.is_error

    anyio.run(session)


def test_a_server_of_one_kb_lists_no_agent_argument(indexed: Path, library: Path) -> None:
    # Its tools listed `agent` (refused if given): a client shown the argument fills it in.
    async def schemas(server: Any) -> dict[str, set[str]]:
        async with Client(server) as c:
            return {t.name: set(t.input_schema.get("properties", {})) for t in (await c.list_tools()).tools}

    one = anyio.run(schemas, build_server(Library(kb=indexed)))
    several = anyio.run(schemas, build_server(Library(kb_root=library.parent)))
    assert set(one) == set(several) == TOOLS
    assert all("agent" not in props for props in one.values()), one
    assert all("agent" in props and props - {"agent"} == one[name] for name, props in several.items())


def test_get_context_answers_as_the_library_does_its_warnings_long_pastes_and_options_included(indexed: Path) -> None:
    # A differential campaign: the tool left out `warnings` (a broken kindex.toml was never said to the agent),
    # refused messages over 20,000 characters the library answers from their start and end, and took neither
    # min_relevance nor fallback_docs.
    (indexed / "kindex.toml").write_text("[retrieval\nbudget_tokens = 300\n", encoding="utf-8")
    paste = "退款多久到账？\n" + "日志行 error at line 42\n" * 1_500
    assert len(paste) > 20_000
    server = build_server(Library(kb=indexed))

    async def session() -> None:
        async with Client(server) as c:
            cases: tuple[dict[str, Any], ...] = (
                {"message": "退款多久到账"},
                {"message": paste, "min_relevance": 0},
                {"message": "讲个笑话", "fallback_docs": ["00-总则与功能导航.md"], "budget_tokens": 300},
            )
            for args in cases:
                got = await c.call_tool("get_context", args)
                assert not got.is_error, got
                mine = kindex.build_context(
                    indexed,
                    args["message"],
                    min_relevance=args.get("min_relevance"),
                    fallback_docs=args.get("fallback_docs"),
                    budget_tokens=args.get("budget_tokens"),
                )
                body = got.structured_content
                assert text_of(got.content[0]) == mine.text
                assert [i["path"] for i in body["items"]] == [i.path for i in mine.items]
                assert tuple(body["warnings"]) == mine.warnings and any("kindex.toml" in w for w in mine.warnings)
            named = await c.call_tool("get_context", {"message": "讲个笑话", "fallback_docs": ["00-总则与功能导航.md"]})
            assert named.structured_content["items"][0]["path"] == "00-总则与功能导航.md"
            sizes = []
            for question, relevance in ((paste, 0), ("开发票 量子计算机 芯片", 0), ("开发票 量子计算机 芯片", 0.9)):
                found = await c.call_tool("search", {"question": question, "min_relevance": relevance})
                mine_found = kindex.search(indexed, question, min_relevance=relevance)
                assert [r["path"] for r in found.structured_content["results"]] == [h.path for h in mine_found]
                sizes.append(len(mine_found))
            assert sizes[0] > 0 and sizes[1] > 0 and sizes[2] == 0  # the argument counts
            # The bounds the HTTP service and kindex.toml have: 200 entries, 50 overview documents.
            many = await c.call_tool("search", {"question": "退款", "limit": 200, "min_relevance": 0})
            assert not many.is_error and many.structured_content["results"]  # (it was refused over 50)
            named_many = {"message": "讲个笑话", "fallback_docs": [f"n{i}.md" for i in range(49)] + ["导读.md"]}
            assert (await c.call_tool("get_context", named_many)).structured_content["items"][0]["path"] == "导读.md"
            # More attachments than are used: the answer stands, from the first 50, and says so (it was refused).
            attached = [f"web/p{i}.ts" for i in range(60)]
            wide = await c.call_tool("get_context", {"message": "退款多久到账", "paths": attached})
            mine_wide = kindex.build_context(indexed, "退款多久到账", paths=attached)
            assert not wide.is_error and tuple(wide.structured_content["warnings"]) == mine_wide.warnings
            assert "60 attachment paths given: the first 50 are used" in mine_wide.warnings
            # A fallback document no KB can hold is refused as the CLI refuses it (it was a warning).
            outside = await c.call_tool("get_context", {"message": "讲个笑话", "fallback_docs": ["/etc/passwd"]})
            assert error_code(outside) == "invalid_request"
            assert "fallback_docs: '/etc/passwd' is not a KB-relative path" in text_of(outside.content[0])
            bad = await c.call_tool("get_context", {"message": "退款", "min_relevance": 2})
            assert error_code(bad) == "invalid_request"
            assert bad.structured_content["error"]["message"] == (
                "get_context: min_relevance: Input should be less than or equal to 1"
            )

    anyio.run(session)


def test_an_sdk_refusal_of_the_arguments_gets_a_code_whatever_its_layout() -> None:
    from kindex.mcpserver import _coded

    def sdk(text: str) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": text}], "isError": True}

    head = "Error executing tool get_context: 2 validation errors for get_contextArguments\n"
    with_urls = head + (
        "budget_tokens\n  Input should be less than or equal to 200000 [type=less_than_equal, input_value=9]\n"
        "    For further information visit https://errors.pydantic.dev/2/v/less_than_equal\n"
        "message\n  Field required [type=missing, input_value={}]\n    For further information visit https://x\n"
    )
    without_urls = (
        head + "budget_tokens\n  Input should be less than or equal to 200000 [type=x]\nmessage\n  Field required\n"
    )
    said = "get_context: budget_tokens: Input should be less than or equal to 200000; message: Field required"
    for text in (with_urls, without_urls):
        got = _coded("get_context", sdk(text))
        assert got.structured_content == {"error": {"code": "invalid_request", "message": said}}
    # Anything else passes through as it is: a result, a coded error, another tool's text, an internal error.
    for other in (
        {"content": [], "isError": False},
        {**sdk("invalid_request: x"), "structuredContent": {"error": {}}},
        sdk(head.replace("get_context", "search") + "x\n  y\n"),
        sdk("Error executing tool get_context: boom"),
    ):
        assert _coded("get_context", other) is other
