"""Entries written by a capable model, measured: kindex over them against extractive entries and raw-text BM25.

No capable model runs on this machine (the local one is a 0.5B model), so the model's part is played by helper
sessions: each reads exactly the prompts kindex sends (system prompt + one document's rendered prompt) and writes
the JSON answer a careful model would, seeing nothing else (no question set, no benchmark). kindex then indexes the
corpus through litellm against a small OpenAI-compatible server that answers each prompt with its written answer,
so the entries pass the same validation, cache and tables as a real model's.

    python bench/scribe_entries.py dump CORPUS JOB [--parts N]     # JOB/prompts/, SYSTEM_PROMPT.txt, part_*.json
    # ... helper sessions write JOB/answers/<id>.json, one per prompt ...
    python bench/scribe_entries.py serve PORT JOB [JOB ...]         # answers by prompt; anything else: HTTP 400
    cp -r CORPUS /tmp/x-llm && KINDEX_MODEL=openai/scribe KINDEX_API_BASE=http://127.0.0.1:PORT/v1 \\
        OPENAI_API_KEY=x kindex reindex /tmp/x-llm                  # the root answer has none: stand-in themes
    cp -r CORPUS /tmp/x-ext && kindex reindex /tmp/x-ext
    python bench/scribe_entries.py measure NAME /tmp/x-llm /tmp/x-ext  # NAME: a key of retrieval_quality.KBS
    python bench/scribe_entries.py measure nebula /tmp/n-llm /tmp/n-ext --questions bench/queries/nebula_faq.json

``dump`` must run with the kindex whose prompts the answers are for: an answer is found by the hash of its prompt.
``measure`` runs every ranked set of ``per_question.question_sets`` for the corpus (dev and held-out labelled; for
APISIX zh also ``queries/newcomer_apisix.json``), with kindex over each KB and the bm25s baselines, and counts the
held-out off-topic messages (``offtopic_heldout.json``) and the on-topic questions that fall back. Copies of
APISIX zh leave out FAQ.md, as ``retrieval_quality.py`` does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def _prompt_id(user: str) -> str:
    return hashlib.sha1(user.encode("utf-8")).hexdigest()[:16]


def dump(corpus: Path, job: Path, parts: int) -> None:
    from kindex.generators import doc_messages
    from kindex.scan import scan

    (job / "prompts").mkdir(parents=True, exist_ok=True)
    (job / "answers").mkdir(exist_ok=True)
    index = []
    system = ""
    for doc in scan(corpus, reuse=False).documents:
        messages = doc_messages(doc)
        system, user = messages[0]["content"], messages[1]["content"]
        pid = _prompt_id(user)
        (job / "prompts" / f"{pid}.txt").write_text(user, encoding="utf-8")
        index.append({"id": pid, "rel": doc.rel, "chars": len(user)})
    (job / "SYSTEM_PROMPT.txt").write_text(system, encoding="utf-8")
    (job / "index.json").write_text(json.dumps(index, ensure_ascii=False, indent=1), encoding="utf-8")
    size = -(-len(index) // parts)
    for i in range(parts):
        part = index[i * size : (i + 1) * size]
        (job / f"part_{i + 1}.json").write_text(json.dumps(part, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"{len(index)} prompts, {sum(p['chars'] for p in index):,} characters, in {parts} part(s)")


def serve(port: int, jobs: list[Path]) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            user = next(m["content"] for m in body["messages"] if m["role"] == "user")
            pid = _prompt_id(user)
            answer = next(
                (j / "answers" / f"{pid}.json" for j in jobs if (j / "answers" / f"{pid}.json").exists()), None
            )
            if answer is None:  # the root prompt, or a prompt no helper answered: kindex writes a stand-in
                out = {"error": {"message": "no answer for this prompt", "type": "invalid_request_error"}}
                self.send_response(400)
            else:
                content = answer.read_text(encoding="utf-8")
                out = {
                    "id": pid,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": "scribe",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                    ],
                    "usage": {
                        "prompt_tokens": len(user) // 2,
                        "completion_tokens": len(content) // 2,
                        "total_tokens": 0,
                    },
                }
                self.send_response(200)
            data = json.dumps(out).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    print(f"http://127.0.0.1:{port}/v1", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def measure(name: str, llm_kb: Path, ext_kb: Path, questions: Path | None = None) -> None:
    import retrieval_quality as rq
    from per_question import question_sets

    import kindex

    if questions is not None:  # a corpus of its own (question_file.py's format), say bench/queries/nebula_faq.json
        data = json.loads(questions.read_text(encoding="utf-8"))
        sets = {f"held {questions.stem}": [(q, list(t)) for q, t in data["on"]]}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "c"
            shutil.copytree(rq.KBS[name], copy, ignore=shutil.ignore_patterns(".kindex", "index.json"))
            sets = question_sets(rq, name, rq.KBS[name], copy)
    if name == "apisix/zh":
        newcomer = json.loads((HERE / "queries" / "newcomer_apisix.json").read_text(encoding="utf-8"))
        sets["held newcomer"] = [(q, t) for q, t in newcomer["on"]]
    handles = {"llm": kindex.KnowledgeBase(llm_kb), "ext": kindex.KnowledgeBase(ext_kb)}

    def ranker(handle: kindex.KnowledgeBase) -> Any:
        def rank(question: str) -> list[str]:
            got = handle.ranking(question, limit=10)
            return [] if got.off_topic else [i.path for i in got.results]

        return rank

    raw, with_llm = rq.baselines(ext_kb), rq.baselines(llm_kb)
    rankers = {
        "kindex-llm": ranker(handles["llm"]),
        "kindex-ext": ranker(handles["ext"]),
        "bm25s-jieba": raw["bm25s-jieba"],
        "bm25s-char": raw["bm25s-char"],
        "bm25s-kx(ext)": raw["bm25s-kx"],
        "bm25s-kx(llm)": with_llm["bm25s-kx"],
    }
    print("| set | n | " + " | ".join(f"{r} Hit@5 / nDCG@10" for r in rankers) + " | llm vs ext better/worse |")
    print("|---" * (len(rankers) + 3) + "|")
    for label, questions in sets.items():
        res = rq.evaluate(rankers, questions)
        pairs = list(zip(res["kindex-llm"], res["kindex-ext"], strict=True))
        better = sum(a["ndcg@10"] > b["ndcg@10"] + 1e-9 for a, b in pairs)
        worse = sum(a["ndcg@10"] < b["ndcg@10"] - 1e-9 for a, b in pairs)
        cells = " | ".join(f"{rq.mean(v, 'hit@5'):.3f} / {rq.mean(v, 'ndcg@10'):.3f}" for v in res.values())
        print(f"| {label} | {len(questions)} | {cells} | {better}/{worse} |")
    off = json.loads((HERE / "queries" / "offtopic_heldout.json").read_text(encoding="utf-8"))
    messages = [m for key, value in off.items() if key in (name, "any") for m in value]
    asked = [q for questions in sets.values() for q, _ in questions]
    for kind, handle in handles.items():
        fell = sum(handle.ranking(m, limit=1).off_topic for m in messages)
        lost = sum(handle.ranking(q, limit=1).off_topic for q in asked)
        print(
            f"- {kind}: held-out off-topic falling back {fell}/{len(messages)}, "
            f"on-topic falling back {lost}/{len(asked)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="write the prompts kindex sends for every document of CORPUS")
    d.add_argument("corpus", type=Path)
    d.add_argument("job", type=Path)
    d.add_argument("--parts", type=int, default=1, help="split the prompt list for this many helper sessions")
    s = sub.add_parser("serve", help="answer kindex's prompts from JOB/answers/")
    s.add_argument("port", type=int)
    s.add_argument("jobs", type=Path, nargs="+")
    m = sub.add_parser("measure", help="every ranked set of a corpus over both KBs and the baselines")
    m.add_argument("name")
    m.add_argument("llm_kb", type=Path)
    m.add_argument("ext_kb", type=Path)
    m.add_argument("--questions", type=Path, help="a question file (question_file.py's format) instead of NAME's sets")
    args = ap.parse_args()
    if args.command == "dump":
        dump(args.corpus, args.job, args.parts)
    elif args.command == "serve":
        serve(args.port, args.jobs)
    else:
        measure(args.name, args.llm_kb, args.ext_kb, args.questions)


if __name__ == "__main__":
    main()
