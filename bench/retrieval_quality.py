"""Retrieval quality: kindex against plain BM25 baselines on every question set we have, plus the on-topic decision.

    python bench/retrieval_quality.py [--sets dev|heldout|all] [--keep DIR]     (needs: pip install -e '.[bench]')

Corpora (copied to a temporary folder, indexed with the offline extractive generator): ../shared/corpora apisix/zh,
fastapi/zh, greptime-zh/kb, memdocs-zh/kb, sample_kb, and the English trees apisix/en and fastapi/en.

Question sets. *dev* sets are the ones the weights and the relevance threshold were chosen on; *held-out* sets were
written by someone who did not see the code (bench/queries/keywords.json, colloquial.json, offtopic_heldout.json)
or come from real FAQ pages (greptime-zh and memdocs-zh qrels.json), and nothing was tuned on them.
  dev:      apisix/zh FAQ.md questions (FAQ.md removed from the indexed copy), bench/queries/handwritten.json,
            bench/queries/offtopic.json; and the on-topic decision on two sets helpers wrote without seeing the code,
            each reported on a line of its own: bench/queries/helper_dev.json (322 questions and 135 off-topic
            messages for sample_kb, FastAPI zh and APISIX zh) and helper_dev2.json (100 questions with the pages
            that answer them, ranked too, and 80 small-talk and near-domain messages for greptime-zh and memdocs-zh);
            bench/queries/helper_ids.json: 120 questions holding an identifier from the docs (a config key, a header,
            an error code…) with the pages that answer them, ranked, and 40 holding another product's identifier,
            for FastAPI zh, APISIX zh, greptime-zh and memdocs-zh; bench/queries/helper_digits.json: the same four,
            80 questions and 120 off-topic messages each holding a name that mixes letters and digits (HTTP2,
            Win11, utf8mb4, an error code), about half of the latter a name the corpus mentions
  held-out: greptime-zh qrels, memdocs-zh qrels, keywords (one- or two-word questions), colloquial, off-topic
            messages (small talk for every KB, near-domain tech questions about other products per KB);
            bench/queries/fresh_heldout.json, written in the eleventh session by a helper that read only the corpora
            and first run after every change of that session was in: for APISIX zh, FastAPI zh, greptime-zh and
            memdocs-zh, 25 questions with the pages that answer them (ranked), 25 near-domain messages the KB does
            not answer (about 15 naming a product the KB mentions) and 10 small-talk ones; and for the
            English KBs, bench/queries/english.json (25 questions with their pages and 15 off-topic messages each,
            a third of them small talk), the only held-out sets sent to them; their dev sets are
            bench/queries/english_dev.json (30 questions and 20 messages each, by another helper) and APISIX's FAQ.md

Baselines, on the same documents in the same run (bm25s, k1 1.5, b 0.75):
  bm25s-jieba: full text, jieba ``lcut_for_search`` tokens;
  bm25s-char:  full text, character unigrams + bigrams (Han), Latin words;
  bm25s-kx:    the index entry (title, tags, summary, questions) + full text, with kindex's own analysis;
  bm25s-en:    (English KBs) full text, bm25s's English stop words and the Snowball English stemmer.
With --llamaindex (measured with `pip install llama-index-core==0.14.25 llama-index-retrievers-bm25==0.8.0` in a venv
beside kindex: they are not in the bench extra), also LlamaIndex's own offline retrieval as its users set it up:
SimpleDirectoryReader over the .md files, the default SentenceSplitter chunks (1,024 tokens, 200 overlap),
BM25Retriever (bm25s underneath), a document ranked by its best chunk:
  llamaindex-bm25:      as shipped (English stop words and stemmer, tokens of two or more word characters, which
                        makes a run of Chinese characters one token);
  llamaindex-bm25-char: with the token pattern a Chinese user would pass (each Han character a token).
A kindex ranking that falls back (off topic) counts as a miss. Per set: Hit@1, Hit@5, MRR@10, nDCG@10, and per
question wins/losses (nDCG@10) against the best baseline of that set. The hand-written and helper dev questions are
also asked with one of VALUES appended (a user name, a ticket, an e-mail address…), which must not push them off
topic; and code identifiers drawn from each corpus's pages are asked alone (:func:`identifier_queries`, dev).
"""

