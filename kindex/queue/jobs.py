"""Task records, the one-writer-per-KB lease and cancel flags, in Redis, where every API replica and worker sees them.

Keys (prefix ``kindex:``)::

    task:{id}     hash: the task record (agent, step, state, progress, report, error, worker); kept RECORD_TTL
                  seconds once finished
    busy:{agent}  the task that holds the agent's KB from submission to its end: a second submission gets 409,
                  a doc step too (in-process it would wait its turn; here the client sends it again, see
                  :attr:`kindex.kb.Step.waits_its_turn`)
    lease:{agent} ``{task_id}:{token}`` with a TTL: the worker running the agent's step, renewed while it runs,
                  lapsed when the worker dies; only its holder may write the task's record (fenced writes)
    cancel:{id}   set by DELETE /v1/tasks/{id}; the worker polls it and stops before its next write
    active        set of the ids of tasks not finished (for /healthz)
    records       sorted set of every task id by creation time: past MAX_RECORDS the oldest finished go
    workers       hash: worker name -> when it last said it was alive

Every change that reads before it writes is one Lua script, so two replicas or two workers cannot interleave.

Long because the record, the lease, the cancel flag and the bound on records are one set of keys that those
scripts change together.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
import redis
import redis.exceptions
from pydantic import ValidationError

from kindex.errors import (
    BusyError,
    KindexError,
    QueueUnavailableError,
    QueueUnreachableError,
    TaskNotFoundError,
    UsageError,
)
from kindex.hosts import redact_url
from kindex.kb import Step
from kindex.results import TERMINAL_STATES, ErrorBody, RunReport, StepProgress, TaskModel

T = TypeVar("T")

PREFIX = "kindex"
RECORD_TTL = 7 * 86400
"""Seconds a finished task stays readable."""
MAX_RECORDS = 100_000
"""Task records kept, newest first, whatever their age (a few hundred MB at most): one client looping submit and
DELETE made 1,000 a minute (1.6 MB), each kept a week, and a Redis run under ``noeviction`` would have filled up.
A task not finished is never dropped. 10,000 agents × a few steps a day stay within it for the week."""
WORKER_SEEN_WITHIN = 30.0
"""A worker that said nothing for this long is not counted as alive by /healthz."""
SOCKET_TIMEOUT = 5.0
"""A Redis that accepts connections but does not answer fails a request after this long, not never."""

_CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder then
  local st = redis.call('HGET', ARGV[2] .. ':task:' .. holder, 'state')
  if st == 'queued' or st == 'running' then return holder end
end
redis.call('SET', KEYS[1], ARGV[1])
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
local over = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[3])
if over > 0 then
  -- the oldest finished ones go (a task not finished, at most one per agent, is stepped over)
  for _, id in ipairs(redis.call('ZRANGE', KEYS[4], 0, over + 99)) do
    if over <= 0 then break end
    local st = redis.call('HGET', ARGV[2] .. ':task:' .. id, 'state')
    if st ~= 'queued' and st ~= 'running' then
      redis.call('DEL', ARGV[2] .. ':task:' .. id, ARGV[2] .. ':cancel:' .. id)
      redis.call('ZREM', KEYS[4], id)
      over = over - 1
    end
  end
end
return false
"""
# A write by the lease holder only, never over a finished record; the final one also frees the agent.
_FENCED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local st = redis.call('HGET', KEYS[2], 'state')
if st == 'done' or st == 'failed' or st == 'cancelled' then return -1 end
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
if ARGV[2] == '1' then
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end
  redis.call('SREM', KEYS[4], ARGV[4])
  redis.call('DEL', KEYS[5])
