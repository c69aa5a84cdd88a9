"""Warm search of two checkouts on one KB, in alternating processes: the comparison the ratio to bm25s blurs.

    python bench/warm_ab.py BEFORE_CHECKOUT AFTER_CHECKOUT [--rounds 2]     (e.g. a `git worktree` and .)

Generates the 10,000-document KB of `retrieval_speed.py` once, indexes it with AFTER's kindex, then runs each
checkout's `kindex.search` over the same 400 questions in a fresh process per run (BEFORE, AFTER, BEFORE, AFTER…):
five passes each, the best pass's median per call printed. Both read the same files, so a difference is the code's,
not the KB's or bm25s's (whose own time, the denominator of `retrieval_speed.py`'s ratio, moves with the machine).
A checkout whose analyzer differs rebuilds the tables in memory once before timing.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

_RUN = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import kindex
kb = Path(sys.argv[2])
qs = json.loads(Path(sys.argv[3]).read_text(encoding="utf-8"))
for q in qs:
    kindex.search(kb, q, limit=10)
passes = []
for _ in range(5):
    times = []
    for q in qs:
        t0 = time.perf_counter()
        kindex.search(kb, q, limit=10)
        times.append(time.perf_counter() - t0)
    passes.append(statistics.median(times))
print(f"{min(passes) * 1e6:.1f}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.after).resolve()))
    sys.path.insert(0, str(HERE))
    import retrieval_speed as rs

    import kindex

    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "kb"
        rng = random.Random(7)
        rs.make_kb(kb, 10_000, 50, rng)
        kindex.reindex(kb)
        questions = Path(tmp) / "questions.json"  # the questions retrieval_speed.py asks: drawn after the KB
        questions.write_text(json.dumps(rs.questions(rng, 400), ensure_ascii=False), encoding="utf-8")
        print("| round | before p50 µs | after p50 µs |\n|---|---|---|")
        for r in range(args.rounds):
            got = [
                subprocess.run(
                    [sys.executable, "-c", _RUN, str(Path(c).resolve()), str(kb), str(questions)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                for c in (args.before, args.after)
            ]
            print(f"| {r + 1} | {got[0]} | {got[1]} |")


if __name__ == "__main__":
    main()