from __future__ import annotations

import argparse
import json
import math
import random
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
from kindex.analysis import analyze, identifier_terms  # noqa: E402
from kindex.searchindex import read_entries  # noqa: E402

VALUES = (
    "用户 zhangsan01",
    "工单 INC0012345",
    "错误码 0x80180014",
    "主机 DESKTOP-8F3K2J",
    "我的邮箱 john.doe@contoso.com",
    "地址 https://portal.contoso.cn/x",
    "ticket JIRA-4411",
    "订单号 A20240518X93",
)
"""Values a support message carries (a user, a ticket, an error code, a host, an address): appended one at a time to
the dev questions, they must not push them off topic."""
Ranker = Callable[[str], list[str]]
Queries = list[tuple[str, list[str]]]
KBS = {
    "apisix/zh": CORPORA / "apisix" / "zh",
    "fastapi/zh": CORPORA / "fastapi" / "zh",
    "greptime-zh": CORPORA / "greptime-zh" / "kb",
    "memdocs-zh": CORPORA / "memdocs-zh" / "kb",
    "sample_kb": HERE.parent / "sample_kb",
    "apisix/en": CORPORA / "apisix" / "en",
    "fastapi/en": CORPORA / "fastapi" / "en",
}


def faq_queries(corpus: Path) -> Queries:
    """(question, linked corpus documents) for each FAQ section that links to a document of the corpus."""
    text = (corpus / "FAQ.md").read_text(encoding="utf-8")
    out = []
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        question, _, body = section.partition("\n")
        question = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", question).strip()
        targets: list[str] = []
        for link in re.findall(r"\]\(([^)\s]+)\)", body):
            link = link.split("#", 1)[0]
            m = re.match(r"https://apisix\.apache\.org/(?:zh/)?docs/apisix/(.+?)/?$", link)
            rel = (m.group(1) + ".md") if m else link.removeprefix("./")
            if rel.endswith(".md") and (corpus / rel).is_file() and rel != "FAQ.md" and rel not in targets:
                targets.append(rel)
        if targets:
            out.append((question, targets))
    return out


def _docs(kb: Path) -> tuple[list[str], list[str]]:
    paths = sorted(p.relative_to(kb).as_posix() for p in kb.rglob("*.md") if ".kindex" not in p.parts)
    return paths, [(kb / p).read_text(encoding="utf-8") for p in paths]


def bm25s_ranker(paths: list[str], texts: list[str], tok: Callable[[str], list[str]]) -> Ranker:
    import bm25s

    retriever = bm25s.BM25(k1=1.5, b=0.75)
    retriever.index([tok(t) or ["∅"] for t in texts], show_progress=False)

    def rank(query: str) -> list[str]:
        q = tok(query)
        if not q:
            return []
        docs, scores = retriever.retrieve([q], k=min(10, len(paths)), show_progress=False)
        return [paths[int(i)] for i, s in zip(docs[0], scores[0], strict=True) if s > 0]

    return rank


def jieba_tok() -> Callable[[str], list[str]]:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return lambda text: [w for w in jieba.lcut_for_search(text.lower()) if w.strip() and not re.fullmatch(r"\W+", w)]


_CHAR = re.compile(r"([\u3400-\u9fff]+)|([^\W_\u3400-\u9fff]+)")


def char_tok(text: str) -> list[str]:
    out: list[str] = []
    for m in _CHAR.finditer(text.lower()):
        if m.group(1):
            run = m.group(1)
            out.extend(run)
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
        else:
            out.append(m.group(2))
    return out


