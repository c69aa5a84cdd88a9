"""Does the LLM earn its keep? Retrieval over LLM-written entries, extractive entries and raw text, same questions.

    # 1. index a copy of FastAPI zh with a model (here the local one from ../shared/tools/local-llm):
    cp -r ../shared/corpora/fastapi/zh /tmp/fz-llm
    KINDEX_MODEL=openai/qwen KINDEX_API_BASE=http://127.0.0.1:8014/v1 OPENAI_API_KEY=local \\
        kindex reindex /tmp/fz-llm --concurrency 2 --timeout 300
    # 2. compare (indexes a second copy offline, with the extractive generator):
    python bench/llm_entries.py /tmp/fz-llm

Questions: every FastAPI zh set of bench/retrieval_quality.py (handwritten, colloquial, keywords). Systems:
kindex over the LLM's entries, kindex over extractive entries, and bm25s over the raw text (jieba tokens and
character unigrams + bigrams). Also counts the entries that carry model-written questions.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from retrieval_quality import KBS, _docs, bm25s_ranker, char_tok, jieba_tok, mean, per_query  # noqa: E402

import kindex  # noqa: E402
from kindex.searchindex import read_entries  # noqa: E402


def main() -> None:
    llm_kb = Path(sys.argv[1]).resolve()
    queries = []
    for file in ("handwritten.json", "colloquial.json", "keywords.json"):
        sets = json.loads((HERE / "queries" / file).read_text(encoding="utf-8"))
        queries += [(q, t, file.removesuffix(".json")) for q, t in sets.get("fastapi/zh", [])]
    entries = read_entries(llm_kb)
    with_questions = sum(1 for _, _, item in entries.docs if item.questions)
    print(f"LLM KB: {len(entries.docs)} entries, {with_questions} with questions")
    with tempfile.TemporaryDirectory() as tmp:
        ext_kb = Path(tmp) / "fz-extractive"
        shutil.copytree(KBS["fastapi/zh"], ext_kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
        kindex.reindex(ext_kb)
        paths, texts = _docs(ext_kb)
        systems = {
            "kindex, LLM entries": lambda q: [i.path for i in kindex.search(llm_kb, q, limit=10)],
            "kindex, extractive entries": lambda q: [i.path for i in kindex.search(ext_kb, q, limit=10)],
            "bm25s raw text, jieba": bm25s_ranker(paths, texts, jieba_tok()),
            "bm25s raw text, char 1+2": bm25s_ranker(paths, texts, char_tok),
        }
        print("| system | questions | Hit@1 | Hit@5 | MRR@10 | nDCG@10 | fell back |")
        print("|---|---|---|---|---|---|---|")
        results = {}
        for name, rank in systems.items():
            rows = [per_query(rank(q), t) for q, t, _ in queries]
            results[name] = rows
            fell = ""
            if name.startswith("kindex"):
                kb = llm_kb if "LLM" in name else ext_kb
                fell = str(sum(kindex.build_context(kb, q).fallback for q, _, _ in queries))
            print(
                f"| {name} | {len(rows)} | {mean(rows, 'hit@1'):.3f} | {mean(rows, 'hit@5'):.3f} "
                f"| {mean(rows, 'mrr@10'):.3f} | {mean(rows, 'ndcg@10'):.3f} | {fell} |"
            )
        a, b = results["kindex, LLM entries"], results["kindex, extractive entries"]
        wins = sum(x["ndcg@10"] > y["ndcg@10"] + 1e-9 for x, y in zip(a, b, strict=True))
        losses = sum(x["ndcg@10"] < y["ndcg@10"] - 1e-9 for x, y in zip(a, b, strict=True))
        print(f"\nLLM entries against extractive entries, per question (nDCG@10): {wins} wins, {losses} losses")


if __name__ == "__main__":
    main()
