"""Watch mode: each batch of changes costs the calls it must (one per edited document) and leaves a valid index."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import watchfiles
from click.testing import CliRunner
from fastapi.testclient import TestClient

import kindex
import kindex.cache
import kindex.store
import kindex.watch
from kindex.cli import main
from kindex.lock import watch_lock
from kindex.server import create_app
from kindex.server.state import AgentWatch
from kindex.watch import RETRY_LIMIT, Batch, Update, Watcher
from tests.conftest import REPO
from tests.fakeclient import Call, FakeClient, call_error, well_behaved


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


def test_a_burst_of_edits_in_one_theme_is_one_step_for_the_theme() -> None:
    # 30 edits in one theme were 30 doc steps, each paying for the whole KB: 59 s at 7,000 documents.
    from kindex.watch import plan

    themes = {"billing", "sync"}
    burst = plan(themes, themes, ["billing/a.md", "billing/b.md", "billing/c.md", "sync/x.md", "sync/y.md"], [])
    assert burst.subs == {"billing"} and burst.docs == [("sync", "x.md"), ("sync", "y.md")]


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


def _kindex_watch(kb: Path) -> subprocess.Popen[str]:
    """`kindex watch KB --json` in a process of its own, offline."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KINDEX_MODEL": ""}
    return subprocess.Popen(
        [sys.executable, "-m", "kindex.cli", "watch", str(kb), "--json", "--debounce", "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; systemd's and `docker stop`'s stop
def test_kindex_watch_prints_a_line_per_update_and_stops_cleanly(sample_kb: Path, stop: signal.Signals) -> None:
    proc = _kindex_watch(sample_kb)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = orjson.loads(proc.stdout.readline())
        assert first["steps"] == ["reindex"]
        assert "watching" in proc.stderr.readline()
        doc = sample_kb / "account" / "登录问题排查.md"
        doc.write_text("# 登录排查（新）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
        line = orjson.loads(proc.stdout.readline())
        assert line["steps"] == ["doc account/登录问题排查.md"] and line["written"] == ["account/index.json"]
        proc.send_signal(stop)
        assert proc.wait(timeout=60) == 0
        assert "stopped watching" in proc.stderr.read()
    finally:
        proc.kill()
    assert kindex.validate(sample_kb) == []


def test_kindex_watch_fails_when_its_folder_is_gone(sample_kb: Path) -> None:
    # It exited 0: a supervisor restarting it on failure never watched the folder a sync job deleted and cloned.
    proc = _kindex_watch(sample_kb)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert orjson.loads(proc.stdout.readline())["steps"] == ["reindex"]
        assert "watching" in proc.stderr.readline()
        shutil.rmtree(sample_kb)
        assert proc.wait(timeout=60) == 1
        assert f"Error: knowledge folder '{sample_kb}' is gone: stopped watching it" in proc.stderr.read()
    finally:
        proc.kill()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> queue.Queue[Update]:
    """Every update the service's watchers record, in order."""
    updates: queue.Queue[Update] = queue.Queue()
    record = AgentWatch.record

    def record_and_queue(self: AgentWatch, update: Update) -> None:
        record(self, update)
        updates.put(update)

    monkeypatch.setattr(AgentWatch, "record", record_and_queue)
    return updates


def test_the_service_watches_an_agent_on_request(sample_kb: Path, recorded: queue.Queue[Update]) -> None:
    client = FakeClient()
    app = create_app(sample_kb.parent, client=client)
    agent = sample_kb.name
    with TestClient(app, base_url="http://127.0.0.1") as http:
        assert http.post(f"/v1/agents/{agent}/knowledge/reindex").status_code == 200
        on = http.put(f"/v1/agents/{agent}/knowledge/watch")
        assert on.status_code == 200 and on.json()["watching"] is True
        entry = app.state.kindex.watchers[agent]
        assert entry.watcher.ready.is_set()  # the answer came once the folder was watched
        doc = sample_kb / "billing" / "自动续费.md"
        doc.write_text("# 自动续费（新）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
        assert recorded.get(timeout=60).steps == ("doc billing/自动续费.md",)
        status = http.get(f"/v1/agents/{agent}/knowledge/watch").json()
        assert status["updates"] == 1 and status["last"]["steps"] == ["doc billing/自动续费.md"]
        off = http.delete(f"/v1/agents/{agent}/knowledge/watch")
        assert off.json()["watching"] is False and agent not in app.state.kindex.watchers
        # What the watch did is in the answer that stops it (it said 0 updates and no last one).
        assert off.json()["updates"] == 1 and off.json()["last"]["steps"] == ["doc billing/自动续费.md"]
        # And in a status asked for after: it said 0 updates and no last one, as of a folder never watched.
        assert http.get(f"/v1/agents/{agent}/knowledge/watch").json() == off.json()
        assert http.put(f"/v1/agents/{agent}/knowledge/watch").json()["updates"] == 0  # a new watch, counted anew
        http.delete(f"/v1/agents/{agent}/knowledge/watch")


def test_a_second_watch_of_one_folder_is_refused_naming_the_first(
    watching: tuple[Running, FakeClient], sample_kb: Path
) -> None:
    # Two watches of one folder started without a word: the second waited for the first's writer lock, then did
    # every step again.
    running, client = watching
    second = Watcher(kindex.KnowledgeBase(sample_kb, client=client), lambda u: None)
    with pytest.raises(kindex.BusyError, match=r"is watched already \(a watch of `.*`, pid \d+ on .*\): that watch"):
        second.claim()
    with pytest.raises(kindex.BusyError, match="is watched already"):
        second.run()  # (before the change, it ran: the test would wait here)
    result = CliRunner().invoke(main, ["watch", str(sample_kb), "--json"])
    assert result.exit_code == 1 and orjson.loads(result.stdout)["error"]["code"] == "busy"
    app = create_app(sample_kb.parent, client=client)
    agent = sample_kb.name
    with TestClient(app, base_url="http://127.0.0.1") as http:
        busy = http.put(f"/v1/agents/{agent}/knowledge/watch")
        assert busy.status_code == 409 and "is watched already" in busy.json()["error"]["message"]
        assert agent not in app.state.kindex.watchers
        running.watcher.stop()
        running.thread.join(30)
        # A watch that ended holds nothing: the service's starts, and a third is refused while it runs.
        assert http.put(f"/v1/agents/{agent}/knowledge/watch").json()["watching"] is True
        with pytest.raises(kindex.BusyError):
            Watcher(kindex.KnowledgeBase(sample_kb, client=client), lambda u: None).claim()
        http.delete(f"/v1/agents/{agent}/knowledge/watch")
    watch_lock(sample_kb).release()  # the service's watch, stopped, holds nothing either


def test_a_watch_claimed_then_refused_at_its_start_holds_nothing(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service claims the lock before its thread runs the watch: a refusal at the start of the run (the folder
    # became a theme of a KB above it meanwhile) kept the lock, and no later watch of the folder could start.
    watcher = Watcher(kindex.KnowledgeBase(sample_kb, client=FakeClient()), lambda u: None)
    watcher.claim()

    def refuse(root: Path) -> None:
        raise kindex.ThemeFolderError(f"{root.name} is a theme of the KB above it")

    monkeypatch.setattr(kindex.watch, "refuse_theme_folder", refuse)
    with pytest.raises(kindex.ThemeFolderError):
        watcher.run()
    watch_lock(sample_kb).release()  # free: taken at once


def test_a_batch_pending_when_the_service_stops_watching_is_tried_when_it_starts_again(
    sample_kb: Path, recorded: queue.Queue[Update]
) -> None:
    # DELETE then PUT …/watch lost the failed batch: the new watcher started with nothing to try again, and the
    # entry kept its old text until that document was edited again.
    up = [False]
    unreachable = call_error("cannot connect", unreachable=True)
    client = FakeClient(by_path={"自动续费.md": lambda call: well_behaved(call) if up[0] else unreachable})
    app = create_app(sample_kb.parent, client=client)
    agent = sample_kb.name
    with TestClient(app, base_url="http://127.0.0.1") as http:
        assert http.post(f"/v1/agents/{agent}/knowledge/reindex").status_code == 200
        http.put(f"/v1/agents/{agent}/knowledge/watch")
        before = len(client.calls)
        doc = sample_kb / "billing" / "自动续费.md"
        doc.write_text("# 自动续费（新）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
        failed = recorded.get(timeout=60)
        assert failed.error and failed.retry_in == 30.0
        http.delete(f"/v1/agents/{agent}/knowledge/watch")
        up[0] = True
        http.put(f"/v1/agents/{agent}/knowledge/watch")
        resumed = recorded.get(timeout=60)  # at once, not after the 30 s the stopped watcher would have waited
        assert resumed.changed == ("billing/自动续费.md",) and resumed.error is None
        assert [c.label for c in client.calls[before:]] == ["自动续费.md", "自动续费.md"]
        http.delete(f"/v1/agents/{agent}/knowledge/watch")


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


def test_a_folder_replaced_under_its_name_is_watched_again(
    sample_kb: Path, tmp_path: Path, watching: tuple[Running, FakeClient]
) -> None:
    # A deploy's swap (`mv kb kb.old && mv kb.new kb`): the watch followed the old folder and never heard of an edit
    # to the new one, while edits to the old one were applied to the new KB.
    running, client = watching
    before = len(client.calls)
    fresh = tmp_path / "kb.new"
    shutil.copytree(sample_kb, fresh)
    page = fresh / "billing" / "退款政策.md"
    page.write_text("# 退款政策（新版）\n\n退款五个工作日内到账。\n", encoding="utf-8")
    sample_kb.rename(tmp_path / "kb.old")
    fresh.rename(sample_kb)
    replaced = running.next()
    assert replaced.error == f"{sample_kb} was replaced by another folder of that name: watching again"
    reconciled = running.next()  # the whole KB reconciled: the edit made before the swap is indexed
    assert not reconciled.error and "退款政策.md" in [c.label for c in client.calls[before:]]
    assert kindex.validate(sample_kb) == []
    calls = len(client.calls)
    (sample_kb / "sync" / "离线模式.md").write_text("# 离线模式\n\n新版说明。\n", encoding="utf-8")
    edited = running.next()  # and the new folder is the one watched
    assert edited.steps == ("doc sync/离线模式.md",) and len(client.calls) == calls + 1


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


def test_the_service_refuses_to_watch_a_broken_config_and_reports_a_removed_folder(
    sample_kb: Path, recorded: queue.Queue[Update]
) -> None:
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

    _emit(Update(("billing/退款政策.md",), (), (), (), "no connection after 5 attempts: cannot connect"), False, False)
    out, err = capsys.readouterr()
    assert out == "billing/退款政策.md -> failed: 0 model calls\n"
    assert "kindex: no connection after 5 attempts: cannot connect (a change of these documents, or a restart" in err
    _emit(Update(("a/b.md",), (), (), (), "cannot connect", retry_in=30.0), False, False)
    assert "kindex: cannot connect (trying again in 30 s)" in capsys.readouterr().err
    _emit(Update(("a/b.md",), (), (), (), "cannot connect", retry_in=30.0), True, False)
    assert orjson.loads(capsys.readouterr().out)["retry_in"] == 30.0


def _failing_once(error: BaseException, answer: str) -> tuple[list[int], Callable[[Call], str | BaseException]]:
    """A script that raises ``error`` on its first call and answers ``answer`` after; the calls counted."""
    seen = [0]

    def script(call: Call) -> str | BaseException:
        seen[0] += 1
        return error if seen[0] == 1 else answer

    return seen, script


NEW_ENTRY = orjson.dumps({"title": "新版退款政策", "summary": "七天内无理由退款。", "tags": ["退款"]}).decode()


@contextlib.contextmanager
def _edit_failing_once(
    kb: Path, retry_s: float, error: BaseException | None = None
) -> Iterator[tuple[Running, list[int], Update]]:
    """A watcher whose model fails on the first call for 退款政策.md (unreachable, or ``error``), then answers with
    a new title; the document edited, and the failed update."""
    kindex.KnowledgeBase(kb, client=FakeClient()).reindex()
    seen, flaky = _failing_once(error or call_error("cannot connect", unreachable=True), NEW_ENTRY)
    running = Running(kb, FakeClient(by_path={"退款政策.md": flaky}), retry_s=retry_s)
    try:
        doc = kb / "billing" / "退款政策.md"
        doc.write_text("# 退款政策（新版）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
        failed = running.next()
        assert failed.error and failed.retry_in == retry_s and failed.retry_at
        yield running, seen, failed
    finally:
        running.watcher.stop()
        running.thread.join(30)


def test_a_batch_that_failed_on_the_model_is_tried_again_unasked(sample_kb: Path) -> None:
    # It used to wait for the next change of the same file: an index left stale for as long as nobody edited it.
    with _edit_failing_once(sample_kb, retry_s=0.2) as (running, seen, failed):
        assert "cannot connect" in str(failed.error)
        assert entries(sample_kb, "billing")["退款政策.md"] == "标题 退款政策.md"  # as it was
        retried = running.next()  # no change made: the watcher tried again by itself
        assert retried.changed == ("billing/退款政策.md",) and retried.steps == ("doc billing/退款政策.md",)
        assert retried.error is None and retried.retry_in is None and seen == [2]
        assert entries(sample_kb, "billing")["退款政策.md"] == "新版退款政策"
        assert kindex.validate(sample_kb) == []


def test_stand_in_entries_from_an_overloaded_model_are_tried_again(sample_kb: Path) -> None:
    # A call that reached the model and failed after its retries (HTTP 500, 429) gives the document a stand-in
    # entry rather than failing the step: the batch used to count as done, the stand-in kept until the next edit.
    with _edit_failing_once(sample_kb, retry_s=0.2, error=call_error()) as (running, seen, failed):
        assert "stand-in entries for 1 documents" in str(failed.error) and "退款政策.md" in str(failed.error)
        retried = running.next()
        assert retried.error is None and seen == [2]
        assert entries(sample_kb, "billing")["退款政策.md"] == "新版退款政策"


def test_a_failed_batch_waits_for_its_time_or_joins_the_next_change(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failed step's own writes (.kindex/) are events too: they used to bring the retry forward, so a pending
    # batch was tried several times a second whatever its backoff said.
    kindex.KnowledgeBase(sample_kb, client=FakeClient()).reindex()
    seen, flaky = _failing_once(call_error("cannot connect", unreachable=True), NEW_ENTRY)
    updates: list[Update] = []
    watcher = Watcher(
        kindex.KnowledgeBase(sample_kb, client=FakeClient(by_path={"退款政策.md": flaky})), updates.append
    )
    now = [1000.0]
    monkeypatch.setattr(kindex.watch, "_clock", lambda: now[0])
    doc = sample_kb / "billing" / "退款政策.md"
    doc.write_text("# 退款政策（新版）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
    edited = {(watchfiles.Change.modified, str(doc))}
    watcher._handle(edited)
    assert updates[-1].retry_in == 30.0 and seen == [1]
    own = {(watchfiles.Change.added, str(sample_kb / ".kindex" / "write.holder.json"))}
    unrelated = {(watchfiles.Change.added, str(sample_kb / "notes.txt"))}
    for batch in (own, unrelated, set()):
        watcher._handle(batch)  # not due: nothing tried
    assert len(updates) == 1 and seen == [1]
    now[0] += 30.0
    watcher._handle(set())  # due
    assert updates[-1].changed == ("billing/退款政策.md",) and updates[-1].error is None and seen == [2]
    # A failed batch joins the next change at once.
    seen[0] = 0
    doc.write_text("# 退款政策（第三版）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
    watcher._handle(edited)
    assert updates[-1].retry_in == 30.0 and seen == [1]
    other = sample_kb / "sync" / "离线模式.md"
    other.write_text("# 离线模式（改）\n\n" + other.read_text(encoding="utf-8"), encoding="utf-8")
    joined = {(watchfiles.Change.modified, str(other))}
    watcher._handle(joined)
    last = updates[-1]
    assert last.changed == ("billing/退款政策.md", "sync/离线模式.md") and last.error is None


def test_a_retried_batch_that_added_a_theme_lists_it_in_the_root(sample_kb: Path) -> None:
    # A failed step left the watcher believing the new theme was indexed: the retry ran without the root step,
    # reported success, and the root index never listed the theme (kindex validate failed).
    kindex.KnowledgeBase(sample_kb, client=FakeClient()).reindex()
    _, root = _failing_once(call_error("cannot connect", unreachable=True), "")
    client = FakeClient(root=lambda call: root(call) or well_behaved(call))
    running = Running(sample_kb, client, retry_s=0.2)
    try:
        (sample_kb / "tax").mkdir()
        (sample_kb / "tax" / "税率.md").write_text("# 税率\n\n增值税税率说明。\n", encoding="utf-8")
        assert running.next().retry_in == 0.2
        retried = running.next()
        assert retried.steps == ("root", "sub tax") and retried.error is None
        assert kindex.validate(sample_kb) == []
    finally:
        running.watcher.stop()
        running.thread.join(30)


def test_retries_back_off_give_up_and_a_failure_on_the_documents_waits_for_a_change(sample_kb: Path) -> None:
    updates: list[Update] = []
    watcher = Watcher(kindex.KnowledgeBase(sample_kb, client=FakeClient()), updates.append, retry_s=100)
    batch = Batch(frozenset({"billing/退款政策.md"}), frozenset())
    for tries in range(RETRY_LIMIT + 1):
        watcher._tries = tries  # as the watch loop counts them
        watcher._report(batch, (), [], ["busy"], True)
    assert [u.retry_in for u in updates] == [100, 200, 400, 600, 600, 600, 600, 600, None]
    assert updates[-1].error == f"busy; gave up after {RETRY_LIMIT} tries" and watcher._pending is None
    watcher._report(batch, (), [], ["kindex.toml: bad"], False)  # fails again until edited
    assert updates[-1].retry_in is None and watcher._pending is None


def _driven(kb: Path, client: FakeClient, monkeypatch: pytest.MonkeyPatch) -> tuple[Watcher, list[Update]]:
    """A watcher whose batches the test hands it (:meth:`Watcher._handle`), its clock standing still."""
    kindex.KnowledgeBase(kb, client=FakeClient()).reindex()
    updates: list[Update] = []
    monkeypatch.setattr(kindex.watch, "_clock", lambda: 1000.0)
    return Watcher(kindex.KnowledgeBase(kb, client=client), updates.append), updates


def _edit(doc: Path, title: str) -> set[tuple[watchfiles.Change, str]]:
    doc.write_text(f"# {title}\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
    return {(watchfiles.Change.modified, str(doc))}


def test_a_theme_change_undone_while_a_batch_is_pending_leaves_a_true_root(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's root step ran (the root listed the new theme) before a document failed; the theme was then
    # removed again. Planned against the themes kept in memory, nothing had changed: the root kept listing it.
    up = [False]
    client = FakeClient(by_path={"退款政策.md": lambda call: well_behaved(call) if up[0] else call_error()})
    watcher, updates = _driven(sample_kb, client, monkeypatch)
    (sample_kb / "newt").mkdir()
    (sample_kb / "newt" / "a.md").write_text("# 新主题\n\n内容一段。\n", encoding="utf-8")
    batch = _edit(sample_kb / "billing" / "退款政策.md", "新版") | {(watchfiles.Change.added, str(sample_kb / "newt"))}
    watcher._handle(batch)
    assert updates[-1].steps[:2] == ("root", "sub newt") and updates[-1].retry_in  # the doc got a stand-in
    shutil.rmtree(sample_kb / "newt")
    up[0] = True
    watcher._handle({(watchfiles.Change.deleted, str(sample_kb / "newt"))})
    assert "root" in updates[-1].steps and updates[-1].error is None
    assert kindex.validate(sample_kb) == []


def test_a_busy_kb_does_not_retry_a_failing_document_without_end(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every other edit joined the failed batch and reset its count: the failing document was paid for again on
    # each edit anywhere in the KB, forever.
    client = FakeClient(by_path={"退款政策.md": call_error()})
    watcher, updates = _driven(sample_kb, client, monkeypatch)
    watcher._handle(_edit(sample_kb / "billing" / "退款政策.md", "新版"))
    for i in range(RETRY_LIMIT + 2):
        watcher._handle(_edit(sample_kb / "sync" / "离线模式.md", f"第{i}版"))
    asked = [c for c in client.calls if c.label == "退款政策.md"]
    assert len(asked) == RETRY_LIMIT + 1  # the first try and RETRY_LIMIT more, then given up
    assert any(f"gave up after {RETRY_LIMIT} tries" in str(u.error) for u in updates)
    assert updates[-1].error is None and updates[-1].changed == ("sync/离线模式.md",)


def test_an_answer_unusable_after_a_repair_is_not_retried(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It will be as unusable in 30 s: trying again would pay two calls a time, eight times.
    client = FakeClient(by_path={"退款政策.md": "this is not JSON"})
    watcher, updates = _driven(sample_kb, client, monkeypatch)
    watcher._handle(_edit(sample_kb / "billing" / "退款政策.md", "新版"))
    assert "unusable answer" in str(updates[-1].error) and updates[-1].retry_in is None
    assert watcher._pending is None and len([c for c in client.calls if c.label == "退款政策.md"]) == 2


def test_a_batch_stopped_mid_step_is_kept_and_a_resumed_one_keeps_its_backoff(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stop (DELETE …/watch) cancels the step in flight: the batch was dropped as a failure that does not pass,
    # and the service's next watcher had nothing to try, the entry stale for good.
    holder: list[Watcher] = []

    def stop_during_the_call(call: Call) -> str:
        holder[0].stopped.set()
        return NEW_ENTRY

    watcher, updates = _driven(sample_kb, FakeClient(by_path={"退款政策.md": stop_during_the_call}), monkeypatch)
    holder.append(watcher)
    watcher._handle(_edit(sample_kb / "billing" / "退款政策.md", "新版"))
    assert "stopped before the update was done" in str(updates[-1].error)
    pending = watcher.pending
    assert pending is not None and pending.batch.changed == {"billing/退款政策.md"}
    resumed = Watcher(kindex.KnowledgeBase(sample_kb, client=FakeClient(doc=NEW_ENTRY)), updates.append, resume=pending)
    resumed._handle(set())  # due: tried at once
    assert updates[-1].error is None and entries(sample_kb, "billing")["退款政策.md"] == "新版退款政策"
    # A batch that failed hands on its tries and its time: stopping and starting must not skip the backoff.
    failing = Watcher(kindex.KnowledgeBase(sample_kb, client=FakeClient(doc=call_error())), updates.append)
    failing._handle(_edit(sample_kb / "billing" / "退款政策.md", "第三版"))
    handed = failing.pending
    assert handed is not None and handed.due == 1000.0 + 30.0
    calls = FakeClient(doc=call_error())
    Watcher(kindex.KnowledgeBase(sample_kb, client=calls), updates.append, resume=handed)._handle(set())
    assert calls.calls == []  # not due yet


def test_a_batch_interrupted_by_ctrl_c_is_said_before_the_watch_ends(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ctrl-C inside a step ended the watch without a line for the batch it interrupted.
    from kindex.cli.watch import _emit

    watcher, updates = _driven(sample_kb, FakeClient(by_path={"退款政策.md": KeyboardInterrupt()}), monkeypatch)
    with pytest.raises(kindex.InterruptedRun):
        watcher._handle(_edit(sample_kb / "billing" / "退款政策.md", "新版"))
    last = updates[-1]
    assert last.changed == ("billing/退款政策.md",) and "stopped before the update was done" in str(last.error)
    problems = kindex.validate(sample_kb)  # the index is whole; the edit the interrupted step left is named
    assert watcher.stopped.is_set() and [p.split(":")[0] for p in problems] == ["billing/退款政策.md"]
    _emit(last, False, True)
    out, err = capsys.readouterr()
    assert out.startswith("billing/退款政策.md -> ")
    assert err == f"kindex: {last.error}\n"  # when it is tried again, said once


def test_an_unforeseen_error_is_reported_and_the_watcher_lives_on(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sqlite's "database or disk is full" escaped as a plain Python error and ended the watcher's thread: the CLI
    # died with a traceback, the service showed a watch that had silently stopped.
    watcher, updates = _driven(sample_kb, FakeClient(), monkeypatch)

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    # Not from the model client: a failing client fails its document (a stand-in entry), as SPEC §5 wants.
    monkeypatch.setattr(kindex.KnowledgeBase, "doc", boom)
    watcher._handle(_edit(sample_kb / "billing" / "退款政策.md", "新版"))
    assert updates[-1].error == "unexpected RuntimeError: boom" and updates[-1].retry_in == 30.0

    class Full:
        def __enter__(self) -> None: ...
        def __exit__(self, *exc: object) -> None: ...

        def execute(self, *args: object) -> None:
            raise sqlite3.OperationalError("database or disk is full")

    cache = kindex.cache.Cache(sample_kb)
    monkeypatch.setattr(cache, "_connect", Full)
    with pytest.raises(kindex.StorageError, match="database or disk is full"):
        cache.put("k", {"title": "t"})


def test_a_theme_without_its_index_is_written_whole(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A doc step merged the edited entry into nothing and wrote a theme index of one document; a watcher over a
    # partly indexed KB wrote the themes it touched and left the others without an index.
    kindex.reindex(sample_kb)
    (sample_kb / "billing" / "index.json").unlink()
    report = kindex.doc(sample_kb, "billing", "退款政策.md")
    assert "billing/index.json was missing" in report.notes[0] and kindex.validate(sample_kb) == []
    assert len(entries(sample_kb, "billing")) == 6
    watcher, updates = _driven(sample_kb, FakeClient(), monkeypatch)
    (sample_kb / "account" / "index.json").unlink()
    watcher._handle(_edit(sample_kb / "billing" / "退款政策.md", "新版"))
    assert updates[-1].steps == ("sub account", "doc billing/退款政策.md") and kindex.validate(sample_kb) == []


def test_a_stop_that_outlasts_its_wait_hands_the_batch_on_when_the_step_ends(
    sample_kb: Path, recorded: queue.Queue[Update]
) -> None:
    # DELETE …/watch waits 30 s for the thread; a model call that took longer left the batch unread (read before the
    # step ended), and a PUT started a second watcher beside the first.
    started, release = threading.Event(), threading.Event()

    def slow(call: Call) -> str:
        started.set()
        release.wait(60)
        return NEW_ENTRY

    app = create_app(sample_kb.parent, client=FakeClient(by_path={"退款政策.md": slow}))
    agent, state = sample_kb.name, app.state.kindex
    with TestClient(app, base_url="http://127.0.0.1") as http:
        kindex.KnowledgeBase(sample_kb, client=FakeClient()).reindex()
        http.put(f"/v1/agents/{agent}/knowledge/watch")
        _edit(sample_kb / "billing" / "退款政策.md", "新版")
        assert started.wait(60)
        state.unwatch(agent, timeout=0.1)  # the step is still in its call
        busy = http.put(f"/v1/agents/{agent}/knowledge/watch")
        assert busy.status_code == 409 and "still stopping" in busy.json()["error"]["message"]
        release.set()
        assert "stopped before the update was done" in str(recorded.get(timeout=60).error)
        state.stopping[agent].thread.join(60) if agent in state.stopping else None
        assert agent in state.left
        http.put(f"/v1/agents/{agent}/knowledge/watch")
        assert recorded.get(timeout=60).error is None
        assert entries(sample_kb, "billing")["退款政策.md"] == "新版退款政策"
        http.delete(f"/v1/agents/{agent}/knowledge/watch")


def test_a_folder_gone_before_it_is_read_and_an_entry_beyond_bounds_are_no_crash(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def vanished(path: object) -> Iterator[os.DirEntry[str]]:
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "scandir", vanished)
    added = {(watchfiles.Change.added, str(sample_kb / "sync"))}
    assert kindex.watch._relevant_changes(sample_kb, added) == (set(), set())
    monkeypatch.undo()
    kindex.reindex(sample_kb)
    root = orjson.loads((sample_kb / "index.json").read_bytes())
    root["documents"][0]["path"] = "x" * 5000 + ".md"
    (sample_kb / "index.json").write_bytes(orjson.dumps(root))
    index, problems = kindex.store.read_index_file(sample_kb / "index.json")  # was a pydantic error
    assert len(index.documents) == len(root["documents"]) - 1 and problems == ["documents[0] is not a usable entry"]
    # A theme index of the wrong shape holds no entry: a doc step writes the whole theme, not one entry.
    (sample_kb / "billing" / "index.json").write_text("{}", encoding="utf-8")
    kindex.doc(sample_kb, "billing", "退款政策.md")
    assert len(entries(sample_kb, "billing")) == 6


def test_a_failure_of_the_file_watcher_itself_does_not_end_the_watch(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # watchfiles raised on a file name that is not UTF-8 (even under .git/; seen with `kindex watch kb`, a relative
    # path) and the watcher thread died: later edits went unindexed. Its error, raised here once on purpose: when
    # the real one fires depends on how the kernel batches the events.
    real = watchfiles.watch
    started: list[int] = []

    def failing_once(*args: Any, **kwargs: Any) -> Iterator[set[tuple[watchfiles.Change, str]]]:
        started.append(1)
        events = real(*args, **kwargs)
        try:
            yield next(events)  # registered: the watcher is ready
            if len(started) == 1:
                raise RuntimeError('Unable to decode path "kb/.git/obj\\xFE" to string')
            yield from events
        finally:
            events.close()

    monkeypatch.setattr(watchfiles, "watch", failing_once)
    client = FakeClient()
    kindex.KnowledgeBase(sample_kb, client=client).reindex()
    running = Running(sample_kb, client)
    try:
        failed = running.next()
        assert failed.error == (
            'the file watcher failed (Unable to decode path "kb/.git/obj\\xFE" to string): watching again'
        )
        assert running.next().steps == ("reindex",)  # watched again, and what changed meanwhile caught up
        doc = sample_kb / "billing" / "退款政策.md"
        doc.write_text("# 退款政策（新版）\n\n七天内无理由退款。\n", encoding="utf-8")
        update = running.next()
        assert update.steps == ("doc billing/退款政策.md",) and update.error is None and running.thread.is_alive()
        assert len(started) == 2
    finally:
        running.watcher.stop()
        running.thread.join(30)


def test_a_watcher_that_fails_before_it_is_ready_still_becomes_ready(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failure before the first batch restarted the watch as a restart: `ready` was never set, and whoever waited
    # for it (the service's PUT …/watch, a test) waited for good.
    real = watchfiles.watch
    started: list[int] = []

    def failing_first(*args: Any, **kwargs: Any) -> Iterator[set[tuple[watchfiles.Change, str]]]:
        started.append(1)
        if len(started) == 1:
            raise RuntimeError("Unable to decode path at registration")
        yield from real(*args, **kwargs)

    monkeypatch.setattr(watchfiles, "watch", failing_first)
    client = FakeClient()
    kindex.KnowledgeBase(sample_kb, client=client).reindex()
    running = Running(sample_kb, client)  # asserts that it becomes ready
    try:
        assert running.next().error == "the file watcher failed (Unable to decode path at registration): watching again"
        assert len(started) == 2
    finally:
        running.watcher.stop()
        running.thread.join(30)


def test_a_document_that_links_to_an_edited_or_deleted_one_follows_it(sample_kb: Path) -> None:
    # watchfiles reports the file written: the link's entry kept the old text until a reindex, and kept being served
    # once the file it led to was deleted.
    (sample_kb / "sync" / "退款.md").symlink_to(Path("..") / "billing" / "退款政策.md")
    kindex.reindex(sample_kb)
    updates: list[Update] = []
    watcher = Watcher(kindex.KnowledgeBase(sample_kb), updates.append)
    target = sample_kb / "billing" / "退款政策.md"
    watcher._handle(_edit(target, "退款新规"))
    assert updates[-1].changed == ("billing/退款政策.md", "sync/退款.md") and updates[-1].error is None
    assert entries(sample_kb, "sync")["退款.md"] == entries(sample_kb, "billing")["退款政策.md"] == "退款新规"
    target.unlink()
    watcher._handle({(watchfiles.Change.deleted, str(target))})
    assert updates[-1].removed == ("billing/退款政策.md", "sync/退款.md") and updates[-1].error is None
    assert "退款.md" not in entries(sample_kb, "sync") and "退款政策.md" not in entries(sample_kb, "billing")
    assert kindex.validate(sample_kb) == []


def test_a_save_that_replaces_the_file_is_an_edit_whatever_order_its_events_come_in(sample_kb: Path) -> None:
    # JetBrains' safe write and an editor's rename over the file are a deletion and an addition of one path in a batch
    # that is a set: the update line said "removed" when the deletion came last.
    doc = sample_kb / "billing" / "退款政策.md"
    events = [(watchfiles.Change.added, str(doc)), (watchfiles.Change.deleted, str(doc))]
    for batch in (events, events[::-1]):
        assert kindex.watch._relevant_changes(sample_kb, batch) == ({"billing/退款政策.md"}, set())
    doc.unlink()
    assert kindex.watch._relevant_changes(sample_kb, events) == (set(), {"billing/退款政策.md"})
