"""Model limits shared by every worker: requests and tokens per minute per model, kept in Redis (GCRA).

Celery's own ``rate_limit`` is per worker process (N workers would send N times the limit). Here each model call
first asks one Lua script, which checks all of the model's limits against Redis's clock and commits only if every
one allows the call; otherwise it answers how long to wait. A call's tokens are not known before it is made: it
reserves an estimate (prompt + expected answer) and the difference is settled when the answer arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from kindex.errors import CancelledRun, QueueUnreachableError, UsageError
from kindex.llm import Completion, LLMClient, Message
from kindex.queue.jobs import reaching
from kindex.tokenize import estimate_tokens

ANY_MODEL = "*"
MIN_RPM = 0.1
"""The smallest request limit: one call every ten minutes."""
ANSWER_RESERVE = 512
"""Tokens reserved for a call's answer before it is known (at most the call's ``max_tokens``)."""
TOKEN_BURST_SECONDS = 10.0
"""The token budget may be spent this many seconds ahead (a single long prompt must fit in the burst)."""

# KEYS: one per limit. ARGV: rate (units/s), burst (units), cost for each key, then mode ('take' or 'settle').
# 'take' commits only when every limit allows the cost now, else answers the wait in ms; 'settle' moves the
# limits by a correction (it may be negative) without waiting.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local settle = ARGV[#ARGV] == 'settle'
local wait, tats = 0, {}
for i = 1, #KEYS do
  local rate, burst, cost = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  local per = 1000 / rate
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  local new_tat = tat + cost * per
  if new_tat < now then new_tat = now end
  if not settle then
    local allow_at = new_tat - burst * per
    if allow_at > now then wait = math.max(wait, allow_at - now) end
  end
  tats[i] = new_tat
end
if wait > 0 then return math.ceil(wait) end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], string.format('%.3f', tats[i]), 'PX', math.ceil(tats[i] - now) + 1000)
end
return 0
"""


@dataclass(frozen=True, slots=True)
class ModelLimit:
    """One model's limits: requests per minute and (optionally) tokens per minute, for all workers together."""

    model: str
    rpm: float
    tpm: float | None = None


def parse_limits(specs: Iterable[str]) -> dict[str, ModelLimit]:
    """Limits from ``MODEL=RPM`` or ``MODEL=RPM,TPM`` (``*`` for any model without its own); UsageError if bad."""
    out: dict[str, ModelLimit] = {}
    for spec in specs:
        model, sep, numbers = spec.strip().rpartition("=")
        parts = numbers.split(",")
        try:
            if not sep or not model.strip() or len(parts) > 2:
                raise ValueError
            rpm = float(parts[0])
            tpm = float(parts[1]) if len(parts) == 2 else None
            if not MIN_RPM <= rpm < 1e9 or (tpm is not None and not 1 <= tpm < 1e12):
                raise ValueError
        except ValueError:
            raise UsageError(
                f"bad rate limit {spec!r}: write MODEL=REQUESTS_PER_MINUTE[,TOKENS_PER_MINUTE] (at least {MIN_RPM} "
                "requests and 1 token a minute), e.g. openai/gpt-4o-mini=500,200000 (or *=60 for every model)"
            ) from None
        out[model.strip()] = ModelLimit(model.strip(), rpm, tpm)
    return out


def limit_for(limits: Mapping[str, ModelLimit], model: str | None) -> ModelLimit | None:
    """The model's own limit, else the ``*`` one, else none."""
    if not model:
        return None
    return limits.get(model) or limits.get(ANY_MODEL)


class SharedLimit:
    """One model's limits as GCRA state in Redis, for every process that uses the same keys."""

    def __init__(self, client: redis.Redis, limit: ModelLimit, prefix: str = "kindex") -> None:
        self.limit = limit
        self._script = client.register_script(_GCRA)
        # The key names the limit, not only the model: `*` shares one budget across the models it covers.
        base = f"{prefix}:rate:{limit.model}"
        self._keys = [f"{base}:req"] + ([f"{base}:tok"] if limit.tpm else [])
        self.token_burst = (limit.tpm or 0) / 60 * TOKEN_BURST_SECONDS

    def _args(self, tokens: float) -> list[Any]:
        # One request of burst: the request rate holds in every one-second window, not only on average.
        args: list[Any] = [self.limit.rpm / 60, 1, 1]
        if self.limit.tpm:
            args += [self.limit.tpm / 60, self.token_burst, tokens]
        return args

    def take(self, tokens: float) -> float:
        """Take one request and ``tokens`` if every limit allows it now: 0.0, else the seconds to wait first."""
        if self.limit.tpm:
            tokens = min(tokens, self.token_burst)  # a prompt larger than the burst would never pass
        with reaching("the Redis that keeps the shared model limit"):
            wait_ms = self._script(keys=self._keys, args=[*self._args(tokens), "take"])
        return float(wait_ms) / 1000

    def settle(self, tokens: float) -> None:
        """Correct the token count of a call already made by ``tokens`` (actual minus reserved)."""
        if not self.limit.tpm or not tokens:
            return
        args: list[float | str] = [self.limit.rpm / 60, 1, 0, self.limit.tpm / 60, self.token_burst, tokens, "settle"]
        # A missed correction only shifts the limit a little; the call itself succeeded.
        with contextlib.suppress(redis.RedisError):
            self._script(keys=self._keys, args=args)


WAIT_SLICE = 0.2
"""A call waiting for the limit looks at its step's cancel this often."""
REDIS_PATIENCE = 120.0
"""How long a call waits for the Redis that keeps the limit to answer again before its step fails."""


class LimitedClient:
    """An :class:`LLMClient` that waits for the shared limit before each call of the client it wraps; a cancel of
    the step (``cancel``) ends the wait, and no call is made after it."""

    def __init__(
        self, inner: LLMClient, limit: SharedLimit, max_tokens: int, cancel: threading.Event | None = None
    ) -> None:
        self.inner = inner
        self.limit = limit
        self.max_tokens = max_tokens
        self.cancel = cancel or threading.Event()

    async def complete(
        self, messages: Sequence[Message], *, json_schema: Mapping[str, Any], max_tokens: int | None = None
    ) -> Completion:
        answer_cap = max(self.max_tokens, max_tokens or 0)
        reserved = sum(estimate_tokens(m.get("content", "")) for m in messages) + min(answer_cap, ANSWER_RESERVE)
        give_up = time.monotonic() + REDIS_PATIENCE
        while True:
            if self.cancel.is_set():
                raise CancelledRun("the run was cancelled while it waited for the shared model limit")
            try:
                wait = self.limit.take(reserved)
            except QueueUnreachableError:
                # A Redis restart failed the whole step here. It waits for Redis as the rest of the step does; one
                # away longer than the lease has the step handed back to the queue (the worker's lease monitor).
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(WAIT_SLICE)
                continue
            if wait <= 0:
                break
            # Jitter: waiters do not all wake at once. Sliced: a cancel is seen within WAIT_SLICE.
            await asyncio.sleep(min(wait + random.uniform(0, 0.005), WAIT_SLICE))
        answer = await self.inner.complete(messages, json_schema=json_schema, max_tokens=max_tokens)
        used = answer.prompt_tokens + answer.completion_tokens
        if used:
            self.limit.settle(used - reserved)
        return answer
