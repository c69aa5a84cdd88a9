"""Context calls during a first reindex, in one process (as the HTTP service runs them): how long the slowest call
takes, and how long the reindex takes with the calls beside it.

    python bench/reindex_calls.py [--corpus ../shared/corpora/memdocs-zh/kb] [--runs 2]

Copies the corpus to a temporary folder (no index), starts `kindex.reindex` on a thread, and calls
`KnowledgeBase.context` on the main thread every 0.1 s until the reindex ends (calls before the root index exists
fail with `index_missing` and are not counted). Run it from two checkouts to compare code.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import corpus_option, fresh_copy

import kindex

ROOT = Path(__file__).resolve().parent.parent


def one_run(corpus: Path) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        kb = fresh_copy(corpus, Path(tmp) / "kb")
        done = threading.Event()
        started = time.perf_counter()
        step = threading.Thread(target=lambda: (kindex.reindex(kb), done.set()))
        step.start()
        handle = kindex.KnowledgeBase(kb)
        calls: list[float] = []
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                handle.context("如何重置设备")
                calls.append(time.perf_counter() - t0)
            except kindex.IndexMissingError:
                pass
            time.sleep(0.1)
        step.join()
        return time.perf_counter() - started, max(calls, default=0.0), len(calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_option(ap)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    print(f"| run ({ROOT.name}) | reindex | slowest call | calls answered |\n|---|---|---|---|")
    for run in range(args.runs):
        wall, slowest, n = one_run(args.corpus)
        print(f"| {run + 1} | {wall:.1f} s | {slowest:.2f} s | {n} |")


if __name__ == "__main__":
    main()
