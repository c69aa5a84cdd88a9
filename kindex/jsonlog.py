"""JSON-lines logging for the long-running processes (``kindex serve``, ``kindex worker``): one object per line on
stderr, so a log collector parses every line, third-party ones included."""

from __future__ import annotations

import logging
from typing import Any

import orjson

ACCESS_LOGGER = "kindex.access"
CONTEXT_FIELDS = ("task_id", "agent_id", "step", "worker")
"""Fields a log call may pass in ``extra=``; they become keys of the line (a task's lines can be followed)."""


class JsonLines(logging.Formatter):
    """Every log record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == ACCESS_LOGGER:
            return message  # already a JSON object
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": JsonLines}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
    "loggers": {
        "uvicorn": {"handlers": [], "level": "INFO", "propagate": True},
        "uvicorn.error": {"handlers": [], "level": "INFO", "propagate": True},
        "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": True},
        "celery": {"handlers": [], "level": "INFO", "propagate": True},
        # kombu and celery's consumer log every reconnect attempt; warnings say enough.
        "kombu": {"handlers": [], "level": "WARNING", "propagate": True},
    },
}
"""JSON lines on stderr for kindex, uvicorn and celery alike."""
