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
