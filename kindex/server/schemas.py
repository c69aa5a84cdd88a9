"""The HTTP service's own shapes: request bodies, task and error bodies. Result bodies are :mod:`kindex.results`
and index bodies :mod:`kindex.records`, the same records the library returns."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kindex.config import MAX_BUDGET_TOKENS, MAX_DOCS_LIMIT, MIN_BUDGET_TOKENS
from kindex.results import ErrorBody
from kindex.retrieve import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_MAX_DOCS,
    DEFAULT_MIN_RELEVANCE,
    MAX_FALLBACK_DOCS,
    MAX_PATHS,
    MAX_SEARCH_LIMIT,
)

"""As ``kindex search --limit``."""
# A misspelt field ("budget_token") is refused with its name, not silently ignored for the default.
_BODY = ConfigDict(frozen=True, extra="forbid")


class ErrorResponse(BaseModel):
    error: ErrorBody


class SubRequest(BaseModel):
    model_config = _BODY
    dir: str = Field(min_length=1, max_length=255, description="A theme: a first-level folder of the KB.")


class DocRequest(BaseModel):
    model_config = _BODY
    dir: str = Field(min_length=1, max_length=255)
    path: str = Field(min_length=1, max_length=1024, description="The document's path relative to `dir`.")
    clear_dir: bool = Field(
        default=False,
        strict=True,  # it drops the theme's other entries: only JSON true does, never "yes", 1 or "false"
        description="Start `dir/index.json` afresh (the theme's first document).",
    )


class SearchRequest(BaseModel):
    model_config = _BODY
    # No length of its own: the 256 KiB body bounds it (413), and of a question over 20,000 characters the first and
    # last 10,000 are used, as by the library and the CLI (a bound here refused what those answer).
    question: str = Field(description="What the user asks, in their words.")
    paths: list[str] = Field(  # (bounded by the body: of more than MAX_PATHS the first are used, as everywhere)
        default=[], description=f"Attachment paths (files the user works on; of more than {MAX_PATHS}, the first)."
    )
    limit: int = Field(default=10, strict=True, ge=1, le=MAX_SEARCH_LIMIT, description="Entries to list.")
    min_relevance: float | None = Field(
        default=None,
        strict=True,
        allow_inf_nan=False,
        ge=0.0,
        le=1.0,
        description=f"As for /context. Default: the agent's setting (else {DEFAULT_MIN_RELEVANCE}).",
    )


class ContextRequest(BaseModel):
    model_config = _BODY
    message: str = Field(  # (bounded by the body, as SearchRequest.question)
        description="The user's chat message (of one over 20,000 characters, its first and last 10,000 are used)."
    )
    paths: list[str] = Field(  # (bounded by the body: of more than MAX_PATHS the first are used, as everywhere)
        default=[], description=f"Attachment paths (files the user works on; of more than {MAX_PATHS}, the first)."
    )
    budget_tokens: int | None = Field(
        default=None,
        strict=True,  # as min_relevance: "100" and true are refused, not read as 100 and 1
        ge=MIN_BUDGET_TOKENS,
        le=MAX_BUDGET_TOKENS,
        description=f"Default: the agent's setting (kindex.toml, else {DEFAULT_BUDGET_TOKENS}).",
    )
    max_docs: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        le=MAX_DOCS_LIMIT,
        description=f"Default: the agent's setting (else {DEFAULT_MAX_DOCS}).",
    )
    min_relevance: float | None = Field(
        default=None,
        strict=True,
        allow_inf_nan=False,  # NaN is "not a finite number", not "should be at most 1"
        ge=0.0,
        le=1.0,
        description="On topic when a document covers this share of the question's informative weight (and, if "
        "the question holds words the KB never uses, shares a subject of the KB with it); 0: any match is on topic. "
        f"Default: the agent's setting (else {DEFAULT_MIN_RELEVANCE}).",
    )
    fallback_docs: list[Annotated[str, Field(min_length=1, max_length=1024)]] | None = Field(
        default=None,
        max_length=MAX_FALLBACK_DOCS,
        description="Overview documents for off-topic messages (KB-relative); default: the agent's setting.",
    )


class FindRequest(BaseModel):
    model_config = _BODY
    query: str = Field(max_length=20_000)
    limit: int = Field(default=10, strict=True, ge=1, le=200, description="Distinct skills to return.")
    levels: list[Annotated[int, Field(strict=True, ge=0, le=2)]] | None = Field(
        default=None, description="Only hits of these levels: 0 skill summary, 1 folder overview, 2 file."
    )


class SyncRequest(BaseModel):
    model_config = _BODY
    only: list[str] = Field(default=[], max_length=1000, description="Skills to include (default: all).")
    manifest: dict[str, Any] | None = Field(
        default=None, description="The `.sync-manifest.json` the client holds: only changed skills are sent."
    )


class QueueHealth(BaseModel):
    url: str = Field(description="The queue's Redis, without its password.")
    reachable: bool
    workers: list[str] = Field(default=[], description="Workers heard from in the last 30 seconds.")
    queued: int = Field(default=0, description="Steps waiting for a worker.")
    error: str | None = None


class HealthModel(BaseModel):
    status: Literal["ok", "unavailable"]
    running_tasks: int = Field(description="Tasks queued or running (in queue mode: across every replica).")
    waiting_tasks: int | None = Field(
        default=None, description="In-process only: document steps waiting their turn behind the step holding an agent."
    )
    queue: QueueHealth | None = Field(default=None, description="Queue mode only.")


class WatchUpdateModel(BaseModel):
    changed: list[str]
    removed: list[str]
    steps: list[str] = Field(description="Steps run, e.g. `doc billing/退款政策.md`, `sub billing`, `root`.")
    calls: int
    written: list[str]
    error: str | None
    retry_in: float | None = Field(
        default=None,
        description="After a failure that may pass (the model unreachable, another writer busy): seconds until the "
        "batch is tried again unasked. `null`: the next change tries again.",
    )
    retry_at: float | None = Field(default=None, description="When that is, in seconds since the epoch.")


class WatchModel(BaseModel):
    agent_id: str
    watching: bool = Field(description="Whether the agent's folder is watched and reindexed on change.")
    updates: int = Field(description="Batches of changes handled since watching started.")
    last: WatchUpdateModel | None = None
