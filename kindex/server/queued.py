"""The queue engine of the tasks (``kindex serve --queue``): steps go to Celery workers, records live in Redis.

Every call that touches Redis runs on a thread (a Redis that stalls must not stall the event loop); a request
waiting for its step polls the record, so it can be answered by any replica, whichever worker runs the step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.exceptions

from kindex.errors import QueueUnavailableError, TaskNotFoundError, UsageError
from kindex.hosts import redact_url
from kindex.kb import KnowledgeBase, Step
from kindex.queue.broker import QUEUE, TASK, make_app
from kindex.queue.jobs import JobStore, error_body, reaching
from kindex.results import TERMINAL_STATES, TaskModel

log = logging.getLogger("kindex.server")

POLL_FIRST, POLL_MAX = 0.05, 0.5
"""A waiting request looks at its task's record this often (backing off from the first to the max, in s)."""
UNREACHABLE_WAIT = 30.0
"""A request waiting for its step gives up with 503 once Redis has been unreachable this long."""
CANCEL_WAIT = 5.0
"""DELETE waits this long for the worker to confirm that it stopped, so its answer usually says ``cancelled``."""


class QueuedTasks:
    """Tasks on a Redis queue (:mod:`kindex.queue`), the same for every replica started with the same URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.store = JobStore.from_url(url)
        self.celery = make_app(url)
        try:
            self.store.redis.ping()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # Not fatal: Redis may come up after the replicas; until then steps and tasks answer 503.
            log.warning(
                "the queue's Redis at %s cannot be reached yet (%s); steps answer 503 until it can",
                redact_url(url),
                exc,
            )
        except redis.exceptions.RedisError as exc:
            raise UsageError(f"the queue's Redis at {redact_url(url)} refuses this service: {exc}") from None

    async def submit(self, agent_id: str, step: Step, kb: KnowledgeBase) -> TaskModel:
        task = await asyncio.to_thread(self.store.create, agent_id, step)
        try:
            await asyncio.to_thread(self._publish, task.id)
        except QueueUnavailableError as exc:
            await asyncio.to_thread(self.store.fail, task.id, agent_id, error_body(exc))
            raise
        return task

    def _publish(self, task_id: str) -> None:
        try:
            self.celery.send_task(TASK, args=[task_id], task_id=task_id, queue=QUEUE)
        except Exception as exc:  # kombu raises its own errors and plain ones (a URL it reads differently)
            raise QueueUnavailableError(f"the step could not be queued ({exc!r}); check the queue's Redis") from None

    async def get(self, task_id: str) -> TaskModel:
        return await asyncio.to_thread(self.store.get, task_id)

    async def wait(self, task_id: str) -> TaskModel:
        delay = POLL_FIRST
        unreachable_since: float | None = None
        while True:
            try:
                task = await asyncio.to_thread(self.store.get, task_id)
                unreachable_since = None
            except TaskNotFoundError:
                raise QueueUnavailableError(
                    f"task {task_id} vanished from the queue's Redis while it was awaited (a restart without "
                    "persistence?): submit the step again"
                ) from None
            except QueueUnavailableError:
                # Redis restarting: the worker goes on, and so does this wait, for a while.
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > UNREACHABLE_WAIT:
                    raise
                task = None
            if task is not None and task.state in TERMINAL_STATES:
                return task
            await asyncio.sleep(delay)
            delay = min(POLL_MAX, delay * 1.5)

    async def cancel(self, task_id: str) -> TaskModel:
        task = await asyncio.to_thread(self.store.cancel, task_id)
        if task.state in TERMINAL_STATES:
            return task
        try:
            return await asyncio.wait_for(self.wait(task_id), CANCEL_WAIT)
        except TimeoutError:
            return await self.get(task_id)  # still running: its worker stops before its next write

    async def health(self) -> dict[str, Any]:
        queue: dict[str, Any] = {"url": redact_url(self.url), "reachable": False}
        try:
            active, workers, queued = await asyncio.to_thread(self._counts)
        except QueueUnavailableError as exc:
            queue["error"] = exc.message
            return {"status": "unavailable", "running_tasks": 0, "queue": queue}
        queue.update(reachable=True, workers=workers, queued=queued)
        return {"status": "ok", "running_tasks": active, "queue": queue}

    def _counts(self) -> tuple[int, list[str], int]:
        with reaching():
            queued = int(self.store.redis.llen(QUEUE))
            # A write, as queueing a step is: a Redis full under noeviction answers reads, and health said "ok"
            # while every step was refused.
            self.store.redis.set(self.store.key("health", "probe"), "1", px=10_000)
            self._connect()
        return self.store.active(), self.store.workers(), queued

    def _connect(self) -> None:
        """A connection of its own, as a new worker's or replica's would be: at ``maxclients`` Redis turns new
        clients away while the pooled ones still answer, and health said "ok"."""
        pool = self.store.redis.connection_pool
        probe = pool.connection_class(**pool.connection_kwargs)
        try:
            probe.connect()
            probe.send_command("PING")
            probe.read_response()
        finally:
            probe.disconnect()

    def stop(self) -> None:
        """Nothing to cancel here: the workers run the steps, and a deploy of the API leaves them running."""

    def shutdown(self) -> None:
        self.store.redis.close()
