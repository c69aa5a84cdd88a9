"""BuildContext (SPEC §6): pick the documents a chat message is about and hand over their original text.

A :class:`Retriever` loads one KB's search index (:mod:`kindex.searchindex`) once and keeps it until an index file
or the saved tables change on disk (the root index and the saved tables are stat-ed on every call, the theme index
files at most once a second), so a chat backend pays for loading only after a reindex. Scoring is BM25F over each
document's entry fields and body; a question is on topic when the best document covers enough of the question's
informative weight (the rarity of its words), else the KB's overview is returned instead. What a term adds to each
document is worked out from its postings on the term's first use and kept with the loaded tables, so a warm call
sums a few ready rows (as bm25s does) without paying at load for the terms no question uses.

Long because scoring, the on-topic decision, ranking and assembling the text all read the loaded tables'
private arrays; what does not (fitting a document into a budget) lives in :mod:`kindex.fitting`.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import threading
import time
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from kindex.analysis import (
    MAX_VOCAB_TERM,
    Pasted,
    analyze,
    background_rate,
    english_rate,
    has_han,
    identifier_terms,
    is_number,
    mixes_letters_and_digits,
    normalize,
    pasted_english,
    stem,
    stems,
    surface_forms,
    title_key,
    traditional_runs,
    value_terms,
    visible,
)
from kindex.config import DEFAULTS, MAX_BUDGET_TOKENS, MAX_DOCS_LIMIT, MIN_BUDGET_TOKENS, document_paths
from kindex.errors import InvalidDataError, UsageError
from kindex.files import regular_file
from kindex.fitting import MAX_FIT_CHARS, fit_to_budget, one_line
from kindex.gcpause import collector_paused
from kindex.globs import (
    MAX_COMPILED_EXPANSIONS,
    MAX_PATH_CHARS,
    MAX_PATH_SEGMENTS,
    Compiled,
    Scope,
    normalize_path,
    path_spans,
)
from kindex.records import INDEX_FILE
from kindex.results import Context, ContextItem, Ranking, context_item
from kindex.scan import MAX_DOC_BYTES, document_start, kb_folder, servable
from kindex.searchindex import (
    FIELDS,
    SEARCH_FILE,
    SearchIndex,
    from_files,
    load,
    read_entries,
    still_current,
    term_hash,
    wait_for_update,
)
from kindex.store import STATE_DIR, refuse_theme_folder
from kindex.tokenize import estimate_tokens, units

DEFAULT_BUDGET_TOKENS: int = DEFAULTS["budget_tokens"]
DEFAULT_MAX_DOCS: int = DEFAULTS["max_docs"]
DEFAULT_FALLBACK_DOCS: tuple[str, ...] = DEFAULTS["fallback_docs"]
DEFAULT_MIN_RELEVANCE: float = DEFAULTS["min_relevance"]
"""A question is on topic when some document covers at least this share of its informative weight."""
MAX_MESSAGE_CHARS = 20_000
"""Of a longer message only the start and the end are analysed (see :func:`_bounded`)."""
MAX_SEARCH_LIMIT = 200
"""Most entries one search lists (CLI, HTTP, MCP)."""
MAX_FALLBACK_DOCS = 50
"""Most overview documents one call may name: as many as ``kindex.toml`` and ``KINDEX_FALLBACK_DOCS`` take."""
MAX_PATHS = 50
"""Attachment paths and paths found in the message, each: enough for any real conversation, bounded glob work."""

# BM25F: a word in a title, a tag or a question the document answers says more about it than the same word in
# its body. Weights multiply a field's length-normalised frequency before the one saturation per term.
FIELD_WEIGHTS = {
    "title": 3.0,
    "tags": 2.5,
    "summary": 1.0,
    "questions": 1.0,
    "headings": 0.75,
    "path": 1.5,
    "anchors": 1.5,
    "body": 0.5,
}
FIELD_B = {
    "title": 0.3,
    "tags": 0.3,
    "summary": 0.5,
    "questions": 0.5,
    "headings": 0.6,
    "path": 0.3,
    "anchors": 0.5,
    "body": 0.75,
}
K1 = 1.2
BODY_COVER = 0.75
"""How much a word found only in a document's body counts towards covering the question (its entry counts 1), times
its saturated frequency there. It was 0.5 before the subject rule (``MIN_SUBJECT``): a general word in a body no
longer needs discounting here, and 税号 or 营业执照 asked alone, found once in a body, should be answered. Chosen with
``MIN_SUBJECT`` on the dev sets and a helper's 457 independent questions (fewest wrong decisions: on-topic falling
back 40 → 32 of 407, off-topic 241 → 245 of 290 against 0.5 without the rule)."""
UNSEEN_HAN_WEIGHT = 0.0
SINGLE_HAN_WEIGHT = 0.25
SPECIFIC_RATIO = 100.0
MIN_SUBJECT = 0.5
"""Besides a share of its weight, an on-topic question that holds words the KB never uses must share with a document
words worth at least this much of a subject of the KB (:func:`subject`: a name 1, a Chinese word by how far the KB,
or its titles and tags, use it more than general Chinese does). Covering all of a question whose other words the
KB never uses is not enough when what is covered is 推荐 or 期间 (推荐几部好看的科幻电影, 减肥期间晚饭吃什么): its
subject is in the words the KB does not know. A question made only of words the KB uses has no such hidden subject
(日志, 压缩, 接口很慢怎么优化): its cover decides alone. Chosen on the dev sets, in the range where no on-topic
question fell back (up to 1; off-topic 144 → 149 of 155 fell back from 0.4 on)."""
RATE_SIGMAS = 2.0
"""The subject rule takes a word's rates in the KB and in its titles as their counts show them at two standard
errors (:func:`_shown`), not as counted: a word a small KB uses once or twice, or one of its few titles holds, is
not shown to be used more than general Chinese does. In sample_kb's one title ``API快速入门``, 快速 counted as a
full subject and 怎么快速学好英语 got the API page. The counted rates still weigh and rank. Dev (696 questions, 530
messages): 9 more off-topic messages fall back, 3 on-topic questions more (能开专票吗, 扣了两次钱,
怎么给已经建好的表加一列: answered through a word the KB uses once or twice); held-out: 4 more, none lost."""
GENERAL_WORD_RANK = 0.5
"""What a Chinese word as common in the KB as in general Chinese adds to a ranking, against a word specific to the KB
(see :func:`specificity`): 配置, 问题, 使用 tell documents apart less than their rarity in the KB alone suggests."""
UNSEEN_ENGLISH_WEIGHT = 0.5
"""What an English word the KB never uses weighs in an English question, times its rarity (see ``english`` in
:func:`_row`): between phrasing (``realtime``, ``boots`` for a page that says startup: 0) and another product's name
(2). Chosen on the dev sets among 0, 0.5 and 1: English questions falling back 4, 7, 12 of 60; English off-topic
messages falling back 24, 27, 29 of 40; and of 80 messages like "How do I fix a dishwasher?" to FastAPI en, whose
every word but one the KB never uses, 45, 12, 0 answered (the code before English rates answered 11)."""
NAME_WEIGHT = 2.0
"""What a Latin-script word the KB never uses weighs in the on-topic decision, times its rarity: it names another
product (``PostgreSQL 的 VACUUM 是干什么的``: VACUUM), and a page holding the question's other names (PostgreSQL,
mentioned beside a migration) is not about it. A name the KB does use weighs its rarity, as any word does; until
the sixth session every name weighed double, and a page mentioning Linux or Excel once covered most of a question
about them. Dev (696 questions, 550 messages): 15 more off-topic messages fall back, one on-topic question more
(``怎么删掉某个 host 的数据``)."""
THEME_PRIOR = 0.3
MATCHED = "matched"
NAMED = "path in the message"
"""Why a document a message names by its path (``tutorial/cors.md``) is served: first, on topic or not."""
_REASONS = {
    frozenset({MATCHED}): "matched the question",
    frozenset({NAMED}): "the documents the message names",
    frozenset({MATCHED, NAMED}): "the documents the message names, and those that match the question",
}
"""The result's reason when something matched (a message naming one file and asking about another gets both)."""
ENTRY_BOOST = 0.25
MAX_ABSENT_ROWS = 20_000
MAX_ABSENT_TERM = 32
"""Rows are kept of at most ``MAX_ABSENT_ROWS`` words the KB does not hold (question words, typos), each at most
this many characters: a run the segmenter cannot cut comes back whole, and a message of 20,000 rare characters must
not become a 20,000-character key. About 10 MB at most."""
THEME_RECHECK_S = 1.0
LOADS_AT_ONCE = 2
"""Tables loaded at once in a process, whatever the number of KBs asked about. A load is CPU work, mostly under the
interpreter's lock: 8 clients loading 56 agents at once put a loaded agent's 4–8 ms call at 76–149 ms (p90
207–399 ms) while they ran (`bench/agent_fairness.py --cold 56`), and more loads at once finish no sooner. Two, not
one: a KB whose load is slow (rebuilt from its documents) must not hold every other KB's load behind it."""
LOAD_WAIT_S = 1.0
"""How long a load waits for its turn before it runs anyway (the turns held by slow loads)."""
_LOADING = threading.BoundedSemaphore(LOADS_AT_ONCE)
PART_WEIGHT = 0.25
"""What the parts of an identifier the KB holds whole add to a ranking (``frame`` and ``end`` of ``frame_end``): the
page that has ``frame_end`` is the one asked about, not the pages titled frame. Weak evidence, as a single Chinese
character is (``SINGLE_HAN_WEIGHT``): a part may tip a tie. On 528 questions made of identifiers drawn from the
corpora (``bench/retrieval_quality.py``), pages holding the identifier in the context: 495 at 1, 506 at 0.5, 512
here, 520 at 0; dev rankings unchanged."""
MAX_FIT_TERMS = 32
"""A document cut to the budget keeps the sections holding most of the question's words: of the words it holds,
the heaviest this many. Each word costs a scan of the document, and a 20,000-character message held by a document
of 60,000 sections made one call take 40 s; a question's subject is in its few heaviest words."""
_EXACT = "\0"
"""Prefix of an exact row's key in :attr:`_Loaded.rows` (no term holds a NUL)."""
_ENGLISH = "\1"
"""Prefix of the key of a row weighed against general English (``english`` in :func:`_row`)."""
_clock = time.monotonic  # a name of this module, so a test can move time without sleeping
_TRUNCATION_MARK = "\n\n[… truncated to fit the context budget; open {path} for the rest]"
_SHORT_MARK = "\n\n[… truncated]"
"""The mark where the long one would leave the document fewer than ``MIN_SERVED_TOKENS`` (a small budget, a long
path): the header names the path already."""
MIN_SERVED_TOKENS = 20
_SEPARATOR = "\n\n"
_README_NAMES = ("readme.md", "index.md")
OVERVIEW_PAGE_TOKENS = 1500
"""What the KB's own README or index page serves when it stands in for the overview (no overview document of
``fallback_docs`` exists): its head, about a page. Such a page is often a project's home page (FastAPI's index.md:
badges, sponsors, templates), and it took the whole budget (6,000 tokens) of every ``你好``; an overview document
the KB names is written to be one, and is served as the budget allows."""


