"""``kindex serve``: the HTTP service (extra ``kindex[server]``)."""

from __future__ import annotations

import logging.config
import os
import socket

import click

from kindex.cli.index import concurrency_opt
from kindex.errors import KindexError, UsageError
from kindex.hosts import loopback


@click.command()
@click.option(
    "--kb-root",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="Folder holding one knowledge folder per agent: KB-ROOT/<agent_id>/.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0 picks a free port.")
@concurrency_opt
def serve(kb_root: str, host: str, port: int, concurrency: int) -> None:
    """Serve the reindex steps, BuildContext and tasks over HTTP (needs kindex[server]).

    Routes live under /v1/agents/{agent_id}/knowledge/ (reindex steps, context, index files, watch); OpenAPI
    at /docs. Requests must carry
    `Authorization: Bearer $KINDEX_API_TOKEN`; without that variable the server listens on loopback only.
    The model comes from KINDEX_MODEL / KINDEX_API_BASE (none: the offline extractive generator).
    """
    token = os.environ.get("KINDEX_API_TOKEN") or None
    if token is None and not loopback(host):
        raise UsageError(f"refusing to listen on {host} without KINDEX_API_TOKEN: set a token, or use 127.0.0.1")
    try:
        import uvicorn

        from kindex.server import LOG_CONFIG, create_app
    except ImportError as exc:
        raise KindexError(
            f"the HTTP service needs its extra ({exc.name} is missing): pip install 'kindex[server]'"
        ) from None
    logging.config.dictConfig(LOG_CONFIG)
    app = create_app(kb_root, token=token, host=host, concurrency=concurrency)
    auth = "bearer token required" if token else "no token: loopback only"
    logging.getLogger("kindex").info(f"kindex: serving {kb_root} ({auth}); OpenAPI at /docs")
    _check_port(host, port)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=LOG_CONFIG,
        access_log=False,
        timeout_graceful_shutdown=30,
    )


def _check_port(host: str, port: int) -> None:
    """Fail with a clear error (exit 1) when the address is taken, before uvicorn reports it its own way."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise KindexError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick another --port, or stop what uses it"
            ) from None
