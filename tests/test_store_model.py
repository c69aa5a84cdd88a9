from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

import kindex
from kindex import AnswerError, DocItem, Index, LLMSettings, Options, ThemeItem, parse_index
from kindex.cache import Cache
from kindex.records import SUMMARY_MAX, TAGS_MAX, TITLE_MAX, doc_item_from
from kindex.sanitize import doc_entry
from kindex.store import atomic_write
from tests.fakeclient import FakeClient


def _doc(path: str, title: str, summary: str, tags: tuple[str, ...] = (), paths: tuple[str, ...] = ()) -> DocItem:
    return DocItem(path=path, title=title, summary=summary or title, tags=tags, paths=paths)


def _theme(name: str, title: str, summary: str, tags: tuple[str, ...] = ()) -> ThemeItem:
    return ThemeItem(dir=name, title=title, summary=summary or title, tags=tags)


def test_field_bounds_are_enforced_on_model_answers() -> None:
    item = doc_item_from(
        {
            "title": "  多行\n标题\t\x07 " + "长" * 200,
            "summary": "摘" * 2000,
            "tags": ["退款", " 退款 ", "REFUND", "refund", "", 3, *[f"t{i}" for i in range(40)], "x" * 500],
            "paths": ["./src/**/*.tsx", "../etc/passwd", "a\x00b", 7, "src/**/*.tsx"],
            "path": "evil/../../x.md",
        },
        "given.md",
    )
    assert item.path == "given.md"
    assert item.title.startswith("多行 标题 长") and len(item.title) == TITLE_MAX and item.title.endswith("…")
    assert len(item.summary) == SUMMARY_MAX
    assert item.tags[:3] == ("退款", "REFUND", "3") and len(item.tags) == TAGS_MAX
    assert item.paths == ("src/**/*.tsx",)


def test_invisible_characters_that_hide_or_reorder_text_are_dropped_from_entries() -> None:
    from kindex.records import clean_text

    # "退款\u202e.exe" would show as "退款exe."; a zero-width space splits a word no one sees split.
    hidden = "\u202e退\u200b款\u2066指南\u2069\ufeff\u200e\u2060"
    assert clean_text(hidden, 100) == "退款指南"
    assert clean_text("👨\u200d👩\u200d👧 家庭账本", 100) == "👨\u200d👩\u200d👧 家庭账本"  # joiners build emoji
    assert clean_text("行一\u2028行二", 100) == "行一 行二"


def test_doc_entry_requires_a_title_and_summary_and_author_globs_win() -> None:
    with pytest.raises(AnswerError, match="no usable title or summary"):
        doc_entry({"title": " ", "summary": None, "tags": []}, "a.md")
    item = doc_entry({"title": "T", "summary": "S", "paths": ["**/*.py"]}, "a.md", ("**/*.tsx",))
    assert item.paths == ("**/*.tsx",)


def test_index_json_is_stable_and_readable() -> None:
    index = Index(
        themes=(_theme("b", "乙", "s"), _theme("a", "甲", "s", ("x",))),
        documents=(_doc("z.md", "Z", "s"), _doc("a.md", "A", "s", (), ("**/*.tsx",))),
    )
    data = index.to_json()
    assert data == Index(themes=index.themes[::-1], documents=index.documents[::-1]).to_json()
    assert data.decode().index('"dir": "a"') < data.decode().index('"dir": "b"')
    assert '"index_file": "a/index.json"' in data.decode() and "甲" in data.decode()
    parsed, problems = parse_index(data)
    assert problems == [] and parsed == index.sorted()


def test_atomic_write_replaces_whole_files_and_leaves_no_temporaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "index.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["index.json"]

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, b"half-written")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["index.json"]


def test_the_cache_commits_each_answer_replaces_superseded_ones_and_survives_damage(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put("k1", {"title": "a"}, "doc.md")
    cache.put("k2", {"title": "b"}, "other.md")
    cache.put("k3", {"title": "a2"}, "doc.md")  # a new answer for doc.md supersedes k1

    again = Cache(tmp_path)  # read while the first connection is still open: committed rows are there
    assert again.get("k1") is None and again.get("k2") == {"title": "b"} and again.get("k3") == {"title": "a2"}
    again.compact({"k3"})
    assert Cache(tmp_path).get("k2") is None and Cache(tmp_path).get("k3") == {"title": "a2"}
    cache.close()
    again.close()

    for extra in tmp_path.glob(".kindex/answers.sqlite-*"):  # its write-ahead log would still hold the pages
        extra.unlink()
    cache.path.write_bytes(b"not a database" * 100)  # damaged: set aside, a new cache starts
    fresh = Cache(tmp_path)
    assert fresh.get("k3") is None and fresh.set_aside == tmp_path / ".kindex" / "answers.damaged"
    fresh.put("k4", {"title": "c"})
    assert Cache(tmp_path).get("k4") == {"title": "c"}
    fresh.close()


def test_another_programs_database_in_the_caches_place_is_set_aside_and_said(sample_kb: Path) -> None:
    # A valid SQLite file with other tables made every model step fail ("no such column: label", no advice); a
    # damaged one was set aside without a word while its answers were bought again.
    import sqlite3

    path = sample_kb / ".kindex" / "answers.sqlite"
    path.parent.mkdir()
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE answers (x)")
        db.commit()
    client = FakeClient()
    report = kindex.reindex(sample_kb, Options(llm=LLMSettings(model="fake-model"), client=client))
    assert report.failures == () and len(client.calls) == 19
    assert report.notes[0] == (
        "the answer cache could not be read (damaged, or another program's database): set aside as "
        ".kindex/answers.damaged; the answers it held are asked for again"
    )
    assert (sample_kb / ".kindex" / "answers.damaged").exists()
    again = kindex.reindex(sample_kb, Options(llm=LLMSettings(model="fake-model"), client=client))
    assert again.cache_hits == 19 and again.notes == ()


def test_answers_of_the_old_json_lines_cache_are_kept(tmp_path: Path) -> None:
    legacy = tmp_path / ".kindex" / "cache.jsonl"
    legacy.parent.mkdir()
    legacy.write_bytes(b'{"key": "k1", "value": {"title": "a"}}\n{"key": "k2", "val')  # a torn last line
    assert Cache(tmp_path).get("k1") == {"title": "a"} and not legacy.exists()
    assert Cache(tmp_path).get("k1") == {"title": "a"}


@pytest.mark.parametrize("fast", [True, False])
def test_a_context_item_built_for_speed_is_the_record_model_construct_builds(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kindex import results
    from kindex.results import ContextItem, context_item

    monkeypatch.setattr(results, "_LAYOUT_KNOWN", fast and results._LAYOUT_KNOWN)
    built = context_item("a/b.md", "document", 1.23456, "退款", "说明", "matched")
    constructed = ContextItem.model_construct(
        path="a/b.md",
        level="document",
        score=1.23456,
        title="退款",
        abstract="说明",
        reason="matched",
        matched=(),
        truncated=False,
        tokens=0,
    )
    assert built == constructed and built.model_fields_set == constructed.model_fields_set
    assert built.model_dump_json() == constructed.model_dump_json() and repr(built) == repr(constructed)
    assert hash(built) == hash(constructed) and built.to_dict()["score"] == 1.2346
    with pytest.raises(Exception, match="frozen"):
        built.title = "x"
