"""Fairness between agents: one agent's flood of heavy /context requests against another agent's small ones.

    python bench/agent_fairness.py [--heavy 48] [--checkout DIR]      (needs: pip install -e '.[dev,bench]')

Agents under a temporary KB root: `mem` = ../shared/corpora/memdocs-zh/kb (1,445 documents) indexed offline,
`demo` = sample_kb. `kindex serve` runs as its own process (the code of --checkout, default this one, so two
versions can be compared on the same machine one after the other). While `--heavy` requests at once ask `mem` with
a 20,000-character message of random Chinese characters (budget 200,000 tokens, max_docs 50), `demo` is asked
`退款多久到账` every 50 ms. Reports `demo`'s latency alone and during the flood (median, p90, max) and the flood's
wall time. Found by a hostile campaign: 48 such requests once stalled another agent's 4 ms call for 24 s.

    python bench/agent_fairness.py --cold 56 [--clients 8] [--checkout DIR]

Instead of the flood: `mem` copied `--cold` times (index and tables with it), and `--clients` clients asking each
copy once, so that each call loads an agent's tables, while `demo` is asked as above. A scale campaign measured a
warm agent's call at p90 308 ms, max 1.1 s, while 8 clients cold-loaded 56 agents.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from serve_load import start

ROOT = Path(__file__).resolve().parent.parent
MEMDOCS = ROOT.parent / "shared" / "corpora" / "memdocs-zh" / "kb"
SMALL = {"message": "退款多久到账"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heavy", type=int, default=48, help="heavy requests sent at once")
    ap.add_argument("--checkout", type=Path, default=ROOT, help="the kindex checkout whose server is measured")
    ap.add_argument(
        "--agents",
        type=Path,
        help="a prepared KB root holding indexed `mem` and `demo` folders, used as it is; default: both indexed "
        "afresh in a temporary folder",
    )
    ap.add_argument("--cold", type=int, default=0, help="agents to cold-load instead of the flood (copies of mem)")
    ap.add_argument("--clients", type=int, default=8, help="clients loading the cold agents at once")
    args = ap.parse_args()
    if not MEMDOCS.is_dir():
        sys.exit(f"corpus not found at {MEMDOCS}")
    with tempfile.TemporaryDirectory() as tmp:
        agents = args.agents or Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(args.checkout.resolve())}
        # ``-P``: the working directory is not put first on sys.path, so --checkout's kindex is the one imported.
        if not args.agents:
            shutil.copytree(MEMDOCS, agents / "mem")
            ignore = shutil.ignore_patterns(".kindex", "index.json")
            shutil.copytree(ROOT / "sample_kb", agents / "demo", ignore=ignore)
            for agent in ("mem", "demo"):
                reindex = [sys.executable, "-P", "-m", "kindex.cli", "reindex", str(agents / agent)]
                subprocess.run(reindex, env=env, check=True, capture_output=True)
        cold = [f"cold{i}" for i in range(args.cold)]
        for name in cold:
            if not (agents / name).exists():
                shutil.copytree(agents / "mem", agents / name)
        server, url = start(
            [sys.executable, "-P", "-m", "kindex.cli", "serve", "--kb-root", str(agents), "--port", "0"],
            env,
            r"running on (http://127\.0\.0\.1:\d+)",
        )
        try:
            # Plain urllib, a connection per request and JSON with \\u escapes, as the campaign's script sent them:
            # a shared httpx client (UTF-8 bodies, kept-alive connections) did not bring the old code down.
            def post(agent: str, body: dict[str, object]) -> tuple[int, float]:
                req = urllib.request.Request(
                    f"{url}/v1/agents/{agent}/knowledge/context",
                    data=json.dumps(body).encode(),
                    method="POST",
                    headers={"Content-Type": "application/json"},
                )
                t = time.perf_counter()
                with urllib.request.urlopen(req, timeout=300) as r:
                    r.read()
                    return r.status, time.perf_counter() - t

            post("mem", {"message": "预热"})  # both agents' tables loaded
            alone = [post("demo", SMALL)[1] for _ in range(20)]
            during: list[float] = []
            heavy_results: list[tuple[int, float]] = []
            stop = threading.Event()

            def small() -> None:
                while not stop.is_set():
                    during.append(post("demo", SMALL)[1])
                    stop.wait(0.05)

            def heavy(seed: int) -> None:
                rnd = random.Random(seed)
                message = "".join(chr(rnd.randint(0x4E00, 0x9FFF)) for _ in range(20_000))
                heavy_results.append(post("mem", {"message": message, "budget_tokens": 200_000, "max_docs": 50}))

            def loader() -> None:
                while cold:
                    try:
                        agent = cold.pop()
                    except IndexError:
                        return
                    heavy_results.append(post(agent, {"message": "设备注册失败怎么办"}))

            asker = threading.Thread(target=small)
            asker.start()
            if args.cold:
                flood = [threading.Thread(target=loader) for _ in range(args.clients)]
            else:
                flood = [threading.Thread(target=heavy, args=(i,)) for i in range(args.heavy)]
            started = time.perf_counter()
            for th in flood:
                th.start()
            for th in flood:
                th.join()
            wall = time.perf_counter() - started
            stop.set()
            asker.join()
        finally:
            server.terminate()
            server.wait()

    def ms(xs: list[float], q: float) -> float:
        return 1000 * sorted(xs)[min(int(len(xs) * q), len(xs) - 1)]

    print(f"| measure | value |\n|---|---|\n| server code | {args.checkout.resolve()} |")
    print(f"| `demo` alone: median / max | {1000 * statistics.median(alone):.1f} / {1000 * max(alone):.1f} ms |")
    what = (
        f"{args.cold} cold agents by {args.clients} clients" if args.cold else f"{args.heavy} heavy requests to `mem`"
    )
    print(
        f"| flood: {what}: wall time, slowest, statuses | {wall:.1f} s, "
        f"{max(d for _, d in heavy_results):.1f} s, {sorted({st for st, _ in heavy_results})} |"
    )
    print(
        f"| `demo` during the flood ({len(during)} calls): median / p90 / max | "
        f"{1000 * statistics.median(during):.0f} / {ms(during, 0.9):.0f} / {1000 * max(during):.0f} ms |"
    )


if __name__ == "__main__":
    main()
