"""Generators: what turns a scanned document (or the KB's top level) into an index entry.

Both generators answer through the same seam and their answers go through the same sanitising, so the offline
generator is a drop-in stand-in for a model, and a model's failure can fall back to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from kindex import extractive, templating
from kindex.errors import AnswerError, CancelledRun, GenerationFailed, KindexError, ModelCallError
from kindex.jsonextract import extract_object, salvage_truncated
from kindex.llm import Completion, LiteLLMClient, LLMClient, LLMSettings, Message
from kindex.records import GLOB_MAX, GLOBS_MAX, QUESTION_MAX, QUESTIONS_MAX, SUMMARY_MAX, TAG_MAX, TAGS_MAX, TITLE_MAX
from kindex.sanitize import doc_entry, require_root_lists
from kindex.scan import Scan, ScannedDoc
from kindex.tokenize import estimate_tokens

DOC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        # The bounds are those of the index contract: a provider that enforces the schema (llama.cpp does, with
        # a grammar) then cannot loop on tags until max_tokens and truncate the answer.
        "title": {"type": "string", "maxLength": TITLE_MAX},
        "summary": {"type": "string", "maxLength": SUMMARY_MAX},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": TAG_MAX}, "maxItems": TAGS_MAX},
        "questions": {
            "type": "array",
            "items": {"type": "string", "maxLength": QUESTION_MAX},
            "maxItems": QUESTIONS_MAX,
        },
        "paths": {"type": "array", "items": {"type": "string", "maxLength": GLOB_MAX}, "maxItems": GLOBS_MAX},
    },
    "required": ["title", "summary", "tags", "questions"],
}
_ENTRY = {"type": "object", "properties": DOC_SCHEMA["properties"]}
ROOT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "themes": {
            "type": "array",
            "items": {**_ENTRY, "properties": {"dir": {"type": "string"}, **_ENTRY["properties"]}},
        },
        "documents": {
            "type": "array",
            "items": {**_ENTRY, "properties": {"path": {"type": "string"}, **_ENTRY["properties"]}},
        },
    },
    "required": ["themes", "documents"],
}
_DOC_SHAPE = '{"title": "...", "summary": "...", "tags": ["..."], "questions": ["..."]}'
_ROOT_SHAPE = '{"themes": [{"dir", "title", "summary", "tags"}], "documents": [{"path", "title", "summary", "tags"}]}'
ROOT_EXCERPT_CHARS = 400
ROOT_TITLES_PER_THEME = 20
ROOT_DOCS_IN_ONE_ANSWER = 12
"""Root documents the root answer describes itself. A KB with more (a flat folder of notes) has each described by a
call of its own, as a theme's documents are: one answer of 200 entries outran the model's output limit (4,096 tokens
for a model litellm does not know), and 172 of 200 documents got extractive entries on every run."""
ROOT_TOKENS_PER_ENTRY = 300
"""The most one root entry of the prompt's bounds costs (a 30-character title, a 150-character summary and 8 tags:
about 250 characters, at the 1.2 tokens of a Chinese character), its dir or path aside."""


@dataclass
class Usage:
    """What answering cost: model calls, retries and tokens (and money, when the price is known)."""

    calls: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None

    def add(self, c: Completion) -> None:
        self.calls += 1
        self.retries += c.retries
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        if c.cost is not None:
            self.cost = (self.cost or 0.0) + c.cost

    def merge(self, other: Usage) -> None:
        self.calls += other.calls
        self.retries += other.retries
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost


@dataclass
class Answer:
    """A generator's raw answer (a JSON object, not yet sanitised) and its usage."""

    obj: dict[str, Any]
    usage: Usage = field(default_factory=Usage)
    cached: bool = False
    """Read from the answer cache: what sanitising it notes was said when it was new."""
    cut_off: bool = False
    """The model's answer stopped at the token limit; what it finished was used (entries it never wrote get
    extractive ones)."""


@dataclass(frozen=True, slots=True)
class ThemeOutline:
    """What the root prompt is told about one theme."""

    dir: str
    count: int
    titles: tuple[str, ...]
    more: bool


def root_outline(scan: Scan) -> list[ThemeOutline]:
    out = []
    for name, docs in scan.themes.items():
        titles = tuple(d.title_hint for d in docs[:ROOT_TITLES_PER_THEME])
        out.append(ThemeOutline(name, len(docs), titles, len(docs) > ROOT_TITLES_PER_THEME))
    return out


