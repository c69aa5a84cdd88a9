"""An offline reindex of a real corpus from nothing: its wall time, in this process, on a fresh copy each run.

    python bench/offline_reindex.py [--corpus ../shared/corpora/memdocs-zh/kb] [--runs 3]

Run it from two checkouts to compare code (each imports the kindex beside it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import corpus_option, fresh_copy

import kindex

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_option(ap)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    times = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            kb = fresh_copy(args.corpus, Path(tmp) / "kb")
            started = time.perf_counter()
            kindex.reindex(kb)
            times.append(time.perf_counter() - started)
    runs = ", ".join(f"{t:.1f}" for t in times)
    median = statistics.median(times)
    print(f"| offline reindex of {args.corpus.parent.name} ({ROOT.name}) | median {median:.1f} s | {runs} |")


if __name__ == "__main__":
    main()
