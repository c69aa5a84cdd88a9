"""Paying once: the cache, what invalidates it, and what a re-run sends."""

from __future__ import annotations

import contextlib
import errno
import re
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import filelock
import orjson
import pytest
from click.testing import CliRunner

import kindex
from kindex import Options, templating
from kindex.cli import main
from kindex.errors import StorageError
from kindex.llm import TIMED_OUT
from kindex.store import STATE_DIR
from tests.conftest import client_options
from tests.fakeclient import Call, FakeClient, call_error, well_behaved
from tests.fakellm import FakeLLM


def test_second_run_makes_no_call_and_rewrites_nothing(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options
) -> None:
    kindex.reindex(sample_kb, fake_options)
    before = {p: p.stat().st_mtime_ns for p in sample_kb.rglob("index.json")}
    assert len(before) == 5
    fake_client.calls.clear()

    again = kindex.reindex(sample_kb, fake_options)

    assert fake_client.calls == [] and again.calls == 0 and again.cache_hits == 19
    assert again.written == ()  # unchanged files are not replaced, so readers keep their cache
    assert {p: p.stat().st_mtime_ns for p in sample_kb.rglob("index.json")} == before


def test_an_edited_document_costs_exactly_one_call(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options
) -> None:
    kindex.reindex(sample_kb, fake_options)
    fake_client.calls.clear()
    doc = sample_kb / "sync" / "离线模式.md"
    doc.write_text(doc.read_text(encoding="utf-8") + "\n离线记录会加密保存。\n", encoding="utf-8")

    report = kindex.reindex(sample_kb, fake_options)

    assert fake_client.labels() == ["离线模式.md"]
    assert "离线记录会加密保存" in fake_client.calls[0].excerpt
    assert report.calls == 1 and report.cache_hits == 18
    assert report.notes == (), report.notes


def test_an_offline_run_says_how_many_documents_it_read_again(sample_kb: Path) -> None:
    first = kindex.reindex(sample_kb)
    doc = sample_kb / "billing" / "退款政策.md"
    doc.write_text(doc.read_text(encoding="utf-8") + "\n海外订单的退款另行处理。\n", encoding="utf-8")

    edited = kindex.reindex(sample_kb)
    again = kindex.reindex(sample_kb)

    assert first.documents_read == 21  # every document, the root's included
    # The edit changed no entry (the offline entry is made of the head), so nothing else shows it was seen.
    assert edited.written == () and edited.documents_read == 1
    assert again.documents_read == 0
    code = CliRunner().invoke(main, ["reindex", str(sample_kb)])
    assert ", no tokens, 0 documents re-analysed for search, " in code.stdout


def test_a_deleted_document_and_theme_leave_no_entry(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options
) -> None:
    kindex.reindex(sample_kb, fake_options)
    (sample_kb / "sync" / "离线模式.md").unlink()
    for path in (sample_kb / "account").iterdir():
        path.unlink()
    (sample_kb / "account").rmdir()
    fake_client.calls.clear()

    kindex.reindex(sample_kb, fake_options)

    assert fake_client.labels() == ["ROOT"]  # the root's inputs changed; no document needs a new answer
    assert fake_client.calls[0].root_dirs == ["billing", "developer", "sync"]
    root = orjson.loads((sample_kb / "index.json").read_bytes())
    assert [t["dir"] for t in root["themes"]] == ["billing", "developer", "sync"]
    sync = orjson.loads((sample_kb / "sync" / "index.json").read_bytes())
    assert "离线模式.md" not in [d["path"] for d in sync["documents"]] and len(sync["documents"]) == 3
    assert kindex.validate(sample_kb) == []