end
return 1
"""
# 0 unknown task, 1 finished already, 2 flagged (its worker stops it), 3 cancelled here (nobody was running it).
_CANCEL = """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 0 end
if st == 'done' or st == 'failed' or st == 'cancelled' then return 1 end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[3])
local holder = redis.call('GET', KEYS[3])
if holder and string.sub(holder, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then return 2 end
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished_at', ARGV[2], 'error', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if redis.call('GET', KEYS[4]) == ARGV[1] then redis.call('DEL', KEYS[4]) end
redis.call('SREM', KEYS[5], ARGV[1])
return 3
"""
# 1 renewed, 2 re-taken (the key was gone: lapsed during a stall, or Redis restarted empty), 0 someone else's now.
_RENEW = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end
return 0
"""
# A task that could not be queued, or could not start: failed, and its agent freed (unless it ended meanwhile).
_FAIL = """
local st = redis.call('HGET', KEYS[1], 'state')
if not st or st == 'done' or st == 'failed' or st == 'cancelled' then return 0 end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
redis.call('SREM', KEYS[3], ARGV[1])
return 1
"""
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


_AUTH_ADVICE = (
    "refused the connection: it needs a password, or the one given is wrong; give it in the URL, "
    "redis://:PASSWORD@HOST:PORT/N"
)


@contextmanager
def reaching(url_hint: str = "the queue's Redis") -> Iterator[None]:
    """Redis failing a request as :class:`QueueUnavailableError`: unreachable (refused, timed out, gone mid-answer),
    or refusing (out of memory under ``noeviction``, a database number it does not have)."""
    try:
        yield
    except redis.exceptions.AuthenticationError as exc:  # a ConnectionError to redis-py, but not "check that it runs"
        raise QueueUnavailableError(f"{url_hint} {_AUTH_ADVICE} ({exc})") from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        if "max number of clients" in str(exc):  # it runs, and turns new connections away
            raise QueueUnavailableError(
                f"{url_hint} refused a new connection: it has as many clients as its maxclients allows; raise "
                "maxclients, or run fewer workers and replicas"
            ) from None
        raise QueueUnreachableError(f"{url_hint} cannot be reached ({exc}); check that it runs, then retry") from None
    except redis.exceptions.RedisError as exc:
        raise QueueUnavailableError(f"{url_hint} refused the request: {exc}") from None


class JobStore:
    """The task records of queue mode (module docstring), over one Redis connection pool."""

    def __init__(self, client: redis.Redis, prefix: str = PREFIX) -> None:
        self.redis = client
        self.prefix = prefix
        self._claim = client.register_script(_CLAIM)
        self._fenced = client.register_script(_FENCED)
        self._cancel = client.register_script(_CANCEL)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._fail = client.register_script(_FAIL)

    @classmethod
    def from_url(cls, url: str) -> JobStore:
        """A store on the Redis at ``url`` (``redis://HOST:PORT/N``); :class:`UsageError` for another scheme."""
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise UsageError(f"the queue must be a Redis URL (redis://HOST:PORT/N), got {redact_url(url)!r}")
        try:
            parts = urlsplit(url)
            _ = parts.port  # a port out of range or not a number raises here
            db = parts.path.strip("/")
            if db and not db.isdigit():
                raise UsageError(f"bad queue URL {redact_url(url)!r}: the database must be a number, not {db!r}")
            client = redis.Redis.from_url(
                url,
                decode_responses=True,
                socket_timeout=SOCKET_TIMEOUT,
                socket_connect_timeout=SOCKET_TIMEOUT,
                health_check_interval=30,
            )
        except ValueError as exc:
            raise UsageError(f"bad queue URL {redact_url(url)!r}: {exc}; write redis://HOST:PORT/N") from None
        return cls(client)

    def key(self, kind: str, name: str) -> str:
        return f"{self.prefix}:{kind}:{name}"

    def check_access(self) -> None:
        """:class:`QueueUnavailableError` when Redis refuses this client's password (or wants one): a worker would
        retry that forever. A Redis that is not up yet is no error here: the worker waits for it."""
        try:
            self.redis.ping()
        except redis.exceptions.AuthenticationError as exc:
            raise QueueUnavailableError(f"the queue's Redis {_AUTH_ADVICE} ({exc})") from None
        except redis.exceptions.RedisError:
            pass

    # -- the API's side -----------------------------------------------------------------------------------------

    def create(self, agent_id: str, step: Step) -> TaskModel:
        """A queued task for ``step`` on the agent's KB; :class:`BusyError` naming the task that holds it."""
        task_id = uuid.uuid4().hex
        now = time.time()
        fields = {
            "id": task_id,
            "agent_id": agent_id,
            "step": step.name,
            "params": orjson.dumps(step.to_dict()).decode(),
            "state": "queued",
            "completed": 0,
            "total": 0,
            "created_at": repr(now),
        }
        with reaching():
            holder = self._claim(
                keys=[
                    self.key("busy", agent_id),
                    self.key("task", task_id),
                    self.key("set", "active"),
                    self.key("set", "records"),
                ],
                args=[task_id, self.prefix, MAX_RECORDS, repr(now), *_flat(fields)],
            )
        if holder is not None:
            raise BusyError.held_by(agent_id, str(holder))
        return self.get(task_id)

    def record(self, task_id: str) -> dict[str, str] | None:
        """The raw record, ``None`` when there is none."""
        with reaching():
            rec: dict[str, str] = self.redis.hgetall(self.key("task", task_id))  # type: ignore[assignment]
        return rec or None

    def get(self, task_id: str) -> TaskModel:
        """The task; :class:`TaskNotFoundError` when Redis has no record of it."""
        rec = self.record(task_id) if len(task_id) <= 64 else None
        if rec is None or "agent_id" not in rec:
            raise TaskNotFoundError(
                f"no task {task_id[:64]!r}: finished tasks are kept {RECORD_TTL // 86400} days; a Redis restarted "
                "without persistence forgets the tasks it held (submit the step again)"
            )
        return to_model(rec)

    def cancel(self, task_id: str) -> TaskModel:
        """Ask the task to stop: a queued task (or one whose worker died) is cancelled at once, a running one stops
        before its next write (its worker polls the flag)."""
        rec = self.get(task_id)
        done = rec.progress.completed
        # Cancelled here only when no worker holds it: never started, or its worker stopped (died, or was cut off)
        # part way, which "before it ran" misdescribed.
        message = (
            f"the task was cancelled after its worker stopped running it ({done} of {rec.progress.total} steps "
            "done, their index files kept)"
            if done or rec.worker
            else "the task was cancelled before it ran"
        )
        error = {"code": "cancelled", "message": message}
        with reaching():
            self._cancel(
                keys=[
                    self.key("task", task_id),
                    self.key("cancel", task_id),
                    self.key("lease", rec.agent_id),
                    self.key("busy", rec.agent_id),
                    self.key("set", "active"),
                ],
                args=[task_id, repr(time.time()), RECORD_TTL, orjson.dumps(error).decode()],
            )
        return self.get(task_id)

    def fail(self, task_id: str, agent_id: str, error: ErrorBody) -> None:
        """Mark a task that could not be queued (or could not start) as failed, and free its agent (best effort:
        Redis may be down)."""
        keys = [self.key("task", task_id), self.key("busy", agent_id), self.key("set", "active")]
        # The record stays queued; DELETE /v1/tasks/{id} frees the agent.
        with contextlib.suppress(redis.exceptions.RedisError):
            self._fail(keys=keys, args=[task_id, RECORD_TTL, *_flat(finished(error))])

    def active(self) -> int:
        with reaching():
            return int(self.redis.scard(self.key("set", "active")))

    def cancel_requested(self, task_id: str) -> bool:
        return bool(self.redis.exists(self.key("cancel", task_id)))

    # -- workers ------------------------------------------------------------------------------------------------

    def worker_alive(self, name: str) -> None:
        self.redis.hset(self.key("set", "workers"), name, repr(time.time()))

    def worker_gone(self, name: str) -> None:
        self.redis.hdel(self.key("set", "workers"), name)

    def workers(self) -> list[str]:
        """Workers heard from within :data:`WORKER_SEEN_WITHIN` seconds."""
        with reaching():
            seen: dict[str, str] = self.redis.hgetall(self.key("set", "workers"))  # type: ignore[assignment]
        now = time.time()
        return sorted(name for name, at in seen.items() if now - float(at) < WORKER_SEEN_WITHIN)


class Lease:
    """The agent's writer lease, held by the worker running one task: ``acquire`` it, ``renew`` it well within
    ``ttl`` seconds, write the task's record through it (fenced: a worker that lost the lease cannot), ``release``.
    """

    def __init__(self, store: JobStore, agent_id: str, task_id: str, ttl: float) -> None:
        self.store = store
        self.task_id = task_id
        self.key = store.key("lease", agent_id)
        self.busy_key = store.key("busy", agent_id)
        self.ttl_ms = max(1000, int(ttl * 1000))
        self.token = f"{task_id}:{uuid.uuid4().hex}"
        self.lost = threading.Event()
        """Set once another holder took the lease, or may have: stop, and write nothing more."""
        self.out_of_touch = threading.Event()
        """Set when Redis could not be reached for longer than the lease: whether another worker took the step over
        is not known, so the step goes back to the queue (a copy that finds it taken or finished ends there)."""

    def acquire(self) -> bool:
        return bool(self.store.redis.set(self.key, self.token, nx=True, px=self.ttl_ms))

    def holder(self) -> str | None:
        value = self.store.redis.get(self.key)
        return None if value is None else str(value).partition(":")[0]

    def renew(self) -> bool:
        """Extend the lease (or take it back when it vanished); ``False`` and :attr:`lost` once another holds it."""
        if self._renew() == 0:
            self.lost.set()
        return not self.lost.is_set()

    def _renew(self) -> int:
        return int(self.store._renew(keys=[self.key], args=[self.token, self.ttl_ms]))

    def write(self, fields: Mapping[str, Any], *, terminal: bool = False) -> bool:
        """Write fields of the task's record if this lease is still ours; ``terminal`` also frees the agent."""
        s = self.store
        keys = [self.key, s.key("task", self.task_id), self.busy_key, s.key("set", "active")]
        args = [self.token, "1" if terminal else "0", RECORD_TTL, self.task_id, *_flat(fields)]
        result = s._fenced(keys=[*keys, s.key("cancel", self.task_id)], args=args)
        if result == 0 and self.renew():  # the key was gone (Redis restarted empty) and is ours again
            result = s._fenced(keys=[*keys, s.key("cancel", self.task_id)], args=args)
        return bool(result == 1)

    def release(self) -> None:
        self.store._release(keys=[self.key], args=[self.token])


def finished(error: ErrorBody | None = None, state: str | None = None, **more: Any) -> dict[str, Any]:
    """The fields of a finished record: its end state (``failed`` with an error unless told), when, and ``more``."""
    end = state or ("failed" if error is not None else "done")
    fields: dict[str, Any] = {"state": end, "finished_at": repr(time.time()), **more}
    if error is not None:
        fields["error"] = error.model_dump_json(exclude_none=True)
    return fields


def error_body(error: KindexError) -> ErrorBody:
    return ErrorBody(code=error.code, message=error.message[:2000])


def to_model(rec: Mapping[str, str]) -> TaskModel:
    """The task as the API shows it, from its record (fields Redis lost after a restart read as unknown)."""

    def num(name: str, kind: Callable[[str], T], default: T) -> T:
        try:
            return kind(rec[name])
        except (KeyError, ValueError):
            return default

    report, report_read = _part(RunReport, rec.get("report"))
    error, error_read = _part(ErrorBody, rec.get("error"))
    if error is None and not (report_read and error_read):
        # A record of another kindex version (a field this one does not know, in a rolling deploy) or damaged:
        # the task is still shown, and can be cancelled, not a 500 on every read.
        error = ErrorBody(
            code="invalid_file",
            message="this task's report cannot be read by this kindex (written by another version, or damaged)",
        )
    state = rec.get("state", "running")
    return TaskModel(
        id=rec.get("id", ""),
        agent_id=rec.get("agent_id", ""),
        step=rec.get("step", ""),
        state=state if state in (*TERMINAL_STATES, "queued", "running") else "running",  # type: ignore[arg-type]
        progress=StepProgress(completed=num("completed", int, 0), total=num("total", int, 0)),
        report=report,
        error=error,
        created_at=num("created_at", float, 0.0),
        finished_at=num("finished_at", float, 0.0) or None,
        worker=rec.get("worker"),
    )


_Part = TypeVar("_Part", RunReport, ErrorBody)


def _part(model: type[_Part], raw: str | None) -> tuple[_Part | None, bool]:
    """A report or an error of a task record, and whether it could be read: its fields this version knows, when
    another version wrote more (nested ones must match)."""
    if not raw:
        return None, True
    try:
        return model.model_validate_json(raw), True
    except ValidationError:
        pass
    with contextlib.suppress(orjson.JSONDecodeError, ValidationError):
        obj = orjson.loads(raw)
        if isinstance(obj, dict):
            return model.model_validate({k: v for k, v in obj.items() if k in model.model_fields}), True
    return None, False


def step_of(rec: Mapping[str, str]) -> Step:
    """The step a record asks for (checked: a record is input from the network)."""
    try:
        return Step.from_dict(orjson.loads(rec.get("params", "null")))
    except orjson.JSONDecodeError:
        raise UsageError(f"task {rec.get('id')!r} names no valid step") from None


def _flat(fields: Mapping[str, Any]) -> list[Any]:
    return [x for kv in fields.items() for x in kv]
