"""What the first context call costs in a fresh process when the saved search tables no longer match the index
files (one theme index changed since they were saved: a step still writing, or a hand edit), against the same
call with no saved tables at all, on a real KB, alternating in one run.

    python bench/stale_tables.py [--corpus ../shared/corpora/memdocs-zh/kb] [--runs 5]

Copies the corpus to a temporary folder and indexes it offline. Per run, the first entry of one theme index gets a
new title (so the saved tables are stale) and `kindex.build_context` is timed in a new Python process (imports
excluded): once with the stale tables saved (rebuilt in memory from them: only the changed documents analysed),
once with them deleted (every document read and analysed). Medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import corpus_option, indexed_copy

import kindex
from kindex.searchindex import SEARCH_FILE
from kindex.store import STATE_DIR

ROOT = Path(__file__).resolve().parent.parent

CALL = """
import sys, time
sys.path.insert(0, sys.argv[1])
import kindex
t = time.perf_counter()
ctx = kindex.build_context(sys.argv[2], "如何重置设备")
assert ctx.warnings, "the tables should be stale"
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_option(ap)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kb = indexed_copy(args.corpus, Path(tmp) / "kb")
        tables = kb / STATE_DIR / SEARCH_FILE
        saved = tables.read_bytes()
        theme = next(d for d in kindex.scan(kb).documents if d.theme is not None).theme
        assert theme is not None
        index_file = kb / theme / "index.json"
        times: dict[str, list[float]] = {"stale tables saved": [], "no saved tables": []}
        for run in range(args.runs):
            index = orjson.loads(index_file.read_bytes())
            index["documents"][0]["title"] = f"{index['documents'][0]['title']} {run}"
            index_file.write_bytes(orjson.dumps(index))
            for name in times:
                if name == "no saved tables":
                    tables.unlink()
                else:
                    tables.write_bytes(saved)
                out = subprocess.run(
                    [sys.executable, "-c", CALL, str(ROOT), str(kb)], capture_output=True, text=True, check=True
                )
                times[name].append(float(out.stdout))
        n = len(kindex.scan(kb).documents)
        print(f"| {n} documents, {args.runs} runs | median | runs |\n|---|---|---|")
        for name, values in times.items():
            runs = ", ".join(f"{v:.2f}" for v in values)
            print(f"| first call, {name} | {statistics.median(values):.3f} s | {runs} |")
        ratio = statistics.median(times["no saved tables"]) / statistics.median(times["stale tables saved"])
        print(f"| no saved tables / stale tables saved | {ratio:.1f}× | |")


if __name__ == "__main__":
    main()
