"""MCP round-trip latency: ``get_context`` over stdio and over streamable HTTP against the library call, one run.

    python bench/mcp_latency.py [--rounds 200]        (needs: pip install -e '.[dev]')

Copies APISIX zh from ../shared/corpora to a temporary folder, indexes it offline, then for the 38 hand-written
APISIX questions (bench/queries/handwritten.json), cycled for ``--rounds`` calls after a warm-up:
- the library: ``KnowledgeBase.context`` in this process;
- stdio: the SDK's client talking to a ``kindex mcp KB`` subprocess;
- HTTP: the SDK's client over streamable HTTP to ``kindex mcp --http`` (a subprocess, bearer token).
Reports p50/p99 of each and the transport's cost over the library at p50 (target: ≤ 5 ms over stdio).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import kindex  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpora" / "apisix" / "zh"
TOKEN = "bench-token"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def mcp_rounds(client: Client, questions: list[str], rounds: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + rounds):
        t0 = time.perf_counter()
        result = await client.call_tool("get_context", {"message": questions[i % len(questions)]})
        elapsed = time.perf_counter() - t0
        assert not result.is_error, result
        if i >= warmup:
            times.append(elapsed)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    handwritten = json.loads((REPO / "bench" / "queries" / "handwritten.json").read_text(encoding="utf-8"))
    questions = [q for q, _ in handwritten["apisix/zh"]]
    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "apisix"
        shutil.copytree(CORPUS, kb)
        kindex.reindex(kb)
        handle = kindex.KnowledgeBase(kb)
        lib = []
        for i in range(args.warmup + args.rounds):
            t0 = time.perf_counter()
            handle.context(questions[i % len(questions)])
            if i >= args.warmup:
                lib.append(time.perf_counter() - t0)

        env = {**os.environ, "PYTHONPATH": str(REPO), "KINDEX_MODEL": ""}
        params = StdioServerParameters(command=sys.executable, args=["-m", "kindex.cli", "mcp", str(kb)], env=env)

        async def over_stdio() -> list[float]:
            async with Client(params) as client:
                return await mcp_rounds(client, questions, args.rounds, args.warmup)

        stdio = anyio.run(over_stdio)

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "kindex.cli", "mcp", str(kb), "--http", "--port", str(port)],
            env={**env, "KINDEX_API_TOKEN": TOKEN},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            proc.stderr.readline()  # "MCP over HTTP at …": uvicorn binds right after printing it
            url = f"http://127.0.0.1:{port}/mcp"

            async def over_http() -> list[float]:
                for _ in range(100):  # connection refused until uvicorn has bound the port
                    try:
                        async with (
                            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
                            Client(streamable_http_client(url, http_client=http)) as client,
                        ):
                            return await mcp_rounds(client, questions, args.rounds, args.warmup)
                    except Exception:
                        await anyio.sleep(0.1)
                raise RuntimeError("the HTTP server did not come up")

            http = anyio.run(over_http)
        finally:
            proc.terminate()
            proc.wait(30)

    base = statistics.median(lib) * 1000
    print("| path | p50 ms | p99 ms | p50 over the library |")
    print("|---|---|---|---|")
    for name, times in (("library (KnowledgeBase.context)", lib), ("MCP stdio", stdio), ("MCP streamable HTTP", http)):
        over = "" if times is lib else f"+{pct(times, 0.5) - base:.2f} ms"
        print(f"| {name} | {pct(times, 0.5):.2f} | {pct(times, 0.99):.2f} | {over} |")
    print(f"\n{len(questions)} questions cycled, {args.rounds} calls each after {args.warmup} warm-up calls")


if __name__ == "__main__":
    main()
