"""Build a real-FAQ retrieval set from the Chinese TiDB docs (pingcap/docs-cn): see ``bench/tidb_faq.py``; or, with
``--macros``, from the Chinese NebulaGraph docs (``bench/queries/nebula_faq.json``, built in the twenty-fourth session).

    python bench/tidb_faq_build.py --src /tmp/tidb-faq/src --out /tmp/tidb-faq --commit <sha>

    R=<the git dir of abby-cyber/nebula-docs-cn>  C=740a35c784c71061c3d89d46a294917622f0bf37
    mkdir -p /tmp/faqset/src && cd /tmp/faqset/src
    git -C $R archive $C -- LICENSE mkdocs.yml $(git -C $R ls-tree -r --name-only $C docs-2.0 | grep '\\.md$') | tar -x
    mv docs-2.0/* . && rmdir docs-2.0 && cd -
    python bench/tidb_faq_build.py --src /tmp/faqset/src --out /tmp/faqset --commit $C --macros
    python bench/question_file.py /tmp/faqset/kb /tmp/faqset/questions.json   # = bench/queries/nebula_faq.json

--src is the docs tree exported from the repository (every .md file at one commit, plus LICENSE).
Writes OUT/kb/ (the docs without the FAQ pages), OUT/qrels.json, OUT/questions.json (``question_file.py``'s
format) and OUT/build_stats.json. ``--macros``: the docs use mkdocs-macros variables (``{{nebula.name}}``); every
document is rendered from the ``extra:`` section of SRC/mkdocs.yml first (a key defined twice takes its last value,
as YAML loading does), and a ``{{...}}`` naming no scalar there is removed.

Rules (all mechanical, nothing is edited by hand):
- a FAQ page is a .md file whose front-matter title contains 常见问题 or FAQ (faq/faq-overview.md, an index
  page of FAQ pages, is one of them and yields no question);
- not documents: dot folders (.agents, .github, .vaunt), resources/ (contributor templates and style guides),
  README.md, CONTRIBUTING.md, TOC*.md, files whose name starts with "_" (landing pages);
- a question unit is a leaf heading (level 2-6, no deeper heading inside its section) of a FAQ page, outside code
  fences; the question is the heading text with leading section numbers ("1.1.2 "), markdown link syntax, HTML
  tags, backticks and a trailing {#id} removed; the answer is the text up to the next heading;
- links of the answer (inline [..](..) and reference definitions) are resolved: "/x.md" from the docs root,
  "x.md"/"../x.md" relative to the FAQ page, https://docs.pingcap.com/zh/tidb/<version>/<name> to the unique KB doc
  named <name>.md; anchors and queries are stripped; links to other sites, to FAQ pages, to the page itself, or to
  paths not in the KB are dropped;
- questions without a Chinese character are dropped; a question whose normalized text is a heading or a bold line
  of some KB doc is dropped as a pure copy; identical normalized questions are merged (targets united, n_src).
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import shutil
from collections import Counter
from pathlib import Path

FAQ_TITLE = re.compile(r"常见问题|FAQ")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
PINGCAP = re.compile(r"^https?://docs\.pingcap\.com/zh/tidb/[^/]+/([^/?#]+)/?$")
HAN = re.compile(r"[\u3400-\u9fff]")


def is_doc(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    if any(p.startswith(".") for p in parts) or parts[0] == "resources":
        return False
    if name in ("README.md", "CONTRIBUTING.md") or name.startswith(("TOC", "_")):
        return False
    return name.endswith(".md")


def title_of(text: str) -> str:
    m = re.match(r"^---\n(.*?)\n---", text, re.DOTALL)
    if m:
        t = re.search(r"^title:\s*(.*)$", m.group(1), re.MULTILINE)
        if t:
            return t.group(1).strip().strip("'\"")
    h = re.search(r"^# (.*)$", text, re.MULTILINE)
    return h.group(1).strip() if h else ""


def clean_question(text: str) -> str:
    text = re.sub(r"\{#[^}]*\}\s*$", "", text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    text = re.sub(r"^\d+(\.\d+)*\.?\s+", "", text.strip())
    return re.sub(r"\s+", " ", text).strip()


def norm(text: str) -> str:
    return re.sub(r"[\W_]+", "", text.lower())


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line number, level, text) of the headings outside code fences."""
    out, fenced = [], False
    for i, line in enumerate(text.split("\n")):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            m = HEADING.match(line)
            if m:
                out.append((i, len(m.group(1)), m.group(2)))
    return out


def units(text: str) -> list[tuple[str, str]]:
    """(heading, answer text) of each leaf heading of level >= 2."""
    lines = text.split("\n")
    hs = headings(text)
    out = []
    for k, (line, level, head) in enumerate(hs):
        if level < 2:
            continue
        nxt = hs[k + 1] if k + 1 < len(hs) else None
        if nxt and nxt[1] > level:  # has a sub-heading: a category, not a question
            continue
        end = nxt[0] if nxt else len(lines)
        out.append((head, "\n".join(lines[line + 1 : end])))
    return out


def resolve(href: str, page: str, kb: set[str], by_name: dict[str, list[str]]) -> tuple[str | None, str]:
    """(KB path or None, reason)."""
    m = PINGCAP.match(href)
    if m:
        hits = by_name.get(m.group(1) + ".md", [])
        return (hits[0], "ok") if len(hits) == 1 else (None, "docs.pingcap.com page not in KB")
    if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.I) or href.startswith("//"):
        return None, "external"
    path = href.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return None, "same page"
    if path.startswith("/"):
        rel = posixpath.normpath(path.lstrip("/"))
    else:
        rel = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
    if not rel.endswith(".md"):
        rel = rel.rstrip("/") + ".md"
    if rel == page:
        return None, "same page"
    return (rel, "ok") if rel in kb else (None, "not in KB")