# -- the loaded index ---------------------------------------------------------------------------------------------


def _stats(paths: Sequence[str], inode: bool = False) -> tuple[tuple[int, ...] | None, ...]:
    """(mtime_ns, size) of each file, and its inode if asked, ``None`` for a missing one: what tells a loaded index
    is still current. Files kindex replaces whole get a new inode at each write, which shows where times are counted
    in whole seconds (ext4 with 128-byte inodes, ext3, HFS+, FAT): an edit and its undo, each written by a step
    within a second, left a service answering from the edit."""
    out: list[tuple[int, ...] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
        except (OSError, ValueError):  # ValueError: a NUL in a hand-edited name
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino) if inode else (st.st_mtime_ns, st.st_size))
    return tuple(out)


_NO_DOCS: npt.NDArray[np.int32] = np.zeros(0, np.int32)
_NO_HOLDERS: npt.NDArray[np.intp] = np.zeros(0, np.intp)
_NO_VALUES: npt.NDArray[np.float32] = np.zeros(0, np.float32)


@dataclass(frozen=True, slots=True)
class _Row:
    """What one term adds to every document holding it: computed from the seven fields' postings on the term's
    first use and kept with the loaded tables (see :func:`_row`)."""

    docs: npt.NDArray[np.intp]
    """The documents holding the term in any field, sorted (as ``intp``: numpy's scatter-add takes such indices in
    half the time of ``int32`` ones, and it is most of a warm call's cost on a large KB)."""
    adds: npt.NDArray[np.complex64]
    """Per document, what the term adds to a question: its gain (BM25F of the term plus the entry boost, before
    the term's weight in the question) as the real part, ``weight`` times ``cover`` (its part of the covered share
    of a question) as the imaginary part. One scatter-add per term then adds both: that scatter is most of a warm
    call's cost on a large KB, and two of them cost nearly twice one. Dense (one value per document of the KB) for a
    term held by more than ``DENSE_ROW_SHARE`` of the documents: adding it is one sequential pass, not a scatter."""
    cover: npt.NDArray[np.float32]
    """Per document: the share of the term's informative weight it covers, 1 in its entry, else ``BODY_COVER``
    times the saturated body frequency (one passing mention counts little); 1 wherever for the exact row of a
    code identifier (see :func:`_row`)."""
    weight: float
    """The term's informative weight in a question (:func:`informative`): fixed for the loaded tables."""
    rank: float
    """What the term's gains are multiplied by in a ranking (``GENERAL_WORD_RANK`` for a general Chinese word,
    1 for a word specific to the KB and for every other term)."""
    subject: float
    """How far the term names a subject of the KB (:func:`subject`)."""
    titled: Mapping[int, tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]] = field(default_factory=dict)
    """The documents whose entry's title holds the term, sorted, by how many terms their title holds (up to
    ``MAX_TITLE_TERMS``), with how often each title holds the term: what :func:`_titled` looks up, a few small
    arrays whatever the KB's size."""


_NO_ADDS = np.zeros(0, np.complex64)
DENSE_ROW_SHARE = 0.25
"""A term's row is kept dense when it holds more than this share of the documents (:class:`_Row`): adding ``n``
values in order costs about what scattering ``n / 10`` does, and a dense row takes at most four times the memory of
the sparse one (numpy 2.4, 10,000 documents)."""


@dataclass(slots=True)
class _Loaded:
    stamps: tuple[str, ...]
    """The root index and the saved tables, as strings (pathlib would cost more): stat-ed on every call. Every
    kindex step that writes an index file rewrites the saved tables after it, so its changes are seen at once."""
    stamps_seen: tuple[tuple[int, ...] | None, ...]
    themes_watched: tuple[str, ...]
    """The theme index files: stat-ed again when a stamp changed, else at most every ``THEME_RECHECK_S``, so a
    theme index edited by hand (or a step that died before saving the tables) is seen within that time."""
    themes_seen: tuple[tuple[int, ...] | None, ...]
    checked_at: float
    """When the theme index files were last stat-ed (``time.monotonic``)."""
    index: SearchIndex
    stale: bool
    """The saved tables were missing or did not match the index files: rebuilt in memory."""
    warnings: tuple[str, ...]
    """What every answer from these tables says about them (see :attr:`Context.warnings`)."""
    n: int
    inv: dict[str, npt.NDArray[np.float32]]
    """Per field: its weight divided by each document's length normalisation."""
    rows: dict[str, _Row]
    """The rows of the terms questions used so far (:func:`_row`): one per term of the tables at most (two for an
    identifier: its exact row too), and ``MAX_ABSENT_ROWS`` of terms the tables do not hold."""
    absent: int
    """How many of ``rows`` are of terms the tables do not hold."""
    theme_rows: dict[str, tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]]
    """Per term of a theme entry used so far: the theme entries holding it and its BM25 gain in each."""
    tokens: float
    """Terms in the KB, all fields: the denominator of a term's rate of use."""
    named_tokens: float
    """Terms in the KB's titles and tags: the denominator of a term's rate of naming documents."""
    theme_of: npt.NDArray[np.intp]
    conditional: npt.NDArray[np.bool_]
    unconditional: npt.NDArray[np.bool_]
    globs: dict[int, tuple[str, ...]]
    """Per conditional document: its entry's ``paths`` and its theme entry's (SPEC §6.4: any theme or document
    entry may carry them; a theme's apply to every document of it)."""
    path_rank: npt.NDArray[np.int64]
    by_path: dict[str, int]
    theme_terms: Sequence[Mapping[str, int]]
    theme_postings: dict[str, list[tuple[int, int]]]
    """Per term of a theme entry: (theme, frequency) of every theme entry holding it, in theme order."""
    theme_norm: list[float]
    """Per theme entry: ``K1`` times its length normalisation, the part of BM25's denominator fixed per load."""
    skill_library: bool
    matchers: Compiled = field(default_factory=Compiled)
    """The compiled ``paths`` globs of this index, filled on first use."""
    folded: dict[str, int] | None = None
    """Unconditional documents in a folder by case-folded path (-1 where two paths differ only in case): how a path
    written in a message names a document (:func:`_named`); made on first use."""
    by_title: dict[str, list[int]] | None = None
    """Unconditional documents by :func:`~kindex.analysis.title_key` of their entry's title and of their own
    (:attr:`DocRecord.own_title`): how a question made only of stop words names a page (:func:`_titled_in_words`);
    made on the first such question."""
    by_own_title: dict[str, list[int]] | None = None
    """Unconditional documents by their own title where their entry gives another (:attr:`DocRecord.own_title`):
    how a question names a page whose entry a model titled otherwise (:func:`_own_titles`); made on first use."""


MAX_FALLBACK_CHECKED = 100
"""Fallback names looked at per call: the HTTP body takes 20; a library caller's list is bounded here."""
UPDATE_WAIT_S = 120.0
"""How long a call that finds the tables stale waits for a step of its process saving new ones (the whole build of
a large KB's first reindex), before it builds them itself."""
MAX_WARNINGS = 10
MAX_WARNING_CHARS = 300
"""A warning quotes what it found (a version, a folder name): a hand-edited index must not make it megabytes."""
STALE_TABLES = (
    "the saved search tables are missing or do not match the index files (a step still writing them, tables "
    "deleted or written by another kindex version, or an index file edited by hand): rebuilt in memory, in each "
    "new process again, until an indexing step (reindex, root, sub, doc or watch) saves new ones"
)


def _warnings(stale: bool, problems: Sequence[str]) -> tuple[str, ...]:
    out = [p if len(p) <= MAX_WARNING_CHARS else p[: MAX_WARNING_CHARS - 1] + "…" for p in problems[:MAX_WARNINGS]]
    if len(problems) > MAX_WARNINGS:
        out.append(f"and {len(problems) - MAX_WARNINGS} more problems in the index files: `kindex validate` lists them")
    if stale:
        out.append(STALE_TABLES)
    return tuple(out)


@collector_paused()
def _load(kb: Path, last: SearchIndex | None = None) -> _Loaded:
    """The tables of ``kb``: the saved ones while they match the index files, else built in memory from the
    documents that changed since ``last`` (the tables this process loaded before) or since the saved ones."""
    # Stat-ed before anything is read: a step that finishes during the load changes them, and the next call reloads.
    stamps = (str(kb / INDEX_FILE), str(kb / STATE_DIR / SEARCH_FILE))
    stamps_seen = _stats(stamps, inode=True)
    saved = load(kb)
    index = None if saved is None else still_current(kb, saved)
    if index is None and wait_for_update(kb, UPDATE_WAIT_S):
        # A step of this process has just saved the tables these index files need: the same work, done once.
        stamps_seen = _stats(stamps, inode=True)
        saved = load(kb)
        index = None if saved is None else still_current(kb, saved)
    problems: tuple[str, ...] = ()
    stale = index is None
    if index is None:
        entries = read_entries(kb)
        # During a first reindex there are no saved tables, and each theme index it writes makes the last ones
        # stale: starting from them, a call analyses that theme's documents, not the KB's.
        index, problems = from_files(kb, entries, last or saved), entries.problems
    n = len(index.docs)
    inv: dict[str, npt.NDArray[np.float32]] = {}
    for f, name in enumerate(FIELDS):
        lengths = index.lengths[:, f] if n else np.zeros(0, np.float32)
        avg = float(lengths.mean()) if n and lengths.mean() > 0 else 1.0
        b = FIELD_B[name]
        inv[name] = (FIELD_WEIGHTS[name] / (1 - b + b * lengths / avg)).astype(np.float32)
    theme_at = {t.dir: i for i, t in enumerate(index.themes)}
    theme_terms = index.theme_terms
    theme_postings: dict[str, list[tuple[int, int]]] = {}
    for i, c in enumerate(theme_terms):
        for term, tf in c.items():
            theme_postings.setdefault(term, []).append((i, tf))
    theme_lengths = [sum(c.values()) for c in theme_terms]
    avg = (sum(theme_lengths) / len(theme_terms) if theme_terms else 0.0) or 1.0
    paths = [d.path for d in index.docs]
    theme_globs = {t.dir: t.item.paths for t in index.themes if t.item.paths}
    globs = {
        i: g
        for i, d in enumerate(index.docs)
        if (g := tuple(dict.fromkeys((*d.globs, *(theme_globs.get(d.theme, ()) if d.theme else ())))))
    }
    conditional = np.zeros(n, dtype=np.bool_)
    conditional[list(globs)] = True
    themes_watched = tuple(str(kb / t.dir / INDEX_FILE) for t in index.themes)
    # What the tables were built from (root first, then the themes in order), not a stat taken now: a theme index
    # replaced since it was read must look changed.
    themes_seen = tuple(None if size < 0 else (mtime, size) for _, mtime, size in index.signature[1:])
    return _Loaded(
        stamps=stamps,
        stamps_seen=stamps_seen,
        themes_watched=themes_watched,
        themes_seen=themes_seen,
        checked_at=_clock(),
        index=index,
        stale=stale,
        warnings=_warnings(stale, problems),
        n=n,
        inv=inv,
        rows={},
        absent=0,
        theme_rows={},
        tokens=max(float(index.lengths.sum()), 1.0),
        named_tokens=max(
            float(index.lengths[:, [FIELDS.index("title"), FIELDS.index("tags")]].sum()) if n else 0.0, 1.0
        ),
        theme_of=np.array([theme_at.get(d.theme, -1) if d.theme else -1 for d in index.docs], dtype=np.intp),
        conditional=conditional,
        unconditional=~conditional,
        globs=globs,
        path_rank=np.argsort(np.argsort(np.array(paths, dtype=object))).astype(np.int64),
        by_path={p: i for i, p in enumerate(paths)},
        theme_terms=theme_terms,
        theme_postings=theme_postings,
        theme_norm=[K1 * (0.25 + 0.75 * length / avg) for length in theme_lengths],
        skill_library=any(regular_file(kb / t.dir / "SKILL.md") for t in index.themes),
    )


