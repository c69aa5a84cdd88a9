"""One question file against one corpus: kindex beside the bm25s baselines of ``retrieval_quality.py``.

    python bench/question_file.py CORPUS QUESTIONS.json     (needs: pip install -e '.[bench]')

QUESTIONS.json is ``{"on": [[question, [KB-relative paths that answer it]], ...], "off": [message, ...]}``: the
shape a helper session writes its questions in, before it has seen what kindex answers (for one,
``bench/queries/newcomer_apisix.json``, run on ``../shared/corpora/apisix/zh``). The corpus is indexed offline in a
fresh copy, whole (its FAQ.md included). Printed: Hit@1, Hit@5, MRR@10 and nDCG@10 of kindex and of each baseline;
kindex's per-question wins and losses (nDCG@10) against the best baseline; how many "on" questions fell back and how
many "off" messages did. A ranking that falls back counts as a miss, as in ``retrieval_quality.py``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from corpus import indexed_copy
from retrieval_quality import Ranker, baselines, evaluate, mean

import kindex
from kindex.analysis import has_han

METRICS = ("hit@1", "hit@5", "mrr@10", "ndcg@10")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path, help="a documentation tree (copied; never written)")
    ap.add_argument("questions", type=Path, help='{"on": [[question, [paths]], ...], "off": [message, ...]}')
    args = ap.parse_args()
    data = json.loads(args.questions.read_text(encoding="utf-8"))
    on = [(q, list(t)) for q, t in data.get("on", [])]
    off = list(data.get("off", []))
    with tempfile.TemporaryDirectory() as tmp:
        kb = indexed_copy(args.corpus, Path(tmp) / "kb")
        handle = kindex.KnowledgeBase(kb)

        def ranked(question: str) -> list[str]:
            got = handle.ranking(question, limit=10)
            return [] if got.off_topic else [item.path for item in got.results]

        rankers: dict[str, Ranker] = {"kindex": ranked, **baselines(kb, english=not has_han(str(on)))}
        results = evaluate(rankers, on)
        for name, rows in results.items():
            print(f"{name:12} " + "  ".join(f"{m} {mean(rows, m):.3f}" for m in METRICS))
        best = max((n for n in results if n != "kindex"), key=lambda n: mean(results[n], "ndcg@10"))
        pairs = list(zip(results["kindex"], results[best], strict=True))
        wins = sum(a["ndcg@10"] > b["ndcg@10"] + 1e-9 for a, b in pairs)
        losses = sum(a["ndcg@10"] < b["ndcg@10"] - 1e-9 for a, b in pairs)
        print(f"against {best}: kindex better on {wins}, worse on {losses} of {len(on)} questions")
        print(f"on-topic questions falling back: {sum(handle.ranking(q, limit=1).off_topic for q, _ in on)}/{len(on)}")
        if off:
            fell = sum(handle.ranking(m, limit=1).off_topic for m in off)
            print(f"off-topic messages falling back: {fell}/{len(off)}")


if __name__ == "__main__":
    main()
