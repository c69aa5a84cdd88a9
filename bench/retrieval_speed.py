"""Retrieval speed at scale: warm and cold build_context on 10,000 documents, against rank_bm25.

    python bench/retrieval_speed.py [--docs 10000] [--themes 50]      (needs: pip install -e '.[bench]')

Generates a KB of Chinese and English documents in N themes (deterministic vocabulary), indexes it with the
offline generator, then measures in this one process: the cold first call (index files parsed and scoring tables
built), warm p50/p99 over a set of questions, peak memory (tracemalloc) of the loaded index, and rank_bm25's
BM25Okapi scoring the same index entries with the same questions as the yardstick.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kindex
from kindex.retrieve import clear_cache
from kindex.tokenize import terms

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
        rank_only = []
        for q in qs:
            t0 = time.perf_counter()
            kindex.search(kb, q, limit=10)
            rank_only.append(time.perf_counter() - t0)

        from rank_bm25 import BM25Okapi

        from kindex.model import parse_index

        root, _ = parse_index((kb / "index.json").read_bytes())
        corpus = []
        for t in root.themes:
            sub, _ = parse_index((kb / t.dir / "index.json").read_bytes())
            corpus += [terms(" ".join([d.title, *d.tags, d.summary, d.path])) for d in sub.documents]
        t0 = time.perf_counter()
        bm25 = BM25Okapi(corpus)
        bm25_build = time.perf_counter() - t0
        bm25_times = []
        for q in qs[:100]:
            t0 = time.perf_counter()
            scores = bm25.get_scores(terms(q))
            sorted(range(len(scores)), key=lambda i: -scores[i])[:10]
            bm25_times.append(time.perf_counter() - t0)

    def ms(x: float) -> str:
        return f"{x * 1000:.2f} ms"

    p = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1]  # noqa: E731
    w50, w99 = statistics.median(warm), p(warm, 99)
    b50 = statistics.median(bm25_times)
    print("| measure | value |\n|---|---|")
    print(f"| documents / themes | {args.docs} / {args.themes} |")
    print(f"| cold first call (load + build + answer), median of 5 | {ms(statistics.median(colds))} |")
    print(f"| warm build_context p50 / p99 ({len(qs)} questions) | {ms(w50)} / {ms(w99)} |")
    print(f"| warm search only (ranking) p50 | {ms(statistics.median(rank_only))} |")
    print(f"| rank_bm25 BM25Okapi get_scores + top 10, p50 (build {ms(bm25_build)}) | {ms(b50)} |")
    print(f"| speed-up vs rank_bm25 (p50, build_context incl. reading originals) | {b50 / w50:.1f}x |")
    print(f"| peak traced memory of the cold load | {peak / 2**20:.1f} MiB |")
    print(f"| process max RSS | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB |")


if __name__ == "__main__":
    main()