def _current(loaded: _Loaded) -> bool:
    """Whether ``loaded`` still matches the files (see :attr:`_Loaded.themes_watched` for how often they are
    checked): two ``stat`` calls on most questions instead of one per theme."""
    if _stats(loaded.stamps, inode=True) != loaded.stamps_seen:
        return False
    now = _clock()
    if now - loaded.checked_at < THEME_RECHECK_S:
        return True
    if _stats(loaded.themes_watched) != loaded.themes_seen:
        return False
    loaded.checked_at = now
    return True


# -- scoring ------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Term:
    term: str
    weight: float
    """Its informative weight for the on-topic decision (see :func:`informative`)."""
    docs: npt.NDArray[np.intp]
    """The documents holding the term in any field, sorted."""
    subject: float
    """How far the term names a subject of the KB (:func:`subject`)."""
    value: bool = False
    """The KB does not hold it and it comes only from the question's values (:func:`value_terms`): no weight."""
    spelled: bool = False
    """The KB does not hold it, but other terms of the question that the KB holds spell all of it (收入支出: 收入,
    支出): not a word the KB never uses (:func:`_spelled`)."""

    @property
    def df(self) -> int:
        return len(self.docs)


@dataclass(slots=True)
class _Scored:
    terms: list[str]
    scores: npt.NDArray[np.float32]
    per_term: list[_Term]
    covered: npt.NDArray[np.float32]
    """Per document, the informative weight of the question's terms it covers."""
    total: float
    """The question's informative weight."""
    message: str = ""
    """The (bounded) question, for :meth:`shown`."""
    fixed: dict[str, str] = field(default_factory=dict)
    """Misspelt words read as the KB's (:func:`_misspelt`): the term read → the misspelt word's term."""
    _forms: dict[str, str] | None = None
    _runs: list[tuple[str, str]] = field(default_factory=list)
    _shown: tuple[dict[str, str], dict[str, tuple[str, ...]]] | None = None
    titled: npt.NDArray[np.int32] = field(default_factory=lambda: _NO_DOCS)
    """The documents whose title is the question (:func:`_titled`)."""

    def shown(self, terms: Sequence[str]) -> tuple[str, ...]:
        """``terms`` as the question wrote them (``CORS``, not its stem ``cor``; ``發票``, not ``发票``), each once,
        and a word shown whole without its parts ("BackgroundTasks", not also "Background"; "离线模式", not also
        "离线"): what "matched" says."""
        if not terms:
            return ()
        display, within = self._shown or self._display()
        shown = tuple(dict.fromkeys(map(display.get, terms, terms)))  # a call per result listed: kept lean
        if not within:
            return shown
        held = set(shown)
        return tuple(w for w in shown if not any(o in held for o in within.get(w, ())))

    def _display(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """The question's terms as written, and for each such word the longer ones of the question holding it;
        worked out once per question, not per result listed."""
        if self._shown is None:
            display = self._surface()
            if self._runs:  # a question with traditional characters: its terms as written
                display = dict(display)
                for t in self.terms:
                    if t not in display:
                        at = next(((r, i) for r in self._runs if (i := r[0].find(t)) >= 0), None)
                        display[t] = t if at is None else at[0][1][at[1] : at[1] + len(t)]
            words = list(dict.fromkeys(map(display.get, self.terms, self.terms)))
            within: dict[str, tuple[str, ...]] = {}
            if 1 < len(words) <= MAX_SHOWN_FOLDED:  # quadratic: a long paste lists parts beside their wholes
                folded = [(w.casefold(), w) for w in words]
                for f, w in folded:
                    holders = tuple(o for g, o in folded if len(g) > len(f) and f in g)
                    if holders:
                        within[w] = holders
            self._shown = (display, within)
        return self._shown

    def cover(self) -> npt.NDArray[np.float32]:
        """Per document, the share of the question's informative weight it covers (see :func:`informative`)."""
        return self.covered / self.total if self.total else self.covered

    @property
    def known(self) -> bool:
        """Every word of the question is one the KB uses (its values aside): the subject rule (``MIN_SUBJECT``)
        does not apply."""
        return all(t.df or t.value or t.spelled for t in self.per_term)

    def on_topic(self, docs: npt.NDArray[np.intp], min_relevance: float) -> bool:
        """Whether one of ``docs`` covers ``min_relevance`` of the question and, unless the KB uses every word of
        it (:attr:`known`), shares ``MIN_SUBJECT`` of a subject with it (0 turns the decision off: every document
        that matches at all is on topic)."""
        if not len(docs) or not min_relevance:
            return bool(len(docs))
        cover = self.covered[docs] / self.total if self.total else self.covered[docs]  # cover() of ``docs`` only
        best = int(np.argmax(cover))
        if cover[best] < min_relevance:
            return False
        if self.known or self._subject_of(int(docs[best])) >= MIN_SUBJECT:
            return True  # most questions: the best-covering document settles it
        return bool(np.any(self.subjects(docs[cover >= min_relevance]) >= MIN_SUBJECT))

    def _subject_of(self, doc: int) -> float:
        """:meth:`subjects` of one document, in scalars: a few term lookups, not a few array passes."""
        shared = 0.0
        for t in self.per_term:
            if t.subject and t.df:
                i = int(t.docs.searchsorted(doc))
                if i < t.df and t.docs[i] == doc:
                    shared += t.subject
        return shared

    def subjects(self, docs: npt.NDArray[np.intp]) -> npt.NDArray[np.float32]:
        """Per document of ``docs``, how much of a subject of the KB it shares with the question: the
        :func:`subject` of each of the question's terms it holds, wherever (how much of the question it covers, and
        how, is :meth:`cover`'s part). Worked out only for the documents that cover enough of the question (see
        :meth:`on_topic`), not summed on every call over every document a term is in."""
        out = np.zeros(len(docs), np.float32)
        for t in self.per_term:
            if t.subject and t.df and len(docs):
                pos = np.minimum(t.docs.searchsorted(docs), t.df - 1)
                out[t.docs[pos] == docs] += t.subject
        return out

    def written(self, terms: Sequence[str]) -> dict[str, str]:
        """Each of ``terms`` whose word the question wrote otherwise (``polici``: ``policy``), that word
        normalised as analysis normalises text: what a document's text can be searched for."""
        forms = self._surface()
        return {t: normalize(f) for t in terms if (f := forms.get(t)) is not None}

    def _surface(self) -> dict[str, str]:
        """The question's Latin words as written, by term; and its runs in traditional characters, for :meth:`shown`
        (worked out once, by whichever of :meth:`shown` and :meth:`written` comes first)."""
        if self._forms is None:
            self._forms = surface_forms(self.message)
            self._runs = traditional_runs(self.message)
            for read, written in self.fixed.items():  # "enabel" matched, as typed, not the stem read for it
                self._forms[read] = self._forms.get(written, written)
        return self._forms

    def heaviest(self, terms: Sequence[str], k: int) -> list[str]:
        """Of ``terms`` (the question's), the ``k`` that weigh most in the question; ties in question order."""
        held = set(terms)
        ranked = sorted((t for t in self.per_term if t.term in held), key=lambda t: -t.weight)
        return [t.term for t in ranked[:k]]

    def matched(self, idxs: Sequence[int]) -> list[tuple[str, ...]]:
        """Per document of ``idxs`` (-1: none), the question's terms it holds: one search per term, not per pair."""
        found: list[list[str]] = [[] for _ in idxs]
        at = np.asarray(idxs, dtype=np.intp)
        for t in sorted(self.per_term, key=lambda t: t.term):
            if not t.df:
                continue
            pos = np.minimum(t.docs.searchsorted(at), t.df - 1)
            for i in np.flatnonzero(t.docs[pos] == at).tolist():
                found[i].append(t.term)
        return [tuple(f) for f in found]


def specificity(term: str, kb_rate: float, named_rate: float = 0.0, background: float | None = None) -> float:
    """How far the KB uses a Chinese word more than general Chinese does, 0 to 1: ``kb_rate`` (its occurrences per
    token in the KB) against its rate in the segmenter's dictionary, on a log scale where ``SPECIFIC_RATIO`` times
    the background rate or more counts fully and the background rate or less not at all. Or, if more, the same of
    ``named_rate``, its occurrences per token of the KB's titles and tags: what names documents is what they are
    about (时区, a chapter of a database manual, is an everyday word in its pages), unless the titles use it no
    more than general Chinese does (期间, 注意, 第一 among a large KB's thousands of titles). Rates of 0 give 0.
    ``background``: the word's rate in the language, when it is not Chinese (an English word: :func:`english_rate`)."""
    ratio = max(kb_rate, named_rate) / (background_rate(term) if background is None else background)
    if ratio <= 0:
        return 0.0
    return min(max(math.log(ratio) / math.log(SPECIFIC_RATIO), 0.0), 1.0)


def informative(term: str, idf: float, df: int, kb_rate: float, named_rate: float = 0.0) -> float:
    """How much ``term`` says about what a question is about: its rarity in the KB, tempered three ways.

    Numbers are values, not subjects ("2024年的发票" is about invoices). A Chinese word the KB never uses cannot
    tell its documents apart and is more often phrasing than subject (去掉, 顺便, 上来: colloquial questions are full
    of them): it weighs ``UNSEEN_HAN_WEIGHT`` of its rarity; a single Chinese character is usually a verb or a
    particle the segmenter left alone (没, 先, 发), sometimes a subject (税): ``SINGLE_HAN_WEIGHT``. And a Chinese
    word counts as a subject of this KB only as far as the KB uses it more than general Chinese does (see
    :func:`specificity`: 名字, 天气, 新闻 in a gateway manual: not subjects; 限流, 上游, 路由: subjects), or its
    titles and tags do (``named_rate``: 时区 in a database manual is an everyday word and a chapter).
    A Latin-script word the KB never uses names something else (git, MySQL, Django) and weighs ``NAME_WEIGHT``
    times its rarity; one the KB uses weighs its rarity. A word of another script the KB never uses (Korean,
    Arabic, Cyrillic: ``CORS 설정 방법``) is phrasing in the asker's language, as an unseen Chinese word is.
    """
    weight = idf * _specific(term, df, kb_rate, named_rate)
    if not has_han(term):
        return weight if df else (NAME_WEIGHT if _latin(term) else UNSEEN_HAN_WEIGHT) * weight
    return SINGLE_HAN_WEIGHT * weight if len(term) == 1 and df else weight


def _latin(term: str) -> bool:
    """Whether ``term`` is written in Latin letters (and digits): accents are taken off in analysis, so nearly
    always ASCII; ``ß`` or ``ø`` stay."""
    return term.isascii() or all(c.isascii() or "\u00c0" <= c <= "\u024f" for c in term)


def subject(term: str, df: int, kb_rate: float, named_rate: float = 0.0) -> float:
    """How far ``term`` names a subject of the KB, 0 to 1, for the on-topic rule (``MIN_SUBJECT``): as in
    :func:`informative` without the rarity; a single Chinese character counts ``SINGLE_HAN_WEIGHT`` of that, or
    fully as far as the KB's titles and tags make it a subject (税, 锁). A Latin-script name the KB holds has no
    rate in general Chinese to beat: it is a subject as soon as its count shows it at all (the rates given are the
    shown ones, :func:`_shown`), and a name the KB mentions under five times is not shown to be one (iPhone in a
    billing FAQ, Python beside one CSV import)."""
    if df and not has_han(term) and not is_number(term):
        return 1.0 if kb_rate or named_rate else 0.0
    specific = _specific(term, df, kb_rate, named_rate)
    if len(term) == 1 and df and has_han(term):
        return max(SINGLE_HAN_WEIGHT * specific, specificity(term, 0.0, named_rate) if named_rate else 0.0)
    return specific


def _shown(count: float) -> float:
    """The least a word's ``count`` shows, ``RATE_SIGMAS`` standard errors below it (a Poisson count ``c`` has
    one of ``√c``): what the subject rule may take as its rate."""
    return max(count - RATE_SIGMAS * math.sqrt(count), 0.0)


def _specific(term: str, df: int, kb_rate: float, named_rate: float) -> float:
    if is_number(term):
        return 0.0
    if not has_han(term):
        return 1.0
    if df == 0:
        return UNSEEN_HAN_WEIGHT
    return specificity(term, kb_rate, named_rate)


def _bounded(message: str) -> str:
    """The start and the end of a message longer than ``MAX_MESSAGE_CHARS``: a question sits before or after what
    was pasted with it (a log, a stack trace), and analysis stays bounded."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    half = MAX_MESSAGE_CHARS // 2
    # Each half ends at white space where it has some: a word cut in two would give made-up terms ("src/App.tsx"
    # cut to "s" and "tsx").
    head, tail = message[:half], message[-half:]
    if head[-1].strip() and message[half].strip() and len(cut := head.rsplit(None, 1)) == 2:
        head = cut[0]
    if tail[0].strip() and message[-half - 1].strip() and len(cut := tail.split(None, 1)) == 2:
        tail = cut[1]
    return head + "\n" + tail


def _scored(loaded: _Loaded, message: str) -> _Scored:
    """The scores of every document for ``message`` (see :func:`_score`)."""
    bounded = _bounded(message)
    english = not has_han(bounded)
    analysed = analyze(bounded, loaded.index.vocab)
    fixed = _misspelt(loaded, bounded, analysed)
    if fixed:
        analysed = [fixed.get(term, term) for term in analysed]
    terms = list(dict.fromkeys(analysed))
    pasted = None if english else pasted_english(bounded)
    scored = _score(loaded, terms, value_terms(bounded), identifier_terms(bounded), english, analysed, pasted)
    scored.message = bounded
    scored.fixed = {read: written for written, read in fixed.items()}
    return scored


_LATIN_WORD = re.compile(r"[A-Za-z]+")
MAX_SPELLING_FIXES = 4
"""Words of one message read as misspellings."""
MAX_SPELLING_TRIES = 16
"""Words of one message looked up as misspellings, found or not: each costs a few hundred lookups, and a message
of thousands of words neither English nor the KB's (a paste, random text) took 5 s. A question with a slip in it
holds a few such words, not sixteen."""
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _misspelt(loaded: _Loaded, text: str, analysed: Sequence[str]) -> dict[str, str]:
    """The terms of Latin words the KB never uses and English does not know, that one slip of the keyboard away
    are a word the KB uses: term → that word's term. Such a word was weighed as another product's name, and one
    typo made a question off topic (``How do I enabel CORS?``, ``upload a flie``, ``Dokcer``).

    A slip is two letters swapped (any word of four letters or more), or for a word of six or more one letter left
    out, added or mistyped that gives a word English knows: names of other products a letter away from a common
    word are short (Nuxt and next, Kong and long, Vite and site), and a swap rarely makes a word. A word typed in
    capitals is a name (VLOOKUP is not lookup). Of several, the one most documents hold."""
    # The question's terms that could be slips, first: most questions have none, and stop here.
    unknown = {
        t
        for t in set(analysed)
        if t.isascii() and t.isalpha() and english_rate(t) is None and not len(_row(loaded, t).docs)
    }
    fixed: dict[str, str] = {}
    if not unknown:
        return fixed
    seen: set[str] = set()
    tries = 0
    for m in _LATIN_WORD.finditer(text):
        if len(fixed) == MAX_SPELLING_FIXES or tries == MAX_SPELLING_TRIES:
            break
        typed = m.group()
        if not 4 <= len(typed) <= 24 or typed.isupper():  # VLOOKUP, NGINX: a name as written, not a slip
            continue
        word = typed.lower()
        if word in seen:
            continue
        seen.add(word)
        term = stem(word)
        if term in fixed or term not in unknown:
            continue
        tries += 1
        swapped = {word[:i] + word[i + 1] + word[i] + word[i + 2 :] for i in range(len(word) - 1)} - {word}
        edited: set[str] = set()
        if len(word) >= 6:
            edited.update(word[:i] + word[i + 1 :] for i in range(len(word)))
            edited.update(word[:i] + c + word[i:] for i in range(len(word) + 1) for c in _LETTERS)
            edited.update(word[:i] + c + word[i + 1 :] for i in range(len(word)) for c in _LETTERS)
        # A letter added, dropped or changed must give a word English knows: its stem may otherwise be the start
        # of a longer word the KB uses (rebase, one letter from "rebale", would read as rebalance).
        found = {t for t in stems(sorted(swapped)) if t != term}
        found.update(t for t in stems(sorted(edited - swapped - {word})) if t != term and english_rate(t) is not None)
        candidates = sorted(found)
        holders = _holders(loaded, candidates)
        best = int(np.argmax(holders)) if candidates else -1
        if best >= 0 and holders[best] > 0:
            fixed[term] = candidates[best]
    return fixed


def _holders(loaded: _Loaded, terms: Sequence[str]) -> npt.NDArray[np.int64]:
    """How many postings each of ``terms`` has over all fields (0: the KB never uses it); one sorted lookup per
    field for all of them."""
    hashes = np.array([term_hash(t) for t in terms], dtype=np.uint64)
    total = np.zeros(len(terms), dtype=np.int64)
    for name in FIELDS:
        table = loaded.index.fields[name]
        if not len(table.hashes) or not len(hashes):
            continue
        at = np.minimum(np.searchsorted(table.hashes, hashes), len(table.hashes) - 1)
        found = table.hashes[at] == hashes
        total += np.where(found, table.offsets[at + 1] - table.offsets[at], 0)
    return total


def _saturate(body_weighted_tf: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Plain BM25 saturation of a body frequency (the ranking weight of the body field taken out again), so the
    on-topic decision does not move when the body's ranking weight is tuned."""
    tf = body_weighted_tf / max(FIELD_WEIGHTS["body"], 1e-6)
    return (tf / (K1 + tf)).astype(np.float32)


def _absent_idf(n: int) -> float:
    """The BM25 rarity of a term none of ``n`` documents holds."""
    return math.log(1 + (n + 0.5) / 0.5)


def _row(loaded: _Loaded, term: str, exact: bool = False, english: float | None = None) -> _Row:
    """The row of ``term`` (see :class:`_Row`), computed on its first use and kept: a KB's questions come back to
    the same few hundred words, and combining a term's postings field by field was most of a call's cost.

    ``exact``: the row of an identifier the question names (:func:`identifier_terms`). Its body frequency ranks
    without the body's length normalisation: ``0x87D1041C`` in one row of a long table of error codes is as much
    that page's subject as a short page's. And a mention of a code identifier (``next_cursor``, ``X-Nonce``)
    covers it fully and ranks as a word of the title would: the page that mentions it is about it, more than a
    page whose title has the question's other words (``X-Nonce 怎么生成``: the API page, not the one titled with
    生成). One holding digits (``HTTP2``, ``UTF-8``, ``k8s``, an error code) covers and ranks as a body word does:
    protocols, encodings and versions are mentioned in passing everywhere, and a page naming HTTP2 once is not
    about ``Chrome 里怎么看网站是不是 HTTP2``. Kept beside the term's plain row.

    ``english``: the rate in general English of a word of an English question (:func:`english_rate`). Such a word
    is weighed as a Chinese word is in a Chinese question: by how much more the KB uses it than the language does
    (``joke`` or ``thanks``, which a page happens to write, say nothing of what the KB is about); one the KB never
    uses is more likely phrasing than another product's name (``realtime``, ``boots``: :func:`_english_row`). In a
    Chinese question a Latin-script word is a name, whatever English makes of it (Excel, Word, Python). Kept beside
    the term's plain row.

    Two threads may both compute a new term's row; they compute the same one and either may be kept.
    """
    key = _EXACT + term if exact else _ENGLISH + term if english is not None else term
    row = loaded.rows.get(key)
    if row is not None:
        return row
    n = loaded.n
    fields = loaded.index.fields
    h = term_hash(term)
    hits = [(name, hit) for name in FIELDS if (hit := fields[name].postings(h)) is not None]
    if not hits:
        idf = _absent_idf(n)
        weight = informative(term, idf, 0, 0.0)
        row = _Row(_NO_HOLDERS, _NO_ADDS, _NO_VALUES, weight, 1.0, subject(term, 0, 0.0))
        # The words a KB does not hold are unbounded (a flood of made-up words): only so many are kept.
        if loaded.absent < MAX_ABSENT_ROWS and len(term) <= MAX_ABSENT_TERM:
            loaded.absent += 1
            loaded.rows[term] = row
        return row
    # Dense rows over all documents: a handful of vectorised passes, whatever the fields the term is in.
    body_w = np.zeros(n, dtype=np.float32)
    entry_w = np.zeros(n, dtype=np.float32)
    body_exact: npt.NDArray[np.float32] | None = None
    code = exact and not mixes_letters_and_digits(term)  # a code identifier, not a name with digits
    occurrences = named = 0.0
    for name, (d, tf) in hits:
        occurrences += float(tf.sum())
        if name == "body":
            body_w[d] = tf * loaded.inv[name][d]
            if exact:
                body_exact = np.zeros(n, dtype=np.float32)
                body_exact[d] = tf * FIELD_WEIGHTS["title" if code else name]
        else:
            entry_w[d] += tf * loaded.inv[name][d]
            if name in ("title", "tags"):
                named += float(tf.sum())
    total_w = (body_w if body_exact is None else body_exact) + entry_w
    docs = np.flatnonzero(total_w)
    wtf, ew = total_w[docs], entry_w[docs]
    idf = math.log(1 + (n - len(docs) + 0.5) / (len(docs) + 0.5))
    gain = idf * wtf / (K1 + wtf)
    entry_df = int(np.count_nonzero(ew))
    if ENTRY_BOOST and entry_df:
        # The entries on their own, with their own rarity: "API" is in nearly every document of a gateway
        # manual (no weight in BM25F) but in few titles, and the page titled "Admin API" should win.
        entry_idf = math.log(1 + (n - entry_df + 0.5) / (entry_df + 0.5))
        gain += ENTRY_BOOST * entry_idf * ew / (K1 + ew)
    cover = np.ones(len(docs), np.float32) if code else np.maximum(ew > 0, BODY_COVER * _saturate(body_w[docs]))
    kb_rate, named_rate = occurrences / loaded.tokens, named / loaded.named_tokens
    if english is not None:
        weight = idf * specificity(term, kb_rate, named_rate, english)
    else:
        weight = informative(term, idf, len(docs), kb_rate, named_rate)
    shown_rates = (_shown(occurrences) / loaded.tokens, _shown(named) / loaded.named_tokens)
    if code:
        subj = 1.0  # a code identifier names one thing: one mention shows it (see ``exact``)
    elif english is not None:
        subj = specificity(term, *shown_rates, english)
    else:
        subj = subject(term, len(docs), *shown_rates)
    rank = 1.0
    if has_han(term) and not named_rate:
        # A word in a title or tag ranks the documents it names fully, however everyday: telling documents apart is
        # not the on-topic question of whether the KB is about it at all (there the titles' rate of it counts).
        rank = GENERAL_WORD_RANK + (1 - GENERAL_WORD_RANK) * specificity(term, kb_rate)
    adds = (gain * np.float32(rank) + 1j * (weight * cover)).astype(np.complex64)
    if len(docs) > n * DENSE_ROW_SHARE:
        # A term in a good share of the documents is added as a dense row: one sequential pass over every document
        # costs what scattering a tenth of them does.
        dense = np.zeros(n, np.complex64)
        dense[docs] = adds
        adds = dense
    in_title, in_title_tf = next(((d, tf) for name, (d, tf) in hits if name == "title"), (_NO_DOCS, _NO_VALUES))
    sizes = loaded.index.lengths[in_title, _TITLE]
    titled = {
        int(k): (in_title[sizes == k], in_title_tf[sizes == k])
        for k in np.unique(sizes).tolist()
        if k <= MAX_TITLE_TERMS
    }
    row = _Row(docs, adds, cover, weight, rank, subj, titled)
    loaded.rows[key] = row
    return row


def _score(
    loaded: _Loaded,
    terms: list[str],
    values: frozenset[str] = frozenset(),
    identifiers: Mapping[str, tuple[str, ...]] = MappingProxyType({}),
    english: bool = False,
    asked: Sequence[str] = (),
    pasted: Pasted | None = None,
) -> _Scored:
    """BM25F scores of every document: the rows of the question's terms (:func:`_row`), summed. Of ``values``
    (the terms that come only from the question's values: :func:`value_terms`), those the KB does not hold weigh
    nothing, as numbers do: a ticket number or a user name the KB cannot know says nothing of what is asked, and
    ``退款多久到账 用户 zhangsan01`` is about refunds. Of ``identifiers`` (:func:`identifier_terms`: whole term → its
    parts' terms), a document mentioning one ranks by it whatever its length and, for a code identifier, covers it
    fully (the term's exact row: :func:`_row`): ``X-Nonce`` or ``next_cursor`` asked alone is about the page that
    mentions it, even once in a table. Where the KB holds an identifier whole, its parts rank ``PART_WEIGHT`` of
    their gain. ``english``: the question holds no Chinese, and its words English has are weighed against general
    English (:func:`_english_row`). ``pasted``: what a Chinese question quotes in English, an error message or a
    log line (:func:`~kindex.analysis.pasted_english`). Of its plain English words, those the KB never uses weigh
    nothing, as an unseen Chinese word does: a KB written in Chinese writes few English sentences, so that it lacks
    ``recent`` or ``present`` says nothing of what is asked, where a name it lacks (``MySQL``) does. None of them is a
    subject (``MIN_SUBJECT``), whether the KB uses it or not: ``back`` or ``port`` in an English sentence says how
    something is put, not what it is about, and with the sentence's other words weighing nothing, ``I love you to the
    moon and back`` or ``Tomcat started on port 8080`` got a page on the one word the KB happens to use. And of its code
    names, one the KB never writes but writes every part of is spelled by them (``GraphMemoryExceeded``: graph,
    memory, exceeded), as 收入支出 is by 收入 and 支出: its parts weigh, not it as another product's name."""
    n = loaded.n
    prose = pasted.prose if pasted is not None else frozenset()
    compounds = pasted.compounds if pasted is not None else {}
    weak = {p for whole, parts in identifiers.items() if len(_row(loaded, whole).docs) for p in parts}
    adds = np.zeros(n, dtype=np.complex64)  # scores + i·covered (see ``_Row.adds``)
    total = 0.0
    per_term: list[_Term] = []
    size = len(asked) or len(terms)  # the question's terms, repeats counted
    # Each term's pages whose title has ``size`` terms (:func:`_titled`): most questions stop at one term in none.
    titles: list[tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]], str]] | None = (
        [] if size <= MAX_TITLE_TERMS else None
    )
    for term in terms:
        row = _row(loaded, term)
        if len(row.docs) and term in identifiers:
            row = _row(loaded, term, exact=True)
        elif english and term.isalpha():
            row = _english_row(loaded, term, row)
        df = len(row.docs)
        # A single letter says nothing of what is asked: "s" of a word cut apart, the "C" of "C 语言" (its other
        # words do): it may rank, never make a question on topic, nor name a subject.
        letter = len(term) == 1 and not has_han(term)
        if df:
            # A single character is weak evidence (账 in 到账, 记账, 账号; the "S" of "导出 C S V"): it may tip a tie,
            # not decide a rank.
            qw = SINGLE_HAN_WEIGHT if len(term) == 1 else PART_WEIGHT if term in weak else 1.0
            # A letter adds its gain only: it covers nothing.
            gains = qw * row.adds.real if letter else row.adds if qw == 1.0 else qw * row.adds.real + 1j * row.adds.imag
            if len(row.adds) == n:  # a dense row (see ``_Row.adds``)
                adds += gains
            else:
                # Each document is once in a row, so ``add.at`` adds exactly what ``adds[docs] += ...`` would, in
                # half its time (one pass, not a gather and a scatter).
                np.add.at(adds, row.docs, gains)
        value = not df and term in values
        phrasing = not df and term in prose
        weight = 0.0 if value or letter or phrasing else row.weight
        total += weight
        per_term.append(_Term(term, weight, row.docs, 0.0 if letter or term in prose else row.subject, value))
        if titles is not None:
            got = row.titled.get(size)
            if got is None:
                titles = None  # no title of the question's size holds this term: none is the question
            else:
                titles.append((got, term))
    held = {t.term for t in per_term if t.df and len(t.term) > 1}
    for t in per_term:
        t.spelled = not t.df and len(t.term) > 2 and has_han(t.term) and _spelled(t.term, held)
        if not t.df and t.weight and t.term in compounds and all(p in held for p in compounds[t.term]):
            total -= t.weight
            t.weight, t.subject, t.spelled = 0.0, 0.0, True
    scored = _Scored(terms, np.ascontiguousarray(adds.real), per_term, np.ascontiguousarray(adds.imag), total)
    scored.titled = _titled(titles, asked or terms) if titles else _NO_DOCS
    return scored