class Generator(Protocol):
    """Answers for one document and for the root, plus the keys under which answers may be cached."""

    name: str
    offline: bool

    def doc_key(self, doc: ScannedDoc) -> str: ...

    def root_key(self, scan: Scan) -> str: ...

    async def describe_doc(self, scan: Scan, doc: ScannedDoc) -> Answer: ...

    async def describe_root(self, scan: Scan) -> Answer: ...


def _digest(*parts: object) -> str:
    return hashlib.sha256(orjson.dumps(parts, default=str)).hexdigest()


class ExtractiveGenerator:
    """The offline default: entries from frontmatter, headings and first paragraphs. Deterministic, free."""

    name = "extractive"
    offline = True
    # Bumped when the entries it writes change (extractive, markdown or scan code): entries are kept by this key and
    # reused for an unchanged document (the answer cache's ``derived``), so a change not bumped here shows only
    # on documents edited since, or with ``--force``.
    _VERSION = "extractive-22"

    def doc_key(self, doc: ScannedDoc) -> str:
        return _digest(self._VERSION, doc.rel, doc.sha256)

    def root_key(self, scan: Scan) -> str:
        return _digest(self._VERSION, [(d.rel, d.sha256) for d in scan.documents])

    async def describe_doc(self, scan: Scan, doc: ScannedDoc) -> Answer:
        return Answer(extractive.describe_doc(doc, scan.read_text(doc)))

    async def describe_root(self, scan: Scan) -> Answer:
        return Answer(
            {
                "themes": [{"dir": n, **extractive.describe_theme(n, d)} for n, d in scan.themes.items()],
                "documents": [
                    {"path": d.path_in_theme, **extractive.describe_doc(d, scan.read_text(d))} for d in scan.root_docs
                ],
            }
        )


class LLMGenerator:
    """Entries written by a model through an :class:`LLMClient`, with one repair request per bad answer."""

    offline = False

    def __init__(self, client: LLMClient, settings: LLMSettings, cancel: threading.Event | None = None) -> None:
        self.client = client
        self.settings = settings
        self.cancel = cancel
        self.name = f"llm:{settings.model}"
        s = settings
        self._fingerprint = (s.model, s.temperature, s.max_tokens, templating.version("repair.j2"))
        # doc_key renders the prompt to hash it; describe_doc reuses that rendering instead of making it again.
        self._rendered: dict[str, list[Message]] = {}

    def doc_key(self, doc: ScannedDoc) -> str:
        messages = self._rendered[doc.rel] = doc_messages(doc)
        return _digest(self._fingerprint, messages)

    def root_key(self, scan: Scan) -> str:
        return _digest(self._fingerprint, root_messages(scan))

    async def describe_doc(self, scan: Scan, doc: ScannedDoc) -> Answer:
        messages = self._rendered.pop(doc.rel, None) or doc_messages(doc)
        return await self._ask(messages, DOC_SCHEMA, _DOC_SHAPE, _check_doc)

    async def describe_root(self, scan: Scan) -> Answer:
        # One answer lists every theme and top document: the configured cap (sized for one entry) would cut off
        # a KB with a dozen themes every run.
        return await self._ask(
            root_messages(scan), ROOT_SCHEMA, _ROOT_SHAPE, require_root_lists, max_tokens=root_answer_tokens(scan)
        )

    async def _ask(
        self,
        messages: list[Message],
        schema: Mapping[str, Any],
        shape: str,
        check: Callable[[Mapping[str, Any]], object],
        max_tokens: int | None = None,
    ) -> Answer:
        usage = Usage()
        convo = list(messages)
        for attempt in (1, 2):
            if self.cancel is not None and self.cancel.is_set():
                raise CancelledRun("the run was cancelled; every index file is as it was before the cancel")
            try:
                completion = await self.client.complete(convo, json_schema=schema, max_tokens=max_tokens)
            except ModelCallError as exc:
                usage.calls += 1  # a call that failed was still made (and may be billed): the report counts it
                usage.retries += exc.retries
                raise GenerationFailed(
                    exc.message, usage, unreachable=exc.unreachable, transient=exc.transient
                ) from None
            except (KindexError, asyncio.CancelledError):
                raise
            except Exception as exc:  # a client of the caller's own: one document fails, not the run
                raise GenerationFailed(f"the model client failed: {type(exc).__name__}: {exc}"[:500], usage) from exc
            if not isinstance(completion, Completion):
                raise GenerationFailed(
                    f"the model client returned a {type(completion).__name__}, not a Completion", usage, transient=False
                )
            usage.add(completion)
            try:
                obj = _extract_or_salvage(completion.text, check)
            except AnswerError as exc:
                if attempt == 2:
                    raise GenerationFailed(
                        f"unusable answer after a repair request: {exc.message}", usage, transient=False
                    ) from None
                convo += [
                    {"role": "assistant", "content": completion.text[:4000]},
                    {
                        "role": "user",
                        "content": templating.render("repair.j2", error=exc.message, shape=shape),
                    },
                ]
                continue
            return Answer(obj, usage, cut_off=completion.cut_off)
        raise GenerationFailed("no answer after the repair request", usage)  # the loop always returns first


