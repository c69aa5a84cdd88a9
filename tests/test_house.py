"""The structure's promises: one schema for validate and the OpenAPI document, async twins inside a running loop,
the security policy inside create_app, and the architecture check itself."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

import kindex
from kindex.server import create_app
from tests.conftest import REPO


@pytest.fixture
def indexed(sample_kb: Path) -> Path:
    kindex.reindex(sample_kb)
    return sample_kb


def _openapi_index_validator() -> Draft202012Validator:
    components = create_app(REPO / "sample_kb").openapi()["components"]
    return Draft202012Validator({"$ref": "#/components/schemas/Index", "components": components})


Mutation = Callable[[dict[str, Any]], None]


def _doc(field: str, value: Any) -> Mutation:
    return lambda index: index["documents"][0].__setitem__(field, value)


def _theme(field: str, value: Any) -> Mutation:
    return lambda index: index["themes"][0].__setitem__(field, value)


# Each bound of index.json's schema, broken once: validate and the published OpenAPI schema must both reject it.
BROKEN: dict[str, Mutation] = {
    "title over 80": _doc("title", "标" * 81),
    "empty title": _doc("title", ""),
    "title with a newline": _doc("title", "a\nb"),
    "summary over 400": _doc("summary", "长" * 401),
    "tag over 32": _doc("tags", ["t" * 33]),
    "more than 12 tags": _doc("tags", [f"t{i}" for i in range(13)]),
    "tags not strings": _doc("tags", [1, 2]),
    "more than 6 questions": _doc("questions", [f"q{i}?" for i in range(7)]),
    "question over 100": _doc("questions", ["问" * 101]),
    "more than 16 globs": _doc("paths", [f"**/*.x{i}" for i in range(17)]),
    "glob over 200": _doc("paths", ["*" + "a" * 200]),
    "a key the contract lacks": _doc("extra", 1),
    "theme summary over 1024": _theme("summary", "长" * 1025),
    "more than 24 theme tags": _theme("tags", [f"t{i}" for i in range(25)]),
    "version 2": lambda index: index.__setitem__("version", 2),
    "documents not a list": lambda index: index.__setitem__("documents", {}),
}
# The same bounds met exactly: both accept.
AT_BOUND: dict[str, Mutation] = {
    "title of 80": _doc("title", "标" * 80),
    "summary of 400": _doc("summary", "长" * 400),
    "12 tags of 32": _doc("tags", [f"{i:02d}" + "t" * 30 for i in range(12)]),
    "6 questions of 100": _doc("questions", [f"{i}" + "问" * 99 for i in range(6)]),
    "16 globs": _doc("paths", [f"**/*.x{i}" for i in range(16)]),
    "theme summary of 1024": _theme("summary", "长" * 1024),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_validate_and_the_openapi_schema_reject_each_broken_bound(indexed: Path, name: str) -> None:
    root = indexed / "index.json"
    index = orjson.loads(root.read_bytes())
    assert kindex.validate(indexed) == [] and not list(_openapi_index_validator().iter_errors(index))

    BROKEN[name](index)
    root.write_bytes(orjson.dumps(index))

    assert [p for p in kindex.validate(indexed) if "contract" in p], name
    assert list(_openapi_index_validator().iter_errors(index)), name


@pytest.mark.parametrize("name", list(AT_BOUND))
def test_validate_and_the_openapi_schema_accept_each_bound_met_exactly(indexed: Path, name: str) -> None:
    root = indexed / "index.json"
    index = orjson.loads(root.read_bytes())
    AT_BOUND[name](index)
    root.write_bytes(orjson.dumps(index))

    assert [p for p in kindex.validate(indexed) if "contract" in p] == []
    assert not list(_openapi_index_validator().iter_errors(index))


def test_async_twins_work_inside_a_running_event_loop(sample_kb: Path) -> None:
    async def chat_backend() -> tuple[kindex.RunReport, kindex.Context, kindex.RunReport]:
        kb = kindex.KnowledgeBase(sample_kb)
        report = await kb.areindex(kindex.Options(on_progress=seen.append))  # the sync twin's options too
        ctx = await kb.acontext("退款多久到账", max_docs=1)
        again = kb.reindex()  # the sync API too, called from inside the loop
        return report, ctx, again

    seen: list[kindex.Progress] = []
    report, ctx, again = asyncio.run(chat_backend())

    assert report.ok and report.completed == report.total == 19 and "index.json" in report.written
    assert len(seen) == 19 and seen[-1].completed == 19
    assert not ctx.fallback and [i.path for i in ctx.items] == ["billing/退款政策.md"]
    with pytest.raises(TypeError, match=r"build_context\(\) got an unexpected keyword argument 'budget_token'"):
        kindex.build_context(sample_kb, "退款", budget_token=100)  # type: ignore[call-arg]
    assert again.ok and again.written == ()  # nothing changed, nothing rewritten
    assert kindex.validate(sample_kb) == []


def test_cancelling_an_awaited_reindex_writes_nothing_after_the_cancel(sample_kb: Path) -> None:
    reached, proceed = threading.Event(), threading.Event()

    def hold(p: kindex.Progress) -> None:  # the worker thread stops here until the test has cancelled
        reached.set()
        proceed.wait(30)

    kb = kindex.KnowledgeBase(sample_kb, kindex.Settings(generation=kindex.Options(on_progress=hold)))

    def files() -> dict[str, int]:
        return {p.relative_to(sample_kb).as_posix(): p.stat().st_mtime_ns for p in sample_kb.rglob("index.json")}

    async def cancel_mid_run() -> dict[str, int]:
        task = asyncio.ensure_future(kb.areindex())
        await asyncio.to_thread(reached.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        state = files()
        proceed.set()
        return state

    at_cancel = asyncio.run(cancel_mid_run())  # returns once the worker thread has finished its run
    assert files() == at_cancel
    assert kindex.validate(sample_kb) != []  # the run really stopped short (a full one would validate)


def test_the_handles_of_the_module_level_functions_are_bounded(indexed: Path) -> None:
    from kindex import kb as kb_module

    kb_module.clear_cache()
    for i in range(kb_module.MAX_HANDLES + 5):
        kindex.build_context(indexed / ".." / "kb" / ("." + "/." * i), "退款")  # the same KB under many spellings
    assert len(kb_module._HANDLES._handles) == 1
    assert kindex.build_context(indexed, "退款").items


def test_create_app_refuses_a_public_bind_without_a_token(tmp_path: Path) -> None:
    with pytest.raises(kindex.UsageError, match="without an API token"):
        create_app(tmp_path, host="0.0.0.0")
    create_app(tmp_path, host="0.0.0.0", token="s3cret")  # with a token it may serve others
    create_app(tmp_path, host="::1")


def test_a_tokenless_app_refuses_requests_arriving_on_a_public_socket(sample_kb: Path) -> None:
    app = create_app(sample_kb.parent)
    agent = sample_kb.name
    local = TestClient(app, base_url="http://127.0.0.1")
    assert local.get(f"/v1/agents/{agent}/knowledge/reindex/preview").status_code == 200

    async def as_if_bound_publicly(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, "server": ("203.0.113.7", 8765)}
        await app(scope, receive, send)

    public = TestClient(as_if_bound_publicly, base_url="http://localhost")
    response = public.get(f"/v1/agents/{agent}/knowledge/reindex/preview")
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"


def test_errors_carry_their_code_exit_status_and_http_status() -> None:
    assert (kindex.UsageError.exit_code, kindex.UsageError.http_status) == (2, 422)
    assert (kindex.InterruptedRun.code, kindex.InterruptedRun.exit_code) == ("interrupted", 130)
    assert kindex.BusyError.http_status == kindex.IndexMissingError.http_status == 409
    assert issubclass(kindex.GenerationFailed, kindex.ModelError) and kindex.ModelError.http_status == 502
    assert issubclass(kindex.SkillError, kindex.InvalidDataError) and kindex.SkillError.code == "invalid_skill"
    assert all(
        issubclass(getattr(kindex, n), kindex.KindexError)
        for n in kindex.__all__
        if isinstance(getattr(kindex, n), type) and issubclass(getattr(kindex, n), BaseException)
    )


def test_the_architecture_check_passes() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "check_architecture.py")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("budget", "max_docs"), [(49, 4), (200_001, 4), (6000, 0), (6000, 51)])
def test_the_library_the_cli_and_http_refuse_the_same_context_bounds(indexed: Path, budget: int, max_docs: int) -> None:
    from click.testing import CliRunner

    from kindex.cli import main

    with pytest.raises(kindex.UsageError):
        kindex.build_context(indexed, "退款", budget_tokens=budget, max_docs=max_docs)
    cli = CliRunner().invoke(
        main, ["context", str(indexed), "退款", "--budget", str(budget), "--max-docs", str(max_docs)]
    )
    assert cli.exit_code == 2
    app = TestClient(create_app(indexed.parent), base_url="http://127.0.0.1")
    body = {"message": "退款", "budget_tokens": budget, "max_docs": max_docs}
    answer = app.post(f"/v1/agents/{indexed.name}/knowledge/context", json=body)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "invalid_request"


def test_create_app_runs_steps_through_the_client_it_is_given(sample_kb: Path) -> None:
    from tests.fakeclient import FakeClient

    client = FakeClient()
    app = TestClient(create_app(sample_kb.parent, client=client), base_url="http://127.0.0.1")
    report = app.post(f"/v1/agents/{sample_kb.name}/knowledge/reindex")
    assert report.status_code == 200 and report.json()["calls"] == 19
    assert len(client.calls) == 19 and report.json()["generator"].startswith("llm:")


def test_the_agent_skill_for_kindex_is_a_valid_skill_that_its_own_search_finds(tmp_path: Path) -> None:
    import shutil

    library = tmp_path / "skills"
    shutil.copytree(REPO / "agent-skills", library)
    assert kindex.validate_skills(library) == []
    kindex.reindex(library)
    assert kindex.validate(library) == []
    assert kindex.find_skills(library, "find the right runbook in our docs folder")[0].name == "kindex"


def test_a_handles_registry_keeps_at_most_its_limit_and_drops_the_least_recently_used(tmp_path: Path) -> None:
    from kindex.kb import Handles

    handles = Handles(limit=2)
    a, b, c = (tmp_path / n for n in "abc")
    first = handles.get(a)
    handles.get(b)
    assert handles.get(a) is first  # used again: now the most recent
    handles.get(c)  # drops b, the least recently used
    assert handles.get(a) is first and len(handles._handles) == 2 and str(b.resolve()) not in handles._handles


def test_a_knowledge_base_handle_follows_a_symlink_switched_to_a_new_release(sample_kb: Path, tmp_path: Path) -> None:
    # The handle resolved its path once: a deploy's `current -> releases/N` switch was never seen, and with the old
    # release deleted it answered "no index yet" of a folder nobody named. The single-KB MCP server is such a handle.
    r1, r2, current = tmp_path / "r1", tmp_path / "r2", tmp_path / "current"
    shutil.copytree(sample_kb, r1)
    shutil.copytree(sample_kb, r2)
    (r2 / "火星.md").write_text("# 火星殖民计划\n\n火星殖民计划的第一阶段在二〇三〇年。\n", encoding="utf-8")
    (r2 / "kindex.toml").write_text("[context]\nmax_docs = 1\n", encoding="utf-8")
    for release in (r1, r2):
        kindex.reindex(release)
    current.symlink_to("r1")
    kb = kindex.KnowledgeBase(current)
    assert "火星.md" not in [i.path for i in kb.context("火星殖民计划").items]
    assert kb.settings.max_docs != 1
    (tmp_path / "next").symlink_to("r2")
    (tmp_path / "next").replace(current)  # atomic, as deploy tools switch
    assert [i.path for i in kb.context("火星殖民计划").items] == ["火星.md"]
    assert kb.path == r2 and kb.settings.max_docs == 1  # its settings are the new release's too
    assert kb.search("火星殖民计划")[0].path == "火星.md"
    shutil.rmtree(r2)
    with pytest.raises(kindex.KBNotFoundError, match="does not exist"):
        kb.context("火星殖民计划")


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"budget_tokens": 10}, "budget_tokens must be 50 to 200,000, got 10"),
        ({"max_docs": 0}, "max_docs must be 1 to 50, got 0"),
        ({"min_relevance": 5}, "min_relevance must be between 0 and 1, got 5"),
        ({"fallback_docs": [1, 2]}, "fallback_docs must be a list of strings, got [1, 2]"),
        ({"generation": None}, "generation must be kindex.Options, got NoneType"),
    ],
)
def test_settings_out_of_bounds_are_refused_where_they_are_written(kw: dict[str, Any], error: str) -> None:
    # They were accepted, and the first context() call failed far from the line that set them.
    with pytest.raises(kindex.UsageError, match=re.escape(error)):
        kindex.Settings(**kw)
