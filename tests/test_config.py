"""kindex.toml, the KINDEX_* environment and flags: precedence, errors, excludes; and `kindex search`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import kindex
from kindex.cli import main
from kindex.config import resolve
from kindex.server import create_app


def write_config(kb: Path, text: str) -> None:
    (kb / "kindex.toml").write_text(text, encoding="utf-8")


def test_flag_beats_environment_beats_file_beats_default(sample_kb: Path) -> None:
    write_config(sample_kb, "[context]\nbudget_tokens = 900\nmax_docs = 3\nmin_relevance = 0.5\n")
    env = {"KINDEX_MAX_DOCS": "2", "KINDEX_MIN_RELEVANCE": "0.4"}

    eff = resolve(sample_kb, {"min_relevance": 0.2}, env)

    assert (eff["min_relevance"], eff.sources["min_relevance"]) == (0.2, "flag")
    assert (eff["max_docs"], eff.sources["max_docs"]) == (2, "env KINDEX_MAX_DOCS")
    assert (eff["budget_tokens"], eff.sources["budget_tokens"]) == (900, "kindex.toml")
    assert (eff["retries"], eff.sources["retries"]) == (4, "default")


def test_a_broken_file_is_left_out_of_answers_with_a_warning_but_steps_refuse_it(sample_kb: Path) -> None:
    # One typo took every chat turn's knowledge away: context and search failed, on the CLI and over HTTP.
    kindex.reindex(sample_kb)
    write_config(sample_kb, '[context]\nfallback_doc = ["导读.md"]\n')
    said = (
        "kindex.toml: [context] has no setting 'fallback_doc' (did you mean 'fallback_docs'?) (known: budget_tokens, "
        "fallback_docs, max_docs, min_relevance): its settings were left out of this answer (fix the file)"
    )

    ctx = kindex.build_context(sample_kb, "发票怎么开")
    assert ctx.items[0].path == "billing/发票开具.md" and said in ctx.warnings
    assert kindex.search(sample_kb, "发票怎么开")[0].path == "billing/发票开具.md"
    result = CliRunner().invoke(main, ["context", str(sample_kb), "发票怎么开", "--json"])
    assert result.exit_code == 0 and said in orjson.loads(result.stdout)["warnings"]
    result = CliRunner().invoke(main, ["search", str(sample_kb), "发票", "--json"])
    assert result.exit_code == 0 and said in orjson.loads(result.stdout)["warnings"]
    app = TestClient(create_app(sample_kb.parent), base_url="http://127.0.0.1")
    answer = app.post(f"/v1/agents/{sample_kb.name}/knowledge/context", json={"message": "发票怎么开"})
    assert answer.status_code == 200 and said in answer.json()["warnings"]  # it was 422 invalid_file
    with pytest.raises(kindex.InvalidFileError, match="did you mean 'fallback_docs'"):
        kindex.reindex(sample_kb)  # a step is steered by the file (exclude, model): it still refuses


def test_a_variable_that_does_not_parse_is_left_out_of_answers_but_steps_refuse_it(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # KINDEX_TEMPERATURE=nan, which no answer uses, failed every `kindex context` and build_context with exit 2.
    kindex.reindex(sample_kb)
    monkeypatch.setenv("KINDEX_TEMPERATURE", "nan")
    monkeypatch.setenv("KINDEX_MAX_DOCS", "0")
    said = (
        "KINDEX_MAX_DOCS='0': must be 1 to 50: left out of this answer (fix the variable); "
        "KINDEX_TEMPERATURE='nan': expected a finite number, got 'nan': left out of this answer (fix the variable)"
    )
    ctx = kindex.KnowledgeBase(sample_kb).context("发票怎么开")
    assert ctx.items[0].path == "billing/发票开具.md" and ctx.warnings == (said,)
    result = CliRunner().invoke(main, ["context", str(sample_kb), "发票怎么开", "--json"])
    assert result.exit_code == 0 and orjson.loads(result.stdout)["warnings"] == [said]
    result = CliRunner().invoke(main, ["reindex", str(sample_kb)])
    assert result.exit_code == 2 and result.stderr == "Error: KINDEX_MAX_DOCS='0': must be 1 to 50\n"
    # A variable the call overrides is not used, and not said (the CLI's --max-docs never said it either).
    only = said.split("; ")[1]
    assert kindex.KnowledgeBase(sample_kb).context("发票怎么开", max_docs=2).warnings == (only,)
    assert kindex.build_context(sample_kb, "发票怎么开", max_docs=2).warnings == (only,)
    result = CliRunner().invoke(main, ["context", str(sample_kb), "发票怎么开", "--max-docs", "2", "--json"])
    assert orjson.loads(result.stdout)["warnings"] == [only]


def test_a_file_saved_with_a_byte_order_mark_is_read(sample_kb: Path) -> None:
    # Notepad's UTF-8 has one; the file made every command of the KB fail, `context` included.
    write_config(sample_kb, "\ufeff[context]\nbudget_tokens = 900\n")

    eff = resolve(sample_kb, {}, {})

    assert (eff["budget_tokens"], eff.sources["budget_tokens"]) == (900, "kindex.toml")


def test_kindex_config_prints_each_value_and_its_source(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(sample_kb, '[model]\nmodel = "openai/gpt-4o-mini"\ntemperature = 0.5\n')
    monkeypatch.setenv("KINDEX_TEMPERATURE", "0.7")

    result = CliRunner().invoke(main, ["config", str(sample_kb), "--json"])

    data = orjson.loads(result.stdout)
    assert data["model"] == {"value": "openai/gpt-4o-mini", "source": "kindex.toml"}
    assert data["temperature"] == {"value": 0.7, "source": "env KINDEX_TEMPERATURE"}
    assert data["budget_tokens"] == {"value": 6000, "source": "default"}
    human = CliRunner().invoke(main, ["config", str(sample_kb)]).stdout
    assert 'model = "openai/gpt-4o-mini"  # kindex.toml' in human and "temperature = 0.7  # env" in human


def test_kindex_config_says_which_overview_documents_the_kb_lacks(sample_kb: Path) -> None:
    # The default names are the sample KB's: an APISIX KB fell back to its README while config showed them silently.
    def shown(*extra: str) -> tuple[str, list[str]]:
        human = CliRunner().invoke(main, ["config", str(sample_kb), *extra]).stdout.splitlines()[2]
        data = orjson.loads(CliRunner().invoke(main, ["config", str(sample_kb), "--json", *extra]).stdout)
        return human, data["fallback_docs"]["absent"]

    assert shown() == ('fallback_docs = ["导读.md", "00-总则与功能导航.md"]  # default: overview documents', [])
    write_config(sample_kb, '[context]\nfallback_docs = ["导读.md", "faq/概览.md"]\n')
    human, absent = shown()
    assert human.endswith("# kindex.toml: overview documents (faq/概览.md: not in this KB)")
    assert absent == ["faq/概览.md"]
    (sample_kb / "导读.md").unlink()
    human, absent = shown()
    assert human.endswith(
        "(none of them is in this KB: its README.md or index.md serves, else an overview of the index)"
    ) and absent == ["导读.md", "faq/概览.md"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[context]\nbudget_tokens = 10\n", "[context] budget_tokens: must be 50 to 200000"),
        ("[context]\nbudget = 900\n", "[context] has no setting 'budget'"),
        ("[retrieval]\nmax_docs = 2\n", "unknown section [retrieval]"),
        ('[index]\nexclude = "**/**/**/*.md"\n', "not a usable glob"),
        ("[model\nmodel = 1\n", "is not valid TOML"),
        ("[context]\nmax_docs = 2.5\n", "[context] max_docs: expected a whole number"),
    ],
)
def test_a_broken_config_file_is_a_clear_error(sample_kb: Path, text: str, message: str) -> None:
    write_config(sample_kb, text)

    for command in (["reindex", str(sample_kb)], ["config", str(sample_kb)]):  # answers leave it out, with a warning
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 1 and message in result.stderr and "kindex.toml" in result.stderr


def test_the_context_command_takes_its_defaults_from_the_file(sample_kb: Path) -> None:
    kindex.reindex(sample_kb)
    write_config(sample_kb, '[context]\nmax_docs = 1\nfallback_docs = ["常见问题.md"]\n')

    on_topic = CliRunner().invoke(main, ["context", str(sample_kb), "退款多久到账", "--json"])
    off_topic = CliRunner().invoke(main, ["context", str(sample_kb), "今天天气怎么样", "--json"])
    flagged = CliRunner().invoke(main, ["context", str(sample_kb), "退款多久到账", "--max-docs", "3", "--json"])

    assert len(orjson.loads(on_topic.stdout)["items"]) == 1
    assert [i["path"] for i in orjson.loads(off_topic.stdout)["items"]] == ["常见问题.md"]
    assert len(orjson.loads(flagged.stdout)["items"]) > 1


def test_excluded_documents_are_not_scanned_indexed_or_served(sample_kb: Path) -> None:
    write_config(sample_kb, '[index]\nexclude = ["sync/**", "**/发票*.md"]\n')

    report = kindex.reindex(sample_kb)

    assert not (sample_kb / "sync" / "index.json").exists()
    billing = orjson.loads((sample_kb / "billing" / "index.json").read_bytes())
    assert all(not d["path"].startswith("发票") for d in billing["documents"])
    assert {s.reason for s in report.skipped if s.path.startswith("sync/")} == {
        "excluded by the setting exclude (sync/**)"
    }
    assert kindex.validate(sample_kb) == []
    assert all("sync/" not in i.path for i in kindex.search(sample_kb, "多设备同步冲突", limit=None))
    # Nor as an overview: an excluded draft was handed over in full as a fallback (hostile campaign).
    write_config(sample_kb, '[index]\nexclude = ["sync/**", "导读.md"]\n')
    kindex.reindex(sample_kb)
    ctx = kindex.build_context(sample_kb, "讲个笑话", fallback_docs=["sync/离线模式.md", "导读.md"])
    assert [i.path for i in ctx.items] == ["index.json"] and "没有网络" not in ctx.text
    assert [w.split(" is not")[0] for w in ctx.warnings] == [
        "fallback document 'sync/离线模式.md'",
        "fallback document '导读.md'",
    ]


def test_a_knowledge_base_handle_rereads_its_file_when_it_changes(sample_kb: Path) -> None:
    kindex.reindex(sample_kb)
    kb = kindex.KnowledgeBase(sample_kb)
    assert kb.settings.max_docs == 4
    write_config(sample_kb, "[context]\nmax_docs = 1\n")
    assert kb.settings.max_docs == 1 and len(kb.context("退款和发票").items) == 1


def test_each_agent_of_the_service_has_its_own_file(sample_kb: Path) -> None:
    kindex.reindex(sample_kb)
    write_config(sample_kb, "[context]\nmax_docs = 1\n")
    app = TestClient(create_app(sample_kb.parent), base_url="http://127.0.0.1")

    ctx = app.post(f"/v1/agents/{sample_kb.name}/knowledge/context", json={"message": "退款和发票"})
    assert ctx.status_code == 200 and len(ctx.json()["items"]) == 1


def test_search_lists_the_ranking_without_the_documents(sample_kb: Path) -> None:
    kindex.reindex(sample_kb)

    result = CliRunner().invoke(main, ["search", str(sample_kb), "退款多久到账", "--limit", "2", "--json"])
    off = CliRunner().invoke(main, ["search", str(sample_kb), "今天天气怎么样"])
    human = CliRunner().invoke(main, ["search", str(sample_kb), "退款多久到账"])

    results = orjson.loads(result.stdout)["results"]
    assert result.exit_code == 0 and len(results) == 2 and results[0]["path"] == "billing/退款政策.md"
    assert "text" not in results[0] and results[0]["title"] == "退款政策"
    assert off.exit_code == 0 and off.stdout == "" and "off topic" in off.stderr
    assert human.stdout.splitlines()[0].split()[1] == "billing/退款政策.md"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[context]\nmax_docs=" + "[" * 2000 + "]" * 2000, "not valid TOML (nested too deeply)"),
        ("[model]\nretry_base_delay = nan\n", "expected a finite number"),
        ("[context]\nmin_relevance = inf\n", "expected a finite number"),
        ('[context]\nmax_docs = "4"\n', "expected a number, not the string '4'"),
        ("context = 5\n", "context must be a section"),
        ('[context]\nfallback_docs = ["../secret.md"]\n', "is not a KB-relative path"),
        ('[context]\nfallback_docs = ["C:/secret.md"]\n', "is not a KB-relative path"),
        ("[model]\nmax_tokens = 100000000000000000000\n", "[model] max_tokens: must be 1 to 1000000"),
    ],
)
def test_hostile_config_values_are_named_errors(sample_kb: Path, text: str, message: str) -> None:
    write_config(sample_kb, text)
    result = CliRunner().invoke(main, ["config", str(sample_kb)])
    assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_a_config_file_that_is_not_a_regular_file_inside_the_kb_is_an_error(sample_kb: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.toml"
    outside.write_text("[context]\nmax_docs = 2\n", encoding="utf-8")
    target = sample_kb / "kindex.toml"
    expected = {
        "folder": "kindex.toml is a folder: kindex reads the KB's settings from a file of that name; rename or "
        "remove it",
        "symlink out": "kindex.toml leads outside the knowledge folder: make it a regular file in it",
        "dangling symlink": "kindex.toml cannot be read (",
    }
    for kind, message in expected.items():
        if kind == "folder":
            target.mkdir()
        else:
            target.symlink_to(outside if kind == "symlink out" else tmp_path / "missing")
        result = CliRunner().invoke(main, ["config", str(sample_kb)])
        assert result.exit_code == 1 and f"Error: {message}" in result.stderr, (kind, result.stderr)
        if kind == "folder":
            target.rmdir()
        else:
            target.unlink()


def test_config_of_a_missing_folder_is_kb_not_found(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["config", str(tmp_path / "nowhere"), "--json"])
    assert result.exit_code == 1 and orjson.loads(result.stdout)["error"]["code"] == "kb_not_found"


def test_a_fallback_document_may_hold_a_colon_in_its_name(sample_kb: Path) -> None:
    # Only a drive (C:/) is absolute: "FAQ: billing.md", then "Q: billing.md", were refused as "not a KB-relative
    # path".
    (sample_kb / "Q: 账单.md").write_text("# 账单问答\n\n账单怎么看。\n", encoding="utf-8")
    write_config(sample_kb, '[context]\nfallback_docs = ["Q: 账单.md"]\n')
    kindex.reindex(sample_kb)
    ctx = kindex.build_context(sample_kb, "今天上海会下雨吗")
    assert ctx.fallback and ctx.items[0].path == "Q: 账单.md"