def _extract_or_salvage(text: str, check: Callable[[Mapping[str, Any]], object]) -> dict[str, Any]:
    """The answer's object, checked; for an answer cut off by ``max_tokens``, its complete part (see
    :func:`salvage_truncated`), which spares a repair request that would most likely be cut off again.

    The check decides, not the extraction alone: in a root answer cut off inside its themes, the first closed
    object is a theme, not the answer.
    """
    try:
        obj = extract_object(text)
        check(obj)
        return obj
    except AnswerError as exc:
        salvaged = salvage_truncated(text)
        if salvaged is None:
            raise
        try:
            check(salvaged)
        except AnswerError:
            raise exc from None
        return salvaged


def _check_doc(obj: Mapping[str, Any]) -> None:
    doc_entry(obj, "-")


def doc_messages(doc: ScannedDoc) -> list[Message]:
    """The chat messages asking for ``doc``'s entry: the path kindex gives, author signals, the excerpt."""
    user = templating.render(
        "doc_user.j2",
        path=doc.path_in_theme,
        signals=doc.signals,
        headings=doc.headings[:20],
        excerpt=doc.excerpt,
    )
    return [
        {"role": "system", "content": templating.render("doc_system.j2")},
        {"role": "user", "content": user},
    ]


def root_docs_apart(scan: Scan) -> tuple[ScannedDoc, ...]:
    """The root documents described by calls of their own (:data:`ROOT_DOCS_IN_ONE_ANSWER`), not by the root answer."""
    return scan.root_docs if len(scan.root_docs) > ROOT_DOCS_IN_ONE_ANSWER else ()


def _root_answer_docs(scan: Scan) -> tuple[ScannedDoc, ...]:
    return () if root_docs_apart(scan) else scan.root_docs


def root_answer_needed(scan: Scan) -> bool:
    """Whether the root answer has anything to describe: an empty KB, or a flat one whose documents are all
    described apart, asks the model nothing for it (an empty prompt's answer could only fail or invent)."""
    return bool(scan.themes or _root_answer_docs(scan))


def root_answer_tokens(scan: Scan) -> int:
    """Tokens the root answer may need: one bounded entry per theme and per top document it describes, and the
    braces."""
    names = [*scan.themes, *(d.path_in_theme for d in _root_answer_docs(scan))]
    return 50 + sum(ROOT_TOKENS_PER_ENTRY + estimate_tokens(name) for name in names)


def root_messages(scan: Scan) -> list[Message]:
    """The chat messages asking for the root index: root excerpts and the closed lists of paths and dirs."""
    docs = [
        {"path": d.path_in_theme, "excerpt": " ".join(d.excerpt[:ROOT_EXCERPT_CHARS].split())}
        for d in _root_answer_docs(scan)
    ]
    return [
        {"role": "system", "content": templating.render("root_system.j2")},
        {
            "role": "user",
            "content": templating.render("root_user.j2", documents=docs, themes=root_outline(scan)),
        },
    ]


def make_generator(
    settings: LLMSettings, client: LLMClient | None = None, cancel: threading.Event | None = None
) -> Generator:
    """The LLM generator when a model is configured (or a client is given), else the extractive one.

    ``cancel``: once set, the generator starts no further model call (a repair request included).
    """
    if client is not None:
        return LLMGenerator(client, settings, cancel)
    if not settings.configured:
        return ExtractiveGenerator()
    return LLMGenerator(LiteLLMClient(settings), settings, cancel)
