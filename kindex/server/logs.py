"""Logging for the HTTP service: one JSON object per line on stderr, access lines included."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

access_log = logging.getLogger("kindex.access")


def log_access(method: str, path: str, status: int, started: float, client: str | None) -> None:
    access_log.info(
        orjson.dumps(
            {
                "ts": round(time.time(), 3),
                "method": method,
                "path": path,
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 2),
                "client": client,
            }
        ).decode()
    )


class JsonLines(logging.Formatter):
    """Every log record as one JSON object per line (uvicorn's own lines included), so the log stays parseable."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == access_log.name:
            return message  # already a JSON object
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


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
    },
}
"""Logging for ``kindex serve``: JSON lines on stderr for kindex and uvicorn alike."""
