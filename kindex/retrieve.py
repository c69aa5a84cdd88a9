"""BuildContext (SPEC §6): pick the documents a chat message is about and hand over their original text.

The index files are loaded once per process and kept, with their scoring tables, until a file changes on disk
(checked with one ``stat`` per index file per call), so a chat backend pays for parsing only after a reindex.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from kindex.errors import IndexMissingError, KBNotFoundError, UsageError
from kindex.globs import any_match, normalize_path, paths_in_text
from kindex.model import INDEX_FILE, DocItem, parse_index
from kindex.scan import clean_body, strip_frontmatter
from kindex.store import STATE_DIR
from kindex.tables import Table
from kindex.tokenize import estimate_tokens, is_weak, normalize, terms

DEFAULT_BUDGET_TOKENS = 6000
DEFAULT_MAX_DOCS = 4
DEFAULT_FALLBACK_DOCS = ("导读.md", "00-总则与功能导航.md")

# Field weights: a word in a title or tag says more about a document than the same word in its summary.
_FIELD_WEIGHTS = (("title", 3.0), ("tags", 2.5), ("path", 1.5), ("summary", 1.0))
_WEAK_WEIGHT = 0.15
_THEME_PRIOR = 0.3
# One shared word is coincidence ("关于", "比较", "good"): the question is on topic only when some document's entry
# shares at least two strong terms (words, character pairs) with it, or its body at least three.
MIN_MATCHED_TERMS = 2
MIN_BODY_TERMS = 3
_TRUNCATION_MARK = "\n\n[… truncated to fit the context budget; open {path} for the rest]"

# Pairs and words that occur in questions about anything: they must not make a match.
_STOP_PAIRS = frozenset(
    "为什 如何 怎么 怎样 什么 为什么 为何 哪里 哪些 哪个 可以 能否 是否 是不是 能不能 一下 一个 这个 那个 "
    "我们 你们 他们 自己 没有 不是 就是 还是 或者 以及 因为 所以 但是 如果 的话 时候 现在 已经 "
    "需要 应该 请问 谢谢 你好 知道 告诉 问题 有没 没有 要怎 怎么 么办 么样 是什 一些 这些 那些 "
    "还有 有什 的是 了吗 的吗 吗？ 呢？ 我想 我要 想要 帮我 给我 多少 一直 为啥 咋办 一样 不能 "
    "不了 不会 会不 可不 以吗 用了 了一".split()
)
# Particles and pronouns glue words together: a pair holding one ("的账", "我的") is not a word.
_STOP_CHARS = frozenset("的了吗呢吧啊呀嘛我你")
_STOP_WORDS = frozenset(
    "a an the is are was were be been do does did how what why when where which who whom can could "
    "should would i me my we our you your it its of to in on for with at by from and or not no this that "
    "these those there here please thanks thank hi hello if then than so as into about any some get use "
    "using".split()
)


@dataclass(frozen=True, slots=True)
class ContextItem:
    """One chosen document (or theme) and why it was chosen."""

    path: str
    level: str
    score: float
    title: str
    abstract: str
    reason: str
    matched: tuple[str, ...] = ()
    truncated: bool = False
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "level": self.level,
            "score": round(self.score, 4),
            "title": self.title,
            "abstract": self.abstract,
            "reason": self.reason,
            "matched": list(self.matched),
            "truncated": self.truncated,
            "tokens": self.tokens,
        }


@dataclass(frozen=True, slots=True)
class Context:
    """What BuildContext hands the agent: the prompt text and the items it was assembled from."""

    text: str
    items: tuple[ContextItem, ...]
    fallback: bool
    reason: str
    missing: tuple[str, ...] = ()
    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    skills: tuple[dict[str, Any], ...] = ()
    """In a skill library: each chosen skill with its dependency closure (skills, tools, MCP servers)."""

    @property
    def tokens(self) -> int:
        return estimate_tokens(self.text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "items": [i.to_dict() for i in self.items],
            "fallback": self.fallback,
            "reason": self.reason,
            "missing": list(self.missing),
            "tokens": self.tokens,
            "budget_tokens": self.budget_tokens,
            "skills": list(self.skills),
        }


# -- the loaded index ---------------------------------------------------------------------------------------------

ENTRY_TABLE_FILE = "entries.npz"
BODY_TABLE_FILE = "body.npz"
# Body terms are a safety net under the index entries: they rescue a document whose entry missed the user's words,
# but must not outvote an entry that names the subject.
BODY_WEIGHT = 0.6
BODY_TERMS_PER_DOC = 4000
_CANDIDATES = 64


@dataclass(slots=True)
class _Entry:
    path: str  # KB-relative
    level: str
    item: DocItem
    theme: str | None
    globs: tuple[str, ...]
    blob: str  # normalised text of every field, for weak single-character evidence


@dataclass(slots=True)
class _Loaded:
    signature: tuple[Any, ...]
    entries: list[_Entry]
    themes: list[_Entry]
    docs: Table
    theme_table: Table
    body: Table | None
    theme_of: npt.NDArray[np.int32]
    conditional: npt.NDArray[np.bool_]
    path_rank: npt.NDArray[np.int64]
    problems: list[str]
    by_path: dict[str, _Entry]
    skill_library: bool


def _row(item: DocItem, path: str) -> dict[str, float]:
    """Field-weighted frequencies of the strong terms of one entry."""
    fields = {
        "title": item.title,
        "tags": " ".join(item.tags),
        "path": re.sub(r"[/_.\-]+", " ", path.removesuffix(".md")),
        "summary": item.summary,
    }
    row: dict[str, float] = {}
    for name, weight in _FIELD_WEIGHTS:
        for t in terms(fields[name]):
            if not is_weak(t):
                row[t] = row.get(t, 0.0) + weight
    return row


def body_row(text: str) -> dict[str, float]:
    """A document body's strong terms with sublinear frequencies (stop pairs and words left out)."""
    counts = Counter(terms(text))  # counted in C; the filters then run once per distinct term
    return {t: 1.0 + math.log(c) for t, c in counts.items() if not is_weak(t) and not _is_stop(t)}


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _read_entries(kb: Path) -> tuple[list[_Entry], list[_Entry], list[Any], list[str]]:
    root_path = kb / INDEX_FILE
    try:
        root, problems = parse_index(root_path.read_bytes())
    except FileNotFoundError:
        raise IndexMissingError(f"{kb} has no index yet: run `kindex reindex {kb}` first") from None
    except ValueError as exc:
        raise IndexMissingError(f"{root_path} is unreadable ({exc}): run `kindex reindex {kb}`") from None
    signature: list[Any] = [_stat(root_path)]
    entries: list[_Entry] = []
    themes: list[_Entry] = []
    for d in root.documents:
        if "/" not in d.path:
            entries.append(_Entry(d.path, "document", d, None, d.paths, _blob(d, d.path)))
    for t in root.themes:
        if "/" in t.dir or t.dir.startswith("."):
            problems.append(f"theme {t.dir!r} is not a first-level folder: ignored")
            continue
        theme_doc = DocItem(t.dir, t.title, t.summary, t.tags, t.paths)
        themes.append(_Entry(t.dir, "theme", theme_doc, t.dir, t.paths, _blob(theme_doc, t.dir)))
        sub_path = kb / t.dir / INDEX_FILE
        signature.append(_stat(sub_path))
        try:
            sub, sub_problems = parse_index(sub_path.read_bytes())
        except (OSError, ValueError) as exc:
            problems.append(f"{t.dir}/{INDEX_FILE} unreadable: {exc}")
            continue
        problems.extend(f"{t.dir}/{INDEX_FILE}: {p}" for p in sub_problems)
        for d in sub.documents:
            rel = f"{t.dir}/{d.path}"
            entries.append(_Entry(rel, "document", d, t.dir, d.paths, _blob(d, rel)))
    return entries, themes, signature, problems


