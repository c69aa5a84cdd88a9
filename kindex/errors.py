"""The one error tree of kindex.

Every failure kindex reports is a :class:`KindexError`. Each class carries its stable ``code`` (the ``code`` of the
HTTP service's JSON errors and of ``--json`` output), the CLI's ``exit_code`` and the service's ``http_status``; the
CLI and the server map errors from these attributes alone. The message says what was wrong and what to do.

::

    KindexError                          kindex_error        exit 1  HTTP 500
    ├── UsageError                       invalid_request     exit 2  HTTP 422
    ├── NotFoundError                    not_found                   HTTP 404
    │   ├── KBNotFoundError              kb_not_found
    │   ├── NotAThemeError               not_a_theme
    │   ├── PathNotInThemeError          path_not_in_theme
    │   └── TaskNotFoundError            task_not_found
    ├── ConflictError                    conflict                    HTTP 409
    │   ├── IndexMissingError            index_missing
    │   ├── BusyError                    busy
    │   ├── CancelledRun                 cancelled
    │   ├── InterruptedRun               interrupted         exit 130
    │   └── ThemeFolderError             theme_folder        (a step given a theme folder of the KB above it)
    ├── InvalidDataError                 invalid_data                HTTP 422
    │   ├── InvalidFileError             invalid_file        (an index, search table or document that breaks a rule)
    │   └── SkillError                   invalid_skill
    ├── ModelError                       model_error                 HTTP 502
    │   ├── ModelCallError               (one call failed after its retries)
    │   ├── AnswerError                  (an answer holds no usable JSON object)
    │   └── GenerationFailed             (no usable answer for one item after a repair request)
    ├── StorageError (also OSError)      storage_error               HTTP 500
    ├── QueueUnavailableError            queue_unavailable           HTTP 503 (queue mode: Redis refusing)
    │   └── QueueUnreachableError        (Redis not answering: may come back)
    └── HttpError                        (raised by the HTTP service only)
        ├── UnauthorizedError            unauthorized                HTTP 401
        ├── ForbiddenError               forbidden                   HTTP 403
        ├── RouteNotFoundError           not_found                   HTTP 404
        ├── MethodNotAllowedError        method_not_allowed          HTTP 405
        ├── PayloadTooLargeError         payload_too_large           HTTP 413
        └── InternalError                internal_error              HTTP 500
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:  # type-only: a report is a record of the layer above, and errors sit below every layer
    from kindex.generators import Usage
    from kindex.results import RunReport


class KindexError(Exception):
    """Base of every error kindex raises."""

    code = "kindex_error"
    exit_code = 1
    http_status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(KindexError):
    """The caller asked for something that cannot be meant (bad option value, bad argument, bad request body)."""

    code = "invalid_request"
    exit_code = 2
    http_status = 422


class NotFoundError(KindexError):
    """Something named by the caller does not exist."""

    code = "not_found"
    http_status = 404


class KBNotFoundError(NotFoundError):
    """The knowledge folder does not exist or is not a folder."""

    code = "kb_not_found"


class NotAThemeError(NotFoundError):
    """A step named a folder that is not a theme of the KB."""

    code = "not_a_theme"


class PathNotInThemeError(NotFoundError):
    """A step named a document that the scan of the theme does not hold."""

    code = "path_not_in_theme"


class TaskNotFoundError(NotFoundError):
    """No task with that id (tasks are kept for a while, then forgotten)."""

    code = "task_not_found"


class ConflictError(KindexError):
    """The KB's state does not allow the request now."""

    code = "conflict"
    http_status = 409


class IndexMissingError(ConflictError):
    """The KB has no index yet (or an unreadable one) where one is needed."""

    code = "index_missing"


