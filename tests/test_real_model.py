"""Opt-in: the whole pipeline against a real OpenAI-compatible model.

Runs only when KINDEX_TEST_MODEL and KINDEX_TEST_API_BASE are set, e.g. with the local model of
../shared/tools/local-llm (serve.sh prints the values):

    KINDEX_TEST_MODEL=openai/qwen KINDEX_TEST_API_BASE=http://127.0.0.1:8014/v1 OPENAI_API_KEY=local \\
        python -m pytest tests/test_real_model.py -s
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import kindex

MODEL = os.environ.get("KINDEX_TEST_MODEL")
API_BASE = os.environ.get("KINDEX_TEST_API_BASE")
pytestmark = pytest.mark.skipif(
    not (MODEL and API_BASE), reason="set KINDEX_TEST_MODEL and KINDEX_TEST_API_BASE to run against a real model"
)
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.mark.timeout(3600)
def test_reindex_sample_kb_with_a_real_model(sample_kb: Path) -> None:
    os.environ.setdefault("OPENAI_API_KEY", "local")
    settings = kindex.LLMSettings(model=MODEL, api_base=API_BASE, timeout=300, retries=2)
    report = kindex.reindex(sample_kb, kindex.Options(llm=settings, concurrency=2))
    print("\n" + str(report.to_dict()))

    assert kindex.validate(sample_kb) == []
    assert report.calls >= 19 and len(report.failures) <= 2, report.failures
    failed = {f.path for f in report.failures}
    s = kindex.scan(sample_kb)
    for name, docs in s.themes.items():
        index, _ = kindex.parse_index((sample_kb / name / "index.json").read_bytes())
        assert sorted(d.path for d in index.documents) == sorted(d.path_in_theme for d in docs)
        for entry in index.documents:
            assert entry.title and entry.summary
            if f"{name}/{entry.path}" in failed:
                continue
            english = entry.path == "rate-limits.md"
            has_cjk = bool(CJK.search(entry.title + entry.summary))
            assert has_cjk != english, f"{name}/{entry.path}: entry not in the document's language: {entry}"
