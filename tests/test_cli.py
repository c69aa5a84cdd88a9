"""The command line: exit codes, messages, stdout/stderr discipline, and what it must not import."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from kindex.cli import main
from kindex.store import read_index
from tests.fakellm import FakeLLM, Reply, doc_path, is_root, well_behaved


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_reindex_offline_then_validate(sample_kb: Path) -> None:
    code, out, err = run("reindex", str(sample_kb), env={"KINDEX_MODEL": ""})

    assert code == 0
    assert out.startswith("reindex: 19/19 steps, 0 model calls, 0 cached, 0 retries, 0 failed, no tokens")
    assert "wrote: index.json, account/index.json, billing/index.json" in out
    assert "kindex: generator: extractive (offline, no model configured" in err
    assert run("validate", str(sample_kb)) == (0, "index is valid\n", "")


def test_reindex_json_output_is_machine_readable(sample_kb: Path) -> None:
    code, out, _ = run("reindex", str(sample_kb), "--json")

    assert code == 0
    report = json.loads(out)
    assert report["progress"] == {"completed": 19, "total": 19}
    assert report["generator"] == "extractive" and report["failures"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["context", "{kb}", "退款", "--budget", "3"], "Invalid value for '--budget': 3 is not in the range"),
        (["context", "{kb}"], "give the chat message"),
        (["reindex", "{kb}", "--temperature", "9"], "temperature: must be 0.0 to 2.0"),
    ],
    ids=["click-range", "missing-message", "core-usage-error"],
)
def test_usage_errors_with_json_still_answer_json_on_stdout(sample_kb: Path, args: list[str], message: str) -> None:
    code, out, err = run(*(a.format(kb=sample_kb) for a in args), "--json")

    assert code == 2 and f"Error: {message}" in err  # for a person, on stderr
    error = json.loads(out)  # and an answer a script can parse
    assert error["ok"] is False and error["error"]["code"] == "invalid_request"
    assert error["error"]["message"].startswith(message)


def test_preview_human_and_json(sample_kb: Path) -> None:
    code, out, _ = run("preview", str(sample_kb))
    assert code == 0
    assert "steps: 1 root (its themes and 3 root documents) + 18 theme documents = 19" in out
    assert "  billing/  6 documents" in out

    code, out, _ = run("preview", str(sample_kb), "--json")
    data = json.loads(out)
    assert code == 0 and data["steps_total"] == 19
    assert data["top_dirs"] == ["account", "billing", "developer", "sync"]
    assert "企业采购/对公转账.md" in data["top_dir_docs"]["billing"]
    assert data["llm_configured"] is False and data["skipped"] == []


def test_preview_of_a_folder_without_markdown_says_so(tmp_path: Path) -> None:
    # It said "0 calls (the root's -1 documents one call each: more than fit one root answer)", and nothing of why.
    (tmp_path / "notes.txt").write_text("hi", encoding="utf-8")
    code, out, err = run("preview", str(tmp_path))
    assert code == 0 and "a full model run: 0 calls, ~0 prompt" in out and "-1" not in out
    assert "no Markdown document found (only .md files are indexed)" in err


def test_validate_lists_problems_and_exits_1(sample_kb: Path) -> None:
    assert run("reindex", str(sample_kb))[0] == 0
    (sample_kb / "sync" / "新增.md").write_text("# 新增\n\n新文档。", encoding="utf-8")
    data = orjson.loads((sample_kb / "index.json").read_bytes())
    data["themes"] = [t for t in data["themes"] if t["dir"] != "account"]
    (sample_kb / "index.json").write_bytes(orjson.dumps(data))
    (sample_kb / "billing" / "index.json").write_text("{broken", encoding="utf-8")

    code, out, err = run("validate", str(sample_kb))

    assert code == 1
    assert "index.json: theme 'account' has no entry" in out
    assert "billing/index.json: not valid JSON" in out
    assert f"sync/index.json: scanned document '新增.md' has no entry (run `kindex sub {sample_kb} sync`)" in out
    assert err == "kindex: 3 problem(s) found\n"


def test_errors_have_clear_messages_and_exit_codes(sample_kb: Path, tmp_path: Path) -> None:
    code, _, err = run("reindex", str(tmp_path / "missing"))
    assert code == 1 and "knowledge folder" in err and "does not exist" in err
    assert "generator" not in err  # the wrong path is the news, not which generator would have run
    code, _, err = run("watch", str(tmp_path / "missing"))
    assert code == 1 and "knowledge folder" in err and "does not exist" in err  # as every command says it

    code, _, err = run("reindx", str(sample_kb))
    assert code == 2 and "No such command 'reindx'. Did you mean 'reindex'?" in err

    # Without its scheme litellm took the base for a path: every document failed as an HTTP 500, after retries.
    code, _, err = run("reindex", str(sample_kb), "--model", "openai/x", "--api-base", "127.0.0.1:8014/v1")
    assert code == 2 and "api base '127.0.0.1:8014/v1' is not an http:// or https:// URL: did you mean http://" in err

    code, _, err = run("sub", str(sample_kb), "nope")
    assert code == 1 and "'nope' is not a theme" in err

    code, _, err = run("doc", str(sample_kb), "billing", "../导读.md")
    assert code == 1 and "'../导读.md' is not a scanned document of theme 'billing'" in err

    code, _, err = run("doc", str(sample_kb), "billing", "/etc/passwd")
    assert code == 1 and "is not a scanned document" in err

    # A newcomer types the path as search prints it, or names a document directly under the KB.
    code, _, err = run("doc", str(sample_kb), "导读.md")
    assert code == 2 and "'导读.md' is directly under the knowledge folder: the root index holds" in err
    assert "run `kindex root" in err
    code, _, err = run("doc", str(sample_kb), ".")
    assert code == 2 and "'.' is the knowledge folder itself: the root index holds" in err
    code, _, err = run("doc", str(sample_kb), ".", "导读.md")
    assert code == 1 and "'.' is the knowledge folder itself, not a theme" in err
    code, _, err = run("doc", str(sample_kb), "..", "x.md")
    assert code == 1 and "'..' is not a theme" in err
    code, _, err = run("doc", str(sample_kb), "billing")
    assert code == 2 and "give the document: `kindex doc KB DIR PATH`" in err

    code, _, err = run("reindex", str(sample_kb), "--concurrency", "0")
    assert code == 2 and "Invalid value for '--concurrency'" in err

    code, _, err = run("reindex", str(sample_kb), env={"KINDEX_TEMPERATURE": "hot"})
    assert code == 2 and "KINDEX_TEMPERATURE='hot': expected a number" in err
    assert not (sample_kb / "index.json").exists()
    assert not (tmp_path / "missing").exists()


def test_a_folder_without_markdown_is_indexed_with_a_note_saying_so(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\n", encoding="utf-8")
    code, out, err = run("reindex", str(tmp_path))
    assert code == 0 and "wrote: index.json" in out
    assert "kindex: note: no Markdown document found (only .md files are indexed): the index is empty" in err
    code, out, _ = run("reindex", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["notes"][0].startswith("no Markdown document found")


def test_a_fallback_document_that_cannot_be_served_is_reported(sample_kb: Path) -> None:
    assert run("reindex", str(sample_kb))[0] == 0
    code, out, err = run("context", str(sample_kb), "讲个笑话", "--fallback", "nosuch.md")
    assert code == 0 and "## Overview" in out  # the overview of the root index serves instead
    assert "kindex: note: fallback document 'nosuch.md' is not a document of the index (missing," in err
    code, out, err = run(
        "context", str(sample_kb), "讲个笑话", "--fallback", "./billing//发票开具.md", "--fallback", "导读.md"
    )
    assert code == 0 and "(source: billing/发票开具.md)" in out and "fallback document" not in err
    assert out.count("(source: billing/发票开具.md)") == 1 and "(source: 导读.md)" in out
    (sample_kb / "kindex.toml").write_text('[context]\nfallback_docs = ["导读.md", "nosuch.md"]\n', encoding="utf-8")
    code, out, err = run("context", str(sample_kb), "讲个笑话")
    assert code == 0 and "(source: 导读.md)" in out
    assert "kindex: note: fallback document 'nosuch.md' is not a document of the index (missing," in err
    code, _, err = run("context", str(sample_kb), "讲个笑话", "--fallback", " ")
    assert code == 2 and "fallback_docs: an empty document path" in err


def test_a_failed_document_gives_exit_3_and_names_it(sample_kb: Path, fake_llm: FakeLLM) -> None:
    def script(request: dict[str, Any]) -> Reply:
        if not is_root(request) and doc_path(request) == "离线模式.md":
            return Reply("garbage")
        return well_behaved(request)

    fake_llm.script = script
    env = {"KINDEX_MODEL": "openai/fake", "KINDEX_API_BASE": fake_llm.url, "KINDEX_RETRY_BASE_DELAY": "0"}
    code, out, err = run("reindex", str(sample_kb), env=env)

    assert code == 3
    assert "failed: sync/离线模式.md: unusable answer after a repair request" in out
    assert f"kindex: generator: model openai/fake at {fake_llm.url}" in err
    assert "1 item(s) failed" in err
    code, out, err = run("validate", str(sample_kb))
    assert code == 1 and out.startswith("sync/离线模式.md: its entry is a stand-in")
    assert "unusable answer after a repair request" in out and "kindex: 1 problem(s) found" in err


@pytest.mark.slow  # fresh interpreters, to see what they import
def test_a_fully_cached_reindex_with_a_model_never_imports_litellm(sample_kb: Path, fake_llm: FakeLLM) -> None:
    args = ["reindex", str(sample_kb), "--model", "openai/fake", "--api-base", fake_llm.url]
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from kindex.cli import main\n"
        "result = CliRunner().invoke(main, sys.argv[1:])\n"
        "print(result.exit_code, 'litellm' in sys.modules)\n"
    )
    env = {**os.environ, "OPENAI_API_KEY": "test-key"}

    def run_probe() -> str:
        return subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True, env=env
        ).stdout.strip()

    assert run_probe() == "0 True"  # the first run calls the model
    calls = len(fake_llm.requests)
    assert run_probe() == "0 False"  # every answer cached: no call, and 4-6 s of import spared
    assert len(fake_llm.requests) == calls


@pytest.mark.slow  # a fresh interpreter, to see what it imports
def test_help_preview_and_validate_never_import_litellm(sample_kb: Path) -> None:
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from kindex.cli import main\n"
        "for args in (['--help'], ['reindex', '--help'], ['preview', sys.argv[1]], ['validate', sys.argv[1]]):\n"
        "    CliRunner().invoke(main, args)\n"
        "print('litellm' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(sample_kb)], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


@pytest.mark.slow  # a fresh interpreter
def test_python_dash_m_kindex_is_the_command(tmp_path: Path) -> None:
    # It said "No module named kindex.__main__": what people type when the script is not on PATH.
    out = subprocess.run(
        [sys.executable, "-m", "kindex", "context", str(tmp_path), "退款"], capture_output=True, text=True
    )
    assert out.returncode == 1 and "has no index yet: run `kindex reindex` on it first" in out.stderr, out.stderr
    assert (
        "Usage: kindex "
        in subprocess.run([sys.executable, "-m", "kindex", "--help"], capture_output=True, text=True).stdout
    )


def test_a_missing_extra_is_named_with_an_install_command_for_this_kindex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The advice was `pip install 'kindex[server]'`, which installs PyPI's kindex: another project, in this one's
    # place.
    import importlib.metadata

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # an import of it fails, as without the extra

    class Installed:
        def __init__(self, record: str | None) -> None:
            self.record = record

        def read_text(self, name: str) -> str | None:
            return self.record if name == "direct_url.json" else None

    for record, advice in [
        ('{"url": "file:///src/my%20kindex", "dir_info": {}}', "pip install '/src/my kindex[server]'"),
        (None, "pip install '.[server]' in kindex's source folder"),
    ]:
        monkeypatch.setattr(importlib.metadata, "distribution", lambda name, r=record: Installed(r))
        result = CliRunner().invoke(main, ["serve", "--kb-root", str(tmp_path)])
        assert result.exit_code == 1
        assert result.stderr == f"Error: the HTTP service needs kindex's server extra (uvicorn is missing): {advice}\n"


def test_validate_quotes_the_theme_in_the_command_it_suggests(tmp_path: Path) -> None:
    # `kindex sub KB my docs` failed with "Got unexpected extra argument (docs)".
    kb = tmp_path / "kb"
    (kb / "my docs").mkdir(parents=True)
    (kb / "my docs" / "a.md").write_text("# A\n\ntext\n", encoding="utf-8")
    assert CliRunner().invoke(main, ["reindex", str(kb)]).exit_code == 0
    (kb / "my docs" / "b.md").write_text("# B\n\ntext\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(kb)])
    said = f"my docs/index.json: scanned document 'b.md' has no entry (run `kindex sub {kb} 'my docs'`)"
    assert said in result.stdout


def test_doc_takes_the_path_as_search_prints_it(sample_kb: Path) -> None:
    assert run("reindex", str(sample_kb))[0] == 0
    doc = sample_kb / "billing" / "企业采购" / "对公转账.md"
    doc.write_text("# 对公转账（新）\n\n" + doc.read_text(encoding="utf-8"), encoding="utf-8")
    for given in ("billing/企业采购/对公转账.md", "./billing\\企业采购/对公转账.md", str(doc)):
        code, out, _ = run("doc", str(sample_kb), given)
        assert code == 0 and "1/1 steps" in out, given
    index = read_index(sample_kb / "billing" / "index.json")
    entry = None if index is None else index.document("企业采购/对公转账.md")
    assert entry is not None and entry.title == "对公转账（新）"


def test_search_says_why_a_named_document_comes_first(sample_kb: Path) -> None:
    assert run("reindex", str(sample_kb))[0] == 0
    code, out, _ = run("search", str(sample_kb), "billing/退款政策.md 讲了什么")
    assert code == 0 and out.splitlines()[0].split()[1] == "billing/退款政策.md"
    assert "(path in the message" in out.splitlines()[1]


def test_a_run_logged_to_a_file_says_its_progress_now_and_then(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model run lasts minutes; piped to a log (no terminal, so no bar) it said nothing until it ended.
    import kindex.cli.index

    quick = CliRunner().invoke(main, ["reindex", str(sample_kb)])
    assert quick.exit_code == 0 and "kindex: progress:" not in quick.stderr  # a short run: no line
    monkeypatch.setattr(kindex.cli.index, "LOG_PROGRESS_EVERY_S", 0.0)
    logged = CliRunner().invoke(main, ["reindex", str(sample_kb), "--force"])
    assert logged.exit_code == 0
    lines = [line for line in logged.stderr.splitlines() if line.startswith("kindex: progress: ")]
    assert len(lines) == 19 and lines[-1].startswith("kindex: progress: 19/19 steps (")
    assert "kindex: progress: 2/19 steps (account/双重验证.md)" in lines


def test_the_cli_runs_off_the_main_thread(sample_kb: Path) -> None:
    # SIGTERM is handled on the main thread only: a program that runs the CLI on a worker thread must still work.
    import threading

    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(CliRunner().invoke(main, ["reindex", str(sample_kb)])))
    worker.start()
    worker.join()
    assert results[0].exit_code == 0, results[0].output


def test_a_file_name_with_a_newline_prints_as_one_escaped_line(tmp_path: Path) -> None:
    # `kindex search` printed "t/new⏎line.md": a file name could forge an output line (and \x01 reached the terminal).
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "new\nline\x01.md").write_text("# 退款\n\n退款说明。\n", encoding="utf-8")
    (tmp_path / "t" / "b.md").write_text("# 其他\n\n其他。\n", encoding="utf-8")
    assert run("reindex", str(tmp_path))[0] == 0
    code, out, _ = run("search", str(tmp_path), "退款")
    assert code == 0 and out.splitlines()[0].endswith("t/new\\nline\\x01.md  退款")
    code, _, err = run("context", str(tmp_path), "退款")
    assert code == 0 and "# t/new\\nline\\x01.md  score" in err


def test_a_message_that_starts_with_a_dash_is_told_to_go_after_double_dash(sample_kb: Path) -> None:
    # It said only "No such option '- '".
    result = CliRunner().invoke(main, ["context", str(sample_kb), "-h 参数是什么"])
    assert result.exit_code == 2 and "goes after `--`: kindex context KB -- " in result.stderr
    result = CliRunner().invoke(main, ["context", str(sample_kb), "--bugdet", "3"])
    assert result.exit_code == 2 and "Did you mean '--budget'?" in result.stderr and "`--`" not in result.stderr
    # Nor had `-x CORS` a hint, and `search` was told to run `kindex context`.
    for command, message, said in (
        ("context", "-x CORS", '-- "-x …"'),
        ("search", "--limit means?", '-- "--limit means?"'),
    ):
        result = CliRunner().invoke(main, [command, str(sample_kb), message])
        assert result.exit_code == 2 and f"goes after `--`: kindex {command} KB {said}" in result.stderr


def test_output_that_cannot_be_written_is_said_not_a_traceback(sample_kb: Path) -> None:
    # A hostile campaign: standard output in latin-1 (a Windows redirect, a GBK locale meeting an emoji) and a full
    # disk under the output each ended the command in a traceback after its work was done.
    command = [sys.executable, "-m", "kindex.cli"]
    subprocess.run([*command, "reindex", str(sample_kb)], capture_output=True, check=True)
    latin = subprocess.run(
        [*command, "search", str(sample_kb), "退款"],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "latin-1"},
    )
    assert latin.returncode == 0 and b"billing/????.md" in latin.stdout and b"Traceback" not in latin.stderr
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    for as_json in ((), ("--json",)):
        with open("/dev/full", "wb") as full:
            failed = subprocess.run(
                [*command, "context", str(sample_kb), "退款", *as_json], stdout=full, stderr=subprocess.PIPE
            )
        assert failed.returncode == 1 and b"Error: No space left on device" in failed.stderr, failed.stderr
        assert b"Traceback" not in failed.stderr


def test_a_password_in_the_api_base_is_never_printed(sample_kb: Path) -> None:
    # `kindex config` and the generator line of every step printed http://user:hunter2@… in clear (the service
    # already hid the queue's).
    env = {"KINDEX_API_BASE": "http://user:hunter2@127.0.0.1:9/v1", "KINDEX_MODEL": "openai/x"}
    for args in (("config", str(sample_kb)), ("config", str(sample_kb), "--json")):
        code, out, err = run(*args, env=env)
        assert code == 0 and "hunter2" not in out + err and "http://***@127.0.0.1:9/v1" in out
    from kindex.hosts import redact_url

    assert redact_url("redis://:pw@host:6379/0") == "redis://***@host:6379/0"
    assert redact_url("http://host/v1/a@b") == "http://host/v1/a@b"  # an @ in the path is no user part
    assert redact_url("http://[::1") == "***"


@pytest.mark.parametrize(
    "args",
    [
        ("skills", "validate", "{gone}"),
        ("skills", "validate", "{file}"),
        ("skills", "validate", "{plain}"),
        ("skills", "validate", "{plain}", "--json"),
        ("find", "{gone}", "pdf"),
        ("skills", "export", "{gone}", "foo", "-o", "{out}"),
        ("skills", "sync", "{plain}", "{out}"),
    ],
)
def test_a_folder_that_is_no_skill_library_is_said_not_passed(
    sample_kb: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    # A newcomer's run: `skills validate` said "skills are valid" (exit 0) of a missing folder, a file and a plain
    # KB (a CI check passing on a wrong path); `find` and `export` of a missing folder blamed the library or the
    # skill; a sync from a plain KB reported success and wrote a manifest.
    where = {"gone": tmp_path / "nope", "file": sample_kb / "导读.md", "plain": sample_kb, "out": tmp_path / "ws"}
    code, out, err = run(*(a.format(**where) for a in args))
    said = out + err
    assert code == 1 and "skills are valid" not in said and not (tmp_path / "ws").exists()
    if "{gone}" in args:
        assert "does not exist: pass the folder that holds your skills" in said
    elif "{file}" in args:
        assert "is not a folder" in said
    else:
        assert "this folder is not a skill library (no folder of it holds a SKILL.md)" in said


def test_a_document_named_without_its_theme_gets_the_command_that_works(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `kindex doc KB 退款政策.md` (the theme left out) said to run `kindex root`, which does not touch it; a name no
    # document has said the same.
    assert run("reindex", str(sample_kb))[0] == 0
    code, _, err = run("doc", str(sample_kb), "退款政策.md")
    assert code == 2 and f"`kindex doc {sample_kb} 'billing/退款政策.md'`" in err and "kindex root" not in err
    code, _, err = run("doc", str(sample_kb), "无此文档.md")
    assert code == 2 and "is not a document of" in err and "kindex root" not in err
    # A name the KB holds at its root is the root's, whatever folder the command runs from.
    (sample_kb / "billing" / "导读.md").write_text("# 计费导读\n\n正文。\n", encoding="utf-8")
    monkeypatch.chdir(sample_kb / "billing")
    code, _, err = run("doc", str(sample_kb), "导读.md")
    assert code == 2 and f"run `kindex root {sample_kb}`" in err


def test_the_commands_validate_advises_run_as_printed(sample_kb: Path) -> None:
    # A hostile campaign: for a theme named `-weird` validate advised `kindex sub KB -weird`, read as an option;
    # for `billing/a\b.md`, `kindex doc KB 'billing/a\b.md'`, whose backslash the one-argument form reads as a folder.
    (sample_kb / "-weird").mkdir()
    (sample_kb / "-weird" / "-n.md").write_text("# 奇怪\n\n正文。\n", encoding="utf-8")
    (sample_kb / "billing" / "a\\b.md").write_text("# 反斜杠\n\n正文。\n", encoding="utf-8")
    assert run("reindex", str(sample_kb))[0] == 0
    with open(sample_kb / "billing" / "a\\b.md", "a", encoding="utf-8") as fh:
        fh.write("改了。\n")
    (sample_kb / "-weird" / "index.json").unlink()
    code, out, _ = run("validate", str(sample_kb))
    commands = [line.split("`")[1] for line in out.splitlines() if "`" in line]
    assert code == 1 and len(commands) == 2, out
    for command in commands:
        args = shlex.split(command)
        assert args[0] == "kindex" and run(*args[1:])[0] == 0, command
    assert run("validate", str(sample_kb))[0] == 0


def test_a_step_lists_at_most_fifty_skipped_files(sample_kb: Path) -> None:
    # 100,000 stray files were 100,000 lines of stderr; --json still lists them all.
    for i in range(60):
        (sample_kb / f"stray{i:02d}.markdown").write_text("# x\n", encoding="utf-8")
    code, _, err = run("reindex", str(sample_kb))
    listed = [line for line in err.splitlines() if line.startswith("kindex: skipped stray")]
    assert code == 0 and len(listed) == 50 and "kindex: skipped 10 more (" in err
    code, out, _ = run("reindex", str(sample_kb), "--json")
    assert code == 0 and len([s for s in json.loads(out)["skipped"] if s["path"].startswith("stray")]) == 60


def test_piped_context_text_is_the_text_assembled(tmp_path: Path) -> None:
    # click strips terminal escapes from output that is no terminal: a file named `th\x1b[31mred.md` was cited as
    # `thred.md`, a path that does not exist (--json was right).
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "th\x1b[31mred.md").write_text("# 退款\n\n退款说明。\n", encoding="utf-8")
    assert run("reindex", str(tmp_path))[0] == 0
    code, out, _ = run("context", str(tmp_path), "退款")
    assert code == 0 and "(source: t/th\x1b[31mred.md)" in out


def test_running_out_of_memory_is_said_not_a_traceback(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `ulimit -v` met while a large KB's tables were built in memory: a MemoryError traceback, exit 1.
    import kindex.retrieve

    kindex.reindex(sample_kb)

    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(kindex.retrieve, "_scored", out_of_memory)
    for extra in ((), ("--json",)):
        result = CliRunner().invoke(main, ["search", str(sample_kb), "退款", *extra])
        assert result.exit_code == 1 and "Traceback" not in result.output and result.exception.__class__ is SystemExit
    assert (
        "ran out of memory; every index file is as it was or complete: raise the memory limit"
        in result.stderr + result.stdout
    )