def english_tok() -> Callable[[str], list[str]]:
    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN

    stemmer, stop = Stemmer.Stemmer("english"), frozenset(STOPWORDS_EN)
    return lambda text: stemmer.stemWords([w for w in re.findall(r"\w+", text.lower()) if w not in stop])


def baselines(kb: Path, english: bool = False) -> dict[str, Ranker]:
    paths, texts = _docs(kb)
    entries = {rel: item for rel, _, item in read_entries(kb).docs}
    with_entry = [
        " ".join([entries[p].title, *entries[p].tags, entries[p].summary, *entries[p].questions, t])
        if p in entries
        else t
        for p, t in zip(paths, texts, strict=True)
    ]
    out = {
        "bm25s-jieba": bm25s_ranker(paths, texts, jieba_tok()),
        "bm25s-char": bm25s_ranker(paths, texts, char_tok),
        "bm25s-kx": bm25s_ranker(paths, with_entry, analyze),
    }
    if english:
        out["bm25s-en"] = bm25s_ranker(paths, texts, english_tok())
    return out


# Han characters one by one, other words of two or more word characters as LlamaIndex's default pattern has them.
LLAMAINDEX_CHAR_PATTERN = r"(?u)[\u3400-\u9fff\uf900-\ufaff]|[^\W\u3400-\u9fff\uf900-\ufaff]{2,}"


def llamaindex_rankers(kb: Path) -> dict[str, Ranker]:
    """LlamaIndex's BM25 retrieval over ``kb`` as its documentation sets it up (see the module docstring)."""
    from llama_index.core import SimpleDirectoryReader
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.retrievers.bm25 import BM25Retriever

    docs = SimpleDirectoryReader(str(kb), recursive=True, required_exts=[".md"]).load_data()
    nodes = SentenceSplitter().get_nodes_from_documents(docs)

    def ranker(**options: str) -> Ranker:
        retriever = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=min(100, len(nodes)), **options)

        def rank(query: str) -> list[str]:
            out: list[str] = []
            for hit in retriever.retrieve(query):
                rel = Path(hit.node.metadata["file_path"]).relative_to(kb).as_posix()
                if hit.score and hit.score > 0 and rel not in out:
                    out.append(rel)
            return out[:10]

        return rank

    return {"llamaindex-bm25": ranker(), "llamaindex-bm25-char": ranker(token_pattern=LLAMAINDEX_CHAR_PATTERN)}


_IDENT = re.compile(r"(?<![\w.-])(?:[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)+|[a-z]{2,}[A-Z][A-Za-z0-9]*)(?![\w])")


def identifier_queries(kb: Path, k: int = 60) -> Queries:
    """Code identifiers (:func:`kindex.analysis.identifier_terms`) without digits that one to three documents of
    ``kb`` hold, ``k`` of them drawn with a fixed seed, each asked alone and with 是什么意思: the pages holding it
    are the targets. Nobody wrote these questions: they are what a developer pastes from the docs."""
    where: dict[str, set[str]] = {}
    paths, texts = _docs(kb)
    for rel, text in zip(paths, texts, strict=True):
        for word in set(_IDENT.findall(text)):
            if identifier_terms(word) and not any(c.isdigit() for c in word):
                where.setdefault(word, set()).add(rel)
    rare = sorted(w for w, docs in where.items() if len(docs) <= 3)
    picked = random.Random(11).sample(rare, min(k, len(rare)))
    return [(q, sorted(where[w])) for w in picked for q in (w, f"{w} 是什么意思")]


def per_query(ranked: list[str], targets: list[str]) -> dict[str, float]:
    rel = [1 if p in targets else 0 for p in ranked[:10]]
    dcg = sum(r / math.log2(i + 2) for i, r in enumerate(rel))
    ideal = sum(1 / math.log2(i + 2) for i in range(min(len(targets), 10)))
    return {
        "hit@1": float(rel[:1] == [1]),
        "hit@3": float(any(rel[:3])),
        "hit@5": float(any(rel[:5])),
        "mrr@10": next((1 / (i + 1) for i, r in enumerate(rel) if r), 0.0),
        "ndcg@10": dcg / ideal,
    }


