"""kindex: a navigable two-layer index for a chat agent's folder of Markdown knowledge.

Generation (``reindex``, ``root``, ``sub``, ``doc``, ``preview``, ``validate``) writes and checks
``index.json`` files; all of it works offline with the extractive generator, or with any litellm model.
Retrieval (``build_context``) picks the documents a chat message is about and returns their original text.
"""

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
    UsageError,
)
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
from kindex.scan import Scan, ScannedDoc, scan
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
from kindex.validate import validate

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
