"""What the benches on a real corpus share: the corpus option and a fresh copy of it to index.

A copy leaves out kindex's state (`.kindex/`, `index.json`), so every run starts from the documents alone.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import kindex

ROOT = Path(__file__).resolve().parent.parent
MEMDOCS = ROOT.parent / "shared" / "corpora" / "memdocs-zh" / "kb"


def corpus_option(ap: argparse.ArgumentParser) -> None:
    """``--corpus``: a documentation tree (default memdocs-zh, 1,445 documents)."""
    ap.add_argument("--corpus", type=Path, default=MEMDOCS, help="a documentation tree (default: memdocs-zh)")


def fresh_copy(corpus: Path, kb: Path) -> Path:
    """``corpus`` copied to ``kb`` without any index or state of kindex's."""
    shutil.copytree(corpus, kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
    return kb


def indexed_copy(corpus: Path, kb: Path) -> Path:
    """:func:`fresh_copy`, indexed offline once its files are as old as a KB's are."""
    fresh_copy(corpus, kb)
    # A file written less than 2 s before it is read is read again by the next scan: a KB's files are older.
    time.sleep(2.1)
    kindex.reindex(kb)
    return kb