MAX_SHOWN_FOLDED = 32
"""A question of more words lists matched parts beside their wholes (the check is quadratic)."""
MAX_TITLE_TERMS = 12
"""A question of more terms (repeats counted) is no document's title (:func:`_titled`): the check is not made."""
_TITLE = FIELDS.index("title")


def _titled(
    titles: Sequence[tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]], str]], asked: Sequence[str]
) -> npt.NDArray[np.int32]:
    """The documents whose title is the question, word for word (its terms, as often, no other: ``测试`` and the page
    titled 测试, ``配置限流`` and one titled 如何配置限流, ``Static Files - StaticFiles`` and the page titled so): a
    person typing a page's title asks for that page, however many longer or shorter pages use the word more
    (``测试`` ranked the page titled so fifth, below 异步测试 and 测试事件). ``titles``: per distinct question term,
    the documents whose title has as many terms as the question and holds that term, with how often; ``asked``: the
    question's terms, repeats kept."""
    # A title of as many terms as the question, holding each of its terms as often, is the question: the fewest
    # documents kept where they hold their term as often, then searched in the other terms' documents.
    ordered = sorted(titles, key=lambda g: len(g[0][0]))
    (docs, tfs), term = ordered[0]
    found: npt.NDArray[np.int32] = docs[tfs == asked.count(term)]
    for (docs, tfs), term in ordered[1:]:
        if not len(found):
            break
        at = np.minimum(np.searchsorted(docs, found), len(docs) - 1)
        found = found[(docs[at] == found) & (tfs[at] == asked.count(term))]
    return found


