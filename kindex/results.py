"""What kindex's operations return: the one definition of each result shape.

These records are at once the library's return values, the ``--json`` output of the CLI and the HTTP service's
response bodies (its OpenAPI document is generated from them). Their fields are their JSON form.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from kindex.tokenize import estimate_tokens

# defer_build: a process builds only the shapes it dumps. Results are made with model_construct from tables already
# checked, so a one-shot `kindex context` printing text builds none (no validator, hence no pydantic plugin loader).
_RESULT = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Result(BaseModel):
    """Base of the result records: frozen, and ``to_dict`` gives their JSON form."""

    model_config = _RESULT

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Skipped(Result):
    """A file the scan did not take (or took with a warning), and why."""

    path: str
    reason: str


class Failure(Result):
    """A document whose model answer failed; it got a stand-in entry."""

    path: str
    reason: str
    transient: bool = Field(
        default=True,
        description="The call failed (an outage, a rate limit): trying again later may help. `false`: the model "
        "answered, unusably, even after a repair request.",
    )


class StepProgress(Result):
    completed: int
    total: int


class RunReport(Result):
    """What a step did: progress, calls, cache hits, failures, tokens, cost and files written."""

    step: str
    generator: str = Field(description="`extractive` (offline) or `llm:<model>`.")
    offline: bool
    progress: StepProgress
    calls: int = Field(description="Model calls made.")
    cache_hits: int = Field(description="Answers reused from the cache (not paid again).")
    retries: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None = Field(description="USD, when litellm knows the model's price.")
    failures: tuple[Failure, ...] = Field(description="Documents whose model answers failed; they got a stand-in.")
    notes: tuple[str, ...]
    written: tuple[str, ...] = Field(description="Index files replaced (KB-relative).")
    skipped: tuple[Skipped, ...] = Field(description="Files the scan did not take, and why.")
    documents_read: int = Field(
        default=0,
        description="Documents read and analysed afresh for search: new, or changed since the last step (an edit "
        "shows here even when no entry changed, as offline).",
    )
    wall_seconds: float

    @property
    def completed(self) -> int:
        return self.progress.completed

    @property
    def total(self) -> int:
        return self.progress.total

    @property
    def ok(self) -> bool:
        return not self.failures

    @field_serializer("wall_seconds")
    def _round_seconds(self, value: float) -> float:
        return round(value, 3)


class TokenEstimate(Result):
    prompt: int
    completion: int
    calls: int


class Preview(Result):
    """The scan of a KB as the generation steps will see it, with the size of a full run (no model call)."""

    kb: str
    steps_total: int = Field(description="1 (root) + the number of theme documents.")
    top_dirs: tuple[str, ...]
    top_dir_docs: dict[str, tuple[str, ...]]
    root_docs: tuple[str, ...]
    llm_configured: bool
    model: str | None
    skipped: tuple[Skipped, ...]
    warnings: tuple[Skipped, ...]
    estimated_tokens: TokenEstimate


class Plan(Result):
    """What a run would do: which items need a model call, and what that should cost."""

    generator: str
    calls: int
    items: tuple[str, ...]
    cached: int
    estimated_prompt_tokens: int
    estimated_completion_tokens: int
    estimated_cost: float | None
    problems: tuple[str, ...] = Field(
        default=(), description="What would stop the run at its first call (a missing API key), when a call is due."
    )


class ContextItem(Result):
    """One chosen document (or theme) and why it was chosen."""

    path: str
    level: str
    score: float
    title: str
    abstract: str
    reason: str = Field(description="`matched`, `path in the message`, `scope glob <glob>` or `fallback`.")
    matched: tuple[str, ...] = ()
    truncated: bool = False
    tokens: int = 0

    @field_serializer("score")
    def _round_score(self, value: float) -> float:
        return round(value, 4)


_BASE_LAYOUT = {"__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"}
_LAYOUT_KNOWN = set(getattr(BaseModel, "__slots__", ())) == _BASE_LAYOUT
_set = object.__setattr__


def context_item(
    path: str,
    level: str,
    score: float,
    title: str,
    abstract: str,
    reason: str,
    matched: tuple[str, ...] = (),
    truncated: bool = False,
    tokens: int = 0,
) -> ContextItem:
    """A :class:`ContextItem` from values retrieval computed from its own checked tables: unvalidated, the same
    object ``ContextItem.model_construct`` with every field would give, in a fifth of its time. A ranking builds
    ten per call, and ``model_construct``'s generic loop over the fields was a fifth of a warm search. Where
    pydantic's instance layout is not the one this writes (its ``BaseModel.__slots__``), ``model_construct``
    builds it."""
    values: dict[str, Any] = {
        "path": path,
        "level": level,
        "score": score,
        "title": title,
        "abstract": abstract,
        "reason": reason,
        "matched": matched,
        "truncated": truncated,
        "tokens": tokens,
    }
    if not _LAYOUT_KNOWN:
        return ContextItem.model_construct(**values)
    item = object.__new__(ContextItem)
    _set(item, "__dict__", values)
    _set(item, "__pydantic_fields_set__", set(values))
    _set(item, "__pydantic_extra__", None)
    _set(item, "__pydantic_private__", None)
    return item


class Ranking(Result):
    """A search: the ranked entries without their text, whether the question is off topic for the KB, and what is
    wrong with the index or the folder they came from (the same shape from the library, the CLI's ``--json``, the
    HTTP service and the MCP server)."""

    results: tuple[ContextItem, ...] = Field(description="Best first: path, title, abstract, score, matched words.")
    off_topic: bool = Field(
        description="No document matched the question or is named in it: the KB does not answer it (rules a path "
        "brings in may be listed all the same)."
    )
    warnings: tuple[str, ...] = Field(
        default=(), description="What is wrong with the index or the folder (a listed document deleted since)."
    )


class SkillClosure(Result):
    """A chosen skill and everything it needs, transitively: skills in load order, tools, MCP servers."""

    name: str
    skill_dependencies: tuple[str, ...]
    tool_dependencies: tuple[str, ...]
    mcp_dependencies: tuple[str, ...]


class Context(Result):
    """What BuildContext hands the agent: the prompt text and the items it was assembled from."""

    text: str = Field(description="The prompt text: each chosen document under a header naming its path.")
    items: tuple[ContextItem, ...]
    fallback: bool
    reason: str
    missing: tuple[str, ...] = ()
    tokens: int = Field(default=0, description="Estimated tokens of `text`.")
    budget_tokens: int
    skills: tuple[SkillClosure, ...] = Field(
        default=(), description="In a skill library: chosen skills and what they need."
    )
    warnings: tuple[str, ...] = Field(
        default=(),
        description="What is wrong with the index this answer came from (an unreadable theme index, search tables "
        "rebuilt in memory because they were missing or stale) or with the call (a chosen fallback document that "
        "cannot serve), each saying what to do; empty when all is well.",
    )

    def model_post_init(self, context: Any, /) -> None:
        # The estimate is part of the record, never passed in: it always describes ``text``.
        object.__setattr__(self, "tokens", estimate_tokens(self.text))


class SkillHit(Result):
    """A skill and the entry of it that best matched the query."""

    name: str
    description: str
    root_uri: str
    skill_md_uri: str
    uri: str = Field(description="KB-relative path of the best-matching entry of this skill.")
    level: int
    score: float
    abstract: str
    skill_dependencies: tuple[str, ...] = Field(description="Transitive skill dependencies, in load order.")
    tool_dependencies: tuple[str, ...]
    mcp_dependencies: tuple[str, ...]

    @field_serializer("score")
    def _round_score(self, value: float) -> float:
        return round(value, 4)


class ImportResult(Result):
    name: str
    replaced: bool
    renamed_from: str | None
    files: int
    report: RunReport | None
    same: bool = Field(
        default=False,
        description="The library already held this very package under its name: indexed again, not installed twice.",
    )


class SyncResult(Result):
    synced: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]
    manifest: dict[str, Any]


class ErrorBody(Result):
    """A failure as the HTTP service and a task report it."""

    code: str = Field(description="Stable machine-readable code, e.g. kb_not_found, not_a_theme, busy.")
    message: str = Field(description="What was wrong and what to do.")
    task_id: str | None = Field(default=None, description="With `busy`: the task that holds the agent's KB.")


TaskState = Literal["queued", "running", "done", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset({"done", "failed", "cancelled"})


class TaskModel(Result):
    """A generation step run as a task: in the server's own threads, or on a queue worker (``kindex worker``)."""

    id: str
    agent_id: str
    step: str
    state: TaskState
    progress: StepProgress
    report: RunReport | None = None
    error: ErrorBody | None = None
    created_at: float
    finished_at: float | None = None
    worker: str | None = Field(default=None, description="Queue mode: the worker that runs (or ran) the task.")
