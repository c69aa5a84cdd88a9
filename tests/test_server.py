"""The HTTP service, in process through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

import kindex
from kindex import LLMSettings
from kindex.server import create_app
from kindex.server.errors import MAX_BODY_BYTES
from kindex.store import read_index_file
from tests.conftest import SAMPLE_KB
from tests.fakellm import FakeLLM, Reply, user_text, well_behaved

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "/v1/agents/agent1/knowledge"


def call(app: FastAPI, method: str, url: str, *, auth: bool = True, **kw: Any) -> httpx.Response:
    headers = {**(AUTH if auth else {}), **kw.pop("headers", {})}

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, url, headers=headers, **kw)

    return asyncio.run(go())


@pytest.fixture
def kb_root(tmp_path: Path) -> Path:
    root = tmp_path / "agents"
    shutil.copytree(SAMPLE_KB, root / "agent1", ignore=shutil.ignore_patterns(".kindex", "index.json"))
    (root / "empty").mkdir()
    return root


@pytest.fixture
def app(kb_root: Path) -> FastAPI:
    return create_app(kb_root, token=TOKEN, llm=LLMSettings())


def test_steps_context_and_indexes(app: FastAPI, kb_root: Path) -> None:
    preview = call(app, "GET", f"{BASE}/reindex/preview")
    assert preview.status_code == 200 and preview.json()["steps_total"] == 19
    assert preview.json()["kb"] == "agent1" and str(kb_root) not in preview.text  # no server path for a tenant

    r = call(app, "POST", f"{BASE}/reindex/root")
    assert r.status_code == 200 and r.json()["progress"] == {"completed": 1, "total": 1}
    r = call(app, "POST", f"{BASE}/reindex/sub", json={"dir": "billing"})
    assert r.status_code == 200 and r.json()["progress"] == {"completed": 6, "total": 6}
    r = call(app, "POST", f"{BASE}/reindex/sub/doc", json={"dir": "sync", "path": "离线模式.md", "clear_dir": True})
    assert r.status_code == 200 and r.json()["written"] == ["sync/index.json"]
    r = call(app, "POST", f"{BASE}/reindex")
    assert r.status_code == 200 and r.json()["progress"] == {"completed": 19, "total": 19}
    assert kindex.validate(kb_root / "agent1") == []

    ctx = call(app, "POST", f"{BASE}/context", json={"message": "退款一般多久能到账", "budget_tokens": 500})
    assert ctx.status_code == 200
    body = ctx.json()
    assert body["items"][0]["path"] == "billing/退款政策.md" and not body["fallback"] and body["tokens"] <= 500
    assert body["warnings"] == []
    off = {"message": "讲个笑话", "fallback_docs": ["billing/套餐与价格.md"]}
    body = call(app, "POST", f"{BASE}/context", json=off).json()
    assert body["fallback"] and [i["path"] for i in body["items"]] == ["billing/套餐与价格.md"]
    assert body["warnings"] == []
    off["fallback_docs"] = ["导览.md", "billing/套餐与价格.md"]
    body = call(app, "POST", f"{BASE}/context", json=off).json()
    assert [i["path"] for i in body["items"]] == ["billing/套餐与价格.md"]
    said = [w.split(" (")[0] for w in body["warnings"]]
    assert said == ["fallback document '导览.md' is not a document of the index"]
    strict = {"message": "Kubernetes 上能退款吗", "min_relevance": 1.0}
    assert call(app, "POST", f"{BASE}/context", json=strict).json()["fallback"]

    assert call(app, "GET", f"{BASE}/index").json()["themes"][0]["dir"] == "account"
    assert call(app, "GET", f"{BASE}/index/billing").json()["themes"] == []
    assert call(app, "GET", "/healthz", auth=False).json() == {"status": "ok", "running_tasks": 0, "waiting_tasks": 0}


def test_a_paste_longer_than_the_analysed_part_is_answered_as_the_library_answers_it(
    app: FastAPI, kb_root: Path
) -> None:
    # A 28,000-character paste answered 422 (max 20,000) where the library and the CLI answer from its first and
    # last 10,000 characters; the body's 256 KiB bound it.
    assert call(app, "POST", f"{BASE}/reindex").status_code == 200
    paste = "退款一般多久能到账？\n" + "日志行 error at line 42\n" * 1_500
    assert len(paste) > kindex.retrieve.MAX_MESSAGE_CHARS
    body = call(app, "POST", f"{BASE}/context", json={"message": paste, "min_relevance": 0}).json()
    mine = kindex.build_context(kb_root / "agent1", paste, min_relevance=0)
    assert [i["path"] for i in body["items"]] == [i.path for i in mine.items] and body["text"] == mine.text
    found = call(app, "POST", f"{BASE}/search", json={"question": paste, "min_relevance": 0})
    assert found.status_code == 200 and found.json()["results"]
    named = {"message": "讲个笑话", "fallback_docs": [f"n{i}.md" for i in range(49)] + ["导读.md"]}
    assert (
        call(app, "POST", f"{BASE}/context", json=named).json()["items"][0]["path"] == "导读.md"
    )  # 50, as kindex.toml
    too_big = call(app, "POST", f"{BASE}/context", json={"message": "退" * 300_000})
    assert too_big.status_code == 413  # the body limit, before any parsing


def test_a_bad_kindex_variable_leaves_the_service_answering_and_says_so(
    kb_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # `kindex serve` refused to start with KINDEX_BUDGET_TOKENS=abc: every agent's knowledge gone for one typo that
    # the CLI and the library leave out of an answer and say.
    kindex.reindex(kb_root / "agent1")
    monkeypatch.setenv("KINDEX_BUDGET_TOKENS", "abc")
    with caplog.at_level("WARNING", logger="kindex.server"):
        app = create_app(kb_root, token=TOKEN, llm=LLMSettings())
    assert "KINDEX_BUDGET_TOKENS='abc': expected an integer: steps fail on it" in caplog.text
    body = call(app, "POST", f"{BASE}/context", json={"message": "退款一般多久能到账"}).json()
    assert body["items"][0]["path"] == "billing/退款政策.md" and body["budget_tokens"] == 6000
    assert body["warnings"] == [
        "KINDEX_BUDGET_TOKENS='abc': expected an integer: left out of this answer (fix the variable)"
    ]
    step = call(app, "POST", f"{BASE}/reindex/root")
    assert (
        step.status_code == 422 and step.json()["error"]["message"] == "KINDEX_BUDGET_TOKENS='abc': expected an integer"
    )
    with pytest.raises(kindex.UsageError):  # a bad flag is still refused at once
        create_app(kb_root, token=TOKEN, llm=LLMSettings(), concurrency=0)


def test_context_over_http_says_what_is_wrong_with_the_index(
    app: FastAPI, kb_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(kindex.retrieve, "_clock", lambda: now[0])
    assert call(app, "POST", f"{BASE}/reindex").status_code == 200
    (kb_root / "agent1" / "billing" / "index.json").unlink()
    now[0] += kindex.retrieve.THEME_RECHECK_S  # a theme index is stat-ed again after this long

    body = call(app, "POST", f"{BASE}/context", json={"message": "退款一般多久能到账"}).json()

    assert "billing/退款政策.md" not in [i["path"] for i in body["items"]]
    assert body["warnings"][0].startswith("billing/index.json cannot be read (missing)"), body
    assert str(kb_root) not in orjson.dumps(body).decode()  # no server path reaches a tenant


def test_search_over_http_lists_the_ranking_and_says_when_off_topic(app: FastAPI, kb_root: Path) -> None:
    # A chat backend had only /context: the ranking the CLI, the library and MCP give was not reachable.
    assert call(app, "POST", f"{BASE}/reindex").status_code == 200
    body = call(app, "POST", f"{BASE}/search", json={"question": "发票怎么开", "limit": 2}).json()
    assert body["results"][0]["path"] == "billing/发票开具.md" and len(body["results"]) == 2
    assert body["off_topic"] is False and body["warnings"] == []
    assert body == kindex.KnowledgeBase(kb_root / "agent1").ranking("发票怎么开", limit=2).to_dict()

    off = call(app, "POST", f"{BASE}/search", json={"question": "讲个笑话"}).json()
    assert off == {"results": [], "off_topic": True, "warnings": []}

    (kb_root / "agent1" / "billing" / "发票开具.md").unlink()
    gone = call(app, "POST", f"{BASE}/search", json={"question": "发票怎么开", "limit": 1}).json()
    assert gone["results"][0]["path"] == "billing/发票开具.md"
    assert gone["warnings"] == [
        "billing/发票开具.md is in the index but cannot be read from the folder (deleted, renamed, or grown past 5 "
        "MiB?): `kindex validate` names what to run"
    ]


def test_tasks_run_in_the_background_and_report_progress(app: FastAPI) -> None:
    r = call(app, "POST", f"{BASE}/reindex", params={"wait": "false"})
    assert r.status_code == 202 and r.headers["location"] == f"/v1/tasks/{r.json()['id']}"
    task_id = r.json()["id"]
    app.state.tasks.task(task_id).done.wait(60)

    done = call(app, "GET", f"/v1/tasks/{task_id}").json()
    assert done["state"] == "done" and done["progress"] == {"completed": 19, "total": 19}
    assert done["report"]["generator"] == "extractive"
    assert call(app, "GET", "/v1/tasks/nope").json()["error"]["code"] == "task_not_found"


def test_a_cancelled_task_writes_nothing_more_and_a_second_writer_gets_409(kb_root: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script = lambda r: Reply(well_behaved(r).content, latency=1.0)
    app = create_app(kb_root, token=TOKEN, llm=LLMSettings(model="openai/fake", api_base=fake_llm.url))
    task_id = call(app, "POST", f"{BASE}/reindex", params={"wait": "false"}).json()["id"]
    fake_llm.wait_for_requests(2)

    busy = call(app, "POST", f"{BASE}/reindex/sub", json={"dir": "billing"})
    assert busy.status_code == 409
    assert busy.json()["error"] == {
        "code": "busy",
        "message": f"agent 'agent1' is being reindexed by task {task_id}",
        "task_id": task_id,
    }

    cancelled = call(app, "DELETE", f"/v1/tasks/{task_id}")
    assert cancelled.status_code == 200
    app.state.tasks.task(task_id).done.wait(60)  # the answers in flight arrive after the cancel

    state = call(app, "GET", f"/v1/tasks/{task_id}").json()
    assert state["state"] == "cancelled" and state["error"]["code"] == "cancelled"
    agent = kb_root / "agent1"
    assert list(agent.rglob("index.json")) == []  # the late answers wrote nothing
    assert cached_count(agent) == 0


@pytest.mark.parametrize(
    ("method", "url", "body", "status", "code"),
    [
        ("GET", "/v1/agents/nobody/knowledge/index", None, 404, "kb_not_found"),
        ("GET", "/v1/agents/empty/knowledge/index", None, 409, "index_missing"),
        ("GET", "/v1/agents/a.b/knowledge/index", None, 422, "invalid_request"),
        ("GET", "/v1/agents/..%2F..%2Fetc/knowledge/index", None, 404, "not_found"),
        ("GET", "/v1/agents/" + "a" * 65 + "/knowledge/index", None, 422, "invalid_request"),
        ("GET", "/v1/agents/agent1%00/knowledge/index", None, 422, "invalid_request"),
        ("GET", f"{BASE}/index/..", None, 404, "not_found"),
        ("GET", f"{BASE}/index/%2Fetc", None, 404, "not_found"),
        ("POST", f"{BASE}/reindex/sub", {"dir": "../.."}, 404, "not_a_theme"),
        ("POST", f"{BASE}/reindex/sub", {"dir": "/etc"}, 404, "not_a_theme"),
        ("POST", f"{BASE}/reindex/sub", {"dir": "billing/../account"}, 404, "not_a_theme"),
        ("POST", f"{BASE}/reindex/sub", {"dir": "bill\u0000ing"}, 404, "not_a_theme"),
        ("POST", f"{BASE}/reindex/sub/doc", {"dir": "billing", "path": "../导读.md"}, 404, "path_not_in_theme"),
        ("POST", f"{BASE}/reindex/sub/doc", {"dir": "billing", "path": "/etc/passwd"}, 404, "path_not_in_theme"),
        ("POST", f"{BASE}/reindex/sub/doc", {"dir": "billing", "path": "x" * 2000}, 422, "invalid_request"),
        ("POST", f"{BASE}/reindex/sub", {"directory": "billing"}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "budget_tokens": 1}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "min_relevance": 1.5}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "min_relevance": False}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "budget_tokens": "100"}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "max_docs": True}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "fallback_docs": [""]}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "fallback_docs": ["/etc/passwd"]}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "fallback_docs": ["a/../../x.md"]}, 422, "invalid_request"),
        ("POST", f"{BASE}/reindex", {"force": True}, 422, "invalid_request"),  # no body taken: not "forced"
        ("POST", f"{BASE}/reindex?wiat=false", None, 422, "invalid_request"),  # ran and waited, unasked
        ("POST", f"{BASE}/context?budget_tokens=100", {"message": "x"}, 422, "invalid_request"),
        ("POST", f"{BASE}/context", {"message": "x", "k" * 100_000: 1}, 422, "invalid_request"),
        ("POST", f"{BASE}/search", {"message": "x"}, 422, "invalid_request"),  # /search asks a question
        ("POST", f"{BASE}/search", {"question": "x", "limit": 0}, 422, "invalid_request"),
        ("POST", f"{BASE}/search", {"question": "x", "limit": "5"}, 422, "invalid_request"),
        ("POST", f"{BASE}/search", {"question": "x", "min_relevance": 2}, 422, "invalid_request"),
        ("POST", "/v1/agents/nobody/knowledge/search", {"question": "x"}, 404, "kb_not_found"),
        ("GET", "/v1/nowhere", None, 404, "not_found"),
    ],
)
def test_hostile_and_wrong_requests_get_stable_json_errors(
    app: FastAPI, method: str, url: str, body: Any, status: int, code: str
) -> None:
    r = call(app, method, url, json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert "Traceback" not in r.text


def test_more_attachment_paths_than_are_used_answer_as_the_library_does(app: FastAPI, kb_root: Path) -> None:
    # They were refused (422) where the library and the CLI answer from the first 50.
    kindex.reindex(kb_root / "agent1")
    attached = [f"web/p{i}.ts" for i in range(60)]
    for route, body in (("context", {"message": "退款多久到账"}), ("search", {"question": "退款多久到账"})):
        r = call(app, "POST", f"{BASE}/{route}", json={**body, "paths": attached})
        assert r.status_code == 200, r.text
        assert "60 attachment paths given: the first 50 are used" in r.json()["warnings"]
    r = call(app, "POST", f"{BASE}/context", json={"message": "退款多久到账", "paths": attached[:50]})
    assert not any("attachment paths" in w for w in r.json()["warnings"])


def test_a_misspelt_body_field_is_refused_by_name_not_ignored(app: FastAPI) -> None:
    r = call(app, "POST", f"{BASE}/context", json={"message": "退款", "budget_token": 500})

    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    message = r.json()["error"]["message"]
    assert message == "body.budget_token: Extra inputs are not permitted (did you mean 'budget_tokens'?)"
    r = call(app, "POST", f"{BASE}/reindex/root", json={"dir": "billing"})
    assert r.json()["error"]["message"] == "this route takes no body (its options are query parameters: wait)"
    r = call(app, "POST", f"{BASE}/reindex", params={"wiat": "false"})
    assert r.json()["error"]["message"] == "unknown query parameter 'wiat': it takes wait"
    assert len(call(app, "POST", f"{BASE}/context", json={"message": "x", "k" * 100_000: 1}).text) < 1000
    r = call(app, "GET", f"{BASE}/context")  # a newcomer's GET: say which method the route takes
    assert r.status_code == 405 and r.json()["error"]["message"] == "GET is not allowed here: use POST"
    assert r.headers["allow"] == "POST"
    r = call(app, "POST", f"{BASE}/watch")  # a path with three methods, on an included router
    assert r.headers["allow"] == "GET, PUT, DELETE" and r.json()["error"]["message"].endswith("GET or PUT or DELETE")
    typo = call(app, "POST", f"{BASE}/context", json={"mesage": "退款"}).json()["error"]["message"]
    assert typo == "body.message: Field required; body.mesage: Extra inputs are not permitted (did you mean 'message'?)"
    # The context route's field sent to the search route: it was told "did you mean 'message'?", the very field.
    other = call(app, "POST", f"{BASE}/search", json={"message": "退款"}).json()["error"]["message"]
    assert other == (
        "body.question: Field required; body.message: Extra inputs are not permitted (did you mean 'question'?)"
    )
    # What HTTP clients send by default on a POST without options is no body to refuse.
    spaced = b"{" + b" " * 70 + b"}"
    for empty in (
        b"",
        b"{}",
        b"null",
        b"{ }",
        b"\xef\xbb\xbf",
        b"\xef\xbb\xbf{}",
        b"{\n}\n",
        spaced,
        b"\xef\xbb\xbf" * 2 + b"{}",
    ):
        assert call(app, "POST", f"{BASE}/reindex/root", content=empty).status_code == 200, empty
    r = call(app, "POST", f"{BASE}/reindex/root", params=[("wait", "true"), ("wait", "false")])
    assert r.json()["error"]["message"] == "query parameter 'wait' is given more than once: give it once"


def test_a_theme_index_is_served_only_for_a_scanned_theme(kb_root: Path, app: FastAPI) -> None:
    # A root index listing a theme ".." (hand-edited or damaged) made GET …/index/.. serve <kb-root>/index.json,
    # a file outside the agent's folder.
    assert call(app, "POST", f"{BASE}/reindex").status_code == 200
    (kb_root / "index.json").write_text('{"version": 1, "themes": [], "documents": []}', encoding="utf-8")
    root = orjson.loads((kb_root / "agent1" / "index.json").read_bytes())
    root["themes"].append({"dir": "..", "title": "x", "summary": "x"})
    (kb_root / "agent1" / "index.json").write_bytes(orjson.dumps(root))
    r = call(app, "GET", f"{BASE}/index/%2E%2E")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_a_theme", r.text
    _, problems = read_index_file(kb_root / "agent1" / "index.json")
    assert problems == ["themes[4] is not a usable entry"]
    assert call(app, "GET", f"{BASE}/index/billing").status_code == 200


def test_a_body_that_is_no_json_object_says_so(app: FastAPI) -> None:
    # The answers were "body.0: JSON decode error" and "body: Input should be a valid dictionary or object to
    # extract fields from".
    for content, headers, message in [
        (b"{bad", {"Content-Type": "application/json"}, "the body is not valid JSON (Expecting property name"),
        (b'{"message": "hi"}', {}, "the body must be a JSON object, sent with Content-Type: application/json"),
        (b"[1, 2]", {"Content-Type": "application/json"}, "the body must be a JSON object, sent with Content-Type"),
    ]:
        r = call(app, "POST", f"{BASE}/context", content=content, headers=headers)
        assert r.status_code == 422 and r.json()["error"]["message"].startswith(message), r.text


def test_a_symlinked_agent_folder_cannot_leave_the_root(kb_root: Path, tmp_path: Path, app: FastAPI) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(SAMPLE_KB, outside)
    (kb_root / "evil").symlink_to(outside, target_is_directory=True)
    r = call(app, "GET", "/v1/agents/evil/knowledge/reindex/preview")
    assert r.status_code == 404 and r.json()["error"]["code"] == "kb_not_found"
    # Nor lead to the root itself (its reindex overwrote agent1's root index and its context served every
    # agent's documents), nor into another agent's folder. A second name for an agent's folder is one.
    (kb_root / "root").symlink_to(".", target_is_directory=True)
    (kb_root / "part").symlink_to("agent1/billing", target_is_directory=True)
    (kb_root / "alias").symlink_to("agent1", target_is_directory=True)
    for agent, status in (("root", 404), ("part", 404), ("alias", 200)):
        r = call(app, "GET", f"/v1/agents/{agent}/knowledge/reindex/preview")
        assert r.status_code == status, (agent, r.text)
    # A folder behind a link out of the agents' folder is said to be there and refused, not said to be missing.
    (kb_root.parent / "elsewhere").mkdir()
    (kb_root / "linked").symlink_to(kb_root.parent / "elsewhere", target_is_directory=True)
    r = call(app, "GET", "/v1/agents/linked/knowledge/reindex/preview")
    assert r.status_code == 404 and r.json()["error"]["message"].startswith(
        "the folder of agent 'linked' is a symbolic link to a folder that is not directly under the agents' folder "
        "(--kb-root): it is not served"
    )
    assert str(kb_root.parent) not in r.text
    # A link loop for an agent's folder was a 500 (pathlib's RuntimeError) on every route of that agent.
    (kb_root / "loop").symlink_to("loop")
    for method, route, body in (("GET", "reindex/preview", None), ("POST", "context", {"message": "退款"})):
        r = call(app, method, f"/v1/agents/loop/knowledge/{route}", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "kb_not_found"), r.text
        assert "'loop' cannot be opened (a symbolic link loop)" in r.json()["error"]["message"]


def test_the_token_is_required_everywhere_but_healthz(app: FastAPI) -> None:
    # A token missing, sent with another scheme, or wrong: each said as it is (a client that sent a wrong one was
    # told to send one).
    said = {
        "": "send the API token as `Authorization: Bearer <token>`",
        "Bearer wrong": "the API token sent is not this server's (KINDEX_API_TOKEN where it runs): check the token",
        "Bearer ": "send the API token as `Authorization: Bearer <token>`",
        f"Basic {TOKEN}": "the Authorization header must be `Bearer <token>`: send the API token as `Authorization: "
        "Bearer <token>`",
    }
    for given, message in said.items():
        headers = {"Authorization": given} if given else {}
        r = call(app, "GET", f"{BASE}/reindex/preview", auth=False, headers=headers)
        assert r.status_code == 401 and r.json()["error"] == {"code": "unauthorized", "message": message}
        assert r.headers["www-authenticate"] == "Bearer"
    assert call(app, "GET", "/v1/tasks/x", auth=False).status_code == 401
    assert call(app, "GET", "/healthz", auth=False).status_code == 200
    # A body that fails validation is parsed before the token is checked; it answered 422 naming the field.
    json_type = {"Content-Type": "application/json"}
    for content in (b"{bad", b"[1]", b'{"message": "x", "budget_tokens": "100"}'):
        r = call(app, "POST", f"{BASE}/context", auth=False, content=content, headers=json_type)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
    r = call(app, "POST", f"{BASE}/context", content=b"{bad", headers=json_type)
    assert r.status_code == 422, r.text


def test_a_body_not_in_utf8_is_an_invalid_request_in_kindex_words(app: FastAPI) -> None:
    # It answered 400 with FastAPI's "There was an error parsing the body": a second status for invalid_request.
    body = '{"message": "退款"}'.encode("gbk")
    r = call(app, "POST", f"{BASE}/context", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == {
        "code": "invalid_request",
        "message": "the body could not be read: send a JSON object in UTF-8 (or, to upload a skill, a multipart "
        "form with its ZIP as `file`)",
    }


def test_request_bodies_are_size_limited(app: FastAPI) -> None:
    big = json.dumps({"message": "x" * (MAX_BODY_BYTES + 10)})
    r = call(app, "POST", f"{BASE}/context", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    async def chunks() -> Any:  # no Content-Length: the limit still holds
        for _ in range(20):
            yield b"x" * (MAX_BODY_BYTES // 10)

    r = call(app, "POST", f"{BASE}/context", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_a_server_fault_is_a_500_without_a_stack_trace(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kw: Any) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(kindex.generate, "preview", boom)
    r = call(app, "GET", f"{BASE}/reindex/preview")
    assert r.status_code == 500
    assert r.json() == {"error": {"code": "internal_error", "message": "internal error; see the server log"}}


@pytest.mark.slow  # a fresh interpreter, to see what it imports
def test_context_never_imports_litellm(kb_root: Path) -> None:
    kindex.reindex(kb_root / "agent1")
    probe = (
        "import sys, asyncio, httpx\n"
        "from kindex.server import create_app\n"
        "app = create_app(sys.argv[1])\n"
        "async def go():\n"
        "    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url='http://127.0.0.1') as c:\n"
        "        r = await c.post('/v1/agents/agent1/knowledge/context', json={'message': '退款多久到账'})\n"
        "        assert r.status_code == 200, r.text\n"
        "asyncio.run(go())\n"
        "print('litellm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(kb_root)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_requests_waiting_for_a_task_hold_no_thread(kb_root: Path, fake_llm: FakeLLM) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    shutil.copytree(SAMPLE_KB, kb_root / "agent2", ignore=shutil.ignore_patterns(".kindex", "index.json"))
    release = threading.Event()

    def held(request: dict[str, Any]) -> Reply:
        release.wait(60)
        return well_behaved(request)

    fake_llm.script = held
    app = create_app(kb_root, token=TOKEN, llm=LLMSettings(model="openai/fake", api_base=fake_llm.url))
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def scenario() -> int:
        # One worker in the loop's default pool: a waiting request that held it would stall the next request.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
            waiting = asyncio.create_task(client.post(f"{BASE}/reindex", params={"wait": "true"}))
            await asyncio.to_thread(fake_llm.wait_for_requests, 1)
            other = client.post(
                "/v1/agents/agent2/knowledge/reindex/sub", json={"dir": "billing"}, params={"wait": "false"}
            )
            status = (await asyncio.wait_for(other, timeout=30)).status_code  # stalled forever before the fix
            release.set()
            assert (await waiting).status_code == 200
            return status

    assert asyncio.run(scenario()) == 202


def cached_count(kb: Path) -> int:
    import sqlite3

    path = kb / ".kindex" / "answers.sqlite"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM answers").fetchone()[0])


def _one_call_per_agent(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], threading.Event, threading.Event]:
    """One read call per agent at once, and a context call that, for the message "block", says it entered and
    waits to be released: the agents computing now, and the two events."""
    import kindex.server.state as server_state

    monkeypatch.setattr(server_state, "CALLS_PER_AGENT", 1)
    inside: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def fake_context(self: kindex.KnowledgeBase, message: str, **kw: Any) -> kindex.Context:
        inside.append(self.path.name)
        if message == "block":
            entered.set()
            release.wait(30)
        inside.remove(self.path.name)
        return kindex.Context.model_construct(
            text="x", items=(), fallback=True, reason="r", missing=(), budget_tokens=1000
        )

    monkeypatch.setattr(kindex.KnowledgeBase, "context", fake_context)
    return inside, entered, release


@contextlib.asynccontextmanager
async def _agent1_blocked(
    app: FastAPI, entered: threading.Event
) -> AsyncIterator[tuple[httpx.AsyncClient, asyncio.Task[httpx.Response]]]:
    """A client, and agent1's context call "block", in the agent's one slot once this yields."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=AUTH) as client:
        first = asyncio.create_task(client.post(f"{BASE}/context", json={"message": "block"}))
        await asyncio.to_thread(entered.wait, 30)
        yield client, first


