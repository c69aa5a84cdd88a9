"""``kindex worker``: runs the steps the API replicas queued, one writer per KB across every machine.

A step's life on a worker (the task record and lease are :mod:`kindex.queue.jobs`):
1. A finished record (a late copy of the message) ends it at once.
2. The agent's lease is taken, or the message is published again for later (``retry``): a second copy never runs
   beside the first, and a copy is never dropped (a dropped copy can lose the step, see the research notes).
3. A monitor thread renews the lease, polls the cancel flag and watches for the worker's shutdown; any of them
   stops the step before its next model call or write, through the step's cancel event.
4. The answer cache lives in the KB's folder: a step taken over from a dead worker pays only for what was not
   answered yet.
5. On SIGTERM the running steps stop and go back to the queue at once (``Reject(requeue=True)``), so a deploy hands
   them to the other workers instead of waiting for them or losing them to a SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import kombu.exceptions
import redis.exceptions
from celery import signals
from celery.exceptions import Reject, Retry

from kindex.errors import BusyError, CancelledRun, InternalError, KBNotFoundError, KindexError
from kindex.generate import Progress
from kindex.hosts import redact_url
from kindex.jsonlog import LOG_CONFIG
from kindex.kb import KnowledgeBase, agent_folder, without_root
from kindex.llm import LiteLLMClient, LLMClient, LLMSettings, check_model, import_litellm
from kindex.queue.broker import DEFAULT_REDELIVER_AFTER, QUEUE, TASK, make_app
from kindex.queue.jobs import JobStore, Lease, error_body, finished, step_of
from kindex.queue.ratelimit import LimitedClient, ModelLimit, SharedLimit, limit_for
from kindex.results import TERMINAL_STATES, ErrorBody

log = logging.getLogger("kindex.worker")

DEFAULT_LEASE = 30.0
"""Seconds a dead worker's lease outlives it; renewed every third of it."""
CANCEL_POLL = 0.2
"""Seconds between looks at the cancel flag: how late a cancel can land."""
PROGRESS_EVERY = 0.25
"""Progress is written at most this often (and always at the end)."""
HEARTBEAT = 5.0
FINAL_WRITE_PATIENCE = 60.0
"""How long the end of a step waits for an unreachable Redis before giving its record up."""


@dataclass(frozen=True)
class WorkerConfig:
    """What ``kindex worker`` was started with."""

    kb_root: Path
    queue: str
    name: str = field(default_factory=lambda: f"kindex-{os.getpid()}@{socket.gethostname()}")
    tasks: int = 2
    """Steps this worker runs at once (each with its own ``concurrency`` model calls)."""
    flags: Mapping[str, Any] = field(default_factory=dict)
    """Settings that win over each agent's environment and ``kindex.toml`` (e.g. ``concurrency``)."""
    limits: Mapping[str, ModelLimit] = field(default_factory=dict)
    lease: float = DEFAULT_LEASE
    redeliver_after: float = DEFAULT_REDELIVER_AFTER


class _HeldHere(KindexError):
    """The step met the KB's writer lock held on this host: it is tried again later, not failed (never raised out
    of :meth:`StepRunner.execute`)."""


