"""What a warm retriever keeps of the words asked about (its term rows), over many varied questions, in two
checkouts on one indexed KB, each in a fresh process.

    python bench/row_memory.py KB BEFORE_CHECKOUT AFTER_CHECKOUT [--questions 3000]

KB must be indexed already (e.g. memdocs-zh copied 14 times over: 20,000 documents). The questions are 40-character
windows of the KB's own documents at random places (seeded: both checkouts ask the same), each a long question of
words the KB holds. Printed per checkout: the process's resident memory after loading the tables and after the
questions, and the median and 99th-percentile call (a byte budget for the rows was tried and not kept:
bench/RESULTS.md, twentieth session).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

_RUN = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import kindex
assert kindex.__file__.startswith(sys.argv[1]), kindex.__file__

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

kb = kindex.KnowledgeBase(sys.argv[2])
qs = json.loads(Path(sys.argv[3]).read_text(encoding="utf-8"))
kb.search(qs[0])
loaded_mb = rss()
times = []
for q in qs:
    t = time.perf_counter()
    kb.search(q)
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"loaded_mb": loaded_mb, "after_mb": rss(), "p50_ms": 1000 * times[len(times) // 2],
                  "p99_ms": 1000 * times[int(len(times) * 0.99)]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kb", type=Path)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--questions", type=int, default=3000)
    args = ap.parse_args()
    rng = random.Random(7)
    docs = sorted(p for p in args.kb.rglob("*.md") if ".kindex" not in p.parts)
    questions = []
    while len(questions) < args.questions:
        text = " ".join(rng.choice(docs).read_text(encoding="utf-8", errors="replace").split())
        if len(text) > 200:
            at = rng.randrange(len(text) - 40)
            questions.append(text[at : at + 40])
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as fh:
        json.dump(questions, fh, ensure_ascii=False)
    print("| checkout | RSS loaded | RSS after | call p50 | call p99 |")
    print("|---|---|---|---|---|")
    for checkout in (args.before, args.after):
        out = subprocess.run(
            [sys.executable, "-c", _RUN, str(checkout.resolve()), str(args.kb), fh.name],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| {checkout.resolve().name} | {r['loaded_mb']:.0f} MB | {r['after_mb']:.0f} MB | {r['p50_ms']:.2f} ms "
            f"| {r['p99_ms']:.2f} ms |"
        )
    Path(fh.name).unlink()


if __name__ == "__main__":
    main()
