"""The pipeline on real documentation trees (../shared/corpora), copied to a temporary folder first."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import kindex
from tests.conftest import CORPORA


@pytest.mark.parametrize("corpus", ["apisix/zh", "fastapi/zh", "apisix/en", "fastapi/en"])
def test_offline_reindex_of_a_real_corpus_validates(corpus: str, tmp_path: Path) -> None:
    source = CORPORA / corpus
    if not source.is_dir():
        pytest.skip(f"corpus {source} is absent (it lives in ../shared/corpora beside the checkout)")
    kb = tmp_path / "kb"
    shutil.copytree(source, kb)

    report = kindex.reindex(kb)

    assert report.ok and report.completed == report.total == kindex.preview(kb).steps_total
    assert kindex.validate(kb) == []
    root, _ = kindex.parse_index((kb / "index.json").read_bytes())
    assert root.themes and [t.dir for t in root.themes] == list(kindex.scan(kb).themes)
    assert all(t.title and t.summary for t in root.themes) and all(d.title for d in root.documents)
    # Short questions a user of the English manuals types, found by a hostile review: a rule that withheld the
    # "every word is one the KB uses" waiver from English KBs (7c9a87e, reverted) made each of them fall back.
    for question, page in {**KEYWORDS.get(corpus, {}), **SLIPS.get(corpus, {})}.items():
        ctx = kindex.build_context(kb, question)
        assert not ctx.fallback and page in [i.path for i in ctx.items[:3]], (question, ctx.items[:3])


KEYWORDS = {
    "apisix/en": {
        "health check": "tutorials/health-check.md",
        "circuit breaker": "plugins/api-breaker.md",
        "canary release": "plugins/traffic-split.md",
        "versioning": "tutorials/add-multiple-api-versions.md",
    },
    "fastapi/en": {"security": "reference/security/index.md", "versioning": "deployment/versions.md"},
}
# A newcomer's questions with one slip of the keyboard or a chat word: 8 of 10 fell back (the word was weighed as
# another product's name).
SLIPS = {
    "apisix/en": {"How to configure JWT authentication for a consumer? thx": "plugins/jwt-auth.md"},
    "fastapi/en": {
        "How do I enabel CORS?": "tutorial/cors.md",
        "How do I upload a flie?": "tutorial/request-files.md",
        "How do I deploy with Dokcer?": "deployment/docker.md",
        "backgorund tasks": "tutorial/background-tasks.md",
        "How do I enable CORS for my frontend? thx": "tutorial/cors.md",
    },
}


@pytest.mark.parametrize(
    ("corpus", "question", "page"),
    [
        # The page titled with the question, word for word, first: 测试 ranked it fifth below 异步测试 and
        # 测试事件; CASE fell back (the manual uses the word too often for it to cover a question); Trigger ranked
        # the page titled Triggers first (the same stem), a helper found.
        ("fastapi/zh", "测试", "tutorial/testing.md"),
        ("greptime-zh/kb", "CASE", "reference/sql/case.md"),
        ("greptime-zh/kb", "Trigger", "enterprise/trigger.md"),
    ],
)
def test_a_question_that_is_a_pages_title_gets_that_page_first(
    corpus: str, question: str, page: str, tmp_path: Path
) -> None:
    source = CORPORA / corpus
    if not source.is_dir():
        pytest.skip(f"corpus {source} is absent (it lives in ../shared/corpora beside the checkout)")
    kb = tmp_path / "kb"
    shutil.copytree(source, kb)
    kindex.reindex(kb)
    ctx = kindex.build_context(kb, question)
    assert not ctx.fallback and ctx.items[0].path == page, ctx.items[:3]