def evaluate(rankers: dict[str, Ranker], queries: Queries) -> dict[str, list[dict[str, float]]]:
    return {name: [per_query(r(q), t) for q, t in queries] for name, r in rankers.items()}


def mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows) if rows else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", choices=("dev", "heldout", "all"), default="all")
    ap.add_argument("--keep", type=Path, help="index into this folder and reuse it on the next run")
    ap.add_argument("--kbs", default=",".join(KBS), help="comma-separated corpora to run")
    ap.add_argument("--llamaindex", action="store_true", help="add LlamaIndex's BM25 retrieval as two more baselines")
    args = ap.parse_args()
    if not CORPORA.is_dir():
        sys.exit(f"corpora not found at {CORPORA}")
    queries_dir = HERE / "queries"
    handwritten = json.loads((queries_dir / "handwritten.json").read_text(encoding="utf-8"))
    keywords = json.loads((queries_dir / "keywords.json").read_text(encoding="utf-8"))
    colloquial = json.loads((queries_dir / "colloquial.json").read_text(encoding="utf-8"))
    off_dev = json.loads((queries_dir / "offtopic.json").read_text(encoding="utf-8"))["messages"]
    off_held = json.loads((queries_dir / "offtopic_heldout.json").read_text(encoding="utf-8"))
    english = json.loads((queries_dir / "english.json").read_text(encoding="utf-8"))
    english_dev = json.loads((queries_dir / "english_dev.json").read_text(encoding="utf-8"))
    fresh = json.loads((queries_dir / "fresh_heldout.json").read_text(encoding="utf-8"))
    helpers = {
        f: json.loads((queries_dir / f).read_text(encoding="utf-8"))
        for f in ("helper_dev.json", "helper_dev2.json", "helper_ids.json", "helper_digits.json")
    }
    # Per file and list ("on", "off", "off_smalltalk", ...): [fell back, messages].
    helper_fell: dict[str, dict[str, list[int]]] = {f: {} for f in helpers}
    dev, held = args.sets in ("dev", "all"), args.sets in ("heldout", "all")

    rows: list[dict[str, object]] = []
    offtopic_rows: list[tuple[str, str, int, int]] = []
    on_topic_total = on_topic_fell = 0
    with_value = [0, 0]  # dev questions with a value appended: [fell back, asked]
    # Identifier questions per script of the KB (zh, en): [fell back, a page holding it in the context, asked].
    identifiers = {"zh": [0, 0, 0], "en": [0, 0, 0]}
    pick = random.Random(7)
    keyword_top3: list[float] = []
    fresh_on = [0, 0]  # the fresh held-out questions: [fell back, asked]
    tmp = tempfile.TemporaryDirectory()
    work = args.keep or Path(tmp.name)
    for name in args.kbs.split(","):
        kb = work / name.replace("/", "-")
        sets: dict[str, Queries] = {}
        if not kb.exists():
            shutil.copytree(KBS[name], kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
            if (kb / "FAQ.md").exists():
                (kb / "FAQ.md").rename(kb.parent / f"{kb.name}-FAQ.md")
        faq = kb.parent / f"{kb.name}-FAQ.md"
        if dev and faq.exists():
            shutil.copy(faq, kb / "FAQ.md")
            sets["faq (dev)"] = faq_queries(kb)
            (kb / "FAQ.md").unlink()
        if dev and name in handwritten:
            sets["handwritten (dev)"] = [(q, t) for q, t in handwritten[name]]
        for f, label in (
            ("helper_dev2.json", "helper"),
            ("helper_ids.json", "identifiers"),
            ("helper_digits.json", "names with digits"),
        ):
            if dev and name in helpers[f]:
                sets[f"{label} (dev)"] = [(q, t) for q, t in helpers[f][name]["on"]]
        if held and name in ("greptime-zh", "memdocs-zh"):
            qrels = json.loads((KBS[name].parent / "qrels.json").read_text(encoding="utf-8"))
            sets["real FAQ (held-out)"] = [(r["q"], r["targets"]) for r in qrels]
        if held and name in colloquial:
            sets["colloquial (held-out)"] = [(q, t) for q, t in colloquial[name]]
        if held and name in keywords:
            sets["keywords (held-out)"] = [(q, t) for q, t in keywords[name]]
        if held and name in fresh:
            sets["fresh (held-out)"] = [(q, t) for q, t in fresh[name]["on"]]
        if dev and name in english_dev:
            sets["english (dev)"] = [(q, t) for q, t in english_dev[name]["on"]]
        if held and name in english:
            sets["english (held-out)"] = [(q, t) for q, t in english[name]["on"]]
        started = time.perf_counter()
        kindex.reindex(kb)
        print(f"{name}: indexed offline in {time.perf_counter() - started:.2f} s", file=sys.stderr)
        rankers: dict[str, Ranker] = {"kindex": lambda q, kb=kb: [i.path for i in kindex.search(kb, q, limit=10)]}
        rankers.update(baselines(kb, english=name.endswith("/en")))
        if args.llamaindex:
            rankers.update(llamaindex_rankers(kb))
        for set_name, queries in sets.items():
            results = evaluate(rankers, queries)
            base = max((b for b in results if b != "kindex"), key=lambda b: mean(results[b], "ndcg@10"))
            wins = sum(
                k["ndcg@10"] > b["ndcg@10"] + 1e-9 for k, b in zip(results["kindex"], results[base], strict=True)
            )
            losses = sum(
                k["ndcg@10"] < b["ndcg@10"] - 1e-9 for k, b in zip(results["kindex"], results[base], strict=True)
            )
            for system, per in results.items():
                rows.append(
                    {
                        "corpus": name,
                        "set": set_name,
                        "n": len(queries),
                        "system": system,
                        **{k: mean(per, k) for k in ("hit@1", "hit@5", "mrr@10", "ndcg@10")},
                        "vs": f"{wins}/{losses} vs {base}" if system == "kindex" else "",
                    }
                )
            if set_name.startswith("keywords"):
                keyword_top3.extend(r["hit@3"] for r in results["kindex"])
            fell = sum(kindex.build_context(kb, q).fallback for q, _ in queries)
            on_topic_total += len(queries)
            on_topic_fell += fell
            if set_name.startswith("fresh"):
                fresh_on[0], fresh_on[1] = fresh_on[0] + fell, fresh_on[1] + len(queries)
            if set_name.startswith(("handwritten", "helper")):
                noisy = [f"{q} {pick.choice(VALUES)}" for q, _ in queries]
                with_value[0] += sum(kindex.build_context(kb, m).fallback for m in noisy)
                with_value[1] += len(queries)
            if fell:
                print(f"{name} {set_name}: {fell}/{len(queries)} on-topic questions fell back", file=sys.stderr)
        if dev:
            for q, targets in identifier_queries(kb):
                ctx = kindex.build_context(kb, q)
                counts = identifiers["en" if name.endswith("/en") else "zh"]
                counts[0] += ctx.fallback
                counts[1] += not ctx.fallback and any(i.path in targets for i in ctx.items)
                counts[2] += 1
        messages: dict[str, list[str]] = {}
        if name in english:  # the Chinese lists are not what an English KB's users send
            if dev:
                messages["dev: english"] = english_dev[name]["off"]
            if held:
                messages["held-out: english"] = english[name]["off"]
        else:
            if dev:
                messages["dev"] = off_dev
            if held:
                messages["held-out: small talk"] = off_held["any"]
                if name in off_held:
                    messages["held-out: near-domain"] = off_held[name]
                if name in fresh:
                    messages["held-out fresh: near-domain"] = fresh[name]["off_near"]
                    messages["held-out fresh: small talk"] = fresh[name]["off_smalltalk"]
        for label, msgs in messages.items():
            fb = [kindex.build_context(kb, m).fallback for m in msgs]
            offtopic_rows.append((name, label, sum(fb), len(msgs)))
            for m, f in zip(msgs, fb, strict=True):
                if not f:
                    got = kindex.search(kb, m, limit=1)
                    print(f"  not fallen back ({name}, {label}): {m} -> {got[0].path if got else '?'}", file=sys.stderr)

        for f, helper in helpers.items():
            if dev and name in helper:
                for label, entries in helper[name].items():
                    msgs = [e if isinstance(e, str) else e[0] for e in entries]
                    count = helper_fell[f].setdefault(label, [0, 0])
                    count[0] += sum(kindex.build_context(kb, m).fallback for m in msgs)
                    count[1] += len(msgs)

    print("| corpus | set | n | system | Hit@1 | Hit@5 | MRR@10 | nDCG@10 | kindex wins/losses |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['corpus']} | {r['set']} | {r['n']} | {r['system']} | {r['hit@1']:.3f} | {r['hit@5']:.3f} "
            f"| {r['mrr@10']:.3f} | {r['ndcg@10']:.3f} | {r['vs']} |"
        )
    print()
    print("| corpus | off-topic messages | fell back |")
    print("|---|---|---|")
    total_fb = total_msgs = 0
    for name, label, fb, n in offtopic_rows:
        print(f"| {name} | {label} | {fb}/{n} |")
        total_fb, total_msgs = total_fb + fb, total_msgs + n
    print()
    if total_msgs:
        print(f"- off-topic messages that fell back: {total_fb}/{total_msgs} ({total_fb / total_msgs:.1%})")
    if on_topic_total:
        print(
            f"- on-topic questions that fell back: {on_topic_fell}/{on_topic_total} "
            f"({on_topic_fell / on_topic_total:.1%})"
        )
    fresh_off = [(fb, n) for _, label, fb, n in offtopic_rows if label.startswith("held-out fresh")]
    if fresh_off:
        near = [(fb, n) for _, label, fb, n in offtopic_rows if label == "held-out fresh: near-domain"]
        off_fb, off_n = sum(f for f, _ in fresh_off), sum(n for _, n in fresh_off)
        near_fb, near_n = sum(f for f, _ in near), sum(n for _, n in near)
        print(
            f"- fresh held-out set: off-topic messages that fell back {off_fb}/{off_n} ({off_fb / off_n:.1%}; "
            f"near-domain {near_fb}/{near_n}), on-topic questions that fell back {fresh_on[0]}/{fresh_on[1]}"
        )
    if keyword_top3:
        print(
            f"- keyword questions with a target in the top 3: {sum(keyword_top3):.0f}/{len(keyword_top3)} "
            f"({sum(keyword_top3) / len(keyword_top3):.1%})"
        )
    if with_value[1]:
        print(
            f"- dev questions with a value appended (a user, a ticket, an address: VALUES) that fell back: "
            f"{with_value[0]}/{with_value[1]}"
        )
    for script, (fell, found, asked) in identifiers.items():
        if asked:
            print(
                f"- identifiers from the docs asked alone or with 是什么意思 ({script} KBs, dev): fell back {fell}/"
                f"{asked}, a page holding it in the context {found}/{asked}"
            )
    for f, counts in helper_fell.items():
        if counts:
            parts = [f"{label} {fell}/{n} ({fell / n:.1%})" for label, (fell, n) in counts.items()]
            print(f"- {f} (dev), fell back: " + ", ".join(parts))
    tmp.cleanup()


if __name__ == "__main__":
    main()