async def _until_waiting(gate: Any, request: asyncio.Task[Any]) -> int:
    """Event-loop turns (no clock) until ``request`` waits at ``gate`` or ends: how many wait there then."""
    for _ in range(100_000):
        if gate.waiting or request.done():
            break
        await asyncio.sleep(0)
    return int(gate.waiting)


def test_one_agents_flood_of_context_calls_waits_its_turn_and_others_are_served(
    kb_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(SAMPLE_KB, kb_root / "agent2", ignore=shutil.ignore_patterns(".kindex", "index.json"))
    inside, entered, release = _one_call_per_agent(monkeypatch)
    app = create_app(kb_root, token=TOKEN, llm=LLMSettings())

    async def scenario() -> None:
        async with _agent1_blocked(app, entered) as (client, first):
            second = asyncio.create_task(client.post(f"{BASE}/context", json={"message": "queued"}))
            waiting = await _until_waiting(app.state.kindex.gates["agent1"], second)
            assert waiting == 1 and inside == ["agent1"]  # it waits on the loop, holding no worker thread
            other = "/v1/agents/agent2/knowledge/context"
            r = await asyncio.wait_for(client.post(other, json={"message": "other"}), timeout=30)
            assert r.status_code == 200 and not second.done()  # another agent is served meanwhile
            release.set()
            assert (await first).status_code == 200 and (await second).status_code == 200

    asyncio.run(scenario())
    # The same app served by a new event loop (a semaphore that waited once is bound to its loop) still gates.
    entered.clear()
    release.clear()
    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("method", "route", "body"),
    [
        ("GET", "/reindex/preview", None),  # a full scan each
        ("GET", "/index", None),  # a 30 MB theme index read and written out
        ("POST", "/reindex/sub", {"dir": "nope"}),  # a scan before the step is queued
        ("PUT", "/watch", None),  # a scan
    ],
)
def test_every_route_that_scans_or_reads_index_files_waits_its_agents_turn(
    kb_root: Path, monkeypatch: pytest.MonkeyPatch, method: str, route: str, body: Any
) -> None:
    # 48 previews of one agent held every worker of the shared pool and another agent's 6 ms context call took 28 s:
    # only /context, /search and skill search waited behind the agent's gate.
    _, entered, release = _one_call_per_agent(monkeypatch)
    app = create_app(kb_root, token=TOKEN, llm=LLMSettings())

    async def scenario() -> None:
        async with _agent1_blocked(app, entered) as (client, first):
            heavy = asyncio.create_task(client.request(method, f"{BASE}{route}", json=body))
            waited = await _until_waiting(app.state.kindex.gates["agent1"], heavy)
            release.set()
            await first
            await heavy
            if route == "/watch":
                await client.delete(f"{BASE}/watch")
            assert waited == 1 and not heavy.exception()

    asyncio.run(scenario())


