"""Retrieval speed at scale: warm and cold build_context on 10,000 documents, against bm25s on the same documents.

    python bench/retrieval_speed.py [--docs 10000] [--themes 50]      (needs: pip install -e '.[bench]')

Generates a KB of Chinese and English documents in N themes (deterministic vocabulary), indexes it with the
offline generator, then measures the first call of a fresh process (`kindex.build_context` right after `import
kindex`: the library's imports, the load and the answer), and in this one process: the cold first call (saved
search tables loaded; the imports and the segmenter already paid for by the indexing), warm p50/p99 over a set of
questions, peak memory (tracemalloc) of the loaded index, and as the yardstick bm25s's own
retrieve (top 10) over the same documents' entry + body text with kindex's analysis, the same questions. Also
the cost of a `doc` step on one edited document against the same step reading and analysing every document.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kindex
from kindex.analysis import analyze
from kindex.kb import clear_cache
from kindex.searchindex import read_entries

ZH_WORDS = (
    "退款 发票 账号 登录 密码 同步 冲突 导出 导入 报表 科目 凭证 预算 审批 权限 成员 套餐 续费 优惠 订单 支付 "
    "提现 结算 对账 税务 工资 社保 库存 采购 供应商 客户 合同 回款 开票 红冲 备份 恢复 离线 通知 短信 验证 "
    "接口 签名 回调 限流 日志 监控 告警 部署 升级 迁移 缓存 索引 搜索 分页 排序 筛选 模板 打印 附件 图片 "
    "扫码 小程序 门店 分店 会员 积分 折扣 退货 换货 物流 快递 运费 仓库 盘点 调拨 成本 利润 现金流 折旧"
).split()
EN_WORDS = (
    "refund invoice account login password sync conflict export import report ledger voucher budget approval "
    "permission member plan renewal coupon order payment payout settlement reconcile tax payroll inventory "
    "purchase supplier customer contract receivable backup restore offline notification webhook signature "
    "callback ratelimit logging monitoring alert deploy upgrade migration cache index search pagination sorting "
    "filter template printing attachment barcode store branch loyalty discount return shipping warehouse cost"
).split()


def make_kb(root: Path, docs: int, themes: int, rng: random.Random) -> None:
    for i in range(docs):
        theme = f"theme{i % themes:02d}"
        english = i % 4 == 0
        words = EN_WORDS if english else ZH_WORDS
        topic = rng.sample(words, 3)
        sep = " " if english else ""
        title = sep.join(topic) + (f" guide {i}" if english else f"指南{i}")
        body = [f"# {title}", ""]
        for _ in range(4):
            body.append(sep.join(rng.choices(words, k=25)) + ("." if english else "。"))
            body.append("")
        path = root / theme / f"sub{i % 7}" / f"doc{i:05d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(body), encoding="utf-8")
    (root / "导读.md").write_text("# 导读\n\n知识库入口。", encoding="utf-8")


def questions(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        if i % 4 == 0:
            out.append("how do I " + " ".join(rng.sample(EN_WORDS, 3)))
        else:
            out.append("请问" + "".join(rng.sample(ZH_WORDS, 3)) + "怎么处理")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--themes", type=int, default=50)
    ap.add_argument("--queries", type=int, default=400)
    args = ap.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "kb"
        make_kb(kb, args.docs, args.themes, rng)
        started = time.perf_counter()
        kindex.reindex(kb)
        print(
            f"generated and indexed {args.docs} documents in {args.themes} themes "
            f"(offline reindex {time.perf_counter() - started:.1f} s)",
            file=sys.stderr,
        )
        qs = questions(rng, args.queries)

        # A process that answers one question and exits (a CLI, a fresh worker): its imports, the load and the
        # segmenter are all first-time costs there; in this process they were paid by the indexing above.
        first_call = (
            "import sys, time; sys.path.insert(0, sys.argv[1]); import kindex; t = time.perf_counter(); "
            "kindex.build_context(sys.argv[2], sys.argv[3]); print(time.perf_counter() - t)"
        )
        root = str(Path(__file__).resolve().parent.parent)
        fresh = [
            float(
                subprocess.run(
                    [sys.executable, "-c", first_call, root, str(kb), q], capture_output=True, text=True, check=True
                ).stdout
            )
            for q in qs[:5]
        ]
        colds = []
        for q in qs[:5]:
            clear_cache()
            t0 = time.perf_counter()
            kindex.build_context(kb, q)
            colds.append(time.perf_counter() - t0)
        clear_cache()
        tracemalloc.start()
        kindex.build_context(kb, qs[0])
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

        warm = []
        for q in qs:
            t0 = time.perf_counter()
            kindex.build_context(kb, q)
            warm.append(time.perf_counter() - t0)
        rank_only, unexplained = [], []
        for q in qs:
            t0 = time.perf_counter()
            kindex.search(kb, q, limit=10)
            rank_only.append(time.perf_counter() - t0)
        for q in qs:  # without the matched words of each result, which bm25s does not give either
            t0 = time.perf_counter()
            kindex.search(kb, q, limit=10, explain=False)
            unexplained.append(time.perf_counter() - t0)

        import bm25s

        entries = read_entries(kb.resolve())
        corpus = [
            analyze(" ".join([item.title, *item.tags, item.summary, (kb / rel).read_text(encoding="utf-8")]))
            for rel, _, item in entries.docs
        ]
        t0 = time.perf_counter()
        retriever = bm25s.BM25()
        retriever.index(corpus, show_progress=False)
        bm25_build = time.perf_counter() - t0
        bm25_times = []
        for q in qs:
            t0 = time.perf_counter()
            retriever.retrieve([analyze(q)], k=10, show_progress=False)
            bm25_times.append(time.perf_counter() - t0)

        edited = next(kb.rglob("doc00001.md"))
        rel = edited.relative_to(kb)
        doc_steps = []
        # The first step after the reindex reads again the files written within 2 s of that reindex's scan (their
        # stat signature could still change unseen); the second is every later one's cost.
        for extra in ("海外信用卡付款失败", "发票抬头填错"):
            edited.write_text(edited.read_text(encoding="utf-8") + f"\n追加一段：{extra}。\n", encoding="utf-8")
            t0 = time.perf_counter()
            kindex.doc(kb, rel.parts[0], "/".join(rel.parts[1:]))
            doc_steps.append(time.perf_counter() - t0)
        # The same step over the whole KB: every document read and analysed.
        (kb / ".kindex" / "search.npz").unlink()
        (kb / ".kindex" / "scan.json").unlink()
        t0 = time.perf_counter()
        kindex.doc(kb, rel.parts[0], "/".join(rel.parts[1:]))
        full = time.perf_counter() - t0

    def ms(x: float) -> str:
        return f"{x * 1000:.2f} ms"

    p = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1]  # noqa: E731
    w50, w99 = statistics.median(warm), p(warm, 99)
    b50 = statistics.median(bm25_times)
    print("| measure | value |\n|---|---|")
    print(f"| documents / themes | {args.docs} / {args.themes} |")
    print(f"| cold first call (load + build + answer), median of 5 | {ms(statistics.median(colds))} |")
    print(f"| first call of a fresh process (imports + load + answer), median of 5 | {ms(statistics.median(fresh))} |")
    print(f"| warm build_context p50 / p99 ({len(qs)} questions) | {ms(w50)} / {ms(w99)} |")
    print(f"| warm search only (ranking) p50 | {ms(statistics.median(rank_only))} |")
    print(f"| bm25s retrieve top 10, p50 (index built in {ms(bm25_build)}) | {ms(b50)} |")
    print(f"| warm search p50 / bm25s p50 | {statistics.median(rank_only) / b50:.2f} |")
    print(f"| warm search with explain=False p50 / bm25s p50 | {statistics.median(unexplained) / b50:.2f} |")
    print(f"| warm build_context p50 / bm25s p50 (incl. reading the originals) | {w50 / b50:.2f} |")
    print(
        f"| doc step on one edited document: first after the reindex / later / every document read and analysed "
        f"| {ms(doc_steps[0])} / {ms(doc_steps[1])} / {ms(full)} |"
    )
    print(f"| peak traced memory of the cold load | {peak / 2**20:.1f} MiB |")
    print(f"| process max RSS | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB |")


if __name__ == "__main__":
    main()
