"""Questions and documents in traditional Chinese: does retrieval find the same documents as in simplified?

    python bench/traditional.py CHECKOUT        (needs: pip install -e '.[bench]', for OpenCC's converter)

For each Chinese KB of ``retrieval_quality.py`` and every ranked question set of ``per_question.py`` (dev and
held-out alike: nothing here is tuned), the kindex of CHECKOUT (this one, or a ``git worktree`` of another commit)
ranks the questions as written (simplified), converted by OpenCC to traditional characters (``s2t``), and to
Taiwan usage (``s2twp``: characters and words, 软件 → 軟體, 设置 → 設定); then the same KB with every document
converted to traditional characters, asked the simplified and the traditional questions. Printed per KB: mean
nDCG@10 of each condition and how many questions got no document (off topic).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import opencc


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(sys.argv[1]).resolve()))
    import kindex

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    import retrieval_quality as rq
    from per_question import question_sets

    print(f"kindex from {kindex.__file__}", file=sys.stderr)
    to_t, to_tw = opencc.OpenCC("s2t"), opencc.OpenCC("s2twp")
    print("| KB | questions | documents | simplified | traditional (s2t) | Taiwan (s2twp) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, corpus in rq.KBS.items():
            if name.endswith("/en"):
                continue
            kb = Path(tmp) / name.replace("/", "-")
            shutil.copytree(corpus, kb, ignore=shutil.ignore_patterns(".kindex", "index.json"))
            questions = [q for qs in question_sets(rq, name, corpus, kb).values() for q in qs]
            trad = Path(tmp) / (kb.name + "-trad")
            shutil.copytree(kb, trad)
            for page in trad.rglob("*.md"):
                page.write_text(to_t.convert(page.read_text(encoding="utf-8")), encoding="utf-8")
            for folder, label in ((kb, "as written"), (trad, "traditional")):
                kindex.reindex(folder)
                cells = []
                for convert in (str, to_t.convert, to_tw.convert):
                    scores, empty = [], 0
                    for q, targets in questions:
                        hits = [h.path for h in kindex.search(folder, convert(q), limit=10)]
                        empty += not hits
                        scores.append(rq.per_query(hits, targets)["ndcg@10"])
                    cells.append(f"{sum(scores) / len(scores):.3f} ({empty} none)")
                print(f"| {name} | {len(questions)} | {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
