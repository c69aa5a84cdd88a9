"""The generation pipeline against a real HTTP endpoint (the fake OpenAI-compatible server) through litellm."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson

import kindex
from kindex import Options
from tests.fakellm import FakeLLM, Reply, doc_path, good_doc, good_root, is_root, user_text, well_behaved


def load(path: Path) -> dict[str, Any]:
    return orjson.loads(path.read_bytes())


def test_reindex_with_a_model_writes_valid_indexes_from_its_answers(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options
) -> None:
    report = kindex.reindex(sample_kb, llm_options)

    assert report.ok and report.offline is False
    assert report.calls == 19 and report.cache_hits == 0
    assert (report.completed, report.total) == (19, 19)
    assert report.prompt_tokens == 19 * 100 and report.completion_tokens == 19 * 20
    assert kindex.validate(sample_kb) == []
    root = load(sample_kb / "index.json")
    assert [t["dir"] for t in root["themes"]] == ["account", "billing", "developer", "sync"]
    assert root["themes"][0] == {
        "dir": "account",
        "title": "主题 account",
        "summary": "account 的内容",
        "tags": ["account"],
        "index_file": "account/index.json",
    }
    billing = load(sample_kb / "billing" / "index.json")
    entry = next(d for d in billing["documents"] if d["path"] == "企业采购/对公转账.md")
    assert entry["title"] == "标题 企业采购/对公转账.md"
    # Non-ASCII stays readable in the file, and the file is 2-space indented.
    text = (sample_kb / "billing" / "index.json").read_text(encoding="utf-8")
    assert "标题" in text and "\\u" not in text and '\n  "themes"' in text


def test_prompts_carry_the_closed_path_list_and_a_bounded_excerpt(
    sample_kb: Path, fake_llm: FakeLLM, fake_llm_settings_short_excerpt: Options
) -> None:
    kindex.reindex(sample_kb, fake_llm_settings_short_excerpt)

    root_prompt = user_text(fake_llm.root_requests()[0])
    for name in ("导读.md", "00-总则与功能导航.md", "常见问题.md"):
        assert f"- path: {name}" in root_prompt
    for theme in ("account", "billing", "developer", "sync"):
        assert re.search(rf"^- dir: {theme} \(\d+ documents\) — ", root_prompt, re.MULTILINE), root_prompt
    assert "双重验证（两步验证）" in root_prompt  # a theme's document titles tell the model what is inside

    paths = sorted(doc_path(r) for r in fake_llm.doc_requests())
    assert len(paths) == 18 and "企业采购/对公转账.md" in paths
    for request in fake_llm.doc_requests():
        excerpt = user_text(request).split("<<<\n", 1)[1].split("\n>>>", 1)[0]
        assert 0 < len(excerpt) <= 150
    # The licence comment in the conflict document never reaches the model.
    conflict = next(r for r in fake_llm.doc_requests() if doc_path(r) == "同步冲突处理.md")
    assert "维护人" not in user_text(conflict)
    assert all(r["model"] == "fake-model" for r in fake_llm.requests)


def test_invented_renamed_and_missing_paths_never_reach_the_index(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options
) -> None:
    def script(request: dict[str, Any]) -> Reply:
        if is_root(request):
            obj = good_root(request)
            obj["themes"] = [t for t in obj["themes"] if t["dir"] != "sync"]  # omits a theme
            obj["themes"].append({"dir": "marketing", "title": "不存在", "summary": "x", "tags": []})
            obj["themes"].append({"dir": "../etc", "title": "逃逸", "summary": "x", "tags": []})
            obj["themes"].append(dict(obj["themes"][0], title="重复"))
            obj["documents"].append({"path": "新文档.md", "title": "编造", "summary": "x", "tags": []})
            obj["documents"].append({"path": "account/双重验证.md", "title": "越层", "summary": "x", "tags": []})
            obj["version"] = 99
            return Reply(json.dumps(obj, ensure_ascii=False))
        obj = good_doc(request)
        obj["path"] = "renamed/elsewhere.md"  # the model renames the path it was given
        obj["unknown_key"] = "dropped"
        return Reply(json.dumps(obj, ensure_ascii=False))

    fake_llm.script = script
    report = kindex.reindex(sample_kb, llm_options)

    assert report.ok
    assert kindex.validate(sample_kb) == []
    root = load(sample_kb / "index.json")
    assert root["version"] == 1
    assert [t["dir"] for t in root["themes"]] == ["account", "billing", "developer", "sync"]
    account = next(t for t in root["themes"] if t["dir"] == "account")
    assert account["title"] == "主题 account"  # the first entry per dir wins, the duplicate is dropped
    sync = next(t for t in root["themes"] if t["dir"] == "sync")
    assert sync["summary"].startswith("sync 主题，共 4 篇文档")  # the omitted theme got a default entry
    assert sorted(d["path"] for d in root["documents"]) == sorted(["00-总则与功能导航.md", "常见问题.md", "导读.md"])
    notes = "\n".join(report.notes)
    assert "'marketing' is not a scanned theme" in notes and "'新文档.md' is not a scanned document" in notes
    dev = load(sample_kb / "developer" / "index.json")
    assert sorted(d["path"] for d in dev["documents"]) == sorted(
        ["API快速入门.md", "Webhook回调.md", "rate-limits.md", "前端组件编码规范.md"]
    )
    assert all(set(d) <= {"path", "title", "summary", "tags", "paths"} for d in dev["documents"])


def test_prose_and_fences_around_the_json_are_accepted(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options
) -> None:
    def script(request: dict[str, Any]) -> Reply:
        inner = well_behaved(request).content
        return Reply(f"好的，下面是索引条目：\n```json\n{inner}\n```\n希望有帮助！{{注：以上}}")

    fake_llm.script = script
    report = kindex.reindex(sample_kb, llm_options)

    assert report.ok and report.calls == 19  # no repair re-asks were needed
    assert load(sample_kb / "sync" / "index.json")["documents"][0]["title"].startswith("标题 ")


def test_garbage_twice_fails_one_document_only_and_the_next_run_retries_it(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options
) -> None:
    bad = "rate-limits.md"

    def script(request: dict[str, Any]) -> Reply:
        if not is_root(request) and doc_path(request) == bad:
            return Reply("I'm sorry, I can't produce JSON for this {broken")
        return well_behaved(request)

    fake_llm.script = script
    report = kindex.reindex(sample_kb, llm_options)

    assert [f.path for f in report.failures] == [f"developer/{bad}"]
    assert "after a repair request" in report.failures[0].reason
    bad_requests = [r for r in fake_llm.doc_requests() if doc_path(r) == bad]
    assert len(bad_requests) == 2  # one repair re-ask, carrying the error
    repair = bad_requests[1]["messages"][-1]["content"]
    assert "could not be used" in repair and "not closed" in repair
    assert kindex.validate(sample_kb) == []
    entry = next(d for d in load(sample_kb / "developer" / "index.json")["documents"] if d["path"] == bad)
    assert entry["title"] == "Rate limits"  # extractive stand-in, so it stays navigable

    fake_llm.requests.clear()
    fake_llm.script = well_behaved
    again = kindex.reindex(sample_kb, llm_options)

    assert again.ok and again.calls == 1 and again.cache_hits == 18
    assert [doc_path(r) for r in fake_llm.requests] == [bad]
    entry = next(d for d in load(sample_kb / "developer" / "index.json")["documents"] if d["path"] == bad)
    assert entry["title"] == f"标题 {bad}"


def test_a_failed_document_keeps_its_previous_entry(sample_kb: Path, fake_llm: FakeLLM, llm_options: Options) -> None:
    kindex.reindex(sample_kb, llm_options)
    (sample_kb / "sync" / "离线模式.md").write_text("# 离线模式\n\n新的内容：离线最多保存 60 天。\n", encoding="utf-8")
    fake_llm.script = lambda r: Reply("not json at all")

    report = kindex.reindex(sample_kb, llm_options)

    assert [f.path for f in report.failures] == ["sync/离线模式.md"]
    entry = next(d for d in load(sample_kb / "sync" / "index.json")["documents"] if d["path"] == "离线模式.md")
    assert entry["title"] == "标题 离线模式.md"


def test_sub_and_doc_steps_merge_into_the_theme_index(sample_kb: Path, fake_llm: FakeLLM, llm_options: Options) -> None:
    first = kindex.doc(sample_kb, "billing", "发票开具.md", llm_options, clear_dir=True)
    second = kindex.doc(sample_kb, "billing", "企业采购/合同与盖章.md", llm_options)

    assert (first.completed, first.total, second.completed) == (1, 1, 1)
    billing = load(sample_kb / "billing" / "index.json")
    assert [d["path"] for d in billing["documents"]] == ["企业采购/合同与盖章.md", "发票开具.md"]

    kindex.doc(sample_kb, "billing", "退款政策.md", llm_options, clear_dir=True)
    assert [d["path"] for d in load(sample_kb / "billing" / "index.json")["documents"]] == ["退款政策.md"]

    report = kindex.sub(sample_kb, "billing", llm_options)
    assert (report.completed, report.total) == (6, 6)
    assert len(load(sample_kb / "billing" / "index.json")["documents"]) == 6
    assert report.cache_hits == 3  # the documents answered by the doc steps are not paid for again


def test_globs_the_model_invents_are_dropped(sample_kb: Path, fake_llm: FakeLLM, llm_options: Options) -> None:
    def script(request: dict[str, Any]) -> Reply:
        obj = good_root(request) if is_root(request) else good_doc(request)
        for entry in obj.get("themes", []) + obj.get("documents", []) + [obj]:
            entry["paths"] = ["**/*.tsx", "**/*.md"]
        return Reply(json.dumps(obj, ensure_ascii=False))

    fake_llm.script = script
    kindex.reindex(sample_kb, llm_options)

    conditional = []
    for path in sample_kb.rglob("index.json"):
        data = load(path)
        conditional += [e.get("dir") or e["path"] for e in data["themes"] + data["documents"] if e.get("paths")]
    assert conditional == ["前端组件编码规范.md"]  # only the page whose author wrote `paths:` frontmatter


def test_a_proposed_glob_is_kept_when_the_document_names_that_file_type() -> None:
    from kindex.sanitize import doc_entry

    answer = {"title": "T", "summary": "S", "paths": ["src/**/*.vue", "**/*.md", "*", "docs/readme"]}
    assert doc_entry(answer, "a.md", evidence="Rules for every .vue single-file component").paths == ("src/**/*.vue",)
    assert doc_entry(answer, "a.md", evidence="How refunds work").paths == ()


def test_an_answer_cut_off_while_looping_on_tags_is_salvaged_without_a_repair_call(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options
) -> None:
    def script(request: dict[str, Any]) -> Reply:
        inner = well_behaved(request).content or ""
        if '"themes"' in inner:
            return Reply(inner)
        obj = json.loads(inner)
        looping = ", ".join(f'"标签{i}"' for i in range(400))  # what a small model does until max_tokens
        return Reply(f'{{"title": {json.dumps(obj["title"])}, "summary": "摘要完整。", "tags": [{looping}')

    fake_llm.script = script
    report = kindex.reindex(sample_kb, llm_options)

    assert report.ok and report.calls == 19  # every document answered, no repair request, no failure
    doc = load(sample_kb / "sync" / "index.json")["documents"][0]
    assert doc["summary"] == "摘要完整。" and doc["title"]  # the complete members kept, the cut-off tags dropped
