"""HTTP load: 200 concurrent clients asking for context while another agent is reindexed against a model.

    python bench/serve_load.py [--clients 200] [--seconds 30]       (needs: pip install -e '.[dev,bench]')

Agents under a temporary KB root: `apisix` = a copy of ../shared/corpora/apisix/zh indexed offline, asked the
hand-written APISIX questions of bench/queries/handwritten.json in a loop; `big` = 400 generated documents
reindexed during the load through litellm against the fake OpenAI-compatible server (tests/fakellm.py, its own
process, 100 ms per answer). `kindex serve` runs as its own process; the clients share this one. Reports
throughput, latency p50/p99, errors, the reindex task's outcome and the server's peak memory (VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kindex  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpora" / "apisix" / "zh"
TOKEN = "bench-token"


def start(cmd: list[str], env: dict[str, str], pattern: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stream = proc.stderr if "running on" in pattern else proc.stdout
    assert stream is not None
    for line in stream:
        m = re.search(pattern, line)
        if m:
            # Keep draining (the access log goes to stderr): a full pipe would stall the server.
            threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()
            return proc, m.group(1)
    raise SystemExit(f"{cmd[2:4]} exited with {proc.wait()}")


async def load(url: str, clients: int, seconds: float, questions: list[str]) -> tuple[list[float], int, int]:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.perf_counter() + seconds
    counter = itertools.count()
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:

        async def one_client() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                q = questions[next(counter) % len(questions)]
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v1/agents/apisix/knowledge/context", json={"message": q})
                    ok = r.status_code == 200 and r.json()["items"]
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += 0 if ok else 1

        await asyncio.gather(*(one_client() for _ in range(clients)))
        task_state = 0
    return latencies, errors, task_state


WRK_SCRIPT = """
local bodies = {%s}
local i = 0
request = function()
  i = i + 1
  return wrk.format("POST", "/v1/agents/apisix/knowledge/context",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer %s"}, bodies[(i %% #bodies) + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %%d, "seconds": %%f, "p50_ms": %%f, "p99_ms": %%f, "errors": %%d}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.status + e.connect + e.read + e.write + e.timeout))
end
"""


def wrk_load(url: str, clients: int, seconds: float, questions: list[str], tmp: Path) -> dict[str, float]:
    """The load from wrk (C, two threads): the client costs little CPU, so the server is what is measured."""
    bodies = ", ".join("[==[" + json.dumps({"message": q}) + "]==]" for q in questions)
    script = tmp / "context.lua"
    script.write_text(WRK_SCRIPT % (bodies, TOKEN), encoding="utf-8")
    out = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{int(seconds)}s", "--timeout", "30s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--big-docs", type=int, default=400)
    args = ap.parse_args()
    if not CORPUS.is_dir():
        raise SystemExit(f"corpus not found: {CORPUS}")
    questions = [q for q, _ in json.loads((ROOT / "bench" / "queries" / "handwritten.json").read_text())["apisix/zh"]]
    with tempfile.TemporaryDirectory() as tmp:
        agents = Path(tmp) / "agents"
        shutil.copytree(CORPUS, agents / "apisix")
        kindex.reindex(agents / "apisix")
        for i in range(args.big_docs):
            doc = agents / "big" / f"t{i % 20:02d}" / f"d{i:04d}.md"
            doc.parent.mkdir(parents=True, exist_ok=True)
            doc.write_text(f"# 文档 {i}\n\n第 {i} 篇测试文档，关于退款、发票和同步。\n", encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "bench"}
        fake, fake_url = start([sys.executable, "-m", "tests.fakellm", "0.1"], env, r"(http://\S+)")
        server_env = {**env, "KINDEX_API_TOKEN": TOKEN, "KINDEX_MODEL": "openai/bench", "KINDEX_API_BASE": fake_url}
        server, url = start(
            [
                sys.executable,
                "-m",
                "kindex.cli",
                "serve",
                "--kb-root",
                str(agents),
                "--port",
                "0",
                "--concurrency",
                "16",
            ],
            server_env,
            r"running on (http://127\.0\.0\.1:\d+)",
        )
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            task = httpx.post(f"{url}/v1/agents/big/knowledge/reindex?wait=false", headers=headers).json()
            started = time.perf_counter()
            if shutil.which("wrk"):
                generator = "wrk"
                w = wrk_load(url, args.clients, args.seconds, questions, Path(tmp))
                count, wall, p50, p99, errors = (
                    int(w["requests"]),
                    w["seconds"],
                    w["p50_ms"],
                    w["p99_ms"],
                    int(w["errors"]),
                )
            else:
                generator = "httpx (install wrk for a lighter client)"
                latencies, errors, _ = asyncio.run(load(url, args.clients, args.seconds, questions))
                wall = time.perf_counter() - started
                lat = sorted(latencies)
                count, p50 = len(lat), statistics.median(lat) * 1000
                p99 = statistics.quantiles(lat, n=100)[98] * 1000
            state = httpx.get(f"{url}/v1/tasks/{task['id']}", headers=headers).json()
            status = Path(f"/proc/{server.pid}/status").read_text()
            hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]
        finally:
            server.terminate()
            server.wait(timeout=60)
            fake.kill()
    print(f"{args.clients} clients ({generator}), {args.seconds:.0f} s, context requests on apisix/zh (177 docs)\n")
    print("| measure | value |\n|---|---|")
    print(f"| requests | {count} in {wall:.1f} s ({count / wall:.0f} per second) |")
    print(f"| latency p50 / p99 | {p50:.0f} ms / {p99:.0f} ms |")
    print(f"| errors | {errors} |")
    rep = state.get("report") or {}
    print(
        f"| concurrent reindex of `big` ({args.big_docs} docs) | state {state['state']}, progress "
        f"{state['progress']['completed']}/{state['progress']['total']}, {rep.get('calls', 0)} calls |"
    )
    print(f"| server peak memory (VmHWM) | {hwm:.0f} MiB |")


if __name__ == "__main__":
    main()
