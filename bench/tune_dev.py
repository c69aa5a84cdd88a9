"""How the dev sets answer to kindex's retrieval knobs: field weights, the weight of general Chinese words, theme
prior, and the on-topic threshold.

    python bench/tune_dev.py [--keep DIR]

Only the dev sets are read (apisix/zh FAQ questions, bench/queries/handwritten.json, bench/queries/offtopic.json
with its near-domain messages); the held-out sets in bench/retrieval_quality.py are never looked at here, so the
figures reported there were not fitted. Prints, per setting, the dev nDCG@10 with ranking alone (no fallback),
and for the on-topic decision the share of dev on-topic questions and off-topic messages that fall back.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from retrieval_quality import KBS, faq_queries, per_query  # noqa: E402

import kindex  # noqa: E402
import kindex.kb  # noqa: E402  (loaded lazily by the package: clear_cache is read from it below)
from kindex import retrieve  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()
    handwritten = json.loads((HERE / "queries" / "handwritten.json").read_text(encoding="utf-8"))
    offtopic = json.loads((HERE / "queries" / "offtopic.json").read_text(encoding="utf-8"))
    tmp = tempfile.TemporaryDirectory()
    work = args.keep or Path(tmp.name)
    on: list[tuple[Path, str, list[str]]] = []
    off: list[tuple[Path, str]] = []
    for name in ("apisix/zh", "fastapi/zh"):
        kb = work / ("dev-" + name.replace("/", "-"))
        if not kb.exists():
            shutil.copytree(KBS[name], kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
            if (kb / "FAQ.md").exists():  # kept beside the KB: it holds every FAQ question verbatim
                (kb / "FAQ.md").rename(kb.parent / f"{kb.name}-FAQ.md")
        faq = kb.parent / f"{kb.name}-FAQ.md"
        if faq.exists():
            shutil.copy(faq, kb / "FAQ.md")
            on.extend((kb, q, t) for q, t in faq_queries(kb))
            (kb / "FAQ.md").unlink()
        kindex.reindex(kb)
        on.extend((kb, q, t) for q, t in handwritten[name])
        off.extend((kb, m) for m in offtopic["messages"] + offtopic["near_domain"][name])

    def ranking_ndcg() -> float:
        kindex.kb.clear_cache()
        got = [per_query([i.path for i in kindex.search(kb, q, min_relevance=0.0)], t) for kb, q, t in on]
        return sum(g["ndcg@10"] for g in got) / len(got)

    print(f"dev: {len(on)} on-topic questions, {len(off)} off-topic messages")
    print(f"ranking nDCG@10 with the defaults: {ranking_ndcg():.3f}")
    for field in retrieve.FIELD_WEIGHTS:
        base = retrieve.FIELD_WEIGHTS[field]
        row = []
        for factor in (0.0, 0.5, 2.0):
            retrieve.FIELD_WEIGHTS[field] = base * factor
            row.append(f"x{factor}: {ranking_ndcg():.3f}")
        retrieve.FIELD_WEIGHTS[field] = base
        print(f"  weight {field} ({base}): " + ", ".join(row))
    base_boost = retrieve.ENTRY_BOOST
    for boost in (0.0, 0.25, 0.5, 1.0):
        retrieve.ENTRY_BOOST = boost
        print(f"  entry boost {boost}: {ranking_ndcg():.3f}")
    retrieve.ENTRY_BOOST = base_boost
    base_rank = retrieve.GENERAL_WORD_RANK
    for rank in (0.0, 0.25, 0.5, 0.75, 1.0):
        retrieve.GENERAL_WORD_RANK = rank
        print(f"  general Chinese word rank {rank}: {ranking_ndcg():.3f}")
    retrieve.GENERAL_WORD_RANK = base_rank
    base_prior = retrieve.THEME_PRIOR
    for prior in (0.0, 0.3, 1.0):
        retrieve.THEME_PRIOR = prior
        print(f"  theme prior {prior}: {ranking_ndcg():.3f}")
    retrieve.THEME_PRIOR = base_prior

    kindex.kb.clear_cache()

    def best_cover(kb: Path, message: str) -> float:
        loaded = kindex.KnowledgeBase(kb).retriever.loaded()  # a fresh load: it reads BODY_COVER
        scored = retrieve._scored(loaded, message)
        cand = (scored.scores > 0) & ~loaded.conditional
        return float(scored.cover()[cand].max()) if cand.any() else 0.0

    base_unseen, base_ratio = retrieve.UNSEEN_HAN_WEIGHT, retrieve.SPECIFIC_RATIO
    base_name, base_body = retrieve.NAME_WEIGHT, retrieve.BODY_COVER
    for unseen, ratio, name_weight in itertools.product((0.0, 0.25), (10.0, 100.0, 1000.0), (1.0, 2.0, 3.0)):
        retrieve.UNSEEN_HAN_WEIGHT, retrieve.SPECIFIC_RATIO, retrieve.NAME_WEIGHT = unseen, ratio, name_weight
        for body_cover in (0.5, 0.8):
            retrieve.BODY_COVER = body_cover
            on_c = np.array([best_cover(kb, q) for kb, q, _ in on])
            off_c = np.array([best_cover(kb, m) for kb, m in off])
            cells = [f"{t}: {np.mean(on_c < t):.0%}/{np.mean(off_c < t):.0%}" for t in (0.2, 0.25, 0.3, 0.35, 0.4, 0.5)]
            label = f"unseen {unseen}, ratio {ratio:g}, names x{name_weight:g}, body {body_cover}: on/off fell back at"
            print(label + " " + ", ".join(cells))
    retrieve.UNSEEN_HAN_WEIGHT, retrieve.SPECIFIC_RATIO, retrieve.NAME_WEIGHT = base_unseen, base_ratio, base_name
    retrieve.BODY_COVER = base_body
    tmp.cleanup()


if __name__ == "__main__":
    main()