def _load(kb: Path) -> _Loaded:
    entries, themes, signature, problems = _read_entries(kb)
    paths = [e.path for e in entries]
    saved = Table.load(kb / STATE_DIR / ENTRY_TABLE_FILE)
    if (
        saved is not None
        and saved[1].get("signature") == orjson.loads(orjson.dumps(signature))
        and (saved[1].get("paths") == paths)
    ):
        docs = saved[0]
    else:
        docs = Table.build([_row(e.item, e.path) for e in entries])
    theme_table = Table.build([_row(t.item, t.path) for t in themes])
    theme_index = {t.path: i for i, t in enumerate(themes)}
    theme_of = np.array([theme_index.get(e.theme, -1) if e.theme else -1 for e in entries], dtype=np.int32)
    conditional = np.array([bool(e.globs) for e in entries], dtype=np.bool_)
    path_rank = np.argsort(np.argsort(np.array(paths, dtype=object))).astype(np.int64)
    body = None
    body_saved = Table.load(kb / STATE_DIR / BODY_TABLE_FILE)
    if body_saved is not None and body_saved[1].get("paths") == paths:
        body = body_saved[0]
    elif body_saved is not None:
        where = {p: i for i, p in enumerate(paths)}
        mapping = np.array([where.get(p, -1) for p in body_saved[1].get("paths", [])], dtype=np.int32)
        if len(mapping) == body_saved[0].n_docs:
            body = body_saved[0].remap(mapping, len(entries))
    by_path = {e.path: e for e in entries}
    skill_library = any((kb / t.path / "SKILL.md").is_file() for t in themes)
    return _Loaded(
        (*signature, _stat(kb / STATE_DIR / BODY_TABLE_FILE)),
        entries,
        themes,
        docs,
        theme_table,
        body,
        theme_of,
        conditional,
        path_rank,
        problems,
        by_path,
        skill_library,
    )


