"""An offline reindex of a real corpus: from nothing, again with nothing changed, and again after one edit; wall
times in this process, on a fresh copy each run.

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


def _timed(kb: Path) -> float:
    started = time.perf_counter()
    kindex.reindex(kb)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_option(ap)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"from nothing": [], "nothing changed": [], "one document edited": []}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            kb = fresh_copy(args.corpus, Path(tmp) / "kb")
            # A file written less than 2 s before it is read is read again by the next scan: a KB's files are older.
            time.sleep(2.1)
            times["from nothing"].append(_timed(kb))
            times["nothing changed"].append(_timed(kb))
            doc = next(d for d in kindex.scan(kb).documents if d.theme is not None)
            with open(kb / doc.rel, "a", encoding="utf-8") as fh:
                fh.write("\n追加一行：海外信用卡付款失败。\n")
            times["one document edited"].append(_timed(kb))
    for name, runs in times.items():
        shown = ", ".join(f"{t:.1f}" for t in runs)
        what = f"offline reindex of {args.corpus.parent.name}, {name} ({ROOT.name})"
        print(f"| {what} | median {statistics.median(runs):.1f} s | {shown} |")


if __name__ == "__main__":
    main()
