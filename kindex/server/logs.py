"""Logging for the HTTP service: one JSON object per line on stderr (:mod:`kindex.jsonlog`), access lines included."""

from __future__ import annotations

import logging
import time

import orjson

from kindex.jsonlog import ACCESS_LOGGER

access_log = logging.getLogger(ACCESS_LOGGER)


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