def save_tables(kb: Path) -> None:
    """Precompute the entry scoring table next to the index files, so a cold process loads it instead.

    Nothing is done when the saved table already describes the index files as they are.
    """
    entries, _, signature, _ = _read_entries(kb)
    meta = Table.load_meta(kb / STATE_DIR / ENTRY_TABLE_FILE) or {}
    paths = [e.path for e in entries]
    if meta.get("signature") == orjson.loads(orjson.dumps(signature)) and meta.get("paths") == paths:
        return
    table = Table.build([_row(e.item, e.path) for e in entries])
    table.save(kb / STATE_DIR / ENTRY_TABLE_FILE, {"signature": signature, "paths": paths})


def body_table(bodies: Sequence[tuple[str, str, str]]) -> tuple[Table, dict[str, Any]]:
    """The body-term table of (path, sha256, text) triples, and the meta that says what it was built from.

    Each document keeps at most its ``BODY_TERMS_PER_DOC`` most frequent terms, which bounds the table's size
    whatever the documents' length. (Ranking by rarity instead keeps the accidental pairs that straddle two words,
    and measured worse.)
    """
    kept = []
    for _, _, text in bodies:
        row = body_row(text)
        if len(row) > BODY_TERMS_PER_DOC:
            row = dict(sorted(row.items(), key=lambda kv: (-kv[1], kv[0]))[:BODY_TERMS_PER_DOC])
        kept.append(row)
    meta = {"paths": [p for p, _, _ in bodies], "sha256": [h for _, h, _ in bodies]}
    return Table.build(kept), meta


def save_body_table(kb: Path, table: Table, meta: dict[str, Any]) -> None:
    table.save(kb / STATE_DIR / BODY_TABLE_FILE, meta)


def body_table_meta(kb: Path) -> dict[str, Any] | None:
    """What the saved body table was built from, to skip rebuilding it when nothing changed."""
    return Table.load_meta(kb / STATE_DIR / BODY_TABLE_FILE)


def _blob(item: DocItem, path: str) -> str:
    return normalize(" ".join((item.title, " ".join(item.tags), path, item.summary)))