def test_a_theme_whose_documents_are_all_deleted_loses_its_index_file(sample_kb: Path, tmp_path: Path) -> None:
    kindex.reindex(sample_kb)
    for doc in (sample_kb / "sync").glob("*.md"):
        doc.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "index.json").write_text('{"version": 1, "themes": [], "documents": []}', encoding="utf-8")
    for doc in (sample_kb / "account").glob("*.md"):
        doc.unlink()
    (sample_kb / "account" / "index.json").unlink()
    (sample_kb / "account").rmdir()
    (sample_kb / "account").symlink_to(elsewhere)  # now a link out of the KB: the scan does not follow it
    for doc in (sample_kb / "developer").rglob("*.md"):
        doc.unlink()
    (sample_kb / "developer" / "index.json").write_text('{"openapi": "3.1.0"}', encoding="utf-8")  # the user's
    root = orjson.loads((sample_kb / "index.json").read_bytes())
    own_looking = {"mine": '{"version": 1, "name": "my app", "routes": ["/"]}', "blank": "", "braces": "{}"}
    for name, text in own_looking.items():  # listed by a hand-edited root, holding what may well be the user's
        (sample_kb / name).mkdir()
        (sample_kb / name / "index.json").write_text(text, encoding="utf-8")
        root["themes"].append({"dir": name, "title": name, "summary": name})
    (sample_kb / "index.json").write_bytes(orjson.dumps(root))

    report = kindex.reindex(sample_kb)

    assert [t["dir"] for t in orjson.loads((sample_kb / "index.json").read_bytes())["themes"]] == ["billing"]
    assert not (sample_kb / "sync" / "index.json").exists()  # would list four deleted documents
    assert "removed sync/index.json: the folder holds no document any more" in report.notes
    assert (elsewhere / "index.json").exists()  # outside the KB: not kindex's to remove
    assert (sample_kb / "developer" / "index.json").read_text(encoding="utf-8") == '{"openapi": "3.1.0"}'
    for name, text in own_looking.items():
        assert (sample_kb / name / "index.json").read_text(encoding="utf-8") == text
    assert [n for n in report.notes if n.startswith("removed")] == [
        "removed sync/index.json: the folder holds no document any more"
    ]
    assert kindex.validate(sample_kb) == []


def test_changing_a_prompt_template_recomputes_what_it_affects(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options, monkeypatch: pytest.MonkeyPatch
) -> None:
    kindex.reindex(sample_kb, fake_options)
    fake_client.calls.clear()
    original = templating._source

    def edited(name: str) -> str:
        text = original(name)
        return text + "\n- Prefer nouns in tags." if name == "doc_system.j2" else text

    monkeypatch.setattr(templating, "_source", edited)
    templating._env.cache_clear()
    templating.version.cache_clear()
    try:
        report = kindex.reindex(sample_kb, fake_options)
    finally:
        templating._env.cache_clear()
        templating.version.cache_clear()

    assert report.calls == 18 and report.cache_hits == 1  # every document again; the root is unaffected
    assert len(fake_client.doc_calls()) == 18 and fake_client.root_calls() == []
    assert all("Prefer nouns in tags." in c.system for c in fake_client.calls)


def test_force_ignores_the_cache(sample_kb: Path, fake_client: FakeClient, fake_options: Options) -> None:
    kindex.reindex(sample_kb, fake_options)
    fake_client.calls.clear()
    report = kindex.reindex(sample_kb, client_options(fake_client, force=True))
    assert report.calls == 19 and report.cache_hits == 0 and len(fake_client.calls) == 19


def test_another_model_does_not_reuse_the_answers_of_the_first(sample_kb: Path, fake_client: FakeClient) -> None:
    kindex.reindex(sample_kb, client_options(fake_client))
    fake_client.calls.clear()
    report = kindex.reindex(sample_kb, client_options(fake_client, llm=kindex.LLMSettings(model="other-model")))
    assert report.cache_hits == 0 and len(fake_client.calls) == 19


def test_doc_steps_do_not_grow_the_answer_cache(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options
) -> None:
    kindex.reindex(sample_kb, fake_options)
    fake_client.calls.clear()
    doc = sample_kb / "billing" / "退款政策.md"
    for i in range(3):  # three edits of the excerpt the model sees, three answers for the same document
        text = doc.read_text(encoding="utf-8").replace("# 退款政策\n", f"# 退款政策\n\n第 {i} 次修订。\n", 1)
        doc.write_text(text, encoding="utf-8")
        kindex.doc(sample_kb, "billing", "退款政策.md", fake_options)
    assert fake_client.labels() == ["退款政策.md"] * 3
    assert "第 2 次修订" in fake_client.calls[-1].excerpt
    with sqlite3.connect(sample_kb / ".kindex" / "answers.sqlite") as db:
        rows = db.execute("SELECT count(*), count(DISTINCT label) FROM answers").fetchone()
    assert rows[0] == rows[1] == 19  # one per theme document (18) and the root: superseded answers are gone