def _english_row(loaded: _Loaded, term: str, plain: _Row) -> _Row:
    """The row of a word of an English question: weighed against general English where English has the word (see
    ``english`` in :func:`_row`), else ``plain`` (a name). One the KB never uses weighs ``UNSEEN_ENGLISH_WEIGHT`` of
    its rarity. Kept beside the plain row, as the KB's words and so many others are."""
    row = loaded.rows.get(_ENGLISH + term)
    if row is not None:
        return row
    rate = english_rate(term)
    if rate is not None and len(plain.docs):
        return _row(loaded, term, english=rate)
    if rate is not None:  # its plain row already found no posting: no need to look again
        weight = UNSEEN_ENGLISH_WEIGHT * _absent_idf(loaded.n)
        row = _Row(_NO_HOLDERS, _NO_ADDS, _NO_VALUES, weight, 1.0, plain.subject)
    else:
        row = plain
    if len(row.docs) or (loaded.absent < MAX_ABSENT_ROWS and len(term) <= MAX_ABSENT_TERM):
        loaded.absent += not len(row.docs)
        loaded.rows[_ENGLISH + term] = row
    return row


def _spelled(word: str, held: set[str]) -> bool:
    """Whether words of ``held`` spell all of ``word``, each character inside one of them: a compound the KB does
    not hold whole but by its parts (the segmenter's search mode gives both). Only words of at most
    ``MAX_VOCAB_TERM`` characters are compounds (longer runs are phrases the segmenter could not cut): at most 28
    substrings tried per word, whatever the message."""
    if len(word) > MAX_VOCAB_TERM:
        return False
    covered = [False] * len(word)
    for i in range(len(word)):
        for j in range(i + 2, len(word) + 1):
            if word[i:j] in held:
                covered[i:j] = [True] * (j - i)
    return all(covered)


