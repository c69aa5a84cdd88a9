"""Queue mode throughput: 8 agents × 200 documents through the fake model (100 ms a call), 1, 2 and 4 workers.

Run from the repository root: ``python bench/queue_scale.py`` (needs ``redis-server`` and ``kindex[queue]``).

Each round starts from fresh copies of the agents (no cached answer), a redis-server of its own, one API replica
(``kindex serve --queue``) and N workers (``kindex worker --concurrency 4 --tasks 1``: four model calls in flight
per worker); all eight reindexes are submitted at once, and the round's time runs from the first submission to the
last task's end. Model calls go through litellm to the fake OpenAI-compatible server of ``tests/fakellm.py``
(in this process), which answers every call after exactly 100 ms, any number at once. The last round runs two
workers under a shared limit (``--rate-limit``) and measures the rate the model server saw.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fakellm import FakeLLM, Reply, well_behaved  # noqa: E402
from tests.services import Redis, until  # noqa: E402

TOKEN = "bench"
WORDS = "网关 路由 插件 限流 认证 缓存 日志 监控 上游 证书 灰度 重试 超时 熔断 鉴权 配置".split()


def make_agents(root: Path, agents: int, docs: int) -> None:
    for a in range(agents):
        for d in range(docs):
            theme = root / f"agent{a}" / f"theme{d % 5}"
            theme.mkdir(parents=True, exist_ok=True)
            w = [WORDS[(a * 7 + d * k) % len(WORDS)] for k in (1, 3, 5)]
            body = (
                f"# 文档 {a}-{d}：{w[0]}与{w[1]}\n\n本文说明如何配置{w[0]}，以及{w[1]}和{w[2]}的关系。\n\n"
                f"## 步骤\n\n按顺序设置{w[2]}。\n"
            )
            (theme / f"doc{d:03d}.md").write_text(body, encoding="utf-8")


class Round:
    def __init__(self, root: Path, llm: FakeLLM, tmp: Path) -> None:
        self.root, self.llm = root, llm
        self.redis = Redis(tmp)
        self.redis.start()
        self.procs: list[subprocess.Popen[str]] = []
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "KINDEX_API_TOKEN": TOKEN,
            "KINDEX_MODEL": "openai/fake",
            "KINDEX_API_BASE": llm.url,
            "OPENAI_API_KEY": "bench",
        }

    def _spawn(self, args: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kindex.cli", *args], env=self.env, stderr=subprocess.PIPE, text=True
        )
        self.procs.append(proc)
        return proc

    def api(self) -> httpx.Client:
        proc = self._spawn(["serve", "--kb-root", str(self.root), "--port", "0", "--queue", self.redis.url])
        assert proc.stderr is not None
        for line in proc.stderr:
            m = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
            if m:
                threading.Thread(target=proc.stderr.read, daemon=True).start()  # drain the log pipe
                return httpx.Client(base_url=m.group(1), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        raise SystemExit(f"the API replica exited with {proc.wait()}")

    def workers(self, n: int, *extra: str) -> None:
        for i in range(n):
            proc = self._spawn(
                [
                    *("worker", "--kb-root", str(self.root), "--queue", self.redis.url, "--name", f"w{i}"),
                    *("--concurrency", "4", "--tasks", "1", *extra),
                ]
            )
            threading.Thread(target=lambda p=proc: p.stderr and p.stderr.read(), daemon=True).start()

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.redis.kill()


def run_round(source: Path, tmp: Path, llm: FakeLLM, workers: int, agents: int, *extra: str) -> dict[str, Any]:
    root = tmp / f"round-{workers}-{len(extra)}"
    shutil.copytree(source, root)
    names = sorted(p.name for p in root.iterdir())[:agents]
    r = Round(root, llm, tmp)
    try:
        api = r.api()
        r.workers(workers, *extra)
        want = {f"w{i}" for i in range(workers)}
        until(lambda: want <= set(api.get("/healthz").json()["queue"]["workers"]), "workers")
        start_calls = len(llm.requests)
        t0 = time.time()
        ids = [api.post(f"/v1/agents/{a}/knowledge/reindex", params={"wait": "false"}).json()["id"] for a in names]

        def all_done() -> list[dict[str, Any]] | None:
            tasks = [api.get(f"/v1/tasks/{i}").json() for i in ids]
            return tasks if all(t["state"] in ("done", "failed", "cancelled") for t in tasks) else None

        tasks = until(all_done, "the reindexes", deadline=600)
        wall = max(t["finished_at"] for t in tasks) - t0
        calls = sum(t["report"]["calls"] for t in tasks)
        assert all(t["state"] == "done" for t in tasks), [t["error"] for t in tasks]
        assert calls == len(llm.requests) - start_calls
        return {
            "workers": workers,
            "calls": calls,
            "wall": wall,
            "rate": calls / wall,
            "per_worker": {w: sum(1 for t in tasks if t["worker"] == w) for w in sorted(want)},
        }
    finally:
        r.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--docs", type=int, default=200)
    ap.add_argument("--latency", type=float, default=0.1, help="seconds the fake model takes per call")
    ap.add_argument("--limit-rpm", type=float, default=1200, help="the shared limit of the last round")
    args = ap.parse_args()
    llm = FakeLLM().start()
    arrivals: list[float] = []

    def answer(request: dict[str, Any]) -> Reply:
        arrivals.append(time.monotonic())
        return Reply(well_behaved(request).content, latency=args.latency)

    llm.script = answer
    print(
        f"# queue_scale: {args.agents} agents × {args.docs} documents, fake model {args.latency * 1000:.0f} ms a "
        f"call; {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        source = tmp / "source"
        make_agents(source, args.agents, args.docs)
        rows = [run_round(source, tmp, llm, n, args.agents) for n in (1, 2, 4)]
        base = rows[0]["rate"]
        print("\n| workers (× 4 calls in flight) | model calls | wall | calls/s | × 1 worker | steps per worker |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print(
                f"| {row['workers']} | {row['calls']} | {row['wall']:.1f} s | {row['rate']:.1f} | "
                f"{row['rate'] / base:.2f} | {row['per_worker']} |"
            )
        # The limit round: two workers that could do 80 calls/s between them, held to the shared limit.
        arrivals.clear()
        limited_agents = 2
        row = run_round(source, tmp, llm, 2, limited_agents, "--rate-limit", f"openai/fake={args.limit_rpm:g}")
        limit = args.limit_rpm / 60
        seen = sorted(arrivals)
        rate = (len(seen) - 1) / (seen[-1] - seen[0])
        window = max(sum(1 for t in seen if s <= t < s + 1.0) for s in seen)
        window10 = max(sum(1 for t in seen if s <= t < s + 10.0) for s in seen)
        print(
            f"\nshared limit {args.limit_rpm:g} requests/min ({limit:g}/s), 2 workers, {limited_agents} agents: "
            f"{len(seen)} calls, measured {rate:.2f}/s over the run; at most {window} in any 1 s, "
            f"{window10} in any 10 s"
        )
    llm.stop()


if __name__ == "__main__":
    main()