class _IndexCache:
    """Loaded indexes per KB, reloaded only when an index file's or the body table's (mtime, size, inode) changed."""

    def __init__(self) -> None:
        self._loaded: dict[Path, _Loaded] = {}
        self._lock = threading.Lock()

    def get(self, kb: Path) -> _Loaded:
        current = self._loaded.get(kb)
        if current is not None and self._signature(kb, current) == current.signature:
            return current
        with self._lock:
            loaded = _load(kb)
            self._loaded[kb] = loaded
            return loaded

    @staticmethod
    def _signature(kb: Path, loaded: _Loaded) -> tuple[Any, ...]:
        parts: list[Any] = [_stat(kb / INDEX_FILE)]
        parts.extend(_stat(kb / t.path / INDEX_FILE) for t in loaded.themes)
        parts.append(_stat(kb / STATE_DIR / BODY_TABLE_FILE))  # a doc step can refresh body terms alone
        return tuple(parts)

    def clear(self) -> None:
        with self._lock:
            self._loaded.clear()


_CACHE = _IndexCache()


# -- the query ----------------------------------------------------------------------------------------------------


def _is_stop(t: str) -> bool:
    return t in _STOP_PAIRS or t in _STOP_WORDS or (len(t) == 2 and not _STOP_CHARS.isdisjoint(t))


@dataclass(frozen=True, slots=True)
class _Query:
    strong: dict[str, float]
    weak: tuple[str, ...]


def _query(message: str) -> _Query:
    strong: dict[str, float] = {}
    weak: list[str] = []
    for t in terms(message):
        if is_weak(t):
            if t not in weak:
                weak.append(t)
        elif not _is_stop(t):
            weight = 0.5 if t.isdigit() else 1.0
            strong[t] = max(strong.get(t, 0.0), weight)
    return _Query(strong, tuple(weak))


@dataclass(slots=True)
class _Hit:
    entry: _Entry
    idx: int  # row in the tables; -1 for an overview document outside the index
    score: float
    reason: str


def _matched(loaded: _Loaded, q: _Query, idx: int) -> tuple[str, ...]:
    """The question's strong terms that document ``idx`` holds (computed only for the hits returned)."""
    if idx < 0:
        return ()
    body = loaded.body
    held = (t for t in q.strong if loaded.docs.holds(t, idx) or (body is not None and body.holds(t, idx)))
    return tuple(sorted(held))


def _rank(loaded: _Loaded, q: _Query, scope: list[str], candidates: int = _CANDIDATES) -> list[_Hit]:
    n = len(loaded.entries)
    hits: list[_Hit] = []
    if n and q.strong:
        scores = np.zeros(n, dtype=np.float32)
        matches = np.zeros(n, dtype=np.int32)
        body_matches = np.zeros(n, dtype=np.int32)
        for term, qw in q.strong.items():
            hit = loaded.docs.postings(term)
            if hit is not None:
                docs, contrib, _ = hit
                scores[docs] += contrib * qw
                matches[docs] += 1
            body_hit = loaded.body.postings(term) if loaded.body is not None else None
            if body_hit is not None:
                docs, contrib, _ = body_hit
                scores[docs] += contrib * (qw * BODY_WEIGHT)
                body_matches[docs] += 1
        relevant = ((matches >= MIN_MATCHED_TERMS) | (body_matches >= MIN_BODY_TERMS)) & ~loaded.conditional
        # The question is on topic when some document meets it on two terms; then every document it touches ranks.
        touched = (matches > 0) | (body_matches > 0)
        cand = np.nonzero(touched & ~loaded.conditional)[0] if relevant.any() else relevant.nonzero()[0]
        if len(cand):
            t_scores = np.zeros(len(loaded.themes) + 1, dtype=np.float32)  # the extra slot serves root documents
            loaded.theme_table.score(q.strong, t_scores)
            final = scores[cand] + _THEME_PRIOR * t_scores[loaded.theme_of[cand]]
            top = cand[np.lexsort((loaded.path_rank[cand], -final))][:candidates]
            final_of = dict(zip(cand.tolist(), final.tolist(), strict=True))
            for idx in top.tolist():
                entry = loaded.entries[idx]
                weak_gain = sum(_WEAK_WEIGHT for ch in q.weak if ch in entry.blob)
                hits.append(_Hit(entry, idx, final_of[idx] + weak_gain, "matched"))
    if scope:
        for idx in np.nonzero(loaded.conditional)[0].tolist():
            entry = loaded.entries[idx]
            glob = any_match(entry.globs, scope)
            if glob is not None:
                hits.append(_Hit(entry, idx, 0.0, f"scope glob {glob}"))
    # Rules for the files the user is working on come first: the message is about those files.
    hits.sort(key=lambda h: (h.reason == "matched", -h.score, h.entry.path))
    return hits