_Floats = npt.NDArray[np.float32]


def _theme_scores(loaded: _Loaded, scored: _Scored) -> tuple[_Floats, _Floats, _Floats]:
    """BM25 scores of the theme entries, the share of the question's informative weight each covers, and how much
    of a subject of the KB each shares with the question (a theme entry holding a term counts as a document's)."""
    k = len(loaded.theme_terms)
    scores = np.zeros(k + 1, dtype=np.float32)  # the extra slot serves root documents (theme -1)
    cover = np.zeros(k + 1, dtype=np.float32)
    subjects = np.zeros(k + 1, dtype=np.float32)
    if not k:
        return scores, cover, subjects
    for t in scored.per_term:
        row = loaded.theme_rows.get(t.term)
        if row is None:
            postings = loaded.theme_postings.get(t.term)
            if postings is None:
                continue
            idf = math.log(1 + (k - len(postings) + 0.5) / (len(postings) + 0.5))
            rank = _row(loaded, t.term).rank  # a general Chinese word says as little of a theme as of a document
            row = loaded.theme_rows[t.term] = (
                np.array([i for i, _ in postings], dtype=np.intp),
                np.array([rank * idf * tf * (K1 + 1) / (tf + loaded.theme_norm[i]) for i, tf in postings], np.float32),
            )
        themes, gain = row
        scores[themes] += gain  # a theme entry is once in a term's postings
        cover[themes] += t.weight
        subjects[themes] += t.subject
    if scored.total:
        cover /= scored.total
    return scores, cover, subjects


@dataclass(slots=True)
class _Hit:
    idx: int  # row in the search index; -1 for an overview outside it
    path: str
    level: str
    entry: Mapping[str, Any]
    """The entry's JSON form: only a served hit's title and summary are read from it."""
    score: float
    reason: str
    read: tuple[str, bool] | None = None
    """The text already read (:func:`_readable`): a fallback document is read once, to tell that it says
    something and to serve it."""
    cap: int | None = None
    """At most this many tokens of it are served (``OVERVIEW_PAGE_TOKENS``), whatever the budget left."""

    @property
    def title(self) -> str:
        return str(self.entry.get("title", ""))

    @property
    def summary(self) -> str:
        return str(self.entry.get("summary", ""))

    def item(self, matched: tuple[str, ...], *, truncated: bool = False, tokens: int = 0) -> ContextItem:
        """The hit as the result record: served (``tokens``) or only ranked."""
        return context_item(
            path=self.path,
            level=self.level,
            score=self.score,
            title=self.title,
            abstract=self.summary,
            reason=self.reason,
            matched=matched,
            truncated=truncated,
            tokens=tokens,
        )


def _rank(
    loaded: _Loaded, scored: _Scored, scope: list[str], min_relevance: float, limit: int, written: list[str]
) -> list[_Hit]:
    """The documents the message names by path first, then rules for the files in scope, then the documents the
    question is about (none when off topic)."""
    hits: list[_Hit] = []
    named = _named(loaded, written)
    for idx in named:
        doc = loaded.index.docs[idx]
        hits.append(_Hit(idx, doc.path, "document", doc.entry, float(scored.scores[idx]), NAMED))
    if scope:
        in_scope = Scope(scope, loaded.matchers)
        matched = [(idx, glob) for idx, globs in loaded.globs.items() if (glob := in_scope.first(globs))]
        # The rules a path brings in, best for the question first (a theme's paths bring in all its documents).
        matched.sort(key=lambda m: (-float(scored.scores[m[0]]), int(loaded.path_rank[m[0]])))
        for idx, glob in matched:
            doc = loaded.index.docs[idx]
            hits.append(_Hit(idx, doc.path, "document", doc.entry, 0.0, f"scope glob {glob}"))
    candidates = np.nonzero((scored.scores > 0) & loaded.unconditional)[0]
    asked: str | None = None  # the question as titles are compared (title_key), made when first needed
    own = _NO_DOCS
    if scored.terms and _own_titles(loaded):
        asked = title_key(scored.message)
        own = np.array(_own_titles(loaded).get(asked, ()), np.int32)
    if len(own):
        # A page's own title may be in no field searched (a Docusaurus page's frontmatter, under a model's title):
        # the page is a candidate all the same.
        candidates = np.union1d(candidates, own)
    if not scored.terms:
        # Nothing to score, but a page may be titled so: candidates of their own.
        candidates = _titled_in_words(loaded, scored.message)
    if named:
        candidates = np.setdiff1d(candidates, named, assume_unique=True)
    titled = _among(scored.titled, candidates) if scored.terms else candidates.astype(np.int32)
    if len(own):
        titled = np.union1d(titled, _among(own, candidates)).astype(np.int32)
    # A page's title asked word for word is on topic whatever its words' weight: `CASE`, `Trigger` or `Go` to a
    # database's manual name a page, though the manual uses them too often for them to cover a question.
    if len(titled) or scored.on_topic(candidates, min_relevance):
        t_scores, _, _ = _theme_scores(loaded, scored)
        # The prior added to every document, then the candidates' picked: one gather of them, not three.
        final = (scored.scores + np.float32(THEME_PRIOR) * t_scores[loaded.theme_of])[candidates]
        if len(titled):
            # The page titled with the question ranks above every other (see :func:`_titled`), its score raised
            # past theirs so that the listing stays in the order of its scores; one titled with it character for
            # character (`Trigger`, not `Triggers`, whose stem is the same) above those.
            at = np.searchsorted(candidates, titled)
            top = final.max()
            final[at] += top
            if asked is None:
                asked = title_key(scored.message)
            exact = [
                i
                for i, d in zip(at.tolist(), titled.tolist(), strict=True)
                if asked and asked in (title_key(_title(loaded, d)), loaded.index.docs[d].own_title)
            ]
            final[exact] += top
        if len(final) > limit:  # keep the top ``limit`` and everything tied with the last of them, then sort
            keep = np.nonzero(final >= np.partition(final, len(final) - limit)[len(final) - limit])[0]
            candidates, final = candidates[keep], final[keep]
        order = np.lexsort((loaded.path_rank[candidates], -final))[:limit]
        for i in order.tolist():
            idx = int(candidates[i])
            doc = loaded.index.docs[idx]
            hits.append(_Hit(idx, doc.path, "document", doc.entry, float(final[i]), MATCHED))
    return hits


def off_topic(items: Sequence[ContextItem]) -> bool:
    """Whether a ranking answers nothing of the question: no document matched it or is named in it (the rules a
    path brings in may be listed all the same, as :meth:`Retriever.context` serves them with the overview)."""
    return not any(it.reason in (MATCHED, NAMED) for it in items)


def _among(docs: npt.NDArray[np.int32], candidates: npt.NDArray[np.intp]) -> npt.NDArray[np.int32]:
    """Those of ``docs`` (few) that are among ``candidates`` (sorted): a search per document."""
    if not len(docs) or not len(candidates):
        return _NO_DOCS
    at = np.minimum(np.searchsorted(candidates, docs), len(candidates) - 1)
    found: npt.NDArray[np.int32] = docs[candidates[at] == docs]
    return found


MAX_TITLE_CHARS = 200
"""A longer question is no page's title (:func:`_titled_in_words`): not compared."""


def _titled_in_words(loaded: _Loaded, message: str) -> npt.NDArray[np.intp]:
    """The documents titled ``message`` character for character (:func:`~kindex.analysis.title_key`), for a
    question of stop words only (``About``, ``关于我们``, ``WHERE``): analysis keeps none of its words, yet a person
    typing a page's title asks for that page."""
    asked = title_key(message) if len(message) <= MAX_TITLE_CHARS else ""
    if not asked:
        return np.zeros(0, np.intp)
    if loaded.by_title is None:
        by_title: dict[str, list[int]] = {}
        for idx in np.flatnonzero(loaded.unconditional).tolist():
            by_title.setdefault(title_key(_title(loaded, idx)), []).append(idx)
            if own := loaded.index.docs[idx].own_title:
                by_title.setdefault(own, []).append(idx)
        loaded.by_title = by_title
    return np.array(loaded.by_title.get(asked, ()), np.intp)


def _own_titles(loaded: _Loaded) -> dict[str, list[int]]:
    """Unconditional documents by their own title where their entry gives another (:attr:`DocRecord.own_title`): a
    model titles the page 测试 ``测试 TestClient`` and APISIX's ``Admin API`` ``APISIX Admin API``, and a person typing
    the title the page shows asks for that page as much as one typing its entry's (:func:`_titled`). Compared
    character for character (:func:`~kindex.analysis.title_key`): the entry's title is the one analysed for search.
    Empty for offline entries, which take the page's own title; made on first use."""
    if loaded.by_own_title is None:
        by_own: dict[str, list[int]] = {}
        for idx, doc in enumerate(loaded.index.docs):
            if doc.own_title and loaded.unconditional[idx]:
                by_own.setdefault(doc.own_title, []).append(idx)
        loaded.by_own_title = by_own
    return loaded.by_own_title