class BusyError(ConflictError):
    """Another writer holds the KB's lock; ``task_id`` names it when it is a task of this service."""

    code = "busy"

    def __init__(self, message: str, task_id: str | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id

    @classmethod
    def held_by(cls, agent_id: str, holder: str, waiting: int = 0) -> BusyError:
        """The agent's KB is held by task ``holder``, with ``waiting`` more steps waiting their turn behind it."""
        more = f" and {waiting} more wait" if waiting else ""
        return cls(f"agent {agent_id!r} is being reindexed by task {holder}{more}", task_id=holder)


class CancelledRun(ConflictError):
    """A run was cancelled (HTTP ``DELETE /v1/tasks/{id}``, server shutdown); nothing was written after the cancel."""

    code = "cancelled"


class InterruptedRun(ConflictError):
    """The user stopped a run (Ctrl-C). Answers received so far are cached; ``report`` says how far it got."""

    code = "interrupted"
    exit_code = 130

    def __init__(self, message: str, report: RunReport) -> None:
        super().__init__(message)
        self.report = report


class ThemeFolderError(ConflictError):
    """A step was given a theme folder of another KB as its KB: writing there would replace that theme's index
    with a root index of its own."""

    code = "theme_folder"


class InvalidDataError(KindexError):
    """Data kindex was given or found breaks a rule of its format."""

    code = "invalid_data"
    http_status = 422


class InvalidFileError(InvalidDataError):
    """A file kindex reads (an index, a search table, a document) is not what its format says."""

    code = "invalid_file"


class SkillError(InvalidDataError):
    """A skill package or library breaks a rule (its message names the file and the rule)."""

    code = "invalid_skill"


class ModelError(KindexError):
    """The model could not be used (bad configuration, authentication, unknown model) or gave nothing usable."""

    code = "model_error"
    http_status = 502


class ModelCallError(ModelError):
    """One model call failed after its retries; the run records it against one document and goes on."""

    def __init__(self, message: str, retries: int = 0, *, unreachable: bool = False, transient: bool = True) -> None:
        super().__init__(message)
        self.retries = retries
        """How many times the call was retried before it was given up: they count in the run's report."""
        self.unreachable = unreachable
        """The call never reached a server (refused, unreachable, DNS)."""
        self.transient = transient
        """Trying the same call later may pass (a 400, a document over the model's context, never will)."""


class AnswerError(ModelError):
    """A model answer that does not hold a usable JSON object."""


class GenerationFailed(ModelError):
    """No usable answer for one item, after retries and a repair request; carries what was spent trying."""

    def __init__(self, message: str, usage: Usage, *, unreachable: bool = False, transient: bool = True) -> None:
        super().__init__(message)
        self.usage = usage
        self.unreachable = unreachable
        """The model was never reached (:attr:`ModelCallError.unreachable`)."""
        self.transient = transient
        """The call failed (trying again later may help), rather than the model answering unusably."""


class StorageError(KindexError, OSError):
    """A file kindex must write could not be written (disk full, read-only folder, permissions).

    Also an ``OSError``, so code that cleans up after a failed write still sees one.
    """

    code = "storage_error"


class QueueUnavailableError(KindexError):
    """Queue mode: the Redis that holds the queue and the task records cannot be reached (or lost a task)."""

    code = "queue_unavailable"
    http_status = 503


class QueueUnreachableError(QueueUnavailableError):
    """The Redis of queue mode did not answer (refused, timed out, gone mid-answer): it may come back, unlike one
    that refuses (a password it wants, out of memory)."""


class HttpError(KindexError):
    """Errors only the HTTP service raises (authentication, routing, body size)."""


class UnauthorizedError(HttpError):
    code = "unauthorized"
    http_status = 401


class ForbiddenError(HttpError):
    code = "forbidden"
    http_status = 403


class RouteNotFoundError(HttpError):
    code = "not_found"
    http_status = 404


class MethodNotAllowedError(HttpError):
    code = "method_not_allowed"
    http_status = 405


class PayloadTooLargeError(HttpError):
    code = "payload_too_large"
    http_status = 413


class InternalError(HttpError):
    code = "internal_error"
    http_status = 500


def missing_extra(what: str, extra: str, exc: ImportError) -> KindexError:
    """The error for an optional part of kindex that is not installed (``exc``: the failed import), saying how to
    add it the way kindex itself was installed. Not ``pip install 'kindex[extra]'``: PyPI's ``kindex`` is another
    project, which that command would install in this one's place."""
    from importlib.metadata import PackageNotFoundError, distribution

    source = None
    try:
        recorded = distribution("kindex").read_text("direct_url.json")  # pip's record of a local install
        url = urlparse(json.loads(recorded)["url"]) if recorded else None
        if url is not None and url.scheme == "file":
            source = unquote(url.path)
    except (PackageNotFoundError, ValueError, KeyError, TypeError):
        pass
    how = f"pip install '{source}[{extra}]'" if source else f"pip install '.[{extra}]' in kindex's source folder"
    return KindexError(f"{what} needs kindex's {extra} extra ({exc.name} is missing): {how}")


def status_of(code: str) -> int:
    """The HTTP status of an error ``code`` (as a task record stores it), 500 for a code no class carries."""
    todo: list[type[KindexError]] = [KindexError]
    while todo:
        cls = todo.pop()
        if cls.code == code:
            return cls.http_status
        todo.extend(cls.__subclasses__())
    return 500
