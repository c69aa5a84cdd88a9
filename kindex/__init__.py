"""kindex: a navigable two-layer index for a chat agent's folder of Markdown knowledge.

Generation (``reindex``, ``root``, ``sub``, ``doc``, ``preview``, ``validate``) writes and checks
``index.json`` files; all of it works offline with the extractive generator, or with any litellm model.
Retrieval (``build_context``) picks the documents a chat message is about and returns their original text.
"""

import importlib
from typing import TYPE_CHECKING, Any

from kindex.errors import (
    AnswerError,
    BusyError,
    CancelledRun,
    ConflictError,
    ForbiddenError,
    GenerationFailed,
    HttpError,
    IndexMissingError,
    InternalError,
    InterruptedRun,
    InvalidDataError,
    InvalidFileError,
    KBNotFoundError,
    KindexError,
    MethodNotAllowedError,
    ModelCallError,
    ModelError,
    NotAThemeError,
    NotFoundError,
    PathNotInThemeError,
    PayloadTooLargeError,
    RouteNotFoundError,
    SkillError,
    StorageError,
    TaskNotFoundError,
    ThemeFolderError,
    UnauthorizedError,
    UsageError,
)

# Functions named like their module are bound now, or the module would shadow them once imported.
from kindex.scan import Scan, ScannedDoc, scan
from kindex.validate import validate
from kindex.version import __version__

# Everything else is imported on first use (PEP 562), so that `import kindex.retrieve` or
# `kindex context` does not pay for generation, the model adapter or skill libraries.
_LAZY = {
    "Options": "kindex.generate",
    "Progress": "kindex.generate",
    "doc": "kindex.generate",
    "dry_run": "kindex.generate",
    "preview": "kindex.generate",
    "reindex": "kindex.generate",
    "root": "kindex.generate",
    "sub": "kindex.generate",
    "ExtractiveGenerator": "kindex.generators",
    "Generator": "kindex.generators",
    "LLMGenerator": "kindex.generators",
    "Usage": "kindex.generators",
    "extract_object": "kindex.jsonextract",
    "Effective": "kindex.config",
    "KnowledgeBase": "kindex.kb",
    "Settings": "kindex.kb",
    "build_context": "kindex.kb",
    "find_skills": "kindex.kb",
    "search": "kindex.kb",
    "Completion": "kindex.llm",
    "LLMClient": "kindex.llm",
    "LLMSettings": "kindex.llm",
    "LiteLLMClient": "kindex.llm",
    "DocItem": "kindex.records",
    "Index": "kindex.records",
    "ThemeItem": "kindex.records",
    "parse_index": "kindex.records",
    "Context": "kindex.results",
    "ContextItem": "kindex.results",
    "Failure": "kindex.results",
    "ImportResult": "kindex.results",
    "Plan": "kindex.results",
    "Preview": "kindex.results",
    "Ranking": "kindex.results",
    "RunReport": "kindex.results",
    "SkillClosure": "kindex.results",
    "SkillHit": "kindex.results",
    "Skipped": "kindex.results",
    "StepProgress": "kindex.results",
    "SyncResult": "kindex.results",
    "TokenEstimate": "kindex.results",
    "Retriever": "kindex.retrieve",
    "Closure": "kindex.skillmodel",
    "Update": "kindex.watch",
    "Watcher": "kindex.watch",
    "Problem": "kindex.skillmodel",
    "Skill": "kindex.skillmodel",
    "validate_skills": "kindex.skillmodel",
    "delete_skill": "kindex.skills",
    "export_skill": "kindex.skills",
    "import_skill": "kindex.skills",
    "sync_skills": "kindex.skills",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kindex' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from kindex.config import Effective
    from kindex.generate import Options, Progress, doc, dry_run, preview, reindex, root, sub
    from kindex.generators import ExtractiveGenerator, Generator, LLMGenerator, Usage
    from kindex.jsonextract import extract_object
    from kindex.kb import KnowledgeBase, Settings, build_context, find_skills, search
    from kindex.llm import Completion, LiteLLMClient, LLMClient, LLMSettings
    from kindex.records import DocItem, Index, ThemeItem, parse_index
    from kindex.results import (
        Context,
        ContextItem,
        Failure,
        ImportResult,
        Plan,
        Preview,
        Ranking,
        RunReport,
        SkillClosure,
        SkillHit,
        Skipped,
        StepProgress,
        SyncResult,
        TokenEstimate,
    )
    from kindex.retrieve import Retriever
    from kindex.skillmodel import Closure, Problem, Skill, validate_skills
    from kindex.skills import delete_skill, export_skill, import_skill, sync_skills
    from kindex.watch import Update, Watcher


__all__ = [
    "AnswerError",
    "BusyError",
    "CancelledRun",
    "Closure",
    "Completion",
    "ConflictError",
    "Context",
    "ContextItem",
    "DocItem",
    "Effective",
    "ExtractiveGenerator",
    "Failure",
    "ForbiddenError",
    "GenerationFailed",
    "Generator",
    "HttpError",
    "ImportResult",
    "Index",
    "IndexMissingError",
    "InternalError",
    "InterruptedRun",
    "InvalidDataError",
    "InvalidFileError",
    "KBNotFoundError",
    "KindexError",
    "KnowledgeBase",
    "LLMClient",
    "LLMGenerator",
    "LLMSettings",
    "LiteLLMClient",
    "MethodNotAllowedError",
    "ModelCallError",
    "ModelError",
    "NotAThemeError",
    "NotFoundError",
    "Options",
    "PathNotInThemeError",
    "PayloadTooLargeError",
    "Plan",
    "Preview",
    "Problem",
    "Progress",
    "Ranking",
    "Retriever",
    "RouteNotFoundError",
    "RunReport",
    "Scan",
    "ScannedDoc",
    "Settings",
    "Skill",
    "SkillClosure",
    "SkillError",
    "SkillHit",
    "Skipped",
    "StepProgress",
    "StorageError",
    "SyncResult",
    "TaskNotFoundError",
    "ThemeFolderError",
    "ThemeItem",
    "TokenEstimate",
    "UnauthorizedError",
    "Update",
    "Usage",
    "UsageError",
    "Watcher",
    "__version__",
    "build_context",
    "delete_skill",
    "doc",
    "dry_run",
    "export_skill",
    "extract_object",
    "find_skills",
    "import_skill",
    "parse_index",
    "preview",
    "reindex",
    "root",
    "scan",
    "search",
    "sub",
    "sync_skills",
    "validate",
    "validate_skills",
]
