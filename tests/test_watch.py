"""Watch mode: each batch of changes costs the calls it must (one per edited document) and leaves a valid index."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

import kindex
from kindex.errors import BusyError, InvalidFileError
from kindex.server import create_app
from kindex.watch import RETRY_MAX_S, Update, Watcher
from tests.conftest import REPO
from tests.fakeclient import Call, FakeClient, call_error


class Running:
    def __init__(self, kb: Path, client: FakeClient, retry_s: float = 30.0) -> None:
        self.handle = kindex.KnowledgeBase(kb, client=client)
        self.updates: queue.Queue[Update] = queue.Queue()
        ready = threading.Event()
        self.watcher = Watcher(self.handle, self.updates.put, debounce_ms=150, on_ready=ready.set, retry_s=retry_s)
        self.thread = threading.Thread(target=self.watcher.run)
        self.thread.start()
        assert ready.wait(30)

    def next(self) -> Update:
        return self.updates.get(timeout=60)


@pytest.fixture
def watching(sample_kb: Path) -> Iterator[tuple[Running, FakeClient]]:
    client = FakeClient()
    kindex.KnowledgeBase(sample_kb, client=client).reindex()
    running = Running(sample_kb, client)
    try:
        yield running, client
    finally:
        running.watcher.stop()
        running.thread.join(30)
    assert not running.thread.is_alive()


def entries(kb: Path, theme: str) -> dict[str, str]:
    data = orjson.loads((kb / theme / "index.json").read_bytes())
    return {d["path"]: d["title"] for d in data["documents"]}


def test_edits_additions_and_deletions_cost_one_call_per_changed_document(
    sample_kb: Path, watching: tuple[Running, FakeClient]
) -> None:
    running, client = watching
    before = len(client.calls)

    doc = sample_kb / "billing" / "退款政策.md"
    doc.write_text("# 退款政策（新版）\n\n七天内无理由退款。\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
    edited = running.next()
    assert edited.steps == ("doc billing/退款政策.md",) and edited.calls == 1
    assert [c.label for c in client.calls[before:]] == ["退款政策.md"]

    (sample_kb / "billing" / "开票抬头.md").write_text("# 开票抬头\n\n抬头怎么填。\n", encoding="utf-8")
    added = running.next()
    assert added.steps == ("doc billing/开票抬头.md",) and added.calls == 1
    assert "开票抬头.md" in entries(sample_kb, "billing")

    (sample_kb / "billing" / "发票开具.md").unlink()
    removed = running.next()
    assert removed.removed == ("billing/发票开具.md",) and removed.calls == 0  # rewritten from cached answers
    assert "发票开具.md" not in entries(sample_kb, "billing")

    (sample_kb / "tax").mkdir()
    (sample_kb / "tax" / "税率.md").write_text("# 税率\n\n增值税税率说明。\n", encoding="utf-8")
    theme = running.next()
    assert theme.steps == ("root", "sub tax") and theme.calls == 2  # the root lists the new theme
    assert len(client.calls) == before + 4
    assert kindex.validate(sample_kb) == []


def test_kindexs_own_writes_and_other_files_are_not_changes(
    sample_kb: Path, watching: tuple[Running, FakeClient]
) -> None:
    running, client = watching
    before = len(client.calls)
    (sample_kb / "notes.txt").write_text("not a document", encoding="utf-8")
    (sample_kb / ".hidden.md").write_text("# hidden", encoding="utf-8")
    doc = sample_kb / "sync" / "离线模式.md"
    doc.write_text("# 离线模式（改）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")

    update = running.next()  # the only batch: the document; its own index write starts no other
    assert update.changed == ("sync/离线模式.md",) and len(client.calls) == before + 1
    assert running.updates.empty()


def test_kindex_watch_prints_a_line_per_update_and_stops_cleanly_on_ctrl_c(sample_kb: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "KINDEX_MODEL": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kindex.cli", "watch", str(sample_kb), "--json", "--debounce", "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = orjson.loads(proc.stdout.readline())
        assert first["steps"] == ["reindex"]
        assert "watching" in proc.stderr.readline()
        doc = sample_kb / "account" / "登录问题排查.md"
        doc.write_text("# 登录排查（新）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
        line = orjson.loads(proc.stdout.readline())
        assert line["steps"] == ["doc account/登录问题排查.md"] and line["written"] == ["account/index.json"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert "stopped watching" in proc.stderr.read()
    finally:
        proc.kill()
    assert kindex.validate(sample_kb) == []


def test_the_service_watches_an_agent_on_request(sample_kb: Path) -> None:
    client = FakeClient()
    app = create_app(sample_kb.parent, client=client)
    agent = sample_kb.name
    with TestClient(app, base_url="http://127.0.0.1") as http:
        assert http.post(f"/v1/agents/{agent}/knowledge/reindex").status_code == 200
        on = http.put(f"/v1/agents/{agent}/knowledge/watch")
        assert on.status_code == 200 and on.json()["watching"] is True
        entry = app.state.kindex.watchers[agent]
        assert entry.watcher.ready.is_set()  # the answer came once the folder was watched
        seen = threading.Event()
        record = entry.record

        def record_and_signal(update: Update) -> None:
            record(update)
            seen.set()

        entry.record = record_and_signal
        doc = sample_kb / "billing" / "自动续费.md"
        doc.write_text("# 自动续费（新）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
        assert seen.wait(60)
        status = http.get(f"/v1/agents/{agent}/knowledge/watch").json()
        assert status["updates"] == 1 and status["last"]["steps"] == ["doc billing/自动续费.md"]
        off = http.delete(f"/v1/agents/{agent}/knowledge/watch")
        assert off.json()["watching"] is False and agent not in app.state.kindex.watchers


def test_a_folder_moved_out_or_hidden_and_an_unscannable_document_leave_a_valid_index(
    sample_kb: Path, tmp_path: Path, watching: tuple[Running, FakeClient]
) -> None:
    running, _ = watching
    (sample_kb / "sync").rename(tmp_path / "sync-elsewhere")  # a whole theme moved out: one event, for the folder
    gone = running.next()
    assert "root" in gone.steps and kindex.validate(sample_kb) == []

    (sample_kb / "billing" / "企业采购").rename(sample_kb / ".trash")  # a sub-folder hidden
    hidden = running.next()
    assert hidden.steps == ("sub billing",) and kindex.validate(sample_kb) == []

    (sample_kb / "account" / "双重验证.md").write_bytes(b"\xff\xfe not utf-8\n")  # the scan no longer takes it
    broken = running.next()
    assert broken.steps == ("sub account",) and broken.error and "skipped" in broken.error
    assert "双重验证.md" not in entries(sample_kb, "account") and kindex.validate(sample_kb) == []


def test_a_burst_of_saves_is_one_update(sample_kb: Path) -> None:
    client = FakeClient()
    kindex.KnowledgeBase(sample_kb, client=client).reindex()
    handle = kindex.KnowledgeBase(sample_kb, client=client)
    updates: queue.Queue[Update] = queue.Queue()
    ready = threading.Event()
    watcher = Watcher(handle, updates.put, debounce_ms=1500, on_ready=ready.set)
    thread = threading.Thread(target=watcher.run)
    thread.start()
    try:
        assert ready.wait(30)
        doc = sample_kb / "sync" / "离线模式.md"
        original = doc.read_text(encoding="utf-8")
        for i in range(5):  # saves well within the quiet time of each other
            doc.write_text(f"# 离线模式 第{i}版\n\n" + original, encoding="utf-8")
        update = updates.get(timeout=60)
        assert update.steps == ("doc sync/离线模式.md",) and update.calls == 1
    finally:
        watcher.stop()
        thread.join(30)
    assert updates.empty()


def test_the_service_refuses_to_watch_a_broken_config_and_reports_a_removed_folder(sample_kb: Path) -> None:
    import shutil

    app = create_app(sample_kb.parent, client=FakeClient())
    agent = sample_kb.name
    with TestClient(app, base_url="http://127.0.0.1") as http:
        assert http.post(f"/v1/agents/{agent}/knowledge/reindex").status_code == 200
        (sample_kb / "kindex.toml").write_text("[context]\nmax_docs = 0\n", encoding="utf-8")
        refused = http.put(f"/v1/agents/{agent}/knowledge/watch")
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_file"
        (sample_kb / "kindex.toml").unlink()
        assert http.put(f"/v1/agents/{agent}/knowledge/watch").json()["watching"] is True
        entry = app.state.kindex.watchers[agent]
        shutil.rmtree(sample_kb)
        entry.thread.join(60)  # the watcher notices its folder is gone and stops
        status = http.get(f"/v1/agents/{agent}/knowledge/watch").json()
        assert status["watching"] is False and "is gone" in status["last"]["error"]
        assert http.delete(f"/v1/agents/{agent}/knowledge/watch").status_code == 200


def test_a_failed_update_is_printed_as_failed_not_as_nothing_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    from kindex.cli.watch import _emit

    _emit(Update(("billing/退款政策.md",), (), (), (), "no connection after 5 attempts: cannot connect"), False)
    out, err = capsys.readouterr()
    assert out == "billing/退款政策.md -> failed: 0 model calls\n"
    assert "kindex: no connection after 5 attempts: cannot connect (the next change tries again)" in err
    _emit(Update(("a/b.md",), (), (), (), "cannot connect", retry_in=30.0), False)
    assert "kindex: cannot connect (trying again in 30 s)" in capsys.readouterr().err
    _emit(Update(("a/b.md",), (), (), (), "cannot connect", retry_in=30.0), True)
    assert orjson.loads(capsys.readouterr().out)["retry_in"] == 30.0


@contextlib.contextmanager
def _edit_failing_once(kb: Path, retry_s: float) -> Iterator[tuple[Running, list[int], Update]]:
    """A watcher whose model is unreachable on the first call for 退款政策.md, then answers with a new title; the
    document edited, and the failed update."""
    kindex.KnowledgeBase(kb, client=FakeClient()).reindex()
    seen = [0]

    def flaky(call: Call) -> str | BaseException:
        seen[0] += 1
        if seen[0] == 1:
            return call_error("cannot connect", unreachable=True)
        return orjson.dumps({"title": "新版退款政策", "summary": "七天内无理由退款。", "tags": ["退款"]}).decode()

    running = Running(kb, FakeClient(by_path={"退款政策.md": flaky}), retry_s=retry_s)
    try:
        doc = kb / "billing" / "退款政策.md"
        doc.write_text("# 退款政策（新版）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
        failed = running.next()
        assert failed.error and "cannot connect" in failed.error and failed.retry_in == retry_s
        assert entries(kb, "billing")["退款政策.md"] == "标题 退款政策.md"  # as it was
        yield running, seen, failed
    finally:
        running.watcher.stop()
        running.thread.join(30)


def test_a_batch_that_failed_on_the_model_is_tried_again_unasked(sample_kb: Path) -> None:
    # It used to wait for the next change of the same file: an index left stale for as long as nobody edited it.
    with _edit_failing_once(sample_kb, retry_s=0.2) as (running, seen, _):
        retried = running.next()  # no change made: the watcher tried again by itself
        assert retried.changed == ("billing/退款政策.md",) and retried.steps == ("doc billing/退款政策.md",)
        assert retried.error is None and retried.retry_in is None and seen == [2]
        assert entries(sample_kb, "billing")["退款政策.md"] == "新版退款政策"
        assert kindex.validate(sample_kb) == []


def test_a_failed_batch_joins_the_next_change(sample_kb: Path) -> None:
    with _edit_failing_once(sample_kb, retry_s=3600) as (running, seen, _):
        other = sample_kb / "sync" / "离线模式.md"
        other.write_text("# 离线模式（改）\n\n" + other.read_text(encoding="utf-8"), encoding="utf-8")
        joined = running.next()
        assert joined.changed == ("billing/退款政策.md", "sync/离线模式.md") and joined.error is None
        assert entries(sample_kb, "billing")["退款政策.md"] == "新版退款政策" and seen == [2]


def test_retries_back_off_and_a_failure_on_the_documents_waits_for_a_change(sample_kb: Path) -> None:
    watcher = Watcher(kindex.KnowledgeBase(sample_kb, client=FakeClient()), lambda u: None, retry_s=100)
    batch: tuple[set[str], set[str]] = ({"billing/退款政策.md"}, set())
    delays = [watcher._failed(batch, BusyError("busy")) for _ in range(5)]
    assert delays == [100, 200, 400, RETRY_MAX_S, RETRY_MAX_S]
    assert watcher._failed(batch, InvalidFileError("kindex.toml: bad")) is None  # fails again until edited
    assert watcher._pending is None and watcher._failed(batch, BusyError("busy")) == 100