# -- assembling the text ------------------------------------------------------------------------------------------


def _read_original(kb: Path, rel: str) -> str | None:
    """The document's text (frontmatter and HTML comments dropped), or ``None`` when it cannot be served."""
    path = kb / rel
    try:
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(kb) or not rel.endswith(".md") or ".." in rel.split("/"):
            return None
        text = real.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return clean_body(strip_frontmatter(text.removeprefix("\ufeff"))).strip()


_BOUNDARY = re.compile(r"\n\s*\n|\n(?=#{1,6} )")


def cut_to_budget(text: str, budget_tokens: int) -> str | None:
    """The longest prefix of ``text`` that ends at a heading or paragraph boundary and fits ``budget_tokens``.

    ``None`` when not even the first paragraph fits. Cuts fall between whole paragraphs, never inside a character.
    """
    if estimate_tokens(text) <= budget_tokens:
        return text
    best: str | None = None
    used, start = 0, 0
    for m in _BOUNDARY.finditer(text):
        used += estimate_tokens(text[start : m.start()])  # counted piece by piece: linear, not quadratic
        start = m.start()
        if used > budget_tokens:
            break
        best = text[: m.start()].rstrip()
    return best or None


def search(
    kb: str | os.PathLike[str],
    message: str,
    *,
    paths: Sequence[str] = (),
    limit: int | None = 10,
    themes: bool = False,
    explain: bool = True,
) -> list[ContextItem]:
    """The ranked entries for ``message`` (best first, at most ``limit``; ``None``: all) without reading files.

    Documents only, unless ``themes``: then theme entries that share at least two strong terms with the message
    rank among them (``level`` says which). ``explain=False`` leaves ``matched`` empty, which is cheaper for long
    rankings. Empty when nothing relevant matched (where :func:`build_context` would fall back).
    """
    loaded = _CACHE.get(_kb_root(kb))
    scope = [normalize_path(p) for p in paths if p.strip()] + paths_in_text(message)
    q = _query(message)
    hits = _rank(loaded, q, scope, candidates=len(loaded.entries) if limit is None else max(limit, _CANDIDATES))
    items = [
        ContextItem(
            h.entry.path,
            h.entry.level,
            h.score,
            h.entry.item.title,
            h.entry.item.summary,
            h.reason,
            _matched(loaded, q, h.idx) if explain else (),
        )
        for h in hits
    ]
    if themes and loaded.themes:
        t_scores = np.zeros(len(loaded.themes), dtype=np.float32)
        loaded.theme_table.score(q.strong, t_scores)
        for i in np.nonzero(t_scores > 0)[0].tolist():
            entry = loaded.themes[i]
            matched = tuple(sorted(t for t in q.strong if loaded.theme_table.holds(t, i)))
            if len(matched) >= MIN_MATCHED_TERMS or items:
                matched = matched if explain else ()
                items.append(
                    ContextItem(
                        entry.path,
                        "theme",
                        float(t_scores[i]),
                        entry.item.title,
                        entry.item.summary,
                        "matched",
                        matched,
                    )
                )
        items.sort(key=lambda it: (-it.score, it.path))
    return items if limit is None else items[:limit]


def _kb_root(kb: str | os.PathLike[str]) -> Path:
    root = Path(kb)
    if not root.is_dir():
        raise KBNotFoundError(f"knowledge folder '{kb}' does not exist: pass the folder that holds index.json")
    return root.resolve()


