"""Warm search of two checkouts on one KB, in alternating processes: the comparison the ratio to bm25s blurs.

    python bench/warm_ab.py BEFORE_CHECKOUT AFTER_CHECKOUT [--rounds 6]     (e.g. a `git worktree` and .)

Generates the 10,000-document KB of `retrieval_speed.py` once, indexes it with AFTER's kindex, then runs each
checkout's `kindex.search` over the same 400 questions in a fresh process per run (BEFORE, AFTER, BEFORE, AFTER…),
with the full segmenter loaded first (a one-shot process would cut its first 4,000 characters on the light path):
seven passes each, the median over the questions of each question's fastest call printed (a pass preempted by
another process on a shared box spoils one call, not the figure), then in how many rounds AFTER was faster and the
median of the rounds' AFTER / BEFORE. Both read the same files, so a difference is the code's, not the KB's or
bm25s's (whose own time, the denominator of `retrieval_speed.py`'s ratio, moves with the machine).
A checkout whose analyzer differs rebuilds the tables in memory once before timing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
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
assert kindex.__file__.startswith(sys.argv[1]), kindex.__file__
try:  # the full segmenter from the start, as a process that has indexed (or a server) has it
    from kindex.analysis import _SEGMENTERS
    _SEGMENTERS.full()
except (ImportError, AttributeError):
    pass
kb = Path(sys.argv[2])
qs = json.loads(Path(sys.argv[3]).read_text(encoding="utf-8"))
for q in qs:
    kindex.search(kb, q, limit=10)
best = [float("inf")] * len(qs)
for _ in range(7):
    for i, q in enumerate(qs):
        t0 = time.perf_counter()
        kindex.search(kb, q, limit=10)
        best[i] = min(best[i], time.perf_counter() - t0)
print(f"{statistics.median(best) * 1e6:.1f}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.after).resolve()))
    import kindex  # AFTER's, before retrieval_speed puts this checkout first on the path

    sys.path.insert(0, str(HERE))
    import retrieval_speed as rs

    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "kb"
        rng = random.Random(7)
        rs.make_kb(kb, 10_000, 50, rng)
        kindex.reindex(kb)
        questions = Path(tmp) / "questions.json"  # the questions retrieval_speed.py asks: drawn after the KB
        questions.write_text(json.dumps(rs.questions(rng, 400), ensure_ascii=False), encoding="utf-8")
        print("| round | before p50 µs | after p50 µs |\n|---|---|---|")
        ratios = []
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
            ratios.append(float(got[1]) / float(got[0]))
        faster = sum(x < 1 for x in ratios)
        median = statistics.median(ratios)
        print(f"\nafter faster in {faster} of {len(ratios)} rounds; median after / before {median:.3f}")


if __name__ == "__main__":
    main()
