"""`kindex serve` as a real process on 127.0.0.1, driven over the network."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import kindex
from tests.conftest import REPO, SAMPLE_KB
from tests.fakellm import FakeLLM, Reply, doc_path, good_doc

TOKEN = "process-token"

pytestmark = pytest.mark.slow  # every test runs `kindex serve` as a process


def start(kb_root: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kindex.cli", "serve", "--kb-root", str(kb_root), "--port", "0"],
        env={**os.environ, "PYTHONPATH": str(REPO), "KINDEX_API_TOKEN": TOKEN, **env},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # uvicorn announces the port it bound: that is the readiness signal
        m = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
    raise AssertionError(f"server exited with {proc.wait()}")


@pytest.fixture
def kb_root(tmp_path: Path) -> Path:
    root = tmp_path / "agents"
    shutil.copytree(SAMPLE_KB, root / "agent1", ignore=shutil.ignore_patterns(".kindex", "index.json"))
    return root


@pytest.fixture
def server(kb_root: Path, fake_llm: FakeLLM) -> Iterator[tuple[subprocess.Popen[str], httpx.Client]]:
    proc, url = start(kb_root, {"KINDEX_MODEL": "openai/fake", "KINDEX_API_BASE": fake_llm.url})
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    try:
        yield proc, client
    finally:
        client.close()
        proc.kill()
        proc.wait()


def test_reindex_and_context_over_the_network(
    server: tuple[subprocess.Popen[str], httpx.Client], kb_root: Path
) -> None:
    _, client = server
    r = client.post("/v1/agents/agent1/knowledge/reindex")
    assert r.status_code == 200, r.text
    assert r.json()["calls"] == 19 and r.json()["generator"] == "llm:openai/fake"
    assert kindex.validate(kb_root / "agent1") == []

    r = client.post("/v1/agents/agent1/knowledge/context", json={"message": "发票开错了怎么红冲", "paths": []})
    assert r.status_code == 200 and r.json()["items"][0]["path"] == "billing/发票开具.md"
    assert client.get("/docs").status_code == 200
    assert httpx.get(f"{client.base_url}/v1/agents/agent1/knowledge/index").status_code == 401


def kb_state(kb: Path) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """What a run writes: a digest of every file of the KB (index files, search tables) and the cached answers.

    The writer lock's own files and SQLite's raw pages (which a checkpoint may move without a new answer) are left
    out; the answers are compared as rows.
    """
    files = {
        p.relative_to(kb).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in kb.rglob("*")
        if p.is_file() and not p.name.startswith(("write.", "answers.sqlite"))
    }
    with sqlite3.connect(kb / ".kindex" / "answers.sqlite") as db:
        answers = {(str(k), str(label)) for k, label in db.execute("SELECT key, label FROM answers")}
    return files, answers


def test_sigterm_cancels_the_running_task_and_nothing_is_written_after_it(
    server: tuple[subprocess.Popen[str], httpx.Client], kb_root: Path, fake_llm: FakeLLM
) -> None:
    proc, client = server
    agent = kb_root / "agent1"
    assert client.post("/v1/agents/agent1/knowledge/reindex").status_code == 200  # a complete index first
    (agent / "sync" / "离线模式.md").write_text("# 离线模式\n\n改过了。\n", encoding="utf-8")

    def late_new_entry(request: dict[str, Any]) -> Reply:
        # A different entry than the index holds: a run that went on after the signal would rewrite sync/index.json,
        # cache the answer and rebuild the search tables for the edited text.
        obj = {**good_doc(request), "title": "信号之后的答案"}
        return Reply(json.dumps(obj, ensure_ascii=False), latency=3.0)

    fake_llm.script = late_new_entry
    fake_llm.requests.clear()
    task = client.post("/v1/agents/agent1/knowledge/reindex", params={"wait": "false"}).json()
    assert task["state"] in ("queued", "running")
    fake_llm.wait_for_requests(1)
    assert doc_path(fake_llm.requests[0]) == "离线模式.md"  # the edited document's call is in flight
    before = kb_state(agent)

    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully; a stop is how the service ends: exit 0 (uvicorn alone re-raises the signal).
    assert proc.wait(timeout=60) == 0
    assert proc.stderr is not None and "Application shutdown complete" in proc.stderr.read()

    assert len(fake_llm.requests) == 1  # the answer arrived after the cancel; nothing else was asked
    assert kb_state(agent) == before  # the late answer was neither used, cached nor indexed
    assert "信号之后的答案" not in (agent / "sync" / "index.json").read_text(encoding="utf-8")
    # The index is whole and as it was; only the edit the cancelled run did not index is named.
    assert [p.split(":")[0] for p in kindex.validate(agent)] == ["sync/离线模式.md"]
    assert list(agent.rglob("*.tmp")) == []


def test_without_a_token_it_refuses_to_listen_beyond_loopback(kb_root: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KINDEX_API_TOKEN"}
    r = subprocess.run(
        [sys.executable, "-m", "kindex.cli", "serve", "--kb-root", str(kb_root), "--host", "0.0.0.0"],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "refusing to listen on 0.0.0.0 without KINDEX_API_TOKEN" in r.stderr


def test_sigterm_answers_the_requests_waiting_for_steps_at_once(
    server: tuple[subprocess.Popen[str], httpx.Client], kb_root: Path, fake_llm: FakeLLM
) -> None:
    """uvicorn drains open requests before the app shuts down: a `wait=true` request, and the doc steps waiting
    their turn behind it, used to run on for the 30 s grace and then get a plain-text 500. The stop signal cancels
    them first, so each request gets its JSON answer and the waiting steps never run."""
    proc, client = server
    assert client.post("/v1/agents/agent1/knowledge/reindex").status_code == 200
    agent = kb_root / "agent1"
    for name in ("双重验证.md", "子账号与权限.md"):
        (agent / "account" / name).write_text(f"# {name}\n\n改过了。\n", encoding="utf-8")
    fake_llm.script = lambda request: Reply(json.dumps(good_doc(request), ensure_ascii=False), latency=2.0)
    asked = len(fake_llm.requests)

    def doc(name: str) -> httpx.Response:
        return client.post("/v1/agents/agent1/knowledge/reindex/sub/doc", json={"dir": "account", "path": name})

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(doc, "双重验证.md")
        fake_llm.wait_for_requests(asked + 1)  # the first step holds the KB, its model call in flight
        waiting = client.post(
            "/v1/agents/agent1/knowledge/reindex/sub/doc",
            json={"dir": "account", "path": "子账号与权限.md"},
            params={"wait": "false"},
        ).json()
        assert waiting["state"] == "queued"
        second = pool.submit(client.get, f"/v1/tasks/{waiting['id']}")  # a poller, answered at once
        assert second.result().json()["state"] == "queued"
        proc.send_signal(signal.SIGTERM)
        answer = first.result()
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "cancelled", answer.text
    assert proc.wait(timeout=60) == 0
    assert len(fake_llm.requests) == asked + 1  # the waiting step never asked the model
    # The index is whole; the two edits the cancelled steps did not index are named.
    assert [p.split(":")[0] for p in kindex.validate(agent)] == ["account/双重验证.md", "account/子账号与权限.md"]


def test_a_kb_given_as_kb_root_is_said_at_start_and_ctrl_c_ends_0(kb_root: Path) -> None:
    kb = kb_root / "agent1"
    kindex.reindex(kb)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kindex.cli", "serve", "--kb-root", str(kb), "--port", "0"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        head = []
        for line in proc.stderr:
            head.append(line)
            if "running on" in line:
                break
        assert any("holds an index.json itself: --kb-root is the folder that holds one" in h for h in head), head
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
