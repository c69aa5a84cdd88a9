"""One writer per KB, no lost updates, and no corrupt index whatever instant a run is killed."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import kindex
from kindex.cache import CACHE_FILE
from kindex.store import STATE_DIR
from tests.conftest import REPO
from tests.fakeclient import FakeClient
from tests.fakellm import FakeLLM, Reply, well_behaved

pytestmark = pytest.mark.slow  # every test runs kindex in subprocesses (to kill them, or to race them)


def kindex_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kindex.cli", *args]


def env_for(server: FakeLLM | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "KINDEX_MODEL": "", "OPENAI_API_KEY": "test"}
    if server is not None:
        env.update(KINDEX_MODEL="openai/fake", KINDEX_API_BASE=server.url, KINDEX_RETRY_BASE_DELAY="0")
    return env


def assert_files_conform(kb: Path) -> None:
    """Every index file on disk parses and conforms; a theme index may be missing, never half-written.

    A kill in the middle of a write may leave a `.index.json.*.tmp` beside the file: it is a dot-file (never
    scanned or read) and the next writer removes it.
    """
    for problem in kindex.validate(kb):
        assert re.fullmatch(
            r"index\.json: missing \(run `kindex reindex \S+`\)|(\w+)/index\.json: missing \(run `kindex sub \S+ \1`\)",
            problem,
        ), problem


def cached_answers(kb: Path) -> int:
    path = kb / STATE_DIR / CACHE_FILE
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM answers").fetchone()[0])


def test_a_second_writer_fails_clearly_or_waits(sample_kb: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script = lambda r: Reply(well_behaved(r).content, latency=0.3)
    first = subprocess.Popen(
        kindex_cmd("reindex", str(sample_kb), "--concurrency", "2"),
        env=env_for(fake_llm),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        fake_llm.wait_for_requests(1)  # the first run holds the lock and is talking to the model
        second = subprocess.run(
            kindex_cmd("reindex", str(sample_kb)), env=env_for(None), capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 1
        assert "another kindex run is writing" in second.stderr and "`kindex reindex`, pid" in second.stderr
        assert "pass --wait SECONDS" in second.stderr

        waiting = subprocess.run(
            kindex_cmd("reindex", str(sample_kb), "--wait", "120"),
            env=env_for(fake_llm),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert first.wait(timeout=120) == 0
        assert waiting.returncode == 0, waiting.stderr
        assert "0 model calls, 19 cached" in waiting.stdout  # it waited, then found everything done
    finally:
        first.kill()
    assert kindex.validate(sample_kb) == []


def test_concurrent_doc_steps_on_one_theme_lose_no_update(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    (kb / "t").mkdir(parents=True)
    (kb / "导读.md").write_text("# 导读\n", encoding="utf-8")
    for i in range(20):
        (kb / "t" / f"d{i:02d}.md").write_text(f"# 文档 {i}\n\n内容 {i}。\n", encoding="utf-8")
    procs = [
        subprocess.Popen(
            kindex_cmd("doc", str(kb), "t", f"d{i:02d}.md", "--wait", "120"),
            env=env_for(None),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(20)
    ]
    for p in procs:
        assert p.wait(timeout=180) == 0, p.stderr.read() if p.stderr else ""

    entries = orjson.loads((kb / "t" / "index.json").read_bytes())["documents"]
    assert sorted(d["path"] for d in entries) == [f"d{i:02d}.md" for i in range(20)]


@pytest.mark.parametrize("kill_after", [1, 7, 14])
def test_sigkill_at_any_point_leaves_valid_files_and_the_rerun_pays_only_the_rest(
    sample_kb: Path, fake_llm: FakeLLM, kill_after: int
) -> None:
    fake_llm.script = lambda r: Reply(well_behaved(r).content, latency=0.2)
    run = subprocess.Popen(
        kindex_cmd("reindex", str(sample_kb), "--concurrency", "3"),
        env=env_for(fake_llm),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fake_llm.wait_for_requests(kill_after)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    sent = len(fake_llm.requests)

    assert_files_conform(sample_kb)
    paid = cached_answers(sample_kb)
    # Answers received before the kill were kept: at most 3 calls were in flight, and no answer is cached without
    # its request.
    assert max(0, kill_after - 3) <= paid <= sent

    # The re-run, in process: the answers cached by the killed run are keyed by what determines them (the model's
    # settings and the prompt), not by the client, so the fake client is asked only for the rest.
    client = FakeClient()
    report = kindex.reindex(sample_kb, kindex.Options(llm=kindex.LLMSettings(model="openai/fake"), client=client))

    assert report.ok and report.cache_hits == paid and report.calls == 19 - paid
    assert len(client.calls) == 19 - paid and cached_answers(sample_kb) == 19
    assert kindex.validate(sample_kb) == []
    assert list(sample_kb.rglob("*.tmp")) == []  # what the kill left half-written was cleaned up


@pytest.mark.parametrize(
    ("stop", "after", "force"),
    [(signal.SIGINT, 4, ()), (signal.SIGTERM, 4, ()), (signal.SIGTERM, 1, ()), (signal.SIGINT, 4, ("--force",))],
    ids=["Ctrl-C", "SIGTERM", "SIGTERM at the first call", "Ctrl-C of --force"],
)
def test_ctrl_c_stops_cleanly_with_a_summary(
    sample_kb: Path, fake_llm: FakeLLM, stop: signal.Signals, after: int, force: tuple[str, ...]
) -> None:
    # SIGTERM is what `timeout`, a CI job's end or systemd send: it ended the run without a word (exit 143); then,
    # raised as a KeyboardInterrupt inside a task, with asyncio's "Task exception was never retrieved" tracebacks.
    # After --force, "run the same command again" asked every document again: a plain run finishes it.
    fake_llm.script = lambda r: Reply(well_behaved(r).content, latency=0.3)
    run = subprocess.Popen(
        kindex_cmd("reindex", str(sample_kb), "--concurrency", "2", *force),
        env=env_for(fake_llm),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    fake_llm.wait_for_requests(after)
    run.send_signal(stop)
    _, err = run.communicate(timeout=60)

    assert run.returncode == 130
    again = "run it again without --force to finish" if force else "run the same command again to finish"
    assert "kindex: interrupted after " in err and again in err and "; the answers received are cached" in err
    assert "Traceback" not in err and "never retrieved" not in err and "was never awaited" not in err, err
    assert_files_conform(sample_kb)
    assert list(sample_kb.rglob("*.tmp")) == []


def test_ctrl_c_reported_after_the_step_finished_says_there_is_nothing_to_run_again(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C during the search tables' update (not cancellable) is raised by the event loop once the step is over:
    # "interrupted after 2409 of 2409 steps ... run the same command again to finish", for a step that had finished.
    real = kindex.generate._run_to_end

    def then_interrupted(coroutine: Any) -> None:
        real(coroutine)
        raise KeyboardInterrupt

    monkeypatch.setattr(kindex.generate, "_run_to_end", then_interrupted)
    with pytest.raises(kindex.InterruptedRun, match=r"after it had finished .*there is nothing to run again"):
        kindex.reindex(sample_kb)
    assert kindex.validate(sample_kb) == []


def test_a_step_that_waited_for_the_lock_reads_the_folder_again(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It merged what it had scanned before waiting: the page the writer before it added was dropped from the index,
    # and every command exited 0 (a hostile campaign's race of `kindex doc --wait`).
    import contextlib
    import threading

    import kindex.generate
    from kindex.lock import write_lock

    kindex.reindex(sample_kb)
    scanned = threading.Event()
    real = kindex.generate.write_lock  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def after_the_scan(*args: Any, **kwargs: Any) -> Any:
        scanned.set()
        with real(*args, **kwargs) as held:
            yield held

    monkeypatch.setattr(kindex.generate, "write_lock", after_the_scan)
    edited = sample_kb / "billing" / "退款政策.md"
    errors: list[BaseException] = []

    def waiting_step() -> None:
        try:
            kindex.doc(sample_kb, "billing", "退款政策.md", options=kindex.Options(wait=60))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    with write_lock(sample_kb.resolve(), "another writer"):
        step = threading.Thread(target=waiting_step)
        step.start()
        assert scanned.wait(60)  # its scan is done: all that follows is newer than what it read
        edited.write_text("# 退款新规\n\n七天内可退。\n", encoding="utf-8")
        (sample_kb / "billing" / "新页.md").write_text("# 新页\n\n新增的说明。\n", encoding="utf-8")
        kindex.doc(sample_kb, "billing", "新页.md")  # the lock is this thread's: the other writer's step
    step.join(60)
    assert not errors and not step.is_alive()
    titles = {
        d["path"]: d["title"] for d in orjson.loads((sample_kb / "billing" / "index.json").read_bytes())["documents"]
    }
    assert titles["新页.md"] == "新页" and titles["退款政策.md"] == "退款新规"
    assert kindex.validate(sample_kb) == []


def test_a_step_reads_the_folder_again_when_another_wrote_between_its_scan_and_its_lock(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other writer finished before this one asked for the lock, so it did not wait, and still had read too early.
    import contextlib

    import kindex.generate

    kindex.reindex(sample_kb)
    real = kindex.generate.write_lock  # type: ignore[attr-defined]
    done: list[bool] = []

    @contextlib.contextmanager
    def another_writer_first(*args: Any, **kwargs: Any) -> Any:
        if not done:
            done.append(True)
            (sample_kb / "billing" / "新页.md").write_text("# 新页\n\n新增的说明。\n", encoding="utf-8")
            kindex.doc(sample_kb, "billing", "新页.md")
        with real(*args, **kwargs) as held:
            yield held

    monkeypatch.setattr(kindex.generate, "write_lock", another_writer_first)
    kindex.doc(sample_kb, "billing", "退款政策.md")
    titles = {d["path"] for d in orjson.loads((sample_kb / "billing" / "index.json").read_bytes())["documents"]}
    assert "新页.md" in titles and kindex.validate(sample_kb) == []


def test_a_step_removes_what_killed_writers_left_half_written_in_the_state_folder(sample_kb: Path) -> None:
    # Only the index files' temporaries were removed: each kill during a table write left a copy of the tables
    # (9 MB at 1,445 pages; six after ten kills), and the scan memory's held document excerpts.
    kindex.reindex(sample_kb)
    state = sample_kb / STATE_DIR
    left = [".search.npz.0a1b2c3d4e5f.tmp", ".scan.json.0a1b2c3d4e5f.tmp", ".write.holder.json.0a1b2c3d4e5f.tmp"]
    watcher = state / ".watch.holder.json.0a1b2c3d4e5f.tmp"  # written under the watch lock, which a step does not hold
    for name in left:
        (state / name).write_bytes(b"half")
    watcher.write_bytes(b"half")
    kindex.doc(sample_kb, "billing", "退款政策.md")
    assert sorted(p.name for p in state.glob("*.tmp")) == [watcher.name]


def test_an_edit_indexed_by_a_step_whose_table_write_failed_is_not_called_unindexed(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk refused only the search tables, after the index files were written with the edit; the scan memory,
    # written after the tables, was not: validate said the page had changed since its entry was written.
    import kindex.searchindex
    from kindex.errors import StorageError

    kindex.reindex(sample_kb)
    page = sample_kb / "billing" / "退款政策.md"
    page.write_text("# 退款新规\n\n七天内可退。\n", encoding="utf-8")

    def full(*args: Any, **kwargs: Any) -> None:
        raise StorageError("cannot write search.npz in .kindex: No space left on device")

    monkeypatch.setattr(kindex.searchindex, "atomic_write", full)
    with pytest.raises(StorageError, match="No space left"):
        kindex.doc(sample_kb, "billing", "退款政策.md")
    titles = {
        d["path"]: d["title"] for d in orjson.loads((sample_kb / "billing" / "index.json").read_bytes())["documents"]
    }
    assert titles["退款政策.md"] == "退款新规"
    assert not [p for p in kindex.validate(sample_kb) if "changed since its entry was written" in p]
