"""Wall time of a one-shot `kindex context` (a fresh process: interpreter, imports, load, answer), as a user sees it.

    python bench/context_time.py [--python PY] [--compare CHECKOUT] [--runs 25]

Runs `kindex context KB "退款多久到账"` on a copy of sample_kb, with PY (default: this interpreter; a clean venv
made with `python -m venv V && V/bin/pip install .` is the README's install), interleaved with `PY -c pass` (the
interpreter alone) and, with ``--compare``, the same command with another checkout's `kindex` package first on
`sys.path` (its own indexed copy of sample_kb), so two versions are measured under the same load. Bytecode is
compiled first: PYTHONDONTWRITEBYTECODE would otherwise make every run compile kindex from source.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MESSAGE = "退款多久到账"


def _code(source: Path | None, kb: Path, command: str) -> str:
    path = f"import sys; sys.path.insert(0, {str(source)!r}); " if source else ""
    tail = f", {MESSAGE!r}" if command == "context" else ""
    return f"{path}from kindex.cli import main; main([{command!r}, {str(kb)!r}{tail}])"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose installed kindex is timed")
    ap.add_argument("--compare", type=Path, help="a checkout whose kindex package is timed beside it")
    ap.add_argument("--runs", type=int, default=25)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        commands: dict[str, list[str]] = {"python -c pass": [args.python, "-c", "pass"]}
        for label, source in (("kindex", None), ("compare", args.compare)):
            if label == "compare" and source is None:
                continue
            kb = Path(tmp) / label
            shutil.copytree(HERE.parent / "sample_kb", kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
            where = f"import sys; sys.path.insert(0, {str(source)!r}); " if source else ""
            package = subprocess.run(
                [args.python, "-c", f"{where}import kindex, os; print(os.path.dirname(kindex.__file__))"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            subprocess.run([args.python, "-m", "compileall", "-q", package], check=True, capture_output=True)
            subprocess.run([args.python, "-c", _code(source, kb, "reindex")], check=True, capture_output=True)
            commands[f"{label} context" + (f" ({source})" if source else "")] = [
                args.python,
                "-c",
                _code(source, kb, "context"),
            ]
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():
                started = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                times[name].append(time.perf_counter() - started)
    print(f"| command ({args.runs} interleaved runs) | median | p10 | p90 |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        ts.sort()
        p10, p90 = ts[len(ts) // 10], ts[min(len(ts) - 1, 9 * len(ts) // 10)]
        print(f"| {name} | {statistics.median(ts) * 1000:.0f} ms | {p10 * 1000:.0f} ms | {p90 * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