def _title(loaded: _Loaded, doc: int) -> str:
    return str(loaded.index.docs[doc].entry.get("title", ""))


def check_context_options(budget_tokens: int, max_docs: int, min_relevance: float) -> None:
    """:class:`UsageError` for a context option out of its bounds (see :meth:`Retriever.context`)."""
    if not _whole(budget_tokens) or not MIN_BUDGET_TOKENS <= budget_tokens <= MAX_BUDGET_TOKENS:
        raise UsageError(f"budget_tokens must be {MIN_BUDGET_TOKENS} to {MAX_BUDGET_TOKENS:,}, got {budget_tokens!r}")
    if not _whole(max_docs) or not 1 <= max_docs <= MAX_DOCS_LIMIT:
        raise UsageError(f"max_docs must be 1 to {MAX_DOCS_LIMIT}, got {max_docs!r}")
    check_relevance(min_relevance)


def check_relevance(min_relevance: float) -> None:
    """:class:`UsageError` unless ``min_relevance`` is a number from 0 to 1 (NaN is not)."""
    if not _number(min_relevance) or not 0.0 <= min_relevance <= 1.0:
        raise UsageError(f"min_relevance must be between 0 and 1, got {min_relevance!r}")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _texts(name: str, value: object) -> tuple[str, ...]:
    """``value`` as names: one given bare is one name, not a list of characters; anything else is refused."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UsageError(f"{name} must be a list of strings, got {value!r}"[:300])


def _message(message: object) -> str:
    if not isinstance(message, str):
        raise UsageError(f"the message must be a string, got {type(message).__name__}")
    return message


def _fallback_names(value: object) -> tuple[str, ...]:
    """The call's fallback documents, refused as ``kindex.toml``, ``KINDEX_FALLBACK_DOCS`` and the CLI refuse them
    (an empty name, an absolute path, ``..``, more than 50): the HTTP service and MCP answered a warning where the
    CLI refused, and one rule serves every surface."""
    try:
        return document_paths(_texts("fallback_docs", value))
    except InvalidDataError as e:
        raise UsageError(f"fallback_docs: {e}") from None


def _paths_left(paths: Sequence[str]) -> tuple[str, ...]:
    """A warning when a call gives more attachment paths than are used: the answer stands, from the first ones."""
    if len(paths) <= MAX_PATHS:
        return ()
    return (f"{len(paths):,} attachment paths given: the first {MAX_PATHS} are used",)


def _question(loaded: _Loaded, message: str, paths: Sequence[str]) -> tuple[_Scored, list[str], list[str]]:
    """The question's scores, the paths in scope (attachments, then those the message writes), and those the
    message writes. A path that names a document of the KB (:func:`_named`) is a reference to it, which comes first
    on its own: its words are left out of the question. `billing/退款政策.md 发票怎么开` is about invoices; with
    the path's words (billing, 退款政策) in its weight, the invoice page covered too little of it and the named page
    was all it got."""
    bounded = _bounded(message)
    spans = path_spans(bounded)
    written = list(dict.fromkeys(path for _, _, path in spans))[:MAX_PATHS]
    naming = {path for path in written if _named(loaded, [path])}
    if naming:
        kept, start = [], 0
        for begin, end, path in spans:
            if path in naming:
                kept.append(bounded[start:begin])
                start = end
        bounded = " ".join([*kept, bounded[start:]])
    scope = [normalize_path(p) for p in paths[:MAX_PATHS] if p.strip()] + written
    return _scored(loaded, bounded), scope, written


def _named(loaded: _Loaded, written: list[str]) -> list[int]:
    """The unconditional documents that paths written in the message name: a document's path (``tutorial/cors.md``),
    or a longer path ending in it at a folder (``docs/zh/tutorial/cors.md``, from the repository's root); the exact
    letter case first, else another one if only one document has the path so. Only a path with a folder names a
    document: a bare file name (``index.md``, ``README.md``) is as often the user's own file, or the tail of a name
    with a space the message cut (``Release Checklist.md``). An attachment path is the user's own file too; a
    conditional document enters through its globs only (SPEC §6.4)."""
    if not written:
        return []
    if loaded.folded is None:
        folded: dict[str, int] = {}
        for i, doc in enumerate(loaded.index.docs):
            if loaded.unconditional[i] and "/" in doc.path:
                # Case and Unicode form aside: a name written NFD on disk (macOS) is typed NFC, and reads the same.
                key = unicodedata.normalize("NFC", doc.path.casefold())
                folded[key] = -1 if key in folded else i  # two paths apart only in case: neither by case-folding
        loaded.folded = folded
    out: list[int] = []
    for path in written:
        if len(path) > MAX_PATH_CHARS or "/" not in path:
            continue  # no document's path is longer; a bare name names none
        parts = path.split("/")[-MAX_PATH_SEGMENTS:]
        # The whole path, then shorter endings down to a folder and a file: at most MAX_PATH_SEGMENTS lookups of at
        # most MAX_PATH_CHARS each, in the exact case, then folded.
        idx = -1
        for i in range(len(parts) - 1):
            key = "/".join(parts[i:])
            exact = loaded.by_path.get(key, -1)
            if exact >= 0 and loaded.unconditional[exact]:
                idx = exact
            else:
                idx = loaded.folded.get(unicodedata.normalize("NFC", key.casefold()), -1)
            if idx >= 0:
                break
        if idx >= 0 and idx not in out:
            out.append(idx)
    return out


# Results are built unvalidated (``model_construct``, :func:`context_item`): every field comes from kindex's own
# tables, already checked when they were loaded, and validating them again would be most of a warm call's overhead.


class Retriever:
    """One KB's search tables, loaded on first use and reloaded when an index file or the saved tables change.

    Thread-safe: a call stats the root index and the saved tables (and, at most every ``THEME_RECHECK_S``, the theme
    index files) and reloads under a lock when one changed. A
    :class:`kindex.KnowledgeBase` owns one; it holds a single KB's tables, so a process bounds its memory by
    bounding how many it keeps.
    """

    def __init__(self, kb: str | os.PathLike[str]) -> None:
        self.root = kb_folder(kb, "index.json")
        refuse_theme_folder(self.root, reading=True)
        self._loaded: _Loaded | None = None
        self._lock = threading.Lock()

    def loaded(self) -> _Loaded:
        """The current tables (reloaded first if the files on disk changed)."""
        current = self._loaded
        if current is not None and _current(current):
            return current
        with self._lock:
            current = self._loaded
            if current is None or not _current(current):
                # A turn among the process's loads, waited for ``LOAD_WAIT_S`` at most: loads that take longer (a
                # KB rebuilt from its documents, its tables deleted) hold back no other KB's first call for long.
                turn = _LOADING.acquire(timeout=LOAD_WAIT_S)
                try:
                    current = self._loaded = _load(self.root, None if current is None else current.index)
                finally:
                    if turn:
                        _LOADING.release()
            return current

    @property
    def skill_library(self) -> bool:
        """Whether the KB is an Agent Skills library (as of the tables last loaded; loads them if none are)."""
        current = self._loaded
        return (current or self.loaded()).skill_library

    def search(
        self,
        message: str,
        *,
        paths: Sequence[str] = (),
        limit: int | None = 10,
        themes: bool = False,
        explain: bool = True,
        min_relevance: float = DEFAULT_MIN_RELEVANCE,
    ) -> list[ContextItem]:
        """The ranked entries for ``message`` (best first, at most ``limit``; ``None``: all) without reading files.

        Documents only, unless ``themes``: then theme entries that match the question rank among them (``level``
        says which). ``explain=False`` leaves ``matched`` empty, which is cheaper for long rankings. Empty when the
        question is off topic (where :meth:`context` would fall back): no document covers ``min_relevance`` of
        its informative weight.
        """
        check_relevance(min_relevance)
        if limit is not None and (not _whole(limit) or limit < 1):
            raise UsageError(f"limit must be at least 1 (or None for all), got {limit!r}")
        message, paths = _message(message), _texts("paths", paths)
        loaded = self.loaded()
        scored, scope, written = _question(loaded, message, paths)
        hits = _rank(loaded, scored, scope, min_relevance, loaded.n if limit is None else limit, written)
        held = scored.matched([h.idx for h in hits]) if explain else [() for _ in hits]
        items = [h.item(scored.shown(m)) for h, m in zip(hits, held, strict=True)]
        if themes and loaded.index.themes:
            t_scores, t_cover, t_subjects = _theme_scores(loaded, scored)
            on_topic = any(h.reason == MATCHED for h in hits)
            relevant = (t_cover >= min_relevance) & (scored.known | (t_subjects >= MIN_SUBJECT))
            for i in np.nonzero(t_scores[:-1] > 0)[0].tolist():
                if on_topic or not min_relevance or relevant[i]:
                    t = loaded.index.themes[i]
                    held_terms = sorted(x for x in scored.terms if x in loaded.theme_terms[i]) if explain else []
                    matched = scored.shown(held_terms)
                    items.append(
                        context_item(
                            path=t.dir,
                            level="theme",
                            score=float(t_scores[i]),
                            title=t.item.title,
                            abstract=t.item.summary,
                            reason=MATCHED,
                            matched=matched,
                        )
                    )
            items.sort(key=lambda it: (it.reason == MATCHED, -it.score, it.path))
        return items if limit is None else items[:limit]

    def context(
        self,
        message: str,
        *,
        paths: Sequence[str] = (),
        budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        max_docs: int = DEFAULT_MAX_DOCS,
        fallback_docs: Sequence[str] = DEFAULT_FALLBACK_DOCS,
        min_relevance: float = DEFAULT_MIN_RELEVANCE,
    ) -> Context:
        """Choose the documents ``message`` is about and return their original text within ``budget_tokens``.

        ``paths`` are attachment paths (the files the user is working on); paths written in the message count
        too. Entries with ``paths`` globs enter only when one of those paths matches. When no document covers
        ``min_relevance`` of the question's informative weight, the overview is returned instead and the result
        says so: the first of ``fallback_docs`` that exist, else the KB's root ``README.md``/``index.md``, else an
        overview written from the root index's entries. A document longer than the room left hands over its head
        and the sections that match the question.
        """
        check_context_options(budget_tokens, max_docs, min_relevance)
        message, paths = _message(message), _texts("paths", paths)
        fallback_docs = _fallback_names(fallback_docs)
        root = self.root
        loaded = self.loaded()
        scored, scope, written = _question(loaded, message, paths)
        hits = _rank(loaded, scored, scope, min_relevance, max(4 * max_docs, 16), written)
        fallback = not any(h.reason in (MATCHED, NAMED) for h in hits)
        kinds = {h.reason for h in hits} & {MATCHED, NAMED}
        reason = _REASONS.get(frozenset(kinds), "")
        if fallback:
            reason = "no document matched the question: overview documents"
            hits.extend(_fallback_hits(root, loaded, fallback_docs, hits))
        ctx = _assemble(root, loaded, hits, max_docs, fallback, reason, budget_tokens, scored)
        if not ctx.items and not fallback:  # every matching document vanished or was emptied since the last reindex
            reason = "the matching documents cannot be read (run `kindex reindex`): overview documents"
            named = _fallback_hits(root, loaded, fallback_docs, [])
            retry = _assemble(root, loaded, named, max_docs, True, reason, budget_tokens, scored)
            ctx = retry.model_copy(update={"missing": ctx.missing + retry.missing})
        if not ctx.items:  # nothing could be read, not even the overview documents: the root index speaks
            retry = _assemble(root, loaded, [_overview_hit()], max_docs, True, ctx.reason, budget_tokens, scored)
            ctx = retry.model_copy(update={"missing": ctx.missing})
        elif ctx.fallback and all(item.reason != "fallback" for item in ctx.items):
            # The documents the paths bring in took the whole budget: no overview document to announce.
            reason = "no document matched the question; the documents its paths bring in left no room for the overview"
            ctx = ctx.model_copy(update={"reason": reason})
        warnings = loaded.warnings + _unservable(root, loaded, fallback_docs) + _paths_left(paths)
        if ctx.fallback:
            warnings += _said_nothing(root, loaded, fallback_docs, {it.path for it in ctx.items})
        if loaded.matchers.exhausted:
            warnings += (
                f"the entries' paths globs hold more than {MAX_COMPILED_EXPANSIONS:,} brace expansions that fit the "
                "paths asked about: the ones past that were not matched (use fewer or simpler globs)",
            )
        if warnings:
            ctx = ctx.model_copy(update={"warnings": warnings})
        return ctx

    def warnings(self) -> tuple[str, ...]:
        """What is wrong with the index the current tables came from (see :attr:`Context.warnings`)."""
        return self.loaded().warnings

    def ranking(
        self,
        message: str,
        *,
        paths: Sequence[str] = (),
        limit: int = 10,
        min_relevance: float = DEFAULT_MIN_RELEVANCE,
        problem: str | None = None,
    ) -> Ranking:
        """:meth:`search` with what a caller that does not hold the library is told: whether the question is off
        topic (:func:`off_topic`) and the warnings (the index's, ``problem``: settings left out of the answer, and a
        listed document gone from the folder)."""
        results = self.search(message, paths=paths, limit=limit, min_relevance=min_relevance)
        said = (*self.warnings(), *(() if problem is None else (problem,)), *_paths_left(_texts("paths", paths)))
        warnings = (*said, *self.unservable(results))
        return Ranking(results=tuple(results), off_topic=off_topic(results), warnings=warnings)

    def unservable(self, items: Sequence[ContextItem]) -> tuple[str, ...]:
        """A warning for each listed document that cannot be read any more (deleted or renamed since the step that
        indexed it): :meth:`search` ranks the index and reads no file, and a one-shot listing should not send its
        reader to a file that is gone. A stat per document."""
        return tuple(
            f"{it.path} is in the index but cannot be read from the folder (deleted, renamed, or grown past "
            f"{MAX_DOC_BYTES // 2**20} MiB?): `kindex validate` names what to run"
            for it in items
            if it.level == "document" and not servable(self.root, it.path)
        )[:MAX_WARNINGS]


def _unservable(root: Path, loaded: _Loaded, names: Sequence[str]) -> tuple[str, ...]:
    """A warning for each fallback document the caller chose that cannot serve, on every call: a misspelt name must
    show before the first off-topic message needs it. The defaults are names a KB may well not have."""
    if tuple(names) == DEFAULT_FALLBACK_DOCS:
        return ()
    # Every name is looked at (a stat each, at most MAX_FALLBACK_CHECKED), the first MAX_WARNINGS missing said.
    names = list(dict.fromkeys(names))[:MAX_FALLBACK_CHECKED]
    missing = [name for name in names if (p := normalize_path(name)) not in loaded.by_path or not servable(root, p)][
        :MAX_WARNINGS
    ]
    return tuple(
        f"fallback document {_quoted(name)} is not a document of the index (missing, not a .md file, excluded or "
        "skipped by the scan, or added since the last step): the next overview in line serves (fallback_docs: the "
        "call's, KINDEX_FALLBACK_DOCS or kindex.toml)"
        for name in missing
    )


def _said_nothing(root: Path, loaded: _Loaded, names: Sequence[str], served: set[str]) -> tuple[str, ...]:
    """A warning for each fallback document the caller chose that a fallback passed over because it says nothing
    (emptied since the last step, or only a comment): the overview that served instead was not the one chosen.
    Read again only on a fallback, and only those not served."""
    if tuple(names) == DEFAULT_FALLBACK_DOCS:
        return ()
    passed = (p for name in dict.fromkeys(names) if (p := normalize_path(name)) in loaded.by_path and p not in served)
    empty = [p for p in itertools.islice(passed, MAX_FALLBACK_CHECKED) if servable(root, p) and not _readable(root, p)]
    return tuple(
        f"fallback document {_quoted(p)} says nothing (empty, or only a comment): the next overview in line serves"
        for p in empty[:MAX_WARNINGS]
    )


def _quoted(name: str) -> str:
    return repr(name if len(name) <= 100 else name[:99] + "…")


def _overview_hit() -> _Hit:
    return _Hit(
        -1,
        INDEX_FILE,
        "overview",
        {"path": INDEX_FILE, "title": "Overview", "summary": "what this knowledge base holds"},
        0.0,
        "fallback",
    )


def _fallback_hits(root: Path, loaded: _Loaded, names: Sequence[str], taken: list[_Hit]) -> list[_Hit]:
    """The named overview documents that can be served; else the root README/index page, then the root index's
    overview; else that overview alone. Only documents of the index serve: what the scan left out (``exclude``,
    hidden, too large) is never handed over. A README is most often a project's home page (badges, a pitch,
    sponsors) that names none of the KB's topics: the overview after it tells the agent what the KB holds."""
    seen = {h.path for h in taken}
    out: list[_Hit] = []
    for name in names:
        name = normalize_path(name)
        idx = loaded.by_path.get(name, -1)
        if idx < 0 or name in seen or (read := _readable(root, name)) is None:
            continue
        out.append(_Hit(idx, name, "document", loaded.index.docs[idx].entry, 0.0, "fallback", read))
        seen.add(name)
    if out:
        return out
    try:
        readme = sorted(p.name for p in root.iterdir() if p.name.casefold() in _README_NAMES)
    except OSError:
        readme = []
    for name in readme:
        idx = loaded.by_path.get(name, -1)
        if idx >= 0 and name not in seen and (read := _readable(root, name)) is not None:
            entry = loaded.index.docs[idx].entry
            return [_Hit(idx, name, "document", entry, 0.0, "fallback", read, OVERVIEW_PAGE_TOKENS), _overview_hit()]
    return [_overview_hit()]


