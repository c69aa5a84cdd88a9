"""Paying once: the cache, what invalidates it, and what a re-run sends."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import kindex
from kindex import Options, templating
from kindex.cli import main
from tests.fakellm import FakeLLM, doc_path, is_root


def paths_called(server: FakeLLM) -> list[str]:
    return sorted("ROOT" if is_root(r) else doc_path(r) for r in server.requests)


def test_second_run_makes_no_call_and_rewrites_nothing(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options
) -> None:
    kindex.reindex(sample_kb, llm_options)
    before = {p: p.stat().st_mtime_ns for p in sample_kb.rglob("index.json")}
    fake_llm.requests.clear()

    again = kindex.reindex(sample_kb, llm_options)

    assert fake_llm.requests == [] and again.calls == 0 and again.cache_hits == 19
    assert again.written == ()  # unchanged files are not replaced, so readers keep their cache
    assert {p: p.stat().st_mtime_ns for p in sample_kb.rglob("index.json")} == before


def test_an_edited_document_costs_exactly_one_call(sample_kb: Path, fake_llm: FakeLLM, llm_options: Options) -> None:
    kindex.reindex(sample_kb, llm_options)
    fake_llm.requests.clear()
    doc = sample_kb / "sync" / "离线模式.md"
    doc.write_text(doc.read_text(encoding="utf-8") + "\n离线记录会加密保存。\n", encoding="utf-8")

    report = kindex.reindex(sample_kb, llm_options)

    assert paths_called(fake_llm) == ["离线模式.md"]
    assert report.calls == 1 and report.cache_hits == 18
    assert report.notes == (), report.notes


def test_a_deleted_document_and_theme_leave_no_entry(sample_kb: Path, fake_llm: FakeLLM, llm_options: Options) -> None:
    kindex.reindex(sample_kb, llm_options)
    (sample_kb / "sync" / "离线模式.md").unlink()
    for path in (sample_kb / "account").iterdir():
        path.unlink()
    (sample_kb / "account").rmdir()
    fake_llm.requests.clear()

    kindex.reindex(sample_kb, llm_options)

    assert paths_called(fake_llm) == ["ROOT"]  # the root's inputs changed; no document needs a new answer
    root = orjson.loads((sample_kb / "index.json").read_bytes())
    assert [t["dir"] for t in root["themes"]] == ["billing", "developer", "sync"]
    sync = orjson.loads((sample_kb / "sync" / "index.json").read_bytes())
    assert "离线模式.md" not in [d["path"] for d in sync["documents"]]
    assert kindex.validate(sample_kb) == []


def test_changing_a_prompt_template_recomputes_what_it_affects(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options, monkeypatch: pytest.MonkeyPatch
) -> None:
    kindex.reindex(sample_kb, llm_options)
    fake_llm.requests.clear()
    original = templating._source

    def edited(name: str) -> str:
        text = original(name)
        return text + "\n- Prefer nouns in tags." if name == "doc_system.j2" else text

    monkeypatch.setattr(templating, "_source", edited)
    templating._env.cache_clear()
    templating.version.cache_clear()
    try:
        report = kindex.reindex(sample_kb, llm_options)
    finally:
        templating._env.cache_clear()
        templating.version.cache_clear()

    assert report.calls == 18 and report.cache_hits == 1  # every document again; the root is unaffected
    assert "Prefer nouns in tags." in fake_llm.requests[0]["messages"][0]["content"]


def test_force_ignores_the_cache(sample_kb: Path, fake_llm: FakeLLM, llm_options: Options) -> None:
    kindex.reindex(sample_kb, llm_options)
    fake_llm.requests.clear()
    report = kindex.reindex(sample_kb, Options(llm=llm_options.llm, force=True))
    assert report.calls == 19 and len(fake_llm.requests) == 19


def test_dry_run_lists_the_calls_without_making_them(sample_kb: Path, fake_llm: FakeLLM) -> None:
    env = {"KINDEX_MODEL": "openai/fake", "KINDEX_API_BASE": fake_llm.url}
    result = CliRunner().invoke(main, ["reindex", str(sample_kb), "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dry run (llm:openai/fake): 19 model calls, 0 answers cached")
    assert "  call: billing/企业采购/对公转账.md" in result.stdout and "cost unknown" in result.stdout
    assert fake_llm.requests == [] and not (sample_kb / "index.json").exists()

    kindex.reindex(sample_kb, Options(llm=kindex.LLMSettings(model="openai/fake", api_base=fake_llm.url)))
    (sample_kb / "导读.md").write_text("# 导读\n\n新的导读。", encoding="utf-8")
    plan = kindex.dry_run(sample_kb, Options(llm=kindex.LLMSettings(model="openai/fake", api_base=fake_llm.url)))
    assert plan.items == ("index.json",) and plan.calls == 1 and plan.cached == 18 and plan.estimated_prompt_tokens > 0


def test_dry_run_prices_a_model_litellm_knows(sample_kb: Path) -> None:
    plan = kindex.dry_run(sample_kb, Options(llm=kindex.LLMSettings(model="gpt-4o-mini")))
    assert plan.estimated_cost is not None and 0 < plan.estimated_cost < 0.1
