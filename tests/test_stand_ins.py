"""`validate` names the entries a failed model call left as stand-ins, until a step writes them from an answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import kindex
from kindex import Options
from tests.conftest import llm_settings
from tests.fakellm import FakeLLM, Reply, doc_path, is_root, well_behaved

RECORD = Path(".kindex") / "stand_ins.json"


def failing(*paths: str, root: bool = False) -> Any:
    def script(request: dict[str, Any]) -> Reply:
        if is_root(request):
            return Reply("boom", status=500) if root else well_behaved(request)
        return Reply("boom", status=500) if doc_path(request) in paths else well_behaved(request)

    return script


def model(fake_llm: FakeLLM) -> Options:
    return Options(llm=llm_settings(fake_llm, retries=0))


def test_a_failed_document_is_named_until_a_doc_step_writes_its_entry(sample_kb: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script = failing("离线模式.md", "退款政策.md")
    report = kindex.reindex(sample_kb, model(fake_llm))
    assert sorted(f.path for f in report.failures) == ["billing/退款政策.md", "sync/离线模式.md"]

    problems = kindex.validate(sample_kb)
    named = [p.split(":", 1)[0] for p in problems]
    assert named == ["billing/退款政策.md", "sync/离线模式.md", "2 entries are stand-ins"]
    assert (
        "InternalServerError" in problems[1]
        and f"run `kindex doc {sample_kb} sync '离线模式.md' --model openai/fake-model` (and the --api-base it "
        "used, if any) to try again (with `--model ''` an extractive entry is written and accepted)"
        in problems[1]
    )
    # Several: one reindex asks again what has no cached answer (a newcomer followed one `doc` per document).
    assert problems[2] == (
        f"2 entries are stand-ins: `kindex reindex {sample_kb} --model openai/fake-model` (and the --api-base it used, "
        "if any) tries them all again in one run, and asks the model only what it has no cached answer for"
    )
    assert (sample_kb / RECORD).stat().st_mode & 0o777 == 0o600

    fake_llm.script = well_behaved
    kindex.doc(sample_kb, "sync", "离线模式.md", model(fake_llm))
    assert [p.split(":", 1)[0] for p in kindex.validate(sample_kb)] == ["billing/退款政策.md"]

    kindex.sub(sample_kb, "billing", model(fake_llm))
    assert kindex.validate(sample_kb) == []
    assert not (sample_kb / RECORD).exists()


def test_a_failed_root_call_is_named_and_an_offline_step_accepts_its_stand_ins(
    sample_kb: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.script = failing(root=True)
    kindex.reindex(sample_kb, model(fake_llm))
    [problem] = kindex.validate(sample_kb)
    assert problem.startswith("index.json: its theme and root-document entries are stand-ins")
    assert f"run `kindex root {sample_kb} --model openai/fake-model` (and the --api-base it used" in problem

    kindex.root(sample_kb)  # the offline generator: its extractive entries are what was asked for
    assert kindex.validate(sample_kb) == []


def test_a_document_failing_again_keeps_its_report_and_others_are_not_forgotten(
    sample_kb: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.script = failing("离线模式.md", "退款政策.md")
    kindex.reindex(sample_kb, model(fake_llm))
    fake_llm.script = failing("离线模式.md", "退款政策.md")
    kindex.sub(sample_kb, "sync", model(fake_llm))  # fails again; billing's stand-in is untouched
    kindex.root(sample_kb, model(fake_llm))
    record = json.loads((sample_kb / RECORD).read_text())
    assert sorted(record["entries"]) == ["billing/退款政策.md", "sync/离线模式.md"]


def test_a_deleted_document_or_theme_is_not_reported(sample_kb: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script = failing("离线模式.md", "退款政策.md")
    kindex.reindex(sample_kb, model(fake_llm))
    (sample_kb / "sync" / "离线模式.md").unlink()
    shutil.rmtree(sample_kb / "billing")

    # Before any step: the scan no longer has them, so there is nothing to report of their stand-ins.
    assert not any("stand-in" in p for p in kindex.validate(sample_kb))
    kindex.reindex(sample_kb, model(fake_llm))
    assert kindex.validate(sample_kb) == []
    assert not (sample_kb / RECORD).exists()


def test_a_damaged_record_is_ignored_and_replaced(sample_kb: Path, fake_llm: FakeLLM) -> None:
    kindex.reindex(sample_kb)
    (sample_kb / RECORD).write_text('{"format": 1, "entries": [')
    assert kindex.validate(sample_kb) == []

    fake_llm.script = failing("离线模式.md")
    kindex.sub(sample_kb, "sync", model(fake_llm))
    assert list(json.loads((sample_kb / RECORD).read_text())["entries"]) == ["sync/离线模式.md"]


def test_a_tampered_record_is_read_bounded_and_without_control_characters(sample_kb: Path, tmp_path: Path) -> None:
    kindex.reindex(sample_kb)
    record = sample_kb / RECORD
    entries = {"sync/离线模式.md": "\x1b]0;OWNED\x07\x1b[2J" + "x" * 100_000, "../outside.md": "no"}
    record.write_text(json.dumps({"format": 1, "entries": entries}))
    [problem] = kindex.validate(sample_kb)
    assert "\x1b" not in problem and "\x07" not in problem and "]0;OWNEDxxx" in problem and len(problem) < 600

    record.write_text(json.dumps({"format": True, "entries": entries}))  # not format 1
    assert kindex.validate(sample_kb) == []
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"format": 1, "entries": {"sync/离线模式.md": "secret text"}}))
    record.unlink()
    record.symlink_to(outside)  # kindex writes a file there: a link may lead out of the KB
    assert kindex.validate(sample_kb) == []


def test_a_document_edited_and_then_failed_is_named_both_ways(sample_kb: Path, fake_llm: FakeLLM) -> None:
    kindex.reindex(sample_kb, model(fake_llm))
    page = sample_kb / "sync" / "离线模式.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n新增一段。\n", encoding="utf-8")
    fake_llm.script = failing("离线模式.md")
    kindex.sub(sample_kb, "sync", model(fake_llm))

    problems = kindex.validate(sample_kb)
    assert [p.split(": ", 1)[1][:24] for p in problems] == ["changed since its entry ", "its entry is a stand-in "]


def test_a_forced_call_that_fails_keeps_the_answer_cached_for_the_same_text(sample_kb: Path, fake_llm: FakeLLM) -> None:
    kindex.reindex(sample_kb, model(fake_llm))
    before = (sample_kb / "sync" / "index.json").read_bytes()
    fake_llm.script = failing("离线模式.md")
    report = kindex.reindex(sample_kb, Options(llm=llm_settings(fake_llm, retries=0), force=True))

    assert report.failures == () and (sample_kb / "sync" / "index.json").read_bytes() == before
    assert any(
        n.startswith("1 forced call(s) failed and kept the answer cached for the same text: sync/离线模式.md")
        for n in report.notes
    )
    assert kindex.validate(sample_kb) == []


def test_a_theme_renamed_and_renamed_back_brings_back_no_record(sample_kb: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script = failing("离线模式.md")
    kindex.reindex(sample_kb, model(fake_llm))
    fake_llm.script = well_behaved
    (sample_kb / "sync").rename(sample_kb / "sync2")
    kindex.sub(sample_kb, "sync2", model(fake_llm))  # the theme's documents, answered under its new name
    (sample_kb / "sync2").rename(sample_kb / "sync")
    kindex.root(sample_kb, model(fake_llm))

    assert not [p for p in kindex.validate(sample_kb) if "stand-in" in p]


def test_a_record_written_before_models_were_kept_still_names_its_stand_ins(sample_kb: Path) -> None:
    kindex.reindex(sample_kb)
    (sample_kb / RECORD).write_text(json.dumps({"format": 1, "entries": {"sync/离线模式.md": "timed out"}}))
    [problem] = kindex.validate(sample_kb)
    assert problem == (
        "sync/离线模式.md: its entry is a stand-in (its previous or an extractive one): its model call failed (timed "
        f"out); run `kindex doc {sample_kb} sync '离线模式.md'` with the model it asked to try again (with "
        "`--model ''` an extractive entry is written and accepted)"
    )


def test_a_new_theme_and_a_deleted_document_are_named_with_the_steps_that_fix_them(sample_kb: Path) -> None:
    # A newcomer was told `kindex reindex` (without the KB) for a new theme's index, and read "not a scanned
    # document here" for a document they had deleted.
    kindex.reindex(sample_kb)
    (sample_kb / "reports").mkdir()
    (sample_kb / "reports" / "月报.md").write_text("# 月报\n\n每月的报表。\n", encoding="utf-8")
    (sample_kb / "sync" / "离线模式.md").unlink()
    assert kindex.validate(sample_kb) == [
        f"index.json: theme 'reports' has no entry (run `kindex root {sample_kb}`)",
        f"reports/index.json: missing (run `kindex sub {sample_kb} reports`)",
        "sync/index.json: document '离线模式.md' is in the index but not in the folder (deleted, renamed, or skipped: "
        f"`kindex preview` says why) (run `kindex sub {sample_kb} sync`)",
    ]
    kindex.sub(sample_kb, "reports")
    kindex.sub(sample_kb, "sync")
    kindex.root(sample_kb)
    assert kindex.validate(sample_kb) == []
