"""What a `doc` step on one edited document costs in a fresh process, on a real KB, with and without the scan's
memory of the unchanged documents (`.kindex/scan.json`), alternating in one run.

    python bench/doc_step.py [--corpus ../shared/corpora/memdocs-zh/kb] [--runs 6] [--compare CHECKOUT]

Copies the corpus to a temporary folder, indexes it offline (its files 2 s old, as a KB's are), then per run
appends a line to one document and runs `kindex doc` on it in a new Python process: once as it is (the memory
read), once after deleting `scan.json` (every document read, as before the memory; the search tables are updated
per document in both). Medians of the wall time of `kindex.doc` (imports excluded), and their ratio. With
``--compare``, the second arm is another checkout's `kindex.doc` with its memory instead (say a worktree of an older
commit): the same KB, the same edit, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import corpus_option, indexed_copy

import kindex

ROOT = Path(__file__).resolve().parent.parent

STEP = """
import sys, time
sys.path.insert(0, sys.argv[1])
import kindex
kb, theme, path = sys.argv[2:5]
with open(f"{kb}/{theme}/{path}", "a", encoding="utf-8") as fh:
    fh.write("\\n追加一行：海外信用卡付款失败。\\n")
t = time.perf_counter()
kindex.doc(kb, theme, path)
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_option(ap)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--compare", type=Path, help="another checkout of kindex, run in turn with this one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kb = indexed_copy(args.corpus, Path(tmp) / "kb")
        doc = next(d for d in kindex.scan(kb).documents if d.theme is not None)
        assert doc.theme is not None
        other = "every document read" if args.compare is None else f"{args.compare} (memory)"
        times: dict[str, list[float]] = {"memory": [], other: []}
        for _ in range(args.runs):
            for name in times:
                if name == "every document read":
                    (kb / ".kindex" / "scan.json").unlink(missing_ok=True)
                checkout = args.compare if name != "memory" and args.compare is not None else ROOT
                out = subprocess.run(
                    [sys.executable, "-c", STEP, str(checkout), str(kb), doc.theme, doc.path_in_theme],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                times[name].append(float(out.stdout))
        n = len(kindex.scan(kb).documents)
        print(f"| {n} documents, {args.runs} runs | median | runs |\n|---|---|---|")
        for name, values in times.items():
            print(f"| doc step, {name} | {statistics.median(values):.3f} s | {', '.join(f'{v:.2f}' for v in values)} |")
        ratio = statistics.median(times[other]) / statistics.median(times["memory"])
        print(f"| {other} / memory | {ratio:.2f}× | |")


if __name__ == "__main__":
    main()
