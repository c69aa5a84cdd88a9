"""``kindex serve``: the HTTP service (extra ``kindex[server]``), and ``kindex worker``: the process that runs its
steps in queue mode (extra ``kindex[queue]``)."""

from __future__ import annotations

import contextlib
import logging.config
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import click

from kindex.cli.index import concurrency_opt
from kindex.cli.options import kb_root_opt
from kindex.errors import KindexError, UsageError, missing_extra
from kindex.files import regular_file
from kindex.hosts import loopback, redact_url
from kindex.jsonlog import LOG_CONFIG
from kindex.records import INDEX_FILE


@click.command()
@kb_root_opt("Folder holding one knowledge folder per agent: KB-ROOT/<agent_id>/.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0 picks a free port.")
@concurrency_opt
@click.option(
    "--queue",
    envvar="KINDEX_QUEUE",
    metavar="redis://HOST:PORT/N",
    help="Queue mode: send every step to `kindex worker` processes over this Redis, where every replica started "
    "with the same URL reads the tasks (needs kindex[queue]) [env KINDEX_QUEUE].",
)
def serve(kb_root: str, host: str, port: int, concurrency: int | None, queue: str | None) -> None:
    """Serve the reindex steps, BuildContext and tasks over HTTP (needs kindex[server]).

    Routes live under /v1/agents/{agent_id}/knowledge/ (reindex steps, context, index files, watch); OpenAPI
    at /docs. Requests must carry
    `Authorization: Bearer $KINDEX_API_TOKEN`; without that variable the server listens on loopback only.
    The model comes from KINDEX_MODEL / KINDEX_API_BASE (none: the offline extractive generator).

    \b
    Several replicas behind a load balancer (steps run by workers, tasks in Redis):
      kindex serve  --kb-root /srv/kb --queue redis://redis:6379/0 --host 0.0.0.0
      kindex worker --kb-root /srv/kb --queue redis://redis:6379/0
    """
    if queue and concurrency is not None:
        raise UsageError("with --queue the workers make the model calls: pass --concurrency to `kindex worker`")
    token = os.environ.get("KINDEX_API_TOKEN") or None
    if token is None and not loopback(host):
        raise UsageError(f"refusing to listen on {host} without KINDEX_API_TOKEN: set a token, or use 127.0.0.1")
    try:
        import uvicorn

        from kindex.server import create_app
    except ImportError as exc:
        raise missing_extra("the HTTP service", "server", exc) from None
    logging.config.dictConfig(LOG_CONFIG)
    app = create_app(kb_root, token=token, host=host, concurrency=concurrency, queue=queue)
    auth = "bearer token required" if token else "no token: loopback only"
    mode = f"steps queued on {redact_url(queue)}" if queue else "steps run in this process"
    log = logging.getLogger("kindex")
    log.info(f"kindex: serving {kb_root} ({auth}; {mode}); OpenAPI at /docs")
    if regular_file(Path(kb_root) / INDEX_FILE):  # said at the start, not at the first request
        log.warning(
            f"kindex: {kb_root} holds an index.json itself: --kb-root is the folder that holds one knowledge folder "
            "per agent (<kb-root>/<agent_id>/), not a knowledge folder"
        )
    _check_port(host, port)
    stop_steps = app.state.tasks.stop

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                # uvicorn drains open requests before the app's shutdown runs: a request waiting for a step (and
                # the steps waiting their turn behind it) would run on for the whole grace period. Cancel them now,
                # on a thread, since a signal handler must not wait for the engine's lock.
                threading.Thread(target=stop_steps, name="kindex-stop", daemon=True).start()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                # uvicorn raises the stopping signal again once it has shut down (the process then ends 130 or
                # 143); a stop by Ctrl-C or SIGTERM is how the service ends, a clean exit, 0, as `watch` and `mcp`.
                getattr(self, "_captured_signals", []).clear()

    config = uvicorn.Config(
        app, host=host, port=port, log_config=LOG_CONFIG, access_log=False, timeout_graceful_shutdown=30
    )
    server = Server(config)
    server.run()
    if not server.started:
        raise KindexError(f"the HTTP service did not start on {host}:{port}; see the log above")


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


@click.command()
@kb_root_opt("The same agents' folder the API replicas serve (shared storage when they run on other machines).")
@click.option(
    "--queue",
    envvar="KINDEX_QUEUE",
    required=True,
    metavar="redis://HOST:PORT/N",
    help="The Redis the replicas were started with (`kindex serve --queue`) [env KINDEX_QUEUE].",
)
@concurrency_opt
@click.option(
    "--tasks",
    type=click.IntRange(1, 256),
    default=2,
    show_default=True,
    help="Steps this worker runs at once; each makes up to --concurrency model calls at once.",
)
@click.option("--name", help="Worker name in logs, task records and /healthz (default kindex-PID@HOST).")
@click.option(
    "--rate-limit",
    "rate_limits",
    multiple=True,
    envvar="KINDEX_RATE_LIMITS",
    metavar="MODEL=RPM[,TPM]",
    help="Requests (and tokens) per minute for a model, kept by all workers together in Redis; `*` for any "
    "model; repeatable [env KINDEX_RATE_LIMITS, space-separated].",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=2, max=3600),
    default=30.0,
    show_default=True,
    help="Seconds a dead worker's hold on a KB outlives it (renewed every third of it while the step runs).",
)
@click.option(
    "--redeliver-after",
    type=click.FloatRange(min=2, max=86400),
    default=120.0,
    show_default=True,
    help="Seconds after delivery before a step whose worker died goes to another worker.",
)
def worker(
    kb_root: str,
    queue: str,
    concurrency: int | None,
    tasks: int,
    name: str | None,
    rate_limits: tuple[str, ...],
    lease: float,
    redeliver_after: float,
) -> None:
    """Run the steps that `kindex serve --queue` replicas queue (needs kindex[queue]).

    Each step takes its agent's KB for itself through a lease in Redis (renewed while it runs), so one KB has one
    writer across every machine. A worker killed mid-step leaves its step to another worker, which pays only for
    the model answers not yet cached in the KB. SIGTERM hands the running steps back to the queue at once.
    Logs are JSON lines on stderr. The model comes from KINDEX_MODEL / KINDEX_API_BASE and each agent's
    kindex.toml, as for `kindex serve`.

    \b
    Example, two workers sharing one provider limit of 500 requests and 200,000 tokens a minute:
      kindex worker --kb-root /srv/kb --queue redis://redis:6379/0 --rate-limit openai/gpt-4o-mini=500,200000
    """
    try:
        from kindex.queue.ratelimit import parse_limits
        from kindex.queue.worker import WorkerConfig, run_worker
    except ImportError as exc:
        raise missing_extra("the worker", "queue", exc) from None
    logging.config.dictConfig(LOG_CONFIG)
    logging.captureWarnings(True)  # Celery's warning about running as root would be a plain-text line
    specs = [part for spec in rate_limits for part in spec.split()]
    config = WorkerConfig(
        kb_root=Path(kb_root).resolve(),
        queue=queue,
        tasks=tasks,
        flags={"concurrency": concurrency} if concurrency is not None else {},
        limits=parse_limits(specs),
        lease=lease,
        redeliver_after=redeliver_after,
        **({"name": name} if name else {}),
    )
    click.get_current_context().exit(run_worker(config))
