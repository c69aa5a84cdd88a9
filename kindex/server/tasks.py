"""Tasks: the generation steps the routes start, behind one interface with two engines.

- :class:`Tasks` (the default): steps run in the server's own bounded pool of threads; their state lives in this
  process.
- :class:`kindex.server.queued.QueuedTasks` (``kindex serve --queue``): steps go to Celery workers over Redis, and
  their state lives in Redis, where every replica reads it.

Both keep one writer per agent: a second step is refused with 409 ``busy``, naming the task that holds it. In-process,
one document merged into its theme (:attr:`kindex.kb.Step.waits_its_turn`) waits ``queued`` for its turn instead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kindex.errors import BusyError, CancelledRun, InternalError, KindexError, TaskNotFoundError
from kindex.generate import Progress
from kindex.kb import KnowledgeBase, Step
from kindex.results import ErrorBody, RunReport, StepProgress, TaskModel
from kindex.server.errors import error_fields

DEFAULT_TASK_WORKERS = 8
"""Generation steps that run at once in one server; more wait queued (each runs its own model calls concurrently)."""
TASKS_KEPT = 1000
MAX_WAITING_STEPS = 100
"""Steps that may wait for one agent's KB (:attr:`kindex.kb.Step.waits_its_turn`); the next one is refused busy."""
LOCK_WAIT_AFTER_WAITING = 300.0
"""Seconds a step that waited its turn, or that may wait it (a document's save), waits for another writer's lock (a
CLI run, a watcher) before it fails busy: it was accepted, so it does not give up at once as another request does."""
log = logging.getLogger("kindex.server")


class TaskEngine(Protocol):
    """What the routes need of tasks, whichever engine runs them."""

    async def submit(self, agent_id: str, step: Step, kb: KnowledgeBase) -> TaskModel:
        """Start (or queue) ``step`` on the agent's KB; :class:`BusyError` while another step holds it."""
        ...

    async def get(self, task_id: str) -> TaskModel: ...

    async def wait(self, task_id: str) -> TaskModel:
        """The task once it has ended (done, failed or cancelled)."""
        ...

    async def cancel(self, task_id: str) -> TaskModel:
        """Stop the task: nothing is written after its answer says ``cancelled``."""
        ...

    async def health(self) -> dict[str, Any]:
        """The ``/healthz`` body; its ``status`` is ``ok`` when the engine can take steps."""
        ...

    def stop(self) -> None:
        """Cancel the steps this process runs or holds waiting, without waiting for them (on the stop signal)."""
        ...

    def shutdown(self) -> None: ...


@dataclass
class Task:
    """One generation step running (or run) in a thread of this server."""

    id: str
    agent_id: str
    step: str
    state: str = "queued"
    completed: int = 0
    total: int = 0
    report: RunReport | None = None
    error: KindexError | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)
    _waiters_lock: threading.Lock = field(default_factory=threading.Lock)

    async def wait(self) -> None:
        """Wait for the task without holding a thread: the worker wakes this coroutine when it finishes."""
        event = asyncio.Event()
        with self._waiters_lock:
            if self.done.is_set():
                return
            self._waiters.append((asyncio.get_running_loop(), event))
        await event.wait()

    def finish(self) -> None:
        with self._waiters_lock:
            self.done.set()
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def to_model(self) -> TaskModel:
        return TaskModel(
            id=self.id,
            agent_id=self.agent_id,
            step=self.step,
            state=self.state,  # type: ignore[arg-type]  # one of TaskModel's states, set only here
            progress=StepProgress(completed=self.completed, total=self.total),
            report=self.report,
            error=ErrorBody(**error_fields(self.error)) if self.error else None,
            created_at=self.created_at,
            finished_at=self.finished_at,
        )