def build_context(
    kb: str | os.PathLike[str],
    message: str,
    *,
    paths: Sequence[str] = (),
    budget_tokens: int = DEFAULT_BUDGET_TOKENS,
    max_docs: int = DEFAULT_MAX_DOCS,
    fallback_docs: Sequence[str] = DEFAULT_FALLBACK_DOCS,
) -> Context:
    """Choose the documents ``message`` is about and return their original text within ``budget_tokens``.

    ``paths`` are attachment paths (the files the user is working on); paths written in the message count too.
    Entries with ``paths`` globs enter only when one of those paths matches. When nothing relevant matches, the
    designated overview documents (``fallback_docs``) are returned instead, and the result says so.
    """
    if budget_tokens < 50:
        raise UsageError(f"budget_tokens must be at least 50, got {budget_tokens}")
    if max_docs < 1:
        raise UsageError(f"max_docs must be at least 1, got {max_docs}")
    root = _kb_root(kb)
    loaded = _CACHE.get(root)
    scope = [normalize_path(p) for p in paths if p.strip()] + paths_in_text(message)
    q = _query(message)
    hits = _rank(loaded, q, scope)
    fallback = not any(h.reason == "matched" for h in hits)
    reason = "matched the question" if not fallback else "no document matched the question: overview documents"
    if fallback:
        hits = [h for h in hits if h.reason != "matched"]
        for name in fallback_docs:
            entry = loaded.by_path.get(name)
            if entry is None and (root / name).is_file():
                item = DocItem(name, Path(name).stem, "")
                entry = _Entry(name, "document", item, None, (), "")
            if entry is not None and all(h.entry.path != name for h in hits):
                hits.append(_Hit(entry, -1, 0.0, "fallback"))
    ctx = _assemble(root, hits, max_docs, fallback, reason, budget_tokens, lambda h: _matched(loaded, q, h.idx))
    if loaded.skill_library and ctx.items:
        ctx = replace(ctx, skills=_skill_closures(root, ctx.items))
    return ctx


def _skill_closures(root: Path, items: Sequence[ContextItem]) -> tuple[dict[str, Any], ...]:
    from kindex import skills  # only skill libraries need it

    known, _ = skills.load_skills(root)
    by_folder = {s.folder: s for s in known.values()}
    out: list[dict[str, Any]] = []
    for folder in dict.fromkeys(i.path.split("/", 1)[0] for i in items if "/" in i.path):
        skill = by_folder.get(folder)
        if skill is not None:
            c = skills.closure(known, skill.name)
            out.append(
                {
                    "name": skill.name,
                    "skill_dependencies": list(c.skills),
                    "tool_dependencies": list(c.tools),
                    "mcp_dependencies": list(c.mcp),
                }
            )
    return tuple(out)


def _assemble(
    root: Path,
    hits: list[_Hit],
    max_docs: int,
    fallback: bool,
    reason: str,
    budget: int,
    matched: Callable[[_Hit], tuple[str, ...]],
) -> Context:
    parts: list[str] = []
    items: list[ContextItem] = []
    missing: list[str] = []
    used = 0
    for hit in hits:
        if len(items) >= max_docs:
            break
        text = _read_original(root, hit.entry.path)
        if text is None:
            missing.append(hit.entry.path)
            continue
        header = f"## {hit.entry.item.title or hit.entry.path}\n(source: {hit.entry.path})\n\n"
        room = budget - used - estimate_tokens(header)
        if room <= 0:
            break
        truncated = False
        body = cut_to_budget(text, room)
        if body is None or body != text:
            mark = _TRUNCATION_MARK.format(path=hit.entry.path)
            body = cut_to_budget(text, room - estimate_tokens(mark))
            if body is None:
                break  # not even its first paragraph fits: the budget is spent
            body += mark
            truncated = True
        chunk = header + body
        used += estimate_tokens(chunk) + 1
        if truncated:
            used = budget  # the cut document is the last one
        parts.append(chunk)
        e = hit.entry
        items.append(
            ContextItem(
                e.path,
                e.level,
                hit.score,
                e.item.title,
                e.item.summary,
                hit.reason,
                matched(hit),
                truncated,
                estimate_tokens(chunk),
            )
        )
    return Context("\n\n".join(parts), tuple(items), fallback, reason, tuple(missing), budget)


def clear_cache() -> None:
    """Forget every loaded index (the next call reloads from disk)."""
    _CACHE.clear()