class StepRunner:
    """Runs one queued step at a time per calling thread (Celery's threads pool calls :meth:`execute`)."""

    def __init__(self, config: WorkerConfig, store: JobStore, shutting_down: threading.Event) -> None:
        self.config = config
        self.store = store
        self.shutting_down = shutting_down

    def execute(self, task_id: str, retry: Callable[[float], Exception]) -> str:
        """Run the task's step; raises ``retry(seconds)`` when its agent's lease is held, ``Reject`` on shutdown or
        when Redis cannot be reached as the step starts (the message goes back to the queue)."""
        try:
            return self._execute(task_id, retry)
        except (Reject, Retry):
            raise
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, kombu.exceptions.OperationalError):
            log.warning("Redis unreachable as the step started: handed back to the queue", extra={"task_id": task_id})
            raise Reject("Redis unreachable", requeue=True) from None
        except Exception as exc:
            # Whatever broke before the step ran (a record Redis garbled, a refused write): the task ends failed and
            # its agent is freed, instead of the message being acknowledged and the agent staying busy for good.
            log.exception("the step could not start", extra={"task_id": task_id})
            reason = f"the step could not start: {type(exc).__name__}: {exc}"
            error = exc if isinstance(exc, KindexError) else InternalError(reason)
            rec: dict[str, str] = {}
            with contextlib.suppress(KindexError):
                rec = self.store.record(task_id) or {}
            self.store.fail(task_id, rec.get("agent_id", ""), self._error(error))
            return "failed"

    def _execute(self, task_id: str, retry: Callable[[float], Exception]) -> str:
        rec = self.store.record(task_id)
        if rec is None or "agent_id" not in rec:
            log.warning("no record of task %s (Redis lost it?): dropped", task_id, extra={"task_id": task_id})
            return "unknown"
        if rec.get("state") in TERMINAL_STATES:
            return "finished"  # a late copy of a finished step
        if self.shutting_down.is_set():
            raise Reject("the worker is stopping", requeue=True)
        agent_id = rec["agent_id"]
        ctx = {"task_id": task_id, "agent_id": agent_id, "step": rec.get("step"), "worker": self.config.name}
        lease = Lease(self.store, agent_id, task_id, self.config.lease)
        if not lease.acquire():
            wait = min(10.0, max(0.5, self.config.lease / 6))
            log.info("agent busy (lease held by task %s): again in %.1f s", lease.holder(), wait, extra=ctx)
            raise retry(wait)
        cancel = threading.Event()
        monitor = _Monitor(self.store, lease, task_id, self.shutting_down, cancel)
        monitor.start()
        try:
            return self._run(lease, task_id, cancel, ctx)
        except _HeldHere:
            # The KB's own lock is held on this host: by a command, or by this very task's first copy, paused past its
            # lease (a stopped process, a stalled VM) and redelivered here. Failing it "busy" freed the agent while that
            # copy went on writing, and its end was refused: the task said failed when its work was done.
            wait = min(10.0, max(0.5, self.config.lease / 6))
            log.info("the KB's lock is held by another writer: again in %.1f s", wait, extra=ctx)
            raise retry(wait) from None
        finally:
            monitor.stop()
            # It lapses by itself.
            with contextlib.suppress(redis.exceptions.RedisError):
                lease.release()

    def _run(self, lease: Lease, task_id: str, cancel: threading.Event, ctx: dict[str, Any]) -> str:
        rec = self.store.record(task_id)  # again, now that the lease is ours: it may have finished meanwhile
        if rec is None or rec.get("state") in TERMINAL_STATES:
            return "finished"
        # Every write carries the record's identity: after a Redis restart the next write recreates it whole.
        base: dict[str, Any] = {k: rec[k] for k in ("id", "agent_id", "step", "params", "created_at") if k in rec}
        base["worker"] = self.config.name
        if self.store.cancel_requested(task_id):
            cancelled = error_body(CancelledRun("the task was cancelled before it started"))
            self._end(lease, {**base, **finished(cancelled, state="cancelled")})
            return "cancelled"
        attempts = int(rec["attempts"]) + 1 if rec.get("attempts", "").isdigit() else 1
        lease.write({**base, "state": "running", "attempts": attempts})
        log.info("step started (attempt %d)", attempts, extra=ctx)
        last = [0.0]

        def progress(p: Progress) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_EVERY and p.completed < p.total:
                return
            last[0] = now
            # Progress is best effort; the end is written with patience.
            with contextlib.suppress(redis.exceptions.RedisError):
                lease.write({**base, "state": "running", "completed": p.completed, "total": p.total})

        try:
            kb = KnowledgeBase(self._folder(ctx["agent_id"]), flags=self.config.flags)
            client = self._client(kb, cancel)
            options = replace(kb.settings.generation, client=client, on_progress=progress, cancel=cancel)
            report = step_of(rec).run(kb, options)
        except CancelledRun as exc:
            if lease.out_of_touch.is_set():
                # Acknowledged as "lost", the step was dropped after a stall or a partition that no other worker had
                # taken it over in: its record said "running" and its agent stayed busy for good.
                log.warning("Redis out of reach longer than the lease: stopped, back to the queue", extra=ctx)
                raise Reject("Redis out of reach longer than the lease", requeue=True) from None
            if lease.lost.is_set():
                log.warning("lease lost (another worker holds the agent): stopped, nothing written", extra=ctx)
                return "lost"
            if self.shutting_down.is_set() and not self.store.cancel_requested(task_id):
                lease.write({**base, "state": "queued"})
                log.info("worker stopping: step handed back to the queue", extra=ctx)
                raise Reject("the worker is stopping", requeue=True) from None
            self._end(lease, {**base, **finished(self._error(exc), state="cancelled")})
            log.info("step cancelled", extra=ctx)
            return "cancelled"
        except BusyError:
            lease.write({**base, "state": "queued"})
            raise _HeldHere("the KB's writer lock is held on this host") from None
        except KindexError as exc:
            self._end(lease, {**base, **finished(self._error(exc))})
            log.warning("step failed: %s", exc.message, extra=ctx)
            return "failed"
        except Exception:
            log.exception("step crashed", extra=ctx)
            fault = InternalError("the step failed on a worker fault; see the worker's log")
            self._end(lease, {**base, **finished(error_body(fault))})
            return "failed"
        end = finished(None, report=report.model_dump_json(), completed=report.completed, total=report.total)
        self._end(lease, {**base, **end})
        log.info("step done: %d calls, %d written", report.calls, len(report.written), extra=ctx)
        return "done"

    def _end(self, lease: Lease, fields: Mapping[str, Any]) -> None:
        """Write the end of the step, waiting out a Redis restart (up to :data:`FINAL_WRITE_PATIENCE`)."""
        deadline = time.monotonic() + FINAL_WRITE_PATIENCE
        while True:
            try:
                lease.write(fields, terminal=True)
                return
            except redis.exceptions.RedisError as exc:
                if time.monotonic() > deadline or lease.lost.is_set():
                    # Unreachable, or refusing writes (out of memory): the error says which.
                    log.error("could not record the end of task %s: %s", lease.task_id, exc)
                    return
                time.sleep(0.5)

    def _error(self, error: KindexError) -> ErrorBody:
        """``error`` as the task record keeps it: without this worker's ``--kb-root``, which the API replicas, on
        another path or machine, could not take out (the worker's log keeps the whole message)."""
        body = error_body(error)
        return body.model_copy(update={"message": without_root(body.message, self.config.kb_root)})

    def _folder(self, agent_id: str) -> Path:
        try:
            return agent_folder(self.config.kb_root, agent_id)
        except KBNotFoundError:
            log.warning("agent %r has no folder under --kb-root %s", agent_id, self.config.kb_root)
            raise KBNotFoundError(
                f"agent {agent_id!r} has no knowledge folder under the --kb-root of worker {self.config.name} (its "
                "log names the path): it was deleted since the step was sent, or this worker was started on another "
                "folder than the one the API replicas serve (start every worker on theirs)"
            ) from None

    def _client(self, kb: KnowledgeBase, cancel: threading.Event) -> LLMClient | None:
        """The model client under the shared limit of its model, if one is set (else generation's own)."""
        llm = kb.settings.generation.llm
        limit = limit_for(self.config.limits, llm.model)
        if limit is None or not llm.configured:
            return kb.settings.generation.client
        # Checked before the first call: a model string no provider takes must not hold a slot of the shared
        # limit (the client checks it lazily, inside its first call, after the slot is taken).
        check_model(import_litellm(), llm.model)
        shared = SharedLimit(self.store.redis, limit)
        return LimitedClient(LiteLLMClient(llm), shared, llm.max_tokens, cancel)