class Tasks:
    """The embedded engine: steps in this process's bounded thread pool, at most one per agent."""

    def __init__(self, workers: int = DEFAULT_TASK_WORKERS) -> None:
        self._tasks: dict[str, Task] = {}
        self._running: dict[str, str] = {}
        # Per agent, the steps waiting for the one that holds its KB, in the order they came.
        self._waiting: dict[str, deque[tuple[Task, Step, KnowledgeBase]]] = {}
        # Steps run in their own bounded pool: more tasks than workers wait "queued", and neither they nor the
        # requests waiting for them take a thread from the pool that serves other requests.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kindex-task")
        self._lock = threading.Lock()
        self._stopping = False

    async def submit(self, agent_id: str, step: Step, kb: KnowledgeBase) -> TaskModel:
        return self.start(agent_id, step, kb).to_model()

    def start(self, agent_id: str, step: Step, kb: KnowledgeBase) -> Task:
        """Start ``step`` in the pool (it reads the KB's settings as they are when it starts), or queue it behind
        the step that holds the agent's KB if it :attr:`~kindex.kb.Step.waits_its_turn`; the task, to follow it."""
        with self._lock:
            if self._stopping:  # requests still draining after the stop signal must not start what stop() ended
                raise CancelledRun("the server is stopping: the step was not started; send it again")
            holder = self._running.get(agent_id)
            waiting = self._waiting.get(agent_id, deque())
            if holder is not None and (not step.waits_its_turn or len(waiting) >= MAX_WAITING_STEPS):
                raise BusyError.held_by(agent_id, holder, len(waiting))
            task = Task(uuid.uuid4().hex, agent_id, step.name)
            self._tasks[task.id] = task
            self._forget_old()
            if holder is not None:
                self._waiting[agent_id] = waiting
                waiting.append((task, step, kb))
                return task
            self._running[agent_id] = task.id
        try:
            self._launch(task, step, kb)
        except BaseException:
            with self._lock:
                del self._tasks[task.id]  # the request fails with the error: no task to follow
            self._hand_on(task)
            raise
        return task

    def _launch(self, task: Task, step: Step, kb: KnowledgeBase, *, waited: bool = False) -> None:
        # One stat of kindex.toml (parsed only when it changed): cheap enough for the event loop.
        options = replace(kb.settings.generation, on_progress=lambda p: self._progress(task, p), cancel=task.cancel)
        if waited or step.waits_its_turn:
            # A save a sync hook sends is not refused because a writer outside the service (a command on the
            # server, a watcher) holds the KB: it waits for it as it would for a step of the service's.
            options = replace(options, wait=max(options.wait, LOCK_WAIT_AFTER_WAITING))
        self._pool.submit(self._run, task, lambda: step.run(kb, options))

    def _hand_on(self, task: Task) -> None:
        """Free the agent ``task`` held, or hand it to the next step waiting for it. A step that cannot start (a
        broken ``kindex.toml``) ends with its error, and the one after it gets its turn; such steps are said to
        have ended only once the agent is freed or handed on (see :meth:`_run`)."""
        unrun: list[tuple[Task, KindexError]] = []
        try:
            while True:
                with self._lock:
                    if self._running.get(task.agent_id) != task.id:
                        return
                    waiting = self._waiting.get(task.agent_id)
                    if not waiting:
                        del self._running[task.agent_id]
                        self._waiting.pop(task.agent_id, None)
                        return
                    task, step, kb = waiting.popleft()
                    self._running[task.agent_id] = task.id
                try:
                    self._launch(task, step, kb, waited=True)
                    return
                except KindexError as exc:
                    unrun.append((task, exc))
                except Exception:  # on a pool thread, after the holder's end: nobody else would free the agent
                    log.exception("task %s (%s of agent %s) could not start", task.id, task.step, task.agent_id)
                    fault = InternalError("the task could not start on a server fault; see the server log")
                    unrun.append((task, fault))
        finally:
            for ended, error in unrun:
                self._end_unrun(ended, error)

    @staticmethod
    def _progress(task: Task, p: Progress) -> None:
        task.completed, task.total = p.completed, p.total

    def _run(self, task: Task, body: Callable[[], RunReport]) -> None:
        task.state = "running"
        state = "failed"
        try:
            report = task.report = body()
            task.completed, task.total = report.completed, report.total
            state = "done"
        except KindexError as exc:
            task.error = exc
            state = "cancelled" if isinstance(exc, CancelledRun) else "failed"
        except Exception:
            log.exception("task %s (%s of agent %s) crashed", task.id, task.step, task.agent_id)
            task.error = InternalError("the task failed on a server fault; see the server log")
        finally:
            # The agent is freed (or handed to the next step) before anyone can learn that this step ended: a
            # client sending its next step on the answer, or on a poll that says "done", found it still held (409).
            self._hand_on(task)
            task.state = state
            task.finished_at = time.time()
            task.finish()

    def task(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFoundError(f"no task {task_id[:64]!r} (tasks are kept until the server restarts)")
        return task

    async def get(self, task_id: str) -> TaskModel:
        return self.task(task_id).to_model()

    async def wait(self, task_id: str) -> TaskModel:
        task = self.task(task_id)
        await task.wait()
        return task.to_model()

    async def cancel(self, task_id: str) -> TaskModel:
        task = self.task(task_id)
        task.cancel.set()
        with self._lock:
            waiting = self._waiting.get(task.agent_id, deque())
            queued = next((w for w in waiting if w[0] is task), None)
            if queued is not None:
                waiting.remove(queued)
        if queued is not None:
            self._end_unrun(task, CancelledRun("the task was cancelled before it ran"))
        return task.to_model()

    @staticmethod
    def _end_unrun(task: Task, error: KindexError) -> None:
        """End a task that never ran: ``cancelled`` for a :class:`CancelledRun`, else ``failed``."""
        task.error, task.finished_at = error, time.time()
        task.state = "cancelled" if isinstance(error, CancelledRun) else "failed"
        task.finish()

    async def health(self) -> dict[str, Any]:
        with self._lock:
            running, waiting = len(self._running), sum(len(w) for w in self._waiting.values())
        return {"status": "ok", "running_tasks": running, "waiting_tasks": waiting}

    def stop(self) -> None:
        """Cancel every step without waiting: the waiting ones end at once, the running ones stop before their next
        write; no step starts after it. The server calls it on its stop signal, so that requests waiting for a step are
        answered."""
        with self._lock:
            self._stopping = True
            unrun = [w[0] for waiting in self._waiting.values() for w in waiting]
            self._waiting.clear()
            tasks = list(self._tasks.values())
        for task in unrun:
            self._end_unrun(task, CancelledRun("the server stopped before the step ran"))
        for task in tasks:
            if not task.done.is_set():
                task.cancel.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel what runs and wait for it: each task stops before its next write, so the index stays valid."""
        self.stop()
        deadline = time.monotonic() + timeout
        self._pool.shutdown(wait=False, cancel_futures=False)
        for task in list(self._tasks.values()):
            task.done.wait(max(0.0, deadline - time.monotonic()))

    def _forget_old(self) -> None:
        finished = [t for t in self._tasks.values() if t.done.is_set()]
        for t in sorted(finished, key=lambda t: t.created_at)[: max(0, len(self._tasks) - TASKS_KEPT)]:
            del self._tasks[t.id]