def test_dry_run_lists_the_calls_without_making_them(
    sample_kb: Path, fake_llm: FakeLLM, fake_client: FakeClient
) -> None:
    env = {"KINDEX_MODEL": "openai/fake", "KINDEX_API_BASE": fake_llm.url}
    result = CliRunner().invoke(main, ["reindex", str(sample_kb), "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dry run (llm:openai/fake): 19 model calls, 0 answers cached")
    assert "  call: billing/企业采购/对公转账.md" in result.stdout and "cost unknown" in result.stdout
    assert not (sample_kb / "index.json").exists()

    settings = kindex.LLMSettings(model="openai/fake", api_base=fake_llm.url)
    kindex.reindex(sample_kb, Options(llm=settings, client=fake_client))
    (sample_kb / "导读.md").write_text("# 导读\n\n新的导读。", encoding="utf-8")
    fake_client.calls.clear()
    # The answers are cached by what determines them, not by the client that fetched them.
    plan = kindex.dry_run(sample_kb, Options(llm=settings))
    assert plan.items == ("index.json",) and plan.calls == 1 and plan.cached == 18 and plan.estimated_prompt_tokens > 0
    assert kindex.dry_run(sample_kb, Options(llm=settings, client=fake_client)) == plan
    assert fake_client.calls == [] and fake_llm.requests == []  # a dry run calls no model, through any client


def test_dry_run_prices_a_model_litellm_knows(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    plan = kindex.dry_run(sample_kb, Options(llm=kindex.LLMSettings(model="gpt-4o-mini")))
    assert plan.estimated_cost is not None and 0 < plan.estimated_cost < 0.1 and plan.problems == ()

    # A newcomer's dry run without the key priced the calls and said nothing of a run that would stop at once.
    monkeypatch.delenv("OPENAI_API_KEY")
    result = CliRunner().invoke(main, ["reindex", str(sample_kb), "--model", "gpt-4o-mini", "--dry-run"])
    assert result.exit_code == 0 and "about $" in result.stdout
    assert result.stderr == (
        "kindex: note: model 'gpt-4o-mini' needs OPENAI_API_KEY in the environment: set it (or use --api-base for a "
        "local OpenAI-compatible server) and run again: a run would stop at its first call\n"
    )


@pytest.mark.parametrize("removed", ["the lock file", "the state folder"])
def test_a_step_whose_lock_was_deleted_under_it_writes_nothing_more(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options, removed: str
) -> None:
    # Deleting the lock file (or `.kindex/`) during a step let a second writer take a new lock at once; the first
    # step then rewrote the theme index from its own earlier scan and the second writer's entry was lost.
    kindex.reindex(sample_kb)
    new = sample_kb / "billing" / "批量导入.md"
    others: list[BaseException | kindex.RunReport] = []

    def second_writer(call: Call) -> str:
        if not others:
            if removed == "the lock file":
                (sample_kb / STATE_DIR / "write.lock").unlink()
            else:
                shutil.rmtree(sample_kb / STATE_DIR)
            new.write_text("# 批量导入\n\n用表格一次导入多张发票抬头。\n", encoding="utf-8")
            worker = threading.Thread(target=lambda: others.append(kindex.doc(sample_kb, "billing", new.name)))
            worker.start()
            worker.join()
        return well_behaved(call)

    fake_client.doc = second_writer
    with pytest.raises(StorageError, match=r"was replaced while this step ran.*nothing more was written"):
        kindex.sub(sample_kb, "billing", fake_options)

    assert isinstance(others[0], kindex.RunReport) and others[0].written == ("billing/index.json",)
    billing = orjson.loads((sample_kb / "billing" / "index.json").read_bytes())
    assert "批量导入.md" in [d["path"] for d in billing["documents"]]


def test_a_read_only_kb_is_said_to_be_read_only_not_to_hold_a_lock_to_remove(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kindex.reindex(sample_kb)

    # Root ignores file modes, so the read-only mount is simulated where the lock file is opened.
    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    with pytest.raises(StorageError) as err:
        kindex.reindex(sample_kb)
    assert "Read-only file system): indexing needs write access to the knowledge folder" in err.value.message
    assert "remove" not in err.value.message
    assert kindex.search(sample_kb, "退款多久到账")  # answering needs no write access


def test_a_state_folder_linked_out_of_the_kb_is_refused_not_written_through(sample_kb: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (sample_kb / STATE_DIR).symlink_to(outside)
    with pytest.raises(StorageError, match=r"\.kindex in .* is a symbolic link: kindex writes its state only into"):
        kindex.reindex(sample_kb)
    assert list(outside.iterdir()) == [] and not (sample_kb / "index.json").exists()


@pytest.mark.parametrize(
    ("lacking", "error", "said"),
    [
        # With a few KiB free SQLite says only "disk I/O error" when it opens the cache; out of inodes or of open
        # files, only "unable to open database file" (a hostile campaign).
        ("space", "disk I/O error", r"\(the disk holding it has 16 KiB free: it is probably full"),
        ("inodes", "unable to open database file", r"\(the disk holding it has 2 free inodes: no file can be made"),
        (
            "files",
            "unable to open database file",
            r"\(this process has run out of open files: raise its limit, `ulimit -n`",
        ),
    ],
)
def test_a_cache_failing_on_a_full_disk_says_what_ran_out(
    sample_kb: Path, fake_options: Options, monkeypatch: pytest.MonkeyPatch, lacking: str, error: str, said: str
) -> None:
    import errno
    import os

    def failing(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError(error)

    monkeypatch.setattr(sqlite3, "connect", failing)
    if lacking == "space":
        monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 20, 10 << 20, 16 << 10))
    elif lacking == "inodes":
        real_statvfs = os.statvfs
        monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((*real_statvfs(path)[:6], 2, 2, 255, 255)))
    else:
        real_open = os.open

        def no_descriptors(path: Any, *args: Any, **kwargs: Any) -> int:
            if path == os.devnull:
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", no_descriptors)
    with pytest.raises(StorageError, match=re.escape(error) + " " + said):
        kindex.reindex(sample_kb, fake_options)


def test_failures_that_a_setting_would_fix_name_the_setting(sample_kb: Path, fake_client: FakeClient) -> None:
    # A local server with two slots and the default eight calls at once: every call waited out its deadline, and
    # "run the command again" paid for the same timeouts again. A cut-off answer needs a larger token limit.
    fake_client.by_path = {
        "退款政策.md": call_error(f"TimeoutError after 5 attempts: {TIMED_OUT}", 4),
        "自动续费.md": '{"title": "自动续费", "summary": "cut',
    }
    local = kindex.LLMSettings(model="fake-model", api_base="http://127.0.0.1:8014/v1")
    report = kindex.sub(sample_kb, "billing", client_options(fake_client, concurrency=8, llm=local))
    assert len(report.failures) == 2
    assert any(
        n.startswith("calls ran out of time: raise --timeout (KINDEX_TIMEOUT); with 8 calls at once")
        for n in report.notes
    )
    assert "an answer was cut off by the token limit: raise --max-tokens (KINDEX_MAX_TOKENS) and run again" in (
        report.notes
    )
    quiet = kindex.sub(sample_kb, "billing", client_options(fake_client, concurrency=2, llm=local))
    assert "calls ran out of time: raise --timeout (KINDEX_TIMEOUT)" in quiet.notes  # two at once: not the slots
    cloud = kindex.sub(sample_kb, "billing", client_options(fake_client, concurrency=8))
    assert "calls ran out of time: raise --timeout (KINDEX_TIMEOUT)" in cloud.notes  # a provider has no slots


def test_an_offline_run_over_model_entries_says_so(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options
) -> None:
    # A newcomer's plain `kindex reindex KB` (no model configured) after a model run replaced every model-written
    # entry with an extractive one, without a word.
    first = kindex.reindex(sample_kb)
    assert not [n for n in first.notes if "cached model answers" in n]
    kindex.reindex(sample_kb, fake_options)
    offline = kindex.reindex(sample_kb)
    assert offline.written and any(n.startswith("this KB holds 19 cached model answers") for n in offline.notes)
    fake_client.calls.clear()
    back = kindex.reindex(sample_kb, fake_options)
    assert fake_client.calls == [] and back.written  # the model's entries again, at no cost


@pytest.fixture
def derived(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The documents the offline generator describes (its root answer as ``index.json``), in order."""
    calls: list[str] = []
    gen = kindex.generators.ExtractiveGenerator
    describe_doc, describe_root = gen.describe_doc, gen.describe_root

    async def doc(self: Any, scan: Any, d: Any) -> Any:
        calls.append(d.rel)
        return await describe_doc(self, scan, d)

    async def root(self: Any, scan: Any) -> Any:
        calls.append("index.json")
        return await describe_root(self, scan)

    monkeypatch.setattr(gen, "describe_doc", doc)
    monkeypatch.setattr(gen, "describe_root", root)
    return calls


def _derived_rows(kb: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(kb / STATE_DIR / "answers.sqlite")) as db:
        return dict(db.execute("SELECT label, key FROM derived").fetchall())


def test_an_offline_rerun_derives_only_what_changed(sample_kb: Path, derived: list[str]) -> None:
    # Every extractive entry was derived again on every run: a no-op offline reindex of 20,000 documents took 67 s.
    first = kindex.reindex(sample_kb)
    assert len(derived) == 19 and first.cache_hits == 0
    entries = {p: p.read_bytes() for p in sample_kb.rglob("index.json")}
    derived.clear()

    again = kindex.reindex(sample_kb)
    assert derived == [] and again.cache_hits == 19 and again.written == ()
    assert {p: p.read_bytes() for p in sample_kb.rglob("index.json")} == entries

    doc = sample_kb / "sync" / "离线模式.md"
    doc.write_text(doc.read_text(encoding="utf-8") + "\n## 加密保存\n离线记录会加密保存。\n", encoding="utf-8")
    edited = kindex.reindex(sample_kb)
    # The document, and the root answer, which is made from every document's digest.
    assert sorted(derived) == ["index.json", "sync/离线模式.md"] and edited.cache_hits == 17
    assert "加密保存" in (sample_kb / "sync" / "index.json").read_text(encoding="utf-8")
    derived.clear()
    assert kindex.doc(sample_kb, "sync", "离线模式.md").cache_hits == 1 and derived == []
    assert kindex.reindex(sample_kb, Options(force=True)).cache_hits == 0 and len(derived) == 19


def test_offline_entries_of_deleted_documents_are_dropped_by_a_whole_run(sample_kb: Path) -> None:
    kindex.reindex(sample_kb)
    assert "sync/离线模式.md" in _derived_rows(sample_kb)
    (sample_kb / "sync" / "离线模式.md").unlink()
    kindex.sub(sample_kb, "sync")
    assert "sync/离线模式.md" in _derived_rows(sample_kb)  # a theme step does not know the rest of the KB
    kindex.reindex(sample_kb)
    labels = set(_derived_rows(sample_kb))
    assert "sync/离线模式.md" not in labels and len(labels) == 18 and "index.json" in labels


def test_an_entry_made_from_a_document_changing_under_the_run_is_not_kept(sample_kb: Path, derived: list[str]) -> None:
    # Its entry was made from the excerpt the scan kept, not from the content its digest names: reused when that
    # content came back, it would have stood for the whole document.
    doc = sample_kb / "billing" / "退款政策.md"
    original = doc.read_text(encoding="utf-8")

    def edit_once(p: kindex.Progress) -> None:
        if doc.read_text(encoding="utf-8") == original:
            doc.write_text(original + "\n运行中加的一段。\n", encoding="utf-8")

    report = kindex.reindex(sample_kb, Options(on_progress=edit_once))
    assert any(n.startswith("changed while the step ran: billing/退款政策.md") for n in report.notes)
    assert "billing/退款政策.md" not in _derived_rows(sample_kb)
    doc.write_text(original, encoding="utf-8")
    derived.clear()
    kindex.reindex(sample_kb)
    assert "billing/退款政策.md" in derived


@pytest.mark.parametrize(
    ("method", "fault"),
    [
        ("_open", sqlite3.OperationalError("database or disk is full")),
        ("_connect", kindex.KBNotFoundError("the knowledge folder disappeared during the run")),
    ],
    ids=["full disk", "folder gone"],
)
def test_offline_entries_not_kept_fail_no_step(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch, method: str, fault: Exception
) -> None:
    # A memo, not money spent: a full disk when writing it must not fail a step whose index files are written.
    def failing(self: Any) -> Any:
        raise fault

    monkeypatch.setattr(kindex.cache.Cache, method, failing)
    report = kindex.reindex(sample_kb)
    assert report.ok and len(report.written) == 5
    assert not (sample_kb / STATE_DIR / "answers.sqlite").exists()


def test_a_no_op_run_builds_no_search_tables(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Building them to find nothing changed merged every table and re-derived every anchor: 2.5 s of a 5 s no-op
    # reindex at 20,000 documents.
    kindex.reindex(sample_kb)
    tables = sample_kb / STATE_DIR / "search.npz"
    saved = tables.stat().st_mtime_ns
    merged: list[int] = []
    real = kindex.searchindex.FieldTable.merge

    def counted(old: Any, mapping: Any, new: Any) -> Any:
        merged.append(len(new))
        return real(old, mapping, new)

    monkeypatch.setattr(kindex.searchindex.FieldTable, "merge", staticmethod(counted))
    assert kindex.reindex(sample_kb).documents_read == 0 and merged == [] and tables.stat().st_mtime_ns == saved
    # A theme index written again as it was: its new stamp saved, nothing analysed or merged.
    theme = sample_kb / "sync" / "index.json"
    theme.write_bytes(theme.read_bytes())
    assert kindex.search(sample_kb, "离线模式")[0].path == "sync/离线模式.md" and merged == []
    doc = sample_kb / "sync" / "离线模式.md"
    doc.write_text(doc.read_text(encoding="utf-8") + "\n离线记录会加密保存。\n", encoding="utf-8")
    assert kindex.reindex(sample_kb).documents_read == 1 and len(merged) == len(kindex.searchindex.FIELDS)
    assert kindex.search(sample_kb, "离线记录加密保存")[0].path == "sync/离线模式.md"


def _scratch_index(kb: Path, tmp: Path) -> dict[str, Any]:
    """Every index file of a from-scratch offline reindex of ``kb``'s documents, by path."""
    fresh = tmp / "scratch"
    shutil.copytree(kb, fresh, ignore=shutil.ignore_patterns(".kindex", "index.json"))
    kindex.reindex(fresh, Options(force=True))
    return {p.relative_to(fresh).as_posix(): orjson.loads(p.read_bytes()) for p in sorted(fresh.rglob("index.json"))}


def _index(kb: Path) -> dict[str, Any]:
    return {p.relative_to(kb).as_posix(): orjson.loads(p.read_bytes()) for p in sorted(kb.rglob("index.json"))}


def test_a_root_answer_made_from_a_document_changing_under_the_run_is_not_kept(
    sample_kb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new root document edited during the run, then restored to the bytes the scan saw (an editor's undo): the
    # root answer made from its excerpt was kept under the scanned digests, and index.json kept tags from only
    # its first 1,200 characters on every later run (a differential campaign).
    kindex.reindex(sample_kb)
    body = "# 长文档\n\n根目录的长文档。\n\n" + "".join(
        f"## 第{i}节 标题{i}\n\n{'内容' * 400}\n\n" for i in range(1, 8)
    )
    doc = sample_kb / "长文档.md"
    doc.write_text(body, encoding="utf-8")
    real = kindex.generate.scan  # type: ignore[attr-defined]

    def scan_then_edit(*args: Any, **kwargs: Any) -> Any:
        s = real(*args, **kwargs)
        doc.write_text("# 改了\n\n编辑中\n", encoding="utf-8")
        return s

    monkeypatch.setattr(kindex.generate, "scan", scan_then_edit)
    kept = _derived_rows(sample_kb)["index.json"]
    kindex.reindex(sample_kb)
    assert _derived_rows(sample_kb)["index.json"] == kept
    monkeypatch.setattr(kindex.generate, "scan", real)
    doc.write_text(body, encoding="utf-8")
    kindex.reindex(sample_kb)
    assert _index(sample_kb) == _scratch_index(sample_kb, tmp_path)


@pytest.mark.parametrize("planted", [b'{"themes": 5, "documents": [5]}', b"{}"])
def test_a_stored_root_answer_of_another_shape_fails_that_answer_not_every_run(sample_kb: Path, planted: bytes) -> None:
    # ``"themes": 5`` crashed every offline run with a TypeError, ``{}`` with an AnswerError, until --force.
    kindex.reindex(sample_kb)
    before = _index(sample_kb)
    with contextlib.closing(sqlite3.connect(sample_kb / STATE_DIR / "answers.sqlite")) as db, db:
        db.execute("UPDATE derived SET value = ? WHERE label = 'index.json'", (planted,))
    report = kindex.reindex(sample_kb)
    assert _index(sample_kb) == before
    if planted == b"{}":
        assert [(f.path, f.reason) for f in report.failures] == [
            ("index.json", 'stored answer unusable: the object has neither a "themes" list nor a "documents" list')
        ]


def test_a_root_documents_globs_and_lists_follow_its_content(sample_kb: Path, tmp_path: Path) -> None:
    # Its entry took paths, tags and questions from its previous entry: globs added to its frontmatter did
    # nothing, removed ones left it conditional (hidden from every chat) for good, and tags of headings deleted
    # since stayed. A scratch run follows the document.
    page = sample_kb / "00-总则与功能导航.md"
    original = page.read_text(encoding="utf-8")
    kindex.reindex(sample_kb)
    page.write_text('---\npaths: ["web/*.ts"]\n---\n' + original, encoding="utf-8")
    kindex.reindex(sample_kb)
    entry = next(d for d in _index(sample_kb)["index.json"]["documents"] if d["path"] == page.name)
    assert entry["paths"] == ["web/*.ts"] and entry["tags"]
    page.write_text("常见问题已经搬到帮助中心的新页面，请在那里查看最新内容。\n", encoding="utf-8")
    kindex.reindex(sample_kb)
    entry = next(d for d in _index(sample_kb)["index.json"]["documents"] if d["path"] == page.name)
    assert not entry.get("paths") and not entry.get("tags") and not entry.get("questions")
    assert _index(sample_kb) == _scratch_index(sample_kb, tmp_path)


def test_a_page_whose_title_and_text_say_nothing_is_titled_by_its_file_name(sample_kb: Path) -> None:
    # "..." for a title and "…" for a text: no usable extractive entry, so the entry of the page's old content
    # was kept, and each run failed again.
    kindex.reindex(sample_kb)
    (sample_kb / "billing" / "退款政策.md").write_text('---\ntitle: "..."\n---\n\n…\n\n— — —\n', encoding="utf-8")
    report = kindex.reindex(sample_kb)
    entry = next(d for d in _index(sample_kb)["billing/index.json"]["documents"] if d["path"] == "退款政策.md")
    assert report.failures == () and entry["title"] == entry["summary"] == "退款政策"


def test_a_root_document_described_apart_keeps_no_globs_its_author_removed(tmp_path: Path) -> None:
    # Past 12 root documents each has a call of its own; one whose call failed kept its previous entry, globs and
    # all: removed from its frontmatter, they still hid it from every chat but those about such files.
    kb = tmp_path / "kb"
    kb.mkdir()
    for i in range(13):
        (kb / f"note{i}.md").write_text(f"# 笔记{i}\n\n第{i}篇笔记的内容。\n", encoding="utf-8")
    rule = kb / "note0.md"
    rule.write_text('---\npaths: ["web/*.ts"]\n---\n# 前端规则\n\n.ts 文件的写法。\n', encoding="utf-8")
    client = FakeClient()
    kindex.reindex(kb, client_options(client))
    entry = next(d for d in orjson.loads((kb / "index.json").read_bytes())["documents"] if d["path"] == "note0.md")
    assert entry["paths"] == ["web/*.ts"]
    rule.write_text("# 前端规则\n\n.ts 文件的写法，对所有页面都适用。\n", encoding="utf-8")
    client.by_path["note0.md"] = lambda call: call_error()
    report = kindex.reindex(kb, client_options(client))
    assert [f.path for f in report.failures] == ["note0.md"]
    entry = next(d for d in orjson.loads((kb / "index.json").read_bytes())["documents"] if d["path"] == "note0.md")
    assert not entry.get("paths") and entry["title"] == "标题 note0.md"  # the previous entry, without its globs