class _Monitor:
    """One thread per running step: renews the lease, polls the cancel flag, relays the worker's shutdown."""

    def __init__(
        self, store: JobStore, lease: Lease, task_id: str, shutting_down: threading.Event, cancel: threading.Event
    ) -> None:
        self.store, self.lease, self.task_id = store, lease, task_id
        self.shutting_down, self.cancel = shutting_down, cancel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"kindex-lease-{task_id[:8]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        ttl = self.lease.ttl_ms / 1000
        renewed = time.monotonic()
        while not self._stop.wait(CANCEL_POLL):
            if self.shutting_down.is_set():
                self.cancel.set()
            try:
                if self.store.cancel_requested(self.task_id):
                    self.cancel.set()
                if time.monotonic() - renewed >= ttl / 3:
                    if not self.lease.renew():
                        self.cancel.set()  # another worker holds the agent now: write nothing more
                    renewed = time.monotonic()
            except redis.exceptions.RedisError:
                if time.monotonic() - renewed > ttl:
                    # Out of touch longer than the lease: another worker may have taken the step over.
                    self.lease.out_of_touch.set()
                    self.lease.lost.set()
                    self.cancel.set()


def run_worker(config: WorkerConfig) -> int:
    """Consume the queue until SIGTERM/SIGINT; the exit code of the Celery worker."""
    store = JobStore.from_url(config.queue)
    store.check_access()  # a wrong password was retried 100 times, said as "Authentication required"
    if LLMSettings.from_env().configured:
        import_litellm()  # seconds, paid when the worker starts rather than inside its first step
    app = make_app(config.queue, redeliver_after=config.redeliver_after)
    shutting_down = threading.Event()
    runner = StepRunner(config, store, shutting_down)

    @app.task(name=TASK, bind=True, max_retries=None, acks_late=True)  # type: ignore[untyped-decorator]
    def step(self: Any, task_id: str) -> str:
        return runner.execute(str(task_id), lambda seconds: self.retry(countdown=seconds))

    # A receiver on setup_logging stops Celery from installing its own (plain-text) handlers: ours are JSON lines.
    signals.setup_logging.connect(lambda **_: logging.config.dictConfig(LOG_CONFIG), weak=False)
    signals.worker_shutting_down.connect(lambda **_: shutting_down.set(), weak=False)
    heartbeat = _Heartbeat(store, config.name)
    signals.worker_ready.connect(lambda **_: heartbeat.start(), weak=False)
    if not any(p.is_dir() for p in config.kb_root.iterdir()):
        log.warning("%s holds no agent folder yet: steps for agents it lacks will fail", config.kb_root)
    log.info(
        "kindex worker %s: %s, %d steps at once, queue %s",
        config.name,
        config.kb_root,
        config.tasks,
        redact_url(config.queue),
        extra={"worker": config.name},
    )
    worker = app.Worker(
        hostname=config.name,
        pool="threads",
        concurrency=config.tasks,
        loglevel="INFO",
        queues=[QUEUE],
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
        quiet=True,
    )
    try:
        worker.start()
    finally:
        heartbeat.stop()
    return int(worker.exitcode or 0)


class _Heartbeat:
    """Tells Redis every few seconds that this worker is alive (what /healthz counts)."""

    def __init__(self, store: JobStore, name: str) -> None:
        self.store, self.name = store, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kindex-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(redis.exceptions.RedisError):
            self.store.worker_gone(self.name)

    def _loop(self) -> None:
        while True:
            # Redis is down: the worker says so in its own log when the broker reconnects.
            with contextlib.suppress(redis.exceptions.RedisError):
                self.store.worker_alive(self.name)
            if self._stop.wait(HEARTBEAT):
                return
