"""Per question, what a change of code did to the ranking: nDCG@10 of every ranked question set, for the kindex of
one checkout, and a comparison of two such runs.

    python bench/per_question.py run CHECKOUT OUT.json    # the kindex of CHECKOUT (a `git worktree`, or this one)
    python bench/per_question.py compare BEFORE.json AFTER.json

`run` copies the corpora into a temporary folder (APISIX's FAQ.md left out, as `retrieval_quality.py` does), indexes
them offline with that checkout's kindex and writes {"corpus|set": [nDCG@10 per question]}; dev sets are named
"dev …", held-out ones "held …". `compare` prints, per set that moved, the mean before and after and how many
questions got better and worse, then the totals for dev and held-out. Run both checkouts in the same hour.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def question_sets(rq: Any, name: str, corpus: Path, kb: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """Every ranked question set of corpus ``name`` (``rq``: the ``retrieval_quality`` module), by label ("dev …",
    "held …"). ``kb``: the corpus's copy, from which APISIX's FAQ.md is taken out here (it holds those questions
    verbatim)."""
    queries = rq.HERE / "queries"

    def load(file: str) -> dict[str, Any]:
        return dict(json.loads((queries / file).read_text(encoding="utf-8")))

    hand, helper2, ids, digits = (
        load(f) for f in ("handwritten.json", "helper_dev2.json", "helper_ids.json", "helper_digits.json")
    )
    colloquial, keywords, fresh = (load(f) for f in ("colloquial.json", "keywords.json", "fresh_heldout.json"))
    english_dev, english = load("english_dev.json"), load("english.json")
    sets: dict[str, Any] = {}
    if (kb / "FAQ.md").exists():
        sets["dev faq"] = rq.faq_queries(kb)
        (kb / "FAQ.md").unlink()
    if name in hand:
        sets["dev handwritten"] = hand[name]
    for source, label in (
        (helper2, "dev helper"),
        (ids, "dev identifiers"),
        (digits, "dev digits"),
        (english_dev, "dev english"),
    ):
        if name in source:
            sets[label] = source[name]["on"]
    if name in ("greptime-zh", "memdocs-zh"):
        qrels = json.loads((corpus.parent / "qrels.json").read_text(encoding="utf-8"))
        sets["held real FAQ"] = [(r["q"], r["targets"]) for r in qrels]
    for source, label in ((colloquial, "held colloquial"), (keywords, "held keywords")):
        if name in source:
            sets[label] = source[name]
    for source, label in ((fresh, "held fresh"), (english, "held english")):
        if name in source:
            sets[label] = source[name]["on"]
    return sets


def run(checkout: Path, out: Path) -> None:
    sys.path.insert(0, str(checkout))  # that checkout's kindex, before the one retrieval_quality would import
    import kindex

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import retrieval_quality as rq

    print(f"kindex from {kindex.__file__}", file=sys.stderr)
    result: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, corpus in rq.KBS.items():
            kb = Path(tmp) / name.replace("/", "-")
            shutil.copytree(corpus, kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
            sets = question_sets(rq, name, corpus, kb)
            kindex.reindex(kb)
            for label, questions in sets.items():
                result[f"{name}|{label}"] = [
                    rq.per_query([hit.path for hit in kindex.search(kb, q, limit=10)], targets)["ndcg@10"]
                    for q, targets in questions
                ]
    out.write_text(json.dumps(result), encoding="utf-8")


def compare(before_file: Path, after_file: Path) -> None:
    before = json.loads(before_file.read_text(encoding="utf-8"))
    after = json.loads(after_file.read_text(encoding="utf-8"))
    totals = {"dev": [0, 0], "held": [0, 0]}
    for key, old in before.items():
        new = after[key]
        better = sum(b > a + 1e-9 for a, b in zip(old, new, strict=True))
        worse = sum(b < a - 1e-9 for a, b in zip(old, new, strict=True))
        kind = key.split("|", 1)[1].split(" ", 1)[0]
        totals[kind][0] += better
        totals[kind][1] += worse
        if better or worse:
            print(
                f"{key:40} n={len(old):3} nDCG@10 {sum(old) / len(old):.3f} -> {sum(new) / len(new):.3f}, "
                f"better/worse {better}/{worse}"
            )
    for kind, (better, worse) in totals.items():
        print(f"{kind}: {better} questions better, {worse} worse")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        run(Path(sys.argv[2]).resolve(), Path(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
