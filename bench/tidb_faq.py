"""kindex against plain BM25 baselines on a third real-FAQ set, from the Chinese TiDB docs, in one run.

The set (built in the sixteenth session by a helper that did not see the ranking code, and run once as held-out):
pingcap/docs-cn at commit ae9ab0fd89873986fabc4c8873d77d46ba76f066 (CC BY-SA 3.0), its 18 FAQ pages removed
(1,179 documents left), each FAQ answer's links to the other pages as the targets of its question: 125 questions.
The corpus is not in the repository; to rebuild it (network needed once):

    git clone https://github.com/pingcap/docs-cn /tmp/docs-cn && cd /tmp/docs-cn && git checkout ae9ab0fd8987
    mkdir -p /tmp/tidb-faq/src && git archive HEAD -- LICENSE $(git ls-files '*.md') | tar -x -C /tmp/tidb-faq/src
    python bench/tidb_faq_build.py --src /tmp/tidb-faq/src --out /tmp/tidb-faq --commit ae9ab0fd8987
    python bench/tidb_faq.py --work /tmp/tidb-faq              (needs: pip install -e '.[bench]')

As ``bench/retrieval_quality.py`` does: the KB is copied to a temporary folder, indexed offline with the extractive
generator, then kindex.search (top 10; empty when the question is off topic, which counts as a miss) is compared
with bm25s-jieba, bm25s-char and bm25s-kx. Wins/losses are per question on nDCG@10 against the best baseline (by
mean nDCG@10). Only aggregate figures are printed (and written with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tidb-faq"), help="holds kb/ and qrels.json")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    args.kb, args.qrels = args.work / "kb", args.work / "qrels.json"

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import retrieval_quality as rq  # also puts the checkout's root first on sys.path

    import kindex

    qrels = json.loads(args.qrels.read_text(encoding="utf-8"))
    queries = [(r["q"], r["targets"]) for r in qrels]
    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "tidb-docs-cn"
        shutil.copytree(args.kb, kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
        n_docs = sum(1 for _ in kb.rglob("*.md"))
        missing = [t for _, ts in queries for t in ts if not (kb / t).is_file()]
        if missing:
            sys.exit(f"targets missing from the KB: {missing[:5]}")

        started = time.perf_counter()
        kindex.reindex(kb)
        index_s = time.perf_counter() - started
        print(f"indexed {n_docs} docs offline in {index_s:.1f} s (kindex {kindex.__version__})", file=sys.stderr)

        rankers: dict[str, rq.Ranker] = {"kindex": lambda q: [i.path for i in kindex.search(kb, q, limit=10)]}
        started = time.perf_counter()
        rankers.update(rq.baselines(kb))
        base_s = time.perf_counter() - started
        results = rq.evaluate(rankers, queries)
        base = max((b for b in results if b != "kindex"), key=lambda b: rq.mean(results[b], "ndcg@10"))
        pairs = list(zip(results["kindex"], results[base], strict=True))
        wins = sum(k["ndcg@10"] > b["ndcg@10"] + 1e-9 for k, b in pairs)
        losses = sum(k["ndcg@10"] < b["ndcg@10"] - 1e-9 for k, b in pairs)
        ties_miss = sum(abs(k["ndcg@10"] - b["ndcg@10"]) <= 1e-9 and k["ndcg@10"] == 0 for k, b in pairs)
        hit5_only_k = sum(k["hit@5"] > b["hit@5"] for k, b in pairs)
        hit5_only_b = sum(k["hit@5"] < b["hit@5"] for k, b in pairs)
        vs_each = {}
        for b_name in (b for b in results if b != "kindex"):
            pp = list(zip(results["kindex"], results[b_name], strict=True))
            vs_each[b_name] = (
                sum(k["ndcg@10"] > b["ndcg@10"] + 1e-9 for k, b in pp),
                sum(k["ndcg@10"] < b["ndcg@10"] - 1e-9 for k, b in pp),
            )
        fell = sum(kindex.build_context(kb, q).fallback for q, _ in queries)
        empty = sum(not rankers["kindex"](q) for q, _ in queries)

    metrics = ("hit@1", "hit@5", "mrr@10", "ndcg@10")
    table = {name: {m: round(rq.mean(per, m), 3) for m in metrics} for name, per in results.items()}
    print(f"\nTiDB docs-cn real FAQ: {len(queries)} questions, {n_docs} docs\n")
    print("| system | Hit@1 | Hit@5 | MRR@10 | nDCG@10 |")
    print("|---|---|---|---|---|")
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[m]:.3f}" for m in metrics) + " |")
    print()
    print(f"- best baseline (mean nDCG@10): {base}")
    print(
        f"- kindex vs {base}, per question on nDCG@10: {wins} wins / {losses} losses / "
        f"{len(pairs) - wins - losses} ties ({ties_miss} ties where both miss the top 10)"
    )
    print(
        "- kindex wins/losses (nDCG@10) vs each baseline: "
        + ", ".join(f"{b} {w}/{lost}" for b, (w, lost) in vs_each.items())
    )
    print(f"- on Hit@5: kindex alone finds a target in the top 5 for {hit5_only_k}, {base} alone for {hit5_only_b}")
    print(
        f"- on-topic questions that kindex answered with a fallback (off topic): {fell}/{len(queries)}"
        f" (empty kindex.search ranking: {empty})"
    )
    print(f"- indexing (kindex.reindex, offline extractive): {index_s:.1f} s; baselines built in {base_s:.1f} s")
    if args.json is None:
        return
    args.json.write_text(
        json.dumps(
            {
                "questions": len(queries),
                "docs": n_docs,
                "metrics": table,
                "best_baseline": base,
                "kindex_vs_best": {
                    "wins": wins,
                    "losses": losses,
                    "ties": len(pairs) - wins - losses,
                    "ties_both_miss": ties_miss,
                    "hit5_only_kindex": hit5_only_k,
                    "hit5_only_baseline": hit5_only_b,
                },
                "kindex_vs_each": {b: {"wins": w, "losses": lost} for b, (w, lost) in vs_each.items()},
                "fallback": fell,
                "empty_search": empty,
                "index_seconds": round(index_s, 1),
                "kindex_version": kindex.__version__,
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
