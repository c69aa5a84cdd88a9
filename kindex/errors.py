"""The one error tree of kindex.

Every failure the core reports is a :class:`KindexError` with a stable ``code`` (used by the CLI for its exit
status and by the HTTP service for its JSON errors) and a message that says what was wrong and what to do.
"""

from __future__ import annotations


class KindexError(Exception):
    """Base of every error kindex raises on purpose."""

    code = "kindex_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(KindexError):
    """The caller asked for something that cannot be meant (bad option value, bad argument)."""

    code = "invalid_request"


class KBNotFoundError(KindexError):
    """The knowledge folder does not exist or is not a folder."""

    code = "kb_not_found"


class NotAThemeError(KindexError):
    """A step named a folder that is not a theme of the KB."""

    code = "not_a_theme"


class PathNotInThemeError(KindexError):
    """A step named a document that the scan of the theme does not hold."""

    code = "path_not_in_theme"


class IndexMissingError(KindexError):
    """The KB has no index yet (or an unreadable one) where one is needed."""

    code = "index_missing"


class StorageError(KindexError, OSError):
    """A file kindex must write could not be written (disk full, read-only folder, permissions).

    Also an ``OSError``, so code that cleans up after a failed write still sees one.
    """

    code = "storage_error"


class BusyError(KindexError):
    """Another writer holds the KB's lock."""

    code = "busy"


class ModelError(KindexError):
    """The model could not be used at all (bad configuration, authentication, unknown model)."""

    code = "model_error"


class ModelCallError(KindexError):
    """One model call failed after its retries; the run records it against one document and goes on."""

    code = "model_error"

    def __init__(self, message: str, retries: int = 0) -> None:
        super().__init__(message)
        self.retries = retries
        """How many times the call was retried before it was given up: they count in the run's report."""


class AnswerError(KindexError):
    """A model answer that does not hold a usable JSON object."""

    code = "model_error"


class InterruptedRun(KindexError):
    """The user stopped a run (Ctrl-C). Answers received so far are cached; ``report`` says how far it got."""

    code = "interrupted"

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report


class CancelledRun(KindexError):
    """A run was cancelled (HTTP ``DELETE /v1/tasks/{id}``, server shutdown); nothing was written after the cancel."""

    code = "cancelled"