def _readable(root: Path, name: str) -> tuple[str, bool] | None:
    """``name``'s text as served (see :func:`document_start`) when it can be served and says something: an overview
    document that is empty, or only a licence comment, would hand the agent a header and nothing else."""
    got = document_start(root, name, MAX_FIT_CHARS)
    return got if got is not None and visible(got[0]) else None


def _overview_text(loaded: _Loaded) -> str:
    """A readable overview written from the root index's entries: every theme and root document, one line each."""
    lines = ["This knowledge base holds:", ""]
    for t in loaded.index.themes:
        lines.append(f"- {t.item.title or t.dir} ({t.dir}/): {t.item.summary}".rstrip(": "))
    for d in loaded.index.docs:
        if d.theme is None:
            lines.append(f"- {d.entry['title'] or d.path} ({d.path}): {d.entry['summary']}".rstrip(": "))
    if len(lines) == 2:  # a KB whose folder holds no document yet: say so, not a heading over nothing
        return "This knowledge base holds no documents yet."
    return "\n".join(lines)


def _assemble(
    root: Path,
    loaded: _Loaded,
    hits: list[_Hit],
    max_docs: int,
    fallback: bool,
    reason: str,
    budget: int,
    scored: _Scored,
) -> Context:
    parts: list[str] = []
    items: list[ContextItem] = []
    missing: list[str] = []
    left = budget * 100  # hundredths of a token (``units``: exact and additive, so the whole never exceeds it)
    for hit in hits:
        if len(items) >= max_docs:
            break
        if hit.level == "overview":
            got: tuple[str, bool] | None = (_overview_text(loaded), False)
        else:
            got = hit.read or document_start(root, hit.path, MAX_FIT_CHARS)
        if got is None:
            missing.append(hit.path)
            continue
        text, more = got  # ``more``: a page past MAX_FIT_CHARS, of which only the start was read
        if not visible(text):
            continue  # emptied since it was indexed, or only a comment: nothing to hand over
        room = left - (units(_SEPARATOR) if parts else 0)
        spare = 0  # what a capped hit leaves of the room for the ones after it
        if hit.cap is not None and room > hit.cap * 100:
            spare, room = room - hit.cap * 100, hit.cap * 100
        headers: tuple[str, ...] = (f"## {one_line(hit.title or hit.path)}\n(source: {one_line(hit.path)})\n\n",)
        if not parts:  # a small budget (or a long path): the first document's text before its header's words
            headers += (f"(source: {one_line(hit.path)})\n\n", "")
        header = next((h for h in headers if room - units(h) >= MIN_SERVED_TOKENS * 100), headers[-1])
        room -= units(header)
        truncated = more or units(text) > room
        matched = scored.matched([hit.idx])[0]
        if truncated:
            mark = _TRUNCATION_MARK.format(path=one_line(hit.path))
            if room - units(mark) < MIN_SERVED_TOKENS * 100:
                mark = _SHORT_MARK
            # A fallback's overview is handed over from its start: a word of the question it happens to hold is
            # not what it is served for.
            terms = [] if fallback else scored.heaviest(matched, MAX_FIT_TERMS)
            fitted = fit_to_budget(text, (room - units(mark)) // 100, terms, scored.written(terms))
            if fitted is None:
                break  # not even a character fits: the budget is spent
            text = fitted + mark
        chunk = header + text
        left = room + units(header) - units(chunk) + spare
        if truncated and not spare:
            left = 0  # the cut document is the last one (one cut at its cap leaves the rest of the budget)
        parts.append(chunk)
        items.append(hit.item(scored.shown(matched), truncated=truncated, tokens=estimate_tokens(chunk)))
    return Context.model_construct(
        text=_SEPARATOR.join(parts),
        items=tuple(items),
        fallback=fallback,
        reason=reason,
        missing=tuple(missing),
        budget_tokens=budget,
    )
