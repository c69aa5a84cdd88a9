"""Retrieval quality: kindex against two baselines on real documentation, plus off-topic fallback.

    python bench/retrieval_quality.py            (needs: pip install -e '.[bench]')

Corpora: ../shared/corpora/apisix/zh and fastapi/zh, copied to a temporary folder and indexed with the offline
extractive generator. Queries: APISIX FAQ questions whose answers link to a corpus document (extracted from
FAQ.md at run time; FAQ.md itself is removed from the indexed copy, since it trivially contains every question),
plus the hand-written questions in bench/queries/handwritten.json. Off-topic messages: bench/queries/offtopic.json.

Baselines, on the same documents in the same run:
  (a) seed-bm25: BM25 (rank_bm25) over the index entries (title, tags, summary, path) with the seed's plain
      tokens: Han single characters and pairs, Latin words; no field weights, no stop words, no theme layer.
  (b) jieba-bm25s: bm25s over each document's full text, tokenised with jieba.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPORA = HERE.parent.parent / "shared" / "corpora"
sys.path.insert(0, str(HERE.parent))

import kindex  # noqa: E402
from kindex.model import parse_index  # noqa: E402
from kindex.tokenize import terms  # noqa: E402

Ranker = Callable[[str], list[str]]


def faq_queries(corpus: Path) -> list[tuple[str, list[str]]]:
    """(question, linked corpus documents) for each FAQ section that links to a document of the corpus."""
    text = (corpus / "FAQ.md").read_text(encoding="utf-8")
    out = []
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        question, _, body = section.partition("\n")
        question = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", question).strip()
        targets = []
        for link in re.findall(r"\]\(([^)\s]+)\)", body) + re.findall(r"`\[[^\]]*\]\(([^)\s]+)\)`", body):
            link = link.split("#", 1)[0]
            m = re.match(r"https://apisix\.apache\.org/(?:zh/)?docs/apisix/(.+?)/?$", link)
            rel = (m.group(1) + ".md") if m else link.removeprefix("./")
            if rel.endswith(".md") and (corpus / rel).is_file() and rel != "FAQ.md" and rel not in targets:
                targets.append(rel)
        if targets:
            out.append((question, targets))
    return out


def index_entries(kb: Path) -> dict[str, str]:
    """KB-relative path → the text of its index entry (title, tags, summary, path)."""
    root, _ = parse_index((kb / "index.json").read_bytes())
    out = {d.path: " ".join([d.title, *d.tags, d.summary, d.path]) for d in root.documents}
    for t in root.themes:
        sub, _ = parse_index((kb / t.dir / "index.json").read_bytes())
        out.update({f"{t.dir}/{d.path}": " ".join([d.title, *d.tags, d.summary, d.path]) for d in sub.documents})
    return out


def seed_bm25(kb: Path) -> Ranker:
    from rank_bm25 import BM25Okapi

    entries = index_entries(kb)
    paths = sorted(entries)
    bm25 = BM25Okapi([terms(entries[p]) or ["∅"] for p in paths])

    def rank(query: str) -> list[str]:
        scores = bm25.get_scores(terms(query))
        order = sorted(range(len(paths)), key=lambda i: (-scores[i], paths[i]))
        return [paths[i] for i in order[:10] if scores[i] > 0]

    return rank


def jieba_bm25s(kb: Path) -> Ranker:
    import logging

    import bm25s
    import jieba

    jieba.setLogLevel(logging.WARNING)
    paths = sorted(p.relative_to(kb).as_posix() for p in kb.rglob("*.md"))

    def tok(text: str) -> list[str]:
        return [w for w in jieba.lcut_for_search(text.lower()) if w.strip() and not re.fullmatch(r"\W+", w)]

    corpus = [tok((kb / p).read_text(encoding="utf-8")) for p in paths]
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)

    def rank(query: str) -> list[str]:
        q = tok(query)
        if not q:
            return []
        docs, scores = retriever.retrieve([q], k=min(10, len(paths)), show_progress=False)
        return [paths[int(i)] for i, s in zip(docs[0], scores[0], strict=True) if s > 0]

    return rank


def kindex_ranker(kb: Path) -> Ranker:
    return lambda q: [i.path for i in kindex.search(kb, q, limit=10)]


def metrics(ranker: Ranker, queries: list[tuple[str, list[str]]]) -> dict[str, float]:
    hit1 = hit5 = mrr = ndcg = 0.0
    for query, targets in queries:
        ranked = ranker(query)[:10]
        rel = [1 if p in targets else 0 for p in ranked]
        hit1 += 1 if rel[:1] == [1] else 0
        hit5 += 1 if any(rel[:5]) else 0
        mrr += next((1 / (i + 1) for i, r in enumerate(rel) if r), 0.0)
        dcg = sum(r / math.log2(i + 2) for i, r in enumerate(rel))
        ideal = sum(1 / math.log2(i + 2) for i in range(min(len(targets), 10)))
        ndcg += dcg / ideal
    n = len(queries)
    return {"n": n, "hit@1": hit1 / n, "hit@5": hit5 / n, "mrr@10": mrr / n, "ndcg@10": ndcg / n}


def main() -> None:
    if not CORPORA.is_dir():
        sys.exit(f"corpora not found at {CORPORA}")
    handwritten = json.loads((HERE / "queries" / "handwritten.json").read_text(encoding="utf-8"))
    offtopic = json.loads((HERE / "queries" / "offtopic.json").read_text(encoding="utf-8"))["messages"]
    rows = []
    fallbacks: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("apisix/zh", "fastapi/zh"):
            kb = Path(tmp) / name.replace("/", "-")
            shutil.copytree(CORPORA / name, kb)
            sets = {"handwritten": [(q, t) for q, t in handwritten[name]]}
            if (kb / "FAQ.md").exists():
                sets["faq"] = faq_queries(kb)
                (kb / "FAQ.md").unlink()
            started = time.perf_counter()
            kindex.reindex(kb)
            print(f"{name}: indexed offline in {time.perf_counter() - started:.2f} s", file=sys.stderr)
            rankers = {"kindex": kindex_ranker(kb), "seed-bm25": seed_bm25(kb), "jieba-bm25s": jieba_bm25s(kb)}
            for set_name, queries in sets.items():
                for system, ranker in rankers.items():
                    rows.append({"corpus": name, "queries": set_name, "system": system, **metrics(ranker, queries)})
            fb = sum(kindex.build_context(kb, m).fallback for m in offtopic)
            on_topic = [q for qs in sets.values() for q, _ in qs]
            false_fb = sum(kindex.build_context(kb, q).fallback for q in on_topic)
            fallbacks[name] = (fb, false_fb)
            print(
                f"{name}: off-topic fallback {fb}/{len(offtopic)}; on-topic questions that fell back "
                f"{false_fb}/{len(on_topic)}",
                file=sys.stderr,
            )
    print("| corpus | queries | n | system | Hit@1 | Hit@5 | MRR@10 | nDCG@10 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['corpus']} | {r['queries']} | {r['n']} | {r['system']} | {r['hit@1']:.3f} | {r['hit@5']:.3f} "
            f"| {r['mrr@10']:.3f} | {r['ndcg@10']:.3f} |"
        )
    print()
    print("| system | all queries | Hit@1 | Hit@5 | MRR@10 | nDCG@10 |")
    print("|---|---|---|---|---|---|")
    for system in ("kindex", "seed-bm25", "jieba-bm25s"):
        mine = [r for r in rows if r["system"] == system]
        n = sum(r["n"] for r in mine)
        avg = {k: sum(r[k] * r["n"] for r in mine) / n for k in ("hit@1", "hit@5", "mrr@10", "ndcg@10")}
        print(
            f"| {system} | {n} | {avg['hit@1']:.3f} | {avg['hit@5']:.3f} | {avg['mrr@10']:.3f} | {avg['ndcg@10']:.3f} |"
        )
    print()
    for name, (fb, false_fb) in fallbacks.items():
        print(
            f"- {name}: off-topic messages that fell back: {fb}/{len(offtopic)} ({fb / len(offtopic):.0%}); "
            f"on-topic questions that fell back: {false_fb}"
        )


if __name__ == "__main__":
    main()
