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
    IndexMissingError,
    InterruptedRun,
    KBNotFoundError,
    KindexError,
    ModelCallError,
    ModelError,
    NotAThemeError,
    PathNotInThemeError,
    StorageError,
    UsageError,
)

# Functions named like their module are bound now, or the module would shadow them once imported.
from kindex.scan import Scan, ScannedDoc, scan
from kindex.validate import validate

# Everything else is imported on first use (PEP 562), so that `import kindex.retrieve` or
# `kindex context` does not pay for generation, the model adapter or skill libraries.
_LAZY = {
    "Failure": "kindex.generate",
    "Options": "kindex.generate",
    "Plan": "kindex.generate",
    "Preview": "kindex.generate",
    "Progress": "kindex.generate",
    "RunReport": "kindex.generate",
    "doc": "kindex.generate",
    "dry_run": "kindex.generate",
    "preview": "kindex.generate",
    "reindex": "kindex.generate",
    "root": "kindex.generate",
    "sub": "kindex.generate",
    "ExtractiveGenerator": "kindex.generators",
    "Generator": "kindex.generators",
    "LLMGenerator": "kindex.generators",
    "extract_object": "kindex.jsonextract",
    "Completion": "kindex.llm",
    "LiteLLMClient": "kindex.llm",
    "LLMClient": "kindex.llm",
    "LLMSettings": "kindex.llm",
    "DocItem": "kindex.model",
    "Index": "kindex.model",
    "ThemeItem": "kindex.model",
    "parse_index": "kindex.model",
    "Context": "kindex.retrieve",
    "ContextItem": "kindex.retrieve",
    "build_context": "kindex.retrieve",
    "search": "kindex.retrieve",
    "SkillError": "kindex.skills",
    "SkillHit": "kindex.skills",
    "delete_skill": "kindex.skills",
    "export_skill": "kindex.skills",
    "find_skills": "kindex.skills",
    "import_skill": "kindex.skills",
    "sync_skills": "kindex.skills",
    "validate_skills": "kindex.skills",
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
    from kindex.generate import (
        Failure,
        Options,
        Plan,
        Preview,
        Progress,
        RunReport,
        doc,
        dry_run,
        preview,
        reindex,
        root,
        sub,
    )
    from kindex.generators import ExtractiveGenerator, Generator, LLMGenerator
    from kindex.jsonextract import extract_object
    from kindex.llm import Completion, LiteLLMClient, LLMClient, LLMSettings
    from kindex.model import DocItem, Index, ThemeItem, parse_index
    from kindex.retrieve import Context, ContextItem, build_context, search
    from kindex.skills import (
        SkillError,
        SkillHit,
        delete_skill,
        export_skill,
        find_skills,
        import_skill,
        sync_skills,
        validate_skills,
    )

__version__ = "0.1.0"

__all__ = [
    "AnswerError",
    "BusyError",
    "CancelledRun",
    "Completion",
    "Context",
    "ContextItem",
    "DocItem",
    "ExtractiveGenerator",
    "Failure",
    "Generator",
    "Index",
    "IndexMissingError",
    "InterruptedRun",
    "KBNotFoundError",
    "KindexError",
    "LLMClient",
    "LLMGenerator",
    "LLMSettings",
    "LiteLLMClient",
    "ModelCallError",
    "ModelError",
    "NotAThemeError",
    "Options",
    "PathNotInThemeError",
    "Plan",
    "Preview",
    "Progress",
    "RunReport",
    "Scan",
    "ScannedDoc",
    "SkillError",
    "SkillHit",
    "StorageError",
    "ThemeItem",
    "UsageError",
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