MACRO = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")


def macro_values(mkdocs_yml: Path) -> dict[str, str]:
    """The scalars of mkdocs.yml's ``extra:`` section by their dotted names."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # !!python/name:... tags
    extra = (yaml.load(mkdocs_yml.read_text(encoding="utf-8"), Loader=Loader) or {}).get("extra", {}) or {}
    out: dict[str, str] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            out[prefix] = str(value)

    walk("", extra)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default="")
    ap.add_argument("--macros", action="store_true", help="render mkdocs-macros variables from SRC/mkdocs.yml")
    args = ap.parse_args()
    src, out = args.src, args.out

    all_md = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.md"))
    values = macro_values(src / "mkdocs.yml") if args.macros else {}
    texts = {rel: (src / rel).read_text(encoding="utf-8") for rel in all_md}
    if args.macros:
        texts = {rel: MACRO.sub(lambda m: values.get(m.group(1), ""), text) for rel, text in texts.items()}
    skipped = [rel for rel in all_md if not is_doc(rel)]
    docs = [rel for rel in all_md if is_doc(rel)]
    faq_pages = [rel for rel in docs if FAQ_TITLE.search(title_of(texts[rel]))]
    kb = set(docs) - set(faq_pages)
    by_name: dict[str, list[str]] = {}
    for rel in sorted(kb):
        by_name.setdefault(posixpath.basename(rel), []).append(rel)

    # Headings and bold lines of the KB docs, normalized, to spot questions the KB repeats verbatim.
    kb_lines: dict[str, set[str]] = {}
    for rel in kb:
        for line in texts[rel].split("\n"):
            m = HEADING.match(line) or re.match(r"^\s*(?:[-*]\s+)?\*\*(.+?)\*\*\s*[:：]?\s*$", line)
            if m:
                kb_lines.setdefault(norm(clean_question(m.groups()[-1])), set()).add(rel)
    kb_norm = {rel: norm(texts[rel]) for rel in kb}

    stats: Counter[str] = Counter()
    link_reasons: Counter[str] = Counter()
    merged: dict[str, dict] = {}
    order: list[str] = []
    for page in faq_pages:
        for head, body in units(texts[page]):
            stats["faq-page question units"] += 1
            q = clean_question(head)
            if not HAN.search(q):
                stats["dropped: question has no Chinese characters"] += 1
                continue
            hrefs = INLINE_LINK.findall(body) + REF_DEF.findall(body)
            targets: list[str] = []
            to_faq = False
            for href in hrefs:
                rel, why = resolve(href, page, kb, by_name)
                if rel is None and why == "not in KB":
                    target = posixpath.normpath(
                        href.split("#")[0].lstrip("/")
                        if href.startswith("/")
                        else posixpath.join(posixpath.dirname(page), href.split("#")[0])
                    )
                    if target in faq_pages:
                        why, to_faq = "FAQ page", True
                link_reasons[why] += 1
                if rel and rel not in targets:
                    targets.append(rel)
            if not targets:
                stats["dropped: links only to FAQ pages" if to_faq else "dropped: no KB link"] += 1
                continue
            key = norm(q)
            if key in kb_lines:
                stats["dropped: pure copy (a KB doc has the question as a heading/bold line)"] += 1
                continue
            if key in merged:
                stats["merged duplicate questions"] += 1
                e = merged[key]
                e["targets"] = sorted(set(e["targets"]) | set(targets))
                e["n_src"] = e.get("n_src", 1) + 1
                continue
            merged[key] = {"q": q, "targets": sorted(targets), "src": page}
            order.append(key)

    qrels = [merged[k] for k in order]
    literal_in_target = sum(any(norm(r["q"]) in kb_norm[t] for t in r["targets"]) for r in qrels)
    literal_elsewhere_only = sum(
        not any(norm(r["q"]) in kb_norm[t] for t in r["targets"])
        and any(norm(r["q"]) in kb_norm[d] for d in kb if d not in r["targets"])
        for r in qrels
    )

    if (out / "kb").exists():
        shutil.rmtree(out / "kb")
    for rel in sorted(kb):
        dst = out / "kb" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(texts[rel], encoding="utf-8")
    if (src / "LICENSE").exists():
        shutil.copy(src / "LICENSE", out / "LICENSE")
    (out / "qrels.json").write_text(json.dumps(qrels, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    questions = {"on": [[r["q"], r["targets"]] for r in qrels], "off": []}
    (out / "questions.json").write_text(json.dumps(questions, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    per_src = Counter(r["src"] for r in qrels)
    n_targets = Counter(len(r["targets"]) for r in qrels)
    target_docs = Counter(t for r in qrels for t in r["targets"])
    summary = {
        "commit": args.commit,
        "md files in tree": len(all_md),
        "skipped (not docs)": skipped,
        "faq pages removed": faq_pages,
        "kb docs": len(kb),
        "questions": len(qrels),
        "mining": dict(stats),
        "answer links": dict(link_reasons),
        "questions per FAQ page": dict(sorted(per_src.items())),
        "targets per question": dict(sorted(n_targets.items())),
        "mean targets": round(sum(len(r["targets"]) for r in qrels) / max(1, len(qrels)), 3),
        "distinct target docs": len(target_docs),
        "most linked targets": target_docs.most_common(10),
        "questions with a target that contains the question text literally": literal_in_target,
        "questions whose text appears literally only in a non-target KB doc": literal_elsewhere_only,
    }
    (out / "build_stats.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
