"""The generation pipeline: model answers in, index files out.

One test goes end to end through litellm to the fake OpenAI-compatible server on 127.0.0.1 (the adapter path);
the others script the in-process fake client, which records every call the pipeline makes.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

import kindex
from kindex import Options
from tests.conftest import client_options
from tests.fakeclient import Answer, Call, FakeClient, call_error, good_doc, good_root, well_behaved
from tests.fakellm import FakeLLM


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def test_reindex_through_litellm_writes_valid_indexes_from_the_answers(
    sample_kb: Path, fake_llm: FakeLLM, llm_options: Options
) -> None:
    report = kindex.reindex(sample_kb, llm_options)

    assert report.ok and report.offline is False and report.generator == "llm:openai/fake-model"
    assert report.calls == 19 and report.cache_hits == 0
    assert (report.completed, report.total) == (19, 19)
    # The usage litellm read from the server's answers: 100 prompt and 20 completion tokens each.
    assert report.prompt_tokens == 19 * 100 and report.completion_tokens == 19 * 20
    assert len(fake_llm.requests) == 19 and len(fake_llm.root_requests()) == 1
    assert all(r["model"] == "fake-model" for r in fake_llm.requests)  # the provider prefix is litellm's
    assert all([m["role"] for m in r["messages"]] == ["system", "user"] for r in fake_llm.requests)
    assert sorted(report.written) == [
        "account/index.json",
        "billing/index.json",
        "developer/index.json",
        "index.json",
        "sync/index.json",
    ]
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


def test_reindex_with_a_client_writes_every_file_from_its_answers(
    sample_kb: Path, fake_client: FakeClient, fake_options: Options
) -> None:
    report = kindex.reindex(sample_kb, fake_options)

    assert report.ok and report.generator == "llm:fake-model"
    assert (report.calls, report.cache_hits, report.completed, report.total) == (19, 0, 19, 19)
    assert len(fake_client.calls) == 19 and [c.kind for c in fake_client.calls].count("root") == 1
    assert not any(c.repair for c in fake_client.calls)
    assert all(c.json_schema["required"][0] in ("title", "themes") for c in fake_client.calls)
    assert 1 < fake_client.max_in_flight <= 4  # the documents are asked concurrently, within --concurrency
    assert kindex.validate(sample_kb) == []
    for theme in ("account", "billing", "developer", "sync"):
        entries = load(sample_kb / theme / "index.json")["documents"]
        assert entries and all(e["title"] == f"标题 {e['path']}" for e in entries)
    assert [d["title"] for d in load(sample_kb / "index.json")["documents"]] == [
        "根 00-总则与功能导航.md",
        "根 导读.md",
        "根 常见问题.md",
    ]


def test_concurrency_bounds_the_calls_in_flight(sample_kb: Path) -> None:
    client = FakeClient(delay=0.01)
    kindex.reindex(sample_kb, client_options(client, concurrency=2))
    assert client.max_in_flight == 2 and len(client.calls) == 19


def test_prompts_carry_the_closed_path_list_and_a_bounded_excerpt(sample_kb: Path, fake_client: FakeClient) -> None:
    kindex.reindex(sample_kb, client_options(fake_client, excerpt_chars=150))

    (root_call,) = fake_client.root_calls()
    for name in ("导读.md", "00-总则与功能导航.md", "常见问题.md"):
        assert f"- path: {name}" in root_call.user
    for theme in ("account", "billing", "developer", "sync"):
        assert re.search(rf"^- dir: {theme} \(\d+ documents\) — ", root_call.user, re.MULTILINE), root_call.user
    assert "双重验证（两步验证）" in root_call.user  # a theme's document titles tell the model what is inside

    paths = sorted(c.label for c in fake_client.doc_calls())
    assert len(paths) == 18 and "企业采购/对公转账.md" in paths
    for call in fake_client.doc_calls():
        assert 0 < len(call.excerpt) <= 150
    # The licence comment in the conflict document never reaches the model.
    conflict = next(c for c in fake_client.doc_calls() if c.path == "同步冲突处理.md")
    assert "维护人" not in conflict.user


def test_invented_renamed_and_missing_paths_never_reach_the_index(sample_kb: Path) -> None:
    def root(call: Call) -> str:
        obj = good_root(call)
        obj["themes"] = [t for t in obj["themes"] if t["dir"] != "sync"]  # omits a theme
        obj["themes"].append({"dir": "marketing", "title": "不存在", "summary": "x", "tags": []})
        obj["themes"].append({"dir": "../etc", "title": "逃逸", "summary": "x", "tags": []})
        obj["themes"].append(dict(obj["themes"][0], title="重复"))
        obj["documents"].append({"path": "新文档.md", "title": "编造", "summary": "x", "tags": []})
        obj["documents"].append({"path": "account/双重验证.md", "title": "越层", "summary": "x", "tags": []})
        obj["version"] = 99
        return json.dumps(obj, ensure_ascii=False)

    def doc(call: Call) -> str:
        obj = good_doc(call)
        obj["path"] = "renamed/elsewhere.md"  # the model renames the path it was given
        obj["unknown_key"] = "dropped"
        return json.dumps(obj, ensure_ascii=False)

    report = kindex.reindex(sample_kb, client_options(FakeClient(root=root, doc=doc)))

    assert report.ok
    assert kindex.validate(sample_kb) == []
    root_index = load(sample_kb / "index.json")
    assert root_index["version"] == 1
    assert [t["dir"] for t in root_index["themes"]] == ["account", "billing", "developer", "sync"]
    account = next(t for t in root_index["themes"] if t["dir"] == "account")
    assert account["title"] == "主题 account"  # the first entry per dir wins, the duplicate is dropped
    sync = next(t for t in root_index["themes"] if t["dir"] == "sync")
    assert sync["summary"].startswith("sync 主题，共 4 篇文档")  # the omitted theme got a default entry
    assert sorted(d["path"] for d in root_index["documents"]) == sorted(
        ["00-总则与功能导航.md", "常见问题.md", "导读.md"]
    )
    notes = "\n".join(report.notes)
    assert "'marketing' is not a scanned theme" in notes and "'新文档.md' is not a scanned document" in notes
    dev = load(sample_kb / "developer" / "index.json")
    assert sorted(d["path"] for d in dev["documents"]) == sorted(
        ["API快速入门.md", "Webhook回调.md", "rate-limits.md", "前端组件编码规范.md"]
    )
    assert all(set(d) <= {"path", "title", "summary", "tags", "paths"} for d in dev["documents"])
    assert {d["title"] for d in dev["documents"]} == {f"标题 {d['path']}" for d in dev["documents"]}


def test_prose_and_fences_around_the_json_are_accepted(sample_kb: Path) -> None:
    def chatty(call: Call) -> str:
        return f"好的，下面是索引条目：\n```json\n{well_behaved(call)}\n```\n希望有帮助！{{注：以上}}"

    client = FakeClient(root=chatty, doc=chatty)
    report = kindex.reindex(sample_kb, client_options(client))

    assert report.ok and report.calls == 19 and not any(c.repair for c in client.calls)  # no repair re-ask
    assert load(sample_kb / "sync" / "index.json")["documents"][0]["title"].startswith("标题 ")


def test_garbage_twice_fails_one_document_only_and_the_next_run_retries_it(sample_kb: Path) -> None:
    bad = "rate-limits.md"
    client = FakeClient(by_path={bad: "I'm sorry, I can't produce JSON for this {broken"})
    options = client_options(client)

    report = kindex.reindex(sample_kb, options)

    assert [f.path for f in report.failures] == [f"developer/{bad}"]
    assert "after a repair request" in report.failures[0].reason
    bad_calls = [c for c in client.calls if c.path == bad]
    assert [c.repair for c in bad_calls] == [False, True]  # one repair re-ask, carrying the error
    repair = bad_calls[1].messages[-1]["content"]
    assert "could not be used" in repair and "not closed" in repair
    assert bad_calls[1].messages[-2] == {
        "role": "assistant",
        "content": "I'm sorry, I can't produce JSON for this {broken",
    }
    assert report.calls == 20
    [problem] = kindex.validate(sample_kb)
    assert problem.startswith(f"developer/{bad}: its entry is a stand-in") and "after a repair request" in problem
    entry = next(d for d in load(sample_kb / "developer" / "index.json")["documents"] if d["path"] == bad)
    assert entry["title"] == "Rate limits"  # extractive stand-in, so it stays navigable

    client.calls.clear()
    client.by_path.clear()
    again = kindex.reindex(sample_kb, options)

    assert again.ok and again.calls == 1 and again.cache_hits == 18
    assert client.labels() == [bad]
    entry = next(d for d in load(sample_kb / "developer" / "index.json")["documents"] if d["path"] == bad)
    assert entry["title"] == f"标题 {bad}"
    assert kindex.validate(sample_kb) == []


@pytest.mark.parametrize(
    "answer",
    [
        '{"title": "T", "summary": "S", "tags": [], "x": ' + "[" * 300 + "]" * 300 + "}",  # orjson writes 254 levels
        '{"{\\" {"title": "T", "summary": "S", "id": 123456789012345678901234567890}',  # read by the fallback parser
    ],
    ids=["nested-300-deep", "integer-beyond-64-bits"],
)
def test_an_answer_the_cache_cannot_keep_fails_its_document_not_the_run(sample_kb: Path, answer: str) -> None:
    # The run crashed writing the answer to the cache (a traceback, no index for the theme), and every later run
    # the same way, since nothing was kept.
    bad = "rate-limits.md"
    report = kindex.reindex(sample_kb, client_options(FakeClient(by_path={bad: answer})))

    if "id" in answer:  # a number beyond 64 bits is read as a float, as orjson reads it: the entry is used
        assert report.ok
    else:
        assert [f.path for f in report.failures] == [f"developer/{bad}"]
        assert "cannot be kept" in report.failures[0].reason
    assert any(d["path"] == bad for d in load(sample_kb / "developer" / "index.json")["documents"])


def test_an_answer_of_placeholders_is_asked_again_and_never_kept(sample_kb: Path) -> None:
    # A small model echoing the prompt's "..." got exit 0, "index is valid", and "## ..." as every page's header in
    # the context; cached, it stuck until --force.
    placeholder = '{"title": "...", "summary": "…", "tags": ["...", "退款"], "questions": ["..."]}'
    root = json.dumps({"themes": [{"dir": "billing", "title": "...", "summary": "..."}], "documents": []})
    client = FakeClient(root=lambda call: root, by_path={"rate-limits.md": placeholder})
    report = kindex.reindex(sample_kb, client_options(client))

    assert sorted(f.path for f in report.failures) == ["developer/rate-limits.md", "index.json"]
    assert [c.repair for c in client.calls if c.path == "rate-limits.md"] == [False, True]
    entry = next(d for d in load(sample_kb / "developer" / "index.json")["documents"] if d["path"] == "rate-limits.md")
    assert entry["title"] == "Rate limits"  # the extractive stand-in
    themes = {t["dir"]: t["title"] for t in load(sample_kb / "index.json")["themes"]}
    assert "..." not in themes.values()

    from kindex.sanitize import doc_entry

    kept = doc_entry(json.loads('{"title": "退款", "summary": "……到账", "tags": ["...", "退款"]}'), "a.md")
    assert (kept.title, kept.summary, kept.tags) == ("退款", "……到账", ("退款",))  # only the empty-saying parts go


def test_a_root_answer_of_invented_themes_is_noted_in_bounded_lines(sample_kb: Path) -> None:
    # 9,000 invented themes made 9,007 notes: 9,008 lines on stderr, in the report and a service's task record.
    def inventive(call: Call) -> str:
        obj = good_root(call)
        obj["themes"] += [{"dir": f"ghost{i}", "title": "幽灵", "summary": "不存在"} for i in range(500)]
        return json.dumps(obj, ensure_ascii=False)

    report = kindex.reindex(sample_kb, client_options(FakeClient(root=inventive)))
    ghosts = [n for n in report.notes if "ghost" in n]
    assert len(ghosts) == 20 and "index.json: 480 more notes like these" in report.notes


def test_a_title_that_is_a_path_is_no_title() -> None:
    # "billing/退款政策.md" as the login page's title headed the login page's text in the context as the refund page.
    from kindex.sanitize import doc_entry

    with pytest.raises(kindex.AnswerError, match="no usable title"):
        doc_entry({"title": "billing/退款政策.md", "summary": "登录问题"}, "登录问题排查.md")
    assert doc_entry({"title": "README.md", "summary": "写法"}, "a.md").title == "README.md"  # a name, not a path


def test_a_repair_request_that_gets_a_good_answer_is_used(sample_kb: Path) -> None:
    client = FakeClient(by_path={"离线模式.md": "not json"}, repair=well_behaved)

    report = kindex.reindex(sample_kb, client_options(client))

    assert report.ok and report.calls == 20
    assert [c.repair for c in client.calls if c.path == "离线模式.md"] == [False, True]
    entry = next(d for d in load(sample_kb / "sync" / "index.json")["documents"] if d["path"] == "离线模式.md")
    assert entry["title"] == "标题 离线模式.md"


def test_a_failed_document_keeps_its_previous_entry(sample_kb: Path, fake_client: FakeClient) -> None:
    kindex.reindex(sample_kb, client_options(fake_client))
    (sample_kb / "sync" / "离线模式.md").write_text("# 离线模式\n\n新的内容：离线最多保存 60 天。\n", encoding="utf-8")
    failing = FakeClient(root="not json at all", doc="not json at all")

    report = kindex.reindex(sample_kb, client_options(failing))

    assert [f.path for f in report.failures] == ["sync/离线模式.md"]
    assert [c.label for c in failing.calls] == ["离线模式.md", "离线模式.md"]  # the edit, and its repair re-ask
    entry = next(d for d in load(sample_kb / "sync" / "index.json")["documents"] if d["path"] == "离线模式.md")
    assert entry["title"] == "标题 离线模式.md"


def test_a_call_error_fails_its_document_and_counts_its_retries(sample_kb: Path) -> None:
    error = call_error("InternalServerError (HTTP 503) after 3 attempts: down", retries=2)
    client = FakeClient(by_path={"离线模式.md": error})

    report = kindex.reindex(sample_kb, client_options(client))

    assert [f.path for f in report.failures] == ["sync/离线模式.md"]
    assert report.failures[0].reason == error.message
    assert [c.label for c in client.calls].count("离线模式.md") == 1  # a call error gets no repair re-ask
    assert (report.calls, report.retries) == (19, 2)
    entry = next(d for d in load(sample_kb / "sync" / "index.json")["documents"] if d["path"] == "离线模式.md")
    assert entry["title"] == "离线模式"  # the extractive stand-in
    [problem] = kindex.validate(sample_kb)
    assert problem.startswith("sync/离线模式.md: its entry is a stand-in") and error.message in problem


def test_a_client_of_the_callers_own_that_raises_or_returns_junk_fails_one_document(sample_kb: Path) -> None:
    # A custom client raising ValueError (not ModelCallError) aborted the whole run; returning a str gave an
    # AttributeError. SPEC §5: one failed document never aborts a run.
    client = FakeClient(by_path={"离线模式.md": ValueError("boom")})
    report = kindex.reindex(sample_kb, client_options(client))
    assert [(f.path, f.reason) for f in report.failures] == [
        ("sync/离线模式.md", "the model client failed: ValueError: boom")
    ]
    entry = next(d for d in load(sample_kb / "sync" / "index.json")["documents"] if d["path"] == "离线模式.md")
    assert entry["title"] == "离线模式"  # the extractive stand-in; every other document from the client

    class Junk:
        async def complete(
            self, messages: Sequence[Mapping[str, str]], *, json_schema: Mapping[str, Any], max_tokens: int | None
        ) -> Any:
            return "{}"  # a str, not a Completion

    report = kindex.reindex(sample_kb, kindex.Options(client=Junk(), force=True))  # type: ignore[arg-type]
    assert report.failures and {f.reason for f in report.failures} == {
        "the model client returned a str, not a Completion"
    }


REFUSED = "no connection after 3 attempts: cannot connect to http://127.0.0.1:9/v1"


def _answers_then_refuses(answered: int) -> Callable[[Call], Answer]:
    """A model that answers ``answered`` calls, then is gone: every later call is refused."""
    count = itertools.count()
    return lambda call: well_behaved(call) if next(count) < answered else call_error(REFUSED, unreachable=True)


def test_a_server_that_answered_an_error_is_there_and_its_refusals_are_failures(sample_kb: Path) -> None:
    # The first call got an HTTP error: a server answered, so the run must not say "no call reached the model";
    # refusals after it are per document until enough of them follow one another (next test).
    count = itertools.count()

    def first_refused(call: Call) -> Answer:
        return call_error(REFUSED, unreachable=True) if next(count) == 0 else well_behaved(call)

    client = FakeClient(root=call_error(), doc=first_refused)
    report = kindex.reindex(sample_kb, client_options(client, concurrency=1))
    assert client.calls[0].kind == "root" and len(report.failures) == 2
    assert report.failures[1].reason == REFUSED and len(client.doc_calls()) == 18


def test_a_server_that_goes_away_mid_run_stops_it_after_a_run_of_refusals(sample_kb: Path) -> None:
    client = FakeClient(root=call_error(), doc=_answers_then_refuses(5))
    with pytest.raises(kindex.ModelError, match=r"the model stopped answering \(4 calls in a row could not connect\)"):
        kindex.reindex(sample_kb, client_options(client, concurrency=1))
    assert len(client.doc_calls()) == 5 + 4  # then no call is started
    again = FakeClient()
    report = kindex.reindex(sample_kb, client_options(again, concurrency=1))
    assert report.ok and report.cache_hits == 5 and len(again.doc_calls()) == 18 - 5  # the answers were kept


def test_scattered_refusals_do_not_stop_a_run(sample_kb: Path) -> None:
    count = itertools.count()

    def every_third_refused(call: Call) -> Answer:
        return call_error(REFUSED, unreachable=True) if next(count) % 3 == 2 else well_behaved(call)

    client = FakeClient(root=every_third_refused, doc=every_third_refused)
    report = kindex.reindex(sample_kb, client_options(client, concurrency=1))
    assert len(report.failures) == 19 // 3 and all(f.reason == REFUSED for f in report.failures)


def test_an_empty_kb_asks_the_model_nothing(tmp_path: Path) -> None:
    client = FakeClient()
    plan, preview = kindex.dry_run(tmp_path, client_options(client)), kindex.preview(tmp_path, client_options(client))
    assert plan.calls == preview.estimated_tokens.calls == 0  # both said 1: a root call the run never makes
    report = kindex.reindex(tmp_path, client_options(client))
    assert client.calls == [] and report.ok and report.notes[0].startswith("no Markdown document found")
    assert kindex.validate(tmp_path) == []


def test_sub_and_doc_steps_merge_into_the_theme_index(sample_kb: Path, fake_client: FakeClient) -> None:
    options = client_options(fake_client)
    first = kindex.doc(sample_kb, "billing", "发票开具.md", options, clear_dir=True)
    second = kindex.doc(sample_kb, "billing", "企业采购/合同与盖章.md", options)

    assert (first.completed, first.total, second.completed) == (1, 1, 1)
    assert fake_client.labels() == ["企业采购/合同与盖章.md", "发票开具.md"]
    billing = load(sample_kb / "billing" / "index.json")
    assert [d["path"] for d in billing["documents"]] == ["企业采购/合同与盖章.md", "发票开具.md"]

    kindex.doc(sample_kb, "billing", "退款政策.md", options, clear_dir=True)
    assert [d["path"] for d in load(sample_kb / "billing" / "index.json")["documents"]] == ["退款政策.md"]

    fake_client.calls.clear()
    report = kindex.sub(sample_kb, "billing", options)
    assert (report.completed, report.total) == (6, 6)
    assert len(load(sample_kb / "billing" / "index.json")["documents"]) == 6
    assert report.cache_hits == 3  # the documents answered by the doc steps are not paid for again
    assert fake_client.labels() == ["企业采购/对公转账.md", "套餐与价格.md", "自动续费.md"]


def test_globs_the_model_invents_are_dropped(sample_kb: Path) -> None:
    def globbing(call: Call) -> str:
        obj = good_root(call) if call.kind == "root" else good_doc(call)
        for entry in obj.get("themes", []) + obj.get("documents", []) + [obj]:
            entry["paths"] = ["**/*.tsx", "**/*.md"]
        return json.dumps(obj, ensure_ascii=False)

    kindex.reindex(sample_kb, client_options(FakeClient(root=globbing, doc=globbing)))

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
    # Only the whole extension counts: ".js" in "settings.json", ".c" in ".com" name no such file.
    js = {"title": "T", "summary": "S", "paths": ["**/*.js", "**/*.c"]}
    assert doc_entry(js, "a.md", evidence="在 settings.json 中填写 app_id，见 example.com").paths == ()
    assert doc_entry(js, "a.md", evidence="每个 .js 文件；和 main.c。").paths == ("**/*.js", "**/*.c")


def test_an_answer_cut_off_while_looping_on_tags_is_salvaged_without_a_repair_call(sample_kb: Path) -> None:
    def looping(call: Call) -> str:
        obj = good_doc(call)
        tags = ", ".join(f'"标签{i}"' for i in range(400))  # what a small model does until max_tokens
        return f'{{"title": {json.dumps(obj["title"], ensure_ascii=False)}, "summary": "摘要完整。", "tags": [{tags}'

    client = FakeClient(doc=looping)
    report = kindex.reindex(sample_kb, client_options(client))

    assert report.ok and report.calls == 19  # every document answered, no repair request, no failure
    assert not any(c.repair for c in client.calls)
    doc = load(sample_kb / "sync" / "index.json")["documents"][0]
    assert doc["summary"] == "摘要完整。" and doc["title"] == f"标题 {doc['path']}"  # complete members kept
    assert doc["tags"] == [f"标签{i}" for i in range(12)]  # the finished tags, up to the contract's 12


def _many_themes(root: Path, count: int) -> Path:
    for i in range(count):
        (root / f"topic{i:02d}").mkdir(parents=True)
        (root / f"topic{i:02d}" / "page.md").write_text(f"# 主题 {i}\n\n第 {i} 个主题的说明。\n", encoding="utf-8")
    return root


@pytest.mark.parametrize("count", [12, 30])
def test_a_flat_folder_of_many_notes_gets_one_call_per_document(tmp_path: Path, count: int) -> None:
    # 200 notes directly under the KB: one root answer of 200 entries stopped at the model's output limit, and 172
    # got extractive entries on every run. Past 12, each root document has a call of its own.
    kb = tmp_path / "kb"
    kb.mkdir()
    for i in range(count):
        (kb / f"note{i:02d}.md").write_text(f"# 笔记 {i}\n\n第 {i} 条笔记的内容。\n", encoding="utf-8")
    client = FakeClient()
    options = client_options(client)
    # With no theme, a root answer would have nothing to describe: it is not asked for (an empty prompt's answer
    # could only fail, and the run exit 3 every time).
    assert kindex.dry_run(kb, options).calls == (1 if count <= 12 else count)
    assert kindex.preview(kb, options).estimated_tokens.calls == kindex.dry_run(kb, options).calls  # it said 1

    report = kindex.reindex(kb, options)

    assert report.ok and report.progress.completed == report.progress.total == 1
    assert len(client.doc_calls()) == (0 if count <= 12 else count)
    assert len([c for c in client.calls if c.kind == "root"]) == (1 if count <= 12 else 0)
    titles = {d["path"]: d["title"] for d in load(kb / "index.json")["documents"]}
    expected = "根 {}" if count <= 12 else "标题 {}"  # the fake's root entries, or its document entries
    assert titles == {p: expected.format(p) for p in titles} and len(titles) == count  # every one the model's
    assert kindex.validate(kb) == []
    again = kindex.reindex(kb, options)
    assert again.calls == 0 and again.cache_hits == (1 if count <= 12 else count)
    (kb / "theme").mkdir()  # with a theme, the root answer describes it, and the notes still one call each
    (kb / "theme" / "t.md").write_text("# 主题页\n\n内容。\n", encoding="utf-8")
    client.calls.clear()
    kindex.reindex(kb, options)
    [root_call] = [c for c in client.calls if c.kind == "root"]
    assert "theme" in root_call.user and ("note00.md" in root_call.user) is (count <= 12)


def test_the_root_answer_may_be_as_long_as_its_entries_need(tmp_path: Path, fake_llm: FakeLLM) -> None:
    from tests.conftest import llm_settings

    kb = _many_themes(tmp_path / "kb", 12)
    report = kindex.reindex(kb, Options(llm=llm_settings(fake_llm, model="openai/gpt-4o-mini")))

    assert report.ok
    (root,) = fake_llm.root_requests()
    # 12 entries of at most 300 tokens each and their dir names: the configured 600 would cut off every run.
    assert 12 * 300 < root["max_tokens"] <= 12 * 310 + 50
    assert {r["max_tokens"] for r in fake_llm.doc_requests()} == {600}  # one entry: the configured cap


def test_the_root_answer_is_held_to_what_the_model_can_write(tmp_path: Path, fake_llm: FakeLLM) -> None:
    from tests.conftest import llm_settings

    kb = _many_themes(tmp_path / "kb", 20)
    known = llm_settings(fake_llm, model="openai/gpt-3.5-turbo")  # litellm's map: 4,096 output tokens
    kindex.reindex(kb, Options(llm=known))
    unknown = llm_settings(fake_llm, model="openai/our-own-model", max_tokens=5000)
    kindex.reindex(kb, Options(llm=unknown, force=True))

    assert [r["max_tokens"] for r in fake_llm.root_requests()] == [4096, 5000]  # the user's own cap still wins


def test_a_root_answer_cut_off_inside_its_themes_keeps_the_themes_it_wrote(tmp_path: Path, fake_llm: FakeLLM) -> None:
    from tests.conftest import llm_settings
    from tests.fakellm import Reply, good_root, is_root, well_behaved

    def cut_off_root(request: dict[str, Any]) -> Reply:
        if not is_root(request):
            return well_behaved(request)
        whole = json.dumps(good_root(request), ensure_ascii=False)
        cut = whole[: whole.index('"topic03 的内容"') + 5]  # max_tokens reached in the 4th theme's summary
        return Reply(cut, finish_reason="length")

    fake_llm.script = cut_off_root
    kb = _many_themes(tmp_path / "kb", 6)
    report = kindex.reindex(kb, Options(llm=llm_settings(fake_llm)))

    assert report.ok and len(fake_llm.root_requests()) == 1  # no repair request, no failure
    titles = [t["title"] for t in load(kb / "index.json")["themes"]]
    assert titles[:4] == ["主题 topic00", "主题 topic01", "主题 topic02", "主题 topic03"]
    assert titles[4:] == ["topic04", "topic05"]  # the themes never written get their default entries
    assert kindex.validate(kb) == []
    # ...and the run says why and what mends it (it said only "theme 'topic04' was missing: default entry added").
    assert "an answer was cut off by the token limit: raise --max-tokens (KINDEX_MAX_TOKENS) and run again" in (
        report.notes
    )


def test_failed_calls_and_their_retries_are_counted_in_the_report(sample_kb: Path) -> None:
    kindex.reindex(sample_kb)  # offline first: the theme exists, its documents get extractive stand-ins
    before = (sample_kb / "sync" / "index.json").read_bytes()
    client = FakeClient(doc=call_error(retries=1))

    report = kindex.sub(sample_kb, "sync", client_options(client))

    assert len(report.failures) == 4 and len(client.calls) == 4
    assert (report.calls, report.retries) == (4, 4)  # each failed call was made twice
    assert (sample_kb / "sync" / "index.json").read_bytes() == before  # the stand-ins stay as they were
    assert report.written == ()


def test_a_kb_deleted_during_the_run_fails_and_is_not_recreated(sample_kb: Path) -> None:
    def delete_then_answer(call: Call) -> str:
        shutil.rmtree(sample_kb, ignore_errors=True)
        return well_behaved(call)

    client = FakeClient(root=delete_then_answer, doc=delete_then_answer)
    with pytest.raises(kindex.KBNotFoundError, match="disappeared during the run"):
        kindex.reindex(sample_kb, client_options(client, concurrency=1))
    assert len(client.calls) >= 1
    assert not sample_kb.exists()  # no index file, no cache, no lock file brought the folder back


def test_a_fatal_model_error_stops_the_run_and_writes_nothing(sample_kb: Path) -> None:
    client = FakeClient(doc=kindex.ModelError("model 'fake-model' cannot be used: invalid api key"), delay=0.01)

    with pytest.raises(kindex.ModelError, match="cannot be used"):
        kindex.reindex(sample_kb, client_options(client, concurrency=2))

    assert client.raised and len(client.calls) < 19  # the run stopped early
    # What was written before the error is whole; the themes whose documents failed have no index yet.
    problems = kindex.validate(sample_kb)
    assert problems and all(p.endswith(f"missing (run `kindex sub {sample_kb} {p.split('/')[0]}`)") for p in problems)
    assert list(sample_kb.rglob("*.tmp")) == []


def test_no_call_is_started_after_a_fatal_model_error(sample_kb: Path) -> None:
    client = FakeClient(doc=kindex.ModelError("model 'fake-model' cannot be used: invalid api key"), delay=0.01)

    with pytest.raises(kindex.ModelError):
        kindex.reindex(sample_kb, client_options(client, concurrency=2))

    assert [c.label for c in client.calls if c.errors_before > 0] == []


def test_a_cancel_stops_new_calls_and_late_answers_write_nothing(sample_kb: Path) -> None:
    kindex.reindex(sample_kb, client_options(FakeClient()))
    before = {p: p.read_bytes() for p in sample_kb.rglob("index.json")}
    for doc in sample_kb.rglob("*.md"):  # every answer is needed again
        doc.write_text(doc.read_text(encoding="utf-8") + "\n改过。\n", encoding="utf-8")
    cancel = threading.Event()

    def cancel_then_answer(call: Call) -> str:
        cancel.set()  # the cancel arrives while this call is in flight
        obj = good_root(call) if call.kind == "root" else {**good_doc(call), "title": "取消后的答案"}
        return json.dumps(obj, ensure_ascii=False)

    client = FakeClient(root=cancel_then_answer, doc=cancel_then_answer)
    with pytest.raises(kindex.CancelledRun):
        kindex.reindex(sample_kb, client_options(client, concurrency=1, force=True, cancel=cancel))

    assert len(client.calls) == 1  # no call was started after the cancel
    assert {p: p.read_bytes() for p in sample_kb.rglob("index.json")} == before
    assert list(sample_kb.rglob("*.tmp")) == []


def test_no_repair_request_is_sent_after_a_cancel(sample_kb: Path) -> None:
    cancel = threading.Event()

    def cancel_then_garbage(call: Call) -> str:
        cancel.set()
        return "not json"

    client = FakeClient(root=cancel_then_garbage, doc=cancel_then_garbage)
    with pytest.raises(kindex.CancelledRun):
        kindex.reindex(sample_kb, client_options(client, concurrency=1, cancel=cancel))

    assert [c.repair for c in client.calls] == [False]


def test_notes_on_a_root_answer_are_said_when_it_is_new_not_on_every_run(sample_kb: Path) -> None:
    # A newcomer's fully cached no-op run printed the same five "theme … was missing: default entry added" each time.
    client = FakeClient(root='{"themes": [], "documents": []}')
    first = kindex.reindex(sample_kb, client_options(client))
    missing = [n for n in first.notes if n.startswith("index.json: theme ") and "was missing" in n]
    assert len(missing) == 4
    again = kindex.reindex(sample_kb, client_options(client))
    assert again.cache_hits and not any("was missing" in n for n in again.notes)