def test_a_nan_threshold_is_refused_as_not_a_finite_number(app: FastAPI) -> None:
    # Python's JSON reader takes NaN; it was refused as "should be less than or equal to 1".
    body = b'{"message": "x", "min_relevance": NaN}'
    r = call(app, "POST", f"{BASE}/context", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "finite number" in r.json()["error"]["message"], r.text


def gated(fake_llm: FakeLLM) -> threading.Event:
    """A model that answers only while the returned gate is set (it starts set)."""
    gate = threading.Event()
    gate.set()

    def script(request: dict[str, Any]) -> Reply:
        gate.wait(60)
        return well_behaved(request)

    fake_llm.script = script
    return gate


def hold_the_kb(app: FastAPI, kb_root: Path, fake_llm: FakeLLM, gate: threading.Event) -> str:
    """After a first reindex, a ``sub billing`` step that holds agent1's KB in the middle of a model call (until the
    gate is set again); its task id."""
    assert call(app, "POST", f"{BASE}/reindex").status_code == 200
    (kb_root / "agent1" / "billing" / "退款政策.md").write_text("# 退款\n\n改写后：要问模型。\n", encoding="utf-8")
    before = len(fake_llm.requests)
    gate.clear()
    holder: str = call(app, "POST", f"{BASE}/reindex/sub", json={"dir": "billing"}, params={"wait": "false"}).json()[
        "id"
    ]
    fake_llm.wait_for_requests(before + 1)
    return holder


def test_document_steps_sent_while_the_kb_is_busy_wait_their_turn(
    kb_root: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC §5: concurrent sub/doc calls lose no update. Each waits queued behind the step that holds the KB and runs
    in the order sent, reading its document when its turn comes; a waiting one can be cancelled and never runs;
    other steps are still refused busy, and so is a doc step past the bound of waiting steps."""
    gate = gated(fake_llm)
    monkeypatch.setattr("kindex.server.tasks.MAX_WAITING_STEPS", 3)
    app = create_app(kb_root, token=TOKEN, llm=LLMSettings(model="openai/fake", api_base=fake_llm.url))
    before = len(fake_llm.requests)
    holder = hold_the_kb(app, kb_root, fake_llm, gate)
    agent = kb_root / "agent1"
    docs = ["双重验证.md", "子账号与权限.md", "注册与实名认证.md"]
    for i, name in enumerate(docs):  # edited while the holder runs: each waiting step reads its document when it runs
        (agent / "account" / name).write_text(f"# 新版 {i}\n\n改写后的第 {i} 篇：暗号 word{i}。\n", encoding="utf-8")
    sent = [
        call(app, "POST", f"{BASE}/reindex/sub/doc", json={"dir": "account", "path": n}, params={"wait": "false"})
        for n in docs
    ]
    assert [r.status_code for r in sent] == [202, 202, 202]
    assert [r.json()["state"] for r in sent] == ["queued"] * 3
    ids = [r.json()["id"] for r in sent]

    over = call(app, "POST", f"{BASE}/reindex/sub/doc", json={"dir": "account", "path": "登录问题排查.md"})
    root = call(app, "POST", f"{BASE}/reindex/root")
    assert over.status_code == root.status_code == 409
    assert over.json()["error"]["message"] == f"agent 'agent1' is being reindexed by task {holder} and 3 more wait"
    assert call(app, "GET", "/healthz").json()["waiting_tasks"] == 3

    cancelled = call(app, "DELETE", f"/v1/tasks/{ids[1]}").json()
    assert cancelled["state"] == "cancelled" and cancelled["finished_at"] is not None
    assert cancelled["error"]["message"] == "the task was cancelled before it ran"

    gate.set()
    for task_id in [holder, *ids]:
        assert app.state.tasks.task(task_id).done.wait(60)
    states = [call(app, "GET", f"/v1/tasks/{t}").json()["state"] for t in [holder, *ids]]
    assert states == ["done", "done", "cancelled", "done"]
    asked = [user_text(r) for r in fake_llm.requests[before:]]
    # Each waiting step read its document when it ran, in the order sent; the cancelled one never asked the model.
    order = [next(i for i, text in enumerate(asked) if f"word{n}" in text) for n in (0, 2)]
    assert order[0] < order[1] and not any("word1" in text for text in asked)
    entries = {d.path: d.title for d in read_index_file(agent / "account" / "index.json")[0].documents}
    assert entries[docs[0]] == f"标题 {docs[0]}" and entries[docs[2]] == f"标题 {docs[2]}"
    assert call(app, "GET", "/healthz").json()["waiting_tasks"] == 0


def test_a_waiting_step_that_cannot_start_fails_and_hands_the_kb_on(kb_root: Path, fake_llm: FakeLLM) -> None:
    """kindex.toml broken while steps wait: each ends failed with the file's error when its turn comes (it was
    left queued, holding the agent for good), and once the file is fixed the agent takes steps again."""
    gate = gated(fake_llm)
    app = create_app(kb_root, token=TOKEN, llm=LLMSettings(model="openai/fake", api_base=fake_llm.url))
    holder = hold_the_kb(app, kb_root, fake_llm, gate)
    agent = kb_root / "agent1"
    body = {"dir": "account", "path": "双重验证.md"}
    ids = [call(app, "POST", f"{BASE}/reindex/sub/doc", json=body, params={"wait": "false"}).json()["id"] for _ in "ab"]
    (agent / "kindex.toml").write_text("[generation\n", encoding="utf-8")
    gate.set()
    for task_id in [holder, *ids]:
        assert app.state.tasks.task(task_id).done.wait(60)
    ends = [call(app, "GET", f"/v1/tasks/{t}").json() for t in ids]
    assert [(e["state"], e["error"]["code"]) for e in ends] == [("failed", "invalid_file")] * 2, ends
    assert call(app, "GET", "/healthz").json() == {"status": "ok", "running_tasks": 0, "waiting_tasks": 0}
    (agent / "kindex.toml").unlink()
    assert call(app, "POST", f"{BASE}/reindex/root").status_code == 200


def test_a_waiting_step_waits_for_another_writer_s_lock(
    kb_root: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step accepted to wait its turn, which then meets another writer's lock (a CLI run, a watcher), waits for
    it instead of failing busy at once as a new request does."""
    from kindex import generate
    from kindex.lock import write_lock

    agent = kb_root / "agent1"
    waits: list[float] = []
    other_holds, other_may_go = threading.Event(), threading.Event()

    def other_writer() -> None:
        with write_lock(agent, "another writer"):
            other_holds.set()
            other_may_go.wait(60)

    def recording_lock(kb: Path, what: str, **kwargs: Any) -> Any:
        waits.append(kwargs.get("wait", 0.0))
        if len(waits) == 3:  # the waiting step's turn (after the first reindex and the holder): another writer is in
            threading.Thread(target=other_writer).start()
            assert other_holds.wait(60)
        return write_lock(kb, what, **kwargs)

    monkeypatch.setattr(generate, "write_lock", recording_lock)
    gate = gated(fake_llm)
    app = create_app(kb_root, token=TOKEN, llm=LLMSettings(model="openai/fake", api_base=fake_llm.url))
    holder = hold_the_kb(app, kb_root, fake_llm, gate)
    body = {"dir": "account", "path": "双重验证.md"}
    waiting = call(app, "POST", f"{BASE}/reindex/sub/doc", json=body, params={"wait": "false"}).json()["id"]
    gate.set()
    assert app.state.tasks.task(holder).done.wait(60) and other_holds.wait(60)
    assert waits == [0.0, 0.0, 300.0]  # the reindex and the holder as new requests, the waiting step as accepted
    other_may_go.set()
    assert app.state.tasks.task(waiting).done.wait(60)
    assert call(app, "GET", f"/v1/tasks/{waiting}").json()["state"] == "done"


def test_a_save_sent_while_a_command_holds_the_kb_waits_and_other_steps_name_the_command(
    app: FastAPI, kb_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync hook's save sent while `kindex reindex` ran on the server was refused 409, and the refusals named the
    command as a route ("another kindex run is writing agent1 (POST /v1/agents/agent1/knowledge/reindex …)") with
    the CLI's advice to pass --wait (a hostile campaign)."""
    import kindex.lock
    from kindex.lock import write_lock

    monkeypatch.setattr(kindex.lock, "_process", lambda: "kindex reindex")
    holds, may_go = threading.Event(), threading.Event()

    def command() -> None:
        with write_lock((kb_root / "agent1").resolve(), "reindex"):
            holds.set()
            may_go.wait(60)

    cli = threading.Thread(target=command)
    cli.start()
    assert holds.wait(60)
    busy = call(app, "POST", f"{BASE}/reindex/sub", json={"dir": "billing"})
    message = busy.json()["error"]["message"]
    assert busy.status_code == 409 and "a command-line `kindex reindex`, since " in message
    assert "POST /v1" not in message and "--wait" not in message
    assert message.endswith("wait for it to finish, or send the request again once it has finished")
    saved = call(
        app, "POST", f"{BASE}/reindex/sub/doc", json={"dir": "billing", "path": "退款政策.md"}, params={"wait": "false"}
    )
    assert saved.status_code == 202
    may_go.set()
    cli.join(60)
    assert app.state.tasks.task(saved.json()["id"]).done.wait(60)
    assert call(app, "GET", f"/v1/tasks/{saved.json()['id']}").json()["state"] == "done"


def test_after_the_stop_signal_no_step_starts(app: FastAPI) -> None:
    """Requests still draining after the stop signal (uvicorn answers them before the app shuts down) must not
    start steps that stop() has already ended."""
    app.state.tasks.stop()
    r = call(app, "POST", f"{BASE}/reindex/sub/doc", json={"dir": "billing", "path": "退款政策.md"})
    assert r.status_code == 409 and r.json()["error"] == {
        "code": "cancelled",
        "message": "the server is stopping: the step was not started; send it again",
    }
    assert call(app, "GET", "/healthz").json()["running_tasks"] == 0


def test_a_knowledge_folder_given_as_the_root_neither_breaks_nor_misleads(tmp_path: Path) -> None:
    # A newcomer's mistake: the KB itself as --kb-root. Its themes look like agents; reindexing one wrote a root
    # index over the theme's index.json and broke the KB, and the agent the newcomer meant was "not found" only.
    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB, kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
    kindex.reindex(kb)
    before = {p: p.read_bytes() for p in kb.rglob("index.json")}
    app = create_app(kb, token=TOKEN, llm=LLMSettings())

    r = call(app, "POST", "/v1/agents/billing/knowledge/reindex")
    assert r.status_code == 409 and r.json()["error"]["code"] == "theme_folder", r.text
    message = r.json()["error"]["message"]
    assert message.startswith("the folder of agent 'billing' is a theme of the knowledge folder above it")
    assert "--kb-root set to the folder that holds one knowledge folder per agent" in message
    assert "kindex " not in message and str(tmp_path) not in r.text
    for route in ("context", "reindex/preview", "watch", "index"):  # reads and the watcher say the same
        method = "PUT" if route == "watch" else "POST" if route == "context" else "GET"
        body = {"message": "退款"} if route == "context" else None
        r = call(app, method, f"/v1/agents/billing/knowledge/{route}", json=body)
        assert r.status_code == 409 and r.json()["error"]["message"] == message, (route, r.text)
    r = call(app, "GET", "/v1/agents/agent1/knowledge/reindex/preview")
    assert r.status_code == 404 and "--kb-root holds an index.json" in r.json()["error"]["message"]
    assert str(tmp_path) not in r.text
    assert {p: p.read_bytes() for p in kb.rglob("index.json")} == before and kindex.validate(kb) == []


def test_a_step_is_said_to_have_ended_only_once_its_agent_is_free(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The answer to a step (and a poll's "done") came before the agent was freed: a client sending its next
    # step at once got 409 busy (seen under load in the test suite).
    from kindex.server import tasks as tasks_module

    engine = app.state.tasks
    seen: list[tuple[str, str | None]] = []
    real = tasks_module.Task.finish

    def finish(task: Any) -> None:
        seen.append((task.state, engine._running.get(task.agent_id)))
        real(task)

    monkeypatch.setattr(tasks_module.Task, "finish", finish)
    for _ in range(3):
        assert call(app, "POST", f"{BASE}/reindex/root").status_code == 200
    assert seen == [("done", None)] * 3


def test_a_steps_error_reaches_its_tenant_without_the_servers_paths(kb_root: Path, app: FastAPI) -> None:
    # Errors raised in a task's thread were recorded as the core raised them: the answer to a step, and the task
    # a poll reads, named the server's folders, where the routes' own errors are reworded for HTTP.
    (kb_root / "agent1" / ".kindex" / "answers.sqlite").mkdir(parents=True)  # no answer cache can be opened there
    r = call(app, "POST", f"{BASE}/reindex")
    assert r.status_code == 500 and r.json()["error"]["code"] == "storage_error", r.text
    assert str(kb_root) not in r.text and "agent1/.kindex/answers.sqlite is not a regular file" in r.text
    r = call(app, "POST", f"{BASE}/reindex", params={"wait": "false"})
    app.state.tasks.task(r.json()["id"]).done.wait(60)
    polled = call(app, "GET", f"/v1/tasks/{r.json()['id']}").json()
    assert polled["state"] == "failed" and str(kb_root) not in polled["error"]["message"]


def test_only_json_true_clears_a_theme_and_the_step_says_what_it_dropped(app: FastAPI, kb_root: Path) -> None:
    # "yes" and 1 were read as true: a client's string flag wiped five entries of billing without a note.
    assert call(app, "POST", f"{BASE}/reindex").status_code == 200
    theme = kb_root / "agent1" / "billing" / "index.json"
    before = theme.read_bytes()
    for flag in ("yes", 1, "false", "true", 0):
        body = {"dir": "billing", "path": "退款政策.md", "clear_dir": flag}
        r = call(app, "POST", f"{BASE}/reindex/sub/doc", json=body)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", (flag, r.text)
        assert "clear_dir" in r.json()["error"]["message"]
    assert theme.read_bytes() == before
    body = {"dir": "billing", "path": "退款政策.md", "clear_dir": True}
    r = call(app, "POST", f"{BASE}/reindex/sub/doc", json=body)
    assert r.status_code == 200 and r.json()["notes"] == [
        "billing/index.json was started afresh (clear_dir): it lists only 退款政策.md now; 5 other entries are gone "
        "until a doc or sub step adds them"
    ]


def test_the_openapi_document_lists_the_statuses_each_route_answers(app: FastAPI) -> None:
    # /healthz needs no token but was documented with 401; 405 and 500, which every route can answer, were missing,
    # and 400, which no route answers any more, was listed.
    paths = app.openapi()["paths"]
    assert sorted(paths["/healthz"]["get"]["responses"]) == ["200", "405", "500", "503"]
    context = paths["/v1/agents/{agent_id}/knowledge/context"]["post"]["responses"]
    assert {"401", "405", "422", "500"} <= set(context) and "400" not in context
