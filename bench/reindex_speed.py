"""Reindex at scale against a provider with fixed latency: concurrency, the sequential baseline, the re-run.

    python bench/reindex_speed.py [--docs 1000] [--themes 20] [--latency 0.1] [--concurrency 16]

A fake OpenAI-compatible server on 127.0.0.1 (tests/fakellm.py) answers every call after a fixed latency L, with
unlimited parallelism; kindex reaches it through litellm as it would a real provider. Reports, in one run: wall
time at concurrency C against the ideal N·L/C, the sequential baseline (concurrency 1, the seed design and the
anchors' way), the re-run on the unchanged KB (calls, wall time, ratio to `preview` on the same KB), and peak
memory (RSS of this process, which runs kindex in-process).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kindex  # noqa: E402
from kindex.llm import import_litellm  # noqa: E402

WORDS = "退款 发票 账号 登录 同步 冲突 导出 报表 科目 凭证 预算 审批 权限 成员 套餐 续费 订单 支付 结算 对账".split()


def make_kb(root: Path, docs: int, themes: int) -> None:
    rng = random.Random(3)
    for i in range(docs):
        path = root / f"theme{i % themes:02d}" / f"doc{i:04d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(rng.choices(WORDS, k=120))
        path.write_text(f"# 文档 {i}\n\n{text}。\n", encoding="utf-8")
    (root / "导读.md").write_text("# 导读\n\n入口。\n", encoding="utf-8")


def run(kb: Path, url: str, model: str, concurrency: int) -> tuple[float, kindex.RunReport]:
    settings = kindex.LLMSettings(model=model, api_base=url, timeout=30, retries=2)
    started = time.perf_counter()
    report = kindex.reindex(kb, kindex.Options(llm=settings, concurrency=concurrency, force=True))
    return time.perf_counter() - started, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--themes", type=int, default=20)
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--sequential-docs", type=int, default=200, help="documents for the concurrency-1 baseline")
    ap.add_argument(
        "--model",
        default="openai/bench",
        help="litellm model string sent to the fake server; a model litellm has a price for (openai/gpt-4o-mini) "
        "costs it less work per call than an unknown one, and gets a cost in the report",
    )
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "bench")
    # The provider is another process, as a real one is; it answers every request after exactly L seconds.
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fakellm", str(args.latency)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    t0 = time.perf_counter()
    import_litellm()  # a one-off cost of any process that calls a model; not part of the runs below
    lines = [f"| `import litellm` (once per process, not in the timings below) | {time.perf_counter() - t0:.2f} s |"]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kb = Path(tmp) / "kb"
            make_kb(kb, args.docs, args.themes)
            calls = args.docs + 1
            wall, report = run(kb, url, args.model, args.concurrency)
            ideal = calls * args.latency / args.concurrency
            assert report.ok and report.usage.calls == calls, report.to_dict()
            lines.append(
                f"| reindex, {calls} calls at concurrency {args.concurrency} | {wall:.2f} s "
                f"(ideal N·L/C = {ideal:.2f} s, ratio {wall / ideal:.2f}) |"
            )

            settings = kindex.LLMSettings(model=args.model, api_base=url)
            t0 = time.perf_counter()
            again = kindex.reindex(kb, kindex.Options(llm=settings, concurrency=args.concurrency))
            rerun = time.perf_counter() - t0
            t0 = time.perf_counter()
            kindex.preview(kb)
            prev = time.perf_counter() - t0
            lines.append(
                f"| re-run on the unchanged KB | {again.usage.calls} calls, {again.cache_hits} cache hits, "
                f"{rerun:.2f} s |"
            )
            lines.append(f"| `preview` on the same KB | {prev:.2f} s (re-run / preview = {rerun / prev:.2f}) |")

            seq_kb = Path(tmp) / "seq"
            make_kb(seq_kb, args.sequential_docs, args.themes)
            seq_wall, seq_report = run(seq_kb, url, args.model, 1)
            per_call = seq_wall / seq_report.usage.calls
            lines.append(
                f"| sequential baseline (concurrency 1), {seq_report.usage.calls} calls | {seq_wall:.2f} s "
                f"({per_call * 1000:.0f} ms per call; for {calls} calls ≈ {per_call * calls:.0f} s, "
                f"{per_call * calls / wall:.1f}× the concurrent run) |"
            )
            shutil.rmtree(seq_kb)
    finally:
        server.kill()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"N = {args.docs} documents in {args.themes} themes, L = {args.latency * 1000:.0f} ms, model {args.model}\n")
    print("| measure | value |\n|---|---|")
    print("\n".join(lines))
    print(f"| peak memory (max RSS of the process, litellm loaded) | {rss:.0f} MiB |")


if __name__ == "__main__":
    main()
