"""The LLM seam: a small client protocol, its settings, and the litellm adapter.

litellm is imported only when a model is actually called: importing it costs seconds and hundreds of MB, and it
would fetch a price list from the internet unless told to use its bundled copy.

Long because the adapter's retries, deadlines and the sorting of its errors (unreachable, transient, fatal) share
one call path.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import random
import socket
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kindex.config import DEFAULTS, RESPONSE_FORMATS, Effective, resolve
from kindex.errors import ModelCallError, ModelError, UsageError
from kindex.hosts import redact_url
from kindex.records import clean_text

Message = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Completion:
    """One model answer and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    retries: int = 0
    cut_off: bool = False
    """The answer stopped at the token limit (``finish_reason: length``): what generation advises on."""


class LLMClient(Protocol):
    """What generation needs from a model: one chat completion at a time (called concurrently).

    ``max_tokens``, when given, is what this call's answer needs (the root's answer lists every theme, so it grows
    with the KB): a client answers with at least its own configured cap and may hold the call to what the model can
    write. ``None``: the configured cap.
    """

    async def complete(
        self, messages: Sequence[Message], *, json_schema: Mapping[str, Any], max_tokens: int | None = None
    ) -> Completion: ...


CONNECT_TIMEOUT = 10.0
"""Seconds a model call may take to connect (at most half its ``timeout``)."""


@dataclass(frozen=True, slots=True)
class LLMSettings:
    """How to reach the model. Unset fields come from ``KINDEX_*`` environment variables (see ``from_env``)."""

    model: str | None = DEFAULTS["model"]
    api_base: str | None = DEFAULTS["api_base"]
    temperature: float = DEFAULTS["temperature"]
    timeout: float = DEFAULTS["timeout"]
    max_tokens: int = DEFAULTS["max_tokens"]
    retries: int = DEFAULTS["retries"]
    retry_base_delay: float = DEFAULTS["retry_base_delay"]
    response_format: str = DEFAULTS["response_format"]

    @property
    def configured(self) -> bool:
        return bool(self.model)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> LLMSettings:
        """Settings from the ``KINDEX_*`` environment (``KINDEX_MODEL``, ``KINDEX_API_BASE``, ``KINDEX_TEMPERATURE``,
        ``KINDEX_TIMEOUT``, ``KINDEX_MAX_TOKENS``, ``KINDEX_RETRIES``, ``KINDEX_RETRY_BASE_DELAY``,
        ``KINDEX_RESPONSE_FORMAT``); keyword ``overrides`` that are not ``None`` win (that is how CLI flags apply).
        A KB's own ``kindex.toml`` comes in through :func:`kindex.config.resolve` and :meth:`from_settings`."""
        return cls.from_settings(resolve(None, overrides, env))

    @classmethod
    def from_settings(cls, effective: Effective) -> LLMSettings:
        """The model settings of resolved KB settings (:func:`kindex.config.resolve`)."""
        values = effective.subset("model")
        values.pop("concurrency")
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Raise :class:`UsageError` for values no provider could accept."""
        if not 0 <= self.temperature <= 2:
            raise UsageError(f"temperature {self.temperature} is outside 0..2")
        if self.timeout <= 0 or self.max_tokens <= 0 or self.retries < 0 or self.retry_base_delay < 0:
            raise UsageError("timeout and max tokens must be positive, retries and retry delay not negative")
        if self.response_format not in RESPONSE_FORMATS:
            raise UsageError(f"response format {self.response_format!r} is not one of {', '.join(RESPONSE_FORMATS)}")
        if self.api_base:
            scheme, sep, rest = self.api_base.partition("://")
            if scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0]:
                # Without a scheme litellm takes the whole string for a path and fails every call as an HTTP 500.
                hint = f": did you mean http://{self.api_base}?" if not sep and " " not in self.api_base else ""
                raise UsageError(f"api base {self.api_base!r} is not an http:// or https:// URL{hint}")


def import_litellm() -> Any:
    """Import litellm with its bundled price list (no network at import) and its own logging quiet."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)  # its INFO lines would flood a server's log
        # Its own plain-text handler would break a service's JSON-lines log: records go to the application's.
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
        logger.addFilter(_not_logging_worker)
    litellm.suppress_debug_info = True
    litellm.drop_params = True
    # A run that stops early (a fatal error, Ctrl-C) drops litellm's calls not yet started; litellm made their
    # coroutine on an executor thread, and Python then printed its internals on stderr beside kindex's message.
    warnings.filterwarnings("ignore", r"coroutine '.*acompletion' was never awaited", RuntimeWarning)
    # A server's odd usage numbers (a float count) made pydantic print its serializer warnings on a run's stderr;
    # the call's failure says what was wrong.
    warnings.filterwarnings("ignore", r"Pydantic serializer warnings", UserWarning)
    return litellm


def _not_logging_worker(record: logging.LogRecord) -> bool:
    """Drop litellm's success-callback worker's complaints: that worker is bound to one event loop, and a service
    runs one loop per step thread (several at once). kindex registers no callbacks, so nothing is lost."""
    return record.filename != "logging_worker.py"


UNKNOWN_OUTPUT_LIMIT = 4096
"""The longest answer asked of a model whose output limit litellm does not know (every current chat model writes
at least this many tokens); a longer answer is cut off and salvaged."""

# Retry-After is honoured but capped, so a hostile or confused server cannot park a run for hours.
MAX_RETRY_AFTER = 120.0


def check_model(litellm: Any, model: str | None) -> None:
    """:class:`UsageError` unless litellm can tell which provider ``model`` names."""
    try:
        litellm.get_llm_provider(model)
    except Exception:  # litellm's BadRequestError: it cannot tell which provider the string names
        raise UsageError(
            f"model {model!r} names no provider litellm knows: write it as provider/model, e.g. "
            "openai/gpt-4o-mini, anthropic/claude-3-5-haiku-latest, ollama/qwen2.5 (a local OpenAI-compatible "
            "server: openai/NAME with --api-base)"
        ) from None


class LiteLLMClient:
    """An :class:`LLMClient` over ``litellm.acompletion``: any litellm model string, retries with backoff."""

    def __init__(self, settings: LLMSettings) -> None:
        if not settings.model:
            raise UsageError("no model configured: pass --model or set KINDEX_MODEL")
        settings.check()
        self.settings = settings
        # litellm is loaded by the first call, not here: a reindex whose answers are all cached makes no call and
        # is spared its 4-6 s import (a model string it cannot read could not have cached an answer either).
        self._litellm: Any = None
        self._httpx: Any = None
        self._loading = threading.Lock()
        self._keys_checked = False
        self._api_key: str | None = None
        self._response_format = "none"
        self._output_limit = UNKNOWN_OUTPUT_LIMIT

    def _load(self) -> None:
        """Import litellm, check the model string, and settle what depends on the model (once)."""
        with self._loading:
            if self._litellm is not None:
                return
            litellm = import_litellm()
            check_model(litellm, self.settings.model)
            import httpx  # litellm's own transport dependency, loaded with it

            self._httpx = httpx
            self._litellm = litellm
            self._response_format = self._choose_response_format()
            self._output_limit = self._model_output_limit()

    def _check_keys(self) -> str | None:
        """Fail at once, naming the variable, when the provider's key is missing (not after a retry per document).

        Returns a placeholder key for an ``--api-base`` endpoint without one: a local OpenAI-compatible server
        (llama.cpp, vLLM) needs none, but the SDK refuses to send a request without it.
        """
        s = self.settings
        try:
            env = self._litellm.validate_environment(model=s.model, api_base=s.api_base)
        except Exception:  # litellm knows nothing about this model string: let the first call tell
            return None
        missing = [k for k in env.get("missing_keys") or [] if not (s.api_base and k.endswith("_API_BASE"))]
        if not missing:
            return None
        if s.api_base and all(k.endswith("_API_KEY") for k in missing):
            return "no-key-needed"
        raise ModelError(
            f"model {s.model!r} needs {' and '.join(missing)} in the environment: set it (or use --api-base for a "
            "local OpenAI-compatible server) and run again"
        )

    def _model_output_limit(self) -> int:
        try:
            limit = self._litellm.get_model_info(self.settings.model).get("max_output_tokens")
        except Exception:  # litellm raises for a model it has no map entry for
            limit = None
        return limit if isinstance(limit, int) and limit > 0 else UNKNOWN_OUTPUT_LIMIT

    def answer_cap(self, wanted: int | None) -> int:
        """The ``max_tokens`` a call that wants ``wanted`` is sent with: never below the configured cap, never above
        what the model can write (unless the configured cap itself is)."""
        self._load()
        own = self.settings.max_tokens
        return own if wanted is None else max(own, min(wanted, self._output_limit))

    def _choose_response_format(self) -> str:
        wanted = self.settings.response_format
        if wanted != "auto":
            return wanted
        lt = self._litellm
        model = self.settings.model
        try:
            if lt.supports_response_schema(model=model):
                return "json_schema"
            _, provider, _, _ = lt.get_llm_provider(model)
            params = lt.get_supported_openai_params(model=model, custom_llm_provider=provider) or []
        except Exception:  # litellm raises assorted errors for models it has no map entry for
            return "none"
        return "json_object" if "response_format" in params else "none"

    def check_ready(self) -> None:
        """Raise :class:`ModelError` when a call could not be sent: a model string litellm cannot read, a missing
        key (named). What a dry run says a run would stop on; nothing is sent."""
        self._load()
        if not self._keys_checked:
            self._api_key = self._check_keys()
            self._keys_checked = True

    async def complete(
        self, messages: Sequence[Message], *, json_schema: Mapping[str, Any], max_tokens: int | None = None
    ) -> Completion:
        self.check_ready()  # before the first call, not at construction: a dry run needs no key
        lt = self._litellm
        s = self.settings
        kwargs: dict[str, Any] = {
            "model": s.model,
            "messages": [dict(m) for m in messages],
            "temperature": s.temperature,
            "max_tokens": self.answer_cap(max_tokens),
            # A connect that takes this long finds no server (a firewalled host drops the attempt): said as such, it
            # counts as unreachable, where the whole-call deadline would only say the call took too long.
            "timeout": self._httpx.Timeout(s.timeout, connect=min(CONNECT_TIMEOUT, s.timeout / 2)),
            # kindex does its own retries (with Retry-After); the SDK's would multiply them.
            "num_retries": 0,
            "max_retries": 0,
        }
        if s.api_base:
            kwargs["api_base"] = s.api_base
        if self._api_key is not None:
            kwargs["api_key"] = self._api_key
        if self._response_format == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "kindex_entry", "schema": dict(json_schema)},
            }
        elif self._response_format == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        retryable = (
            lt.RateLimitError,
            lt.InternalServerError,
            lt.ServiceUnavailableError,
            lt.BadGatewayError,
            lt.APIConnectionError,
            lt.Timeout,
            TimeoutError,
        )
        fatal = (lt.AuthenticationError, lt.PermissionDeniedError, lt.NotFoundError)
        attempt = 0
        answered = False  # an earlier attempt reached a server
        while True:
            try:
                # The SDK's timeout bounds each wait for a byte; this bounds the whole call, so a server that
                # trickles its answer cannot hold a run past --timeout.
                response = await asyncio.wait_for(lt.acompletion(**kwargs), timeout=s.timeout)
                text = _answer_text(response)
            except fatal as exc:
                raise ModelError(f"model {s.model!r} cannot be used: {_short(exc)}{_fatal_hint(lt, exc)}") from None
            except (*retryable, _EmptyAnswer) as exc:
                unreadable = _unreadable_response(exc)
                if unreadable is not None:
                    # Not an outage: the server answered something that is no chat completion (a float token count,
                    # content as a list). The same answer would come again; and litellm's wording of it, with the
                    # answer quoted, was taken for a rate limit when the answer held the word.
                    raise ModelCallError(unreadable, attempt, transient=False) from None
                if attempt >= s.retries:
                    where = redact_url(s.api_base) if s.api_base else "the provider"
                    failure = _connection_failure(exc)
                    detail = {
                        "refused": f"cannot connect to {where}",
                        "dropped": f"{where} closed the connection without an answer",
                    }.get(failure or "", _short(exc))
                    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                    # Unreachable only if no attempt of the call got through: a server that answered even an error
                    # once is there.
                    unreachable = failure == "refused" and not answered
                    raise ModelCallError(
                        f"{_kind(exc)} after {tries}: {detail}", attempt, unreachable=unreachable
                    ) from None
                answered = answered or _connection_failure(exc) != "refused"
                await asyncio.sleep(self._delay(exc, attempt))
                attempt += 1
                continue
            except lt.BadRequestError as exc:  # a 400 (a document over the model's context): this document, for good
                raise ModelCallError(f"{_kind(exc)}: {_short(exc)}", attempt, transient=False) from None
            except lt.APIError as exc:
                unreadable = _unreadable_response(exc)
                if unreadable is not None:
                    raise ModelCallError(unreadable, attempt, transient=False) from None
                raise ModelCallError(f"{_kind(exc)}: {_short(exc)}", attempt) from None
            usage = getattr(response, "usage", None)
            # Never below zero: a server's negative counts made a run's totals negative.
            prompt_tokens = max(0, int(getattr(usage, "prompt_tokens", 0) or 0))
            completion_tokens = max(0, int(getattr(usage, "completion_tokens", 0) or 0))
            # litellm prices every response of a model it knows; unknown models leave the cost unset.
            cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
            priced = float(cost) if isinstance(cost, int | float) and cost > 0 else None
            cut_off = getattr(response.choices[0], "finish_reason", None) == "length"
            return Completion(text, prompt_tokens, completion_tokens, priced, retries=attempt, cut_off=cut_off)

    def _delay(self, exc: BaseException, attempt: int) -> float:
        after = retry_after(exc)
        if after is not None:
            return min(after, MAX_RETRY_AFTER)
        base: float = self.settings.retry_base_delay * 2.0**attempt
        return min(base, 60.0) * (0.5 + random.random() / 2)  # full jitter keeps parallel retries apart


def _fatal_hint(lt: Any, exc: BaseException) -> str:
    """What to check after an error no retry mends: litellm's text names the provider's complaint, not the setting."""
    if isinstance(exc, lt.NotFoundError):
        return " (check the model name: litellm's provider/model string, e.g. openai/gpt-4o-mini)"
    return " (check the API key: the provider's variable, e.g. OPENAI_API_KEY, and that it may use this model)"


class _EmptyAnswer(ModelError):
    """A response with no choices: a provider hiccup, worth a retry."""


_INVALID_RESPONSE = "Invalid response object"
"""How litellm words a response it cannot turn into a chat completion: its own traceback, then the response."""


def _unreadable_response(exc: BaseException) -> str | None:
    """What litellm could not read in the server's response (the last line of its traceback), or ``None``."""
    text = str(exc)
    at = text.find(_INVALID_RESPONSE)
    if at < 0:
        return None
    trace = text[at + len(_INVALID_RESPONSE) :].split("\n\nreceived_args=", 1)[0].strip().splitlines()
    cause = clean_text(trace[-1], 200) if trace else ""
    return f"the server's answer is no chat completion litellm can read ({cause or 'no reason given'})"


def _answer_text(response: Any) -> str:
    choices = getattr(response, "choices", None)
    if not choices:
        raise _EmptyAnswer("the response has no choices")
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if content:
        return str(content)
    # A model that answers with a tool call (some do, given a JSON schema) wrote the entry as its arguments.
    calls = getattr(message, "tool_calls", None) or ()
    arguments = getattr(getattr(calls[0], "function", None), "arguments", None) if calls else None
    if isinstance(arguments, str) and arguments.strip():
        return arguments
    if getattr(message, "reasoning_content", None):
        # "The answer is empty" sent the user looking at the prompt: the model spent the whole answer thinking.
        raise ModelCallError(
            "the model wrote only its reasoning, no answer: raise --max-tokens (KINDEX_MAX_TOKENS; the reasoning "
            "counts against it) or use a model that does not reason",
            0,
            transient=False,
        )
    return ""


def retry_after(exc: BaseException) -> float | None:
    """Seconds from a ``Retry-After`` header (delta or HTTP date) on a provider error, if any."""
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    if not headers:
        return None
    value = headers.get("retry-after") or headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _kind(exc: BaseException) -> str:
    failure = _connection_failure(exc)
    if failure:  # litellm reports either as an HTTP 500 it never received
        return "no connection" if failure == "refused" else "connection dropped"
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    return f"{name} (HTTP {status})" if isinstance(status, int) else name


# Names, not classes: the transports (httpx, aiohttp) are litellm's dependencies, not kindex's, and may change.
_CONNECT_ERRORS = frozenset({"ConnectError", "ConnectTimeout", "ClientConnectorError", "ClientConnectorDNSError"})
_DROP_ERRORS = frozenset({"ReadError", "WriteError", "RemoteProtocolError", "ServerDisconnectedError", "ClientOSError"})


def _connection_failure(exc: BaseException) -> str | None:
    """How a call failed to talk to a server, whatever litellm wrapped it in: ``"refused"`` when no server could be
    reached (refused, unreachable, DNS), ``"dropped"`` when one accepted the connection and then closed it, ``None``
    when a server answered (an HTTP error is an answer) or the failure was not the connection's."""
    seen: BaseException | None = exc
    chained = False
    for _ in range(10):  # the chain of causes is short; bounded against a cycle
        if seen is None:
            break
        name = type(seen).__name__
        if name == "HTTPStatusError":
            return None  # the server answered, with an error status ("upstream Connection error." from a gateway)
        if isinstance(seen, ConnectionRefusedError | socket.gaierror) or name in _CONNECT_ERRORS:
            return "refused"
        if isinstance(seen, ConnectionError) or name in _DROP_ERRORS:
            return "dropped"
        following = seen.__cause__ or seen.__context__
        chained = chained or following is not None
        seen = following
    # Some versions of the stack drop the cause and say it only in the message (the OpenAI client's wording).
    return "refused" if not chained and "Connection error" in str(exc) else None


TIMED_OUT = "no complete answer within the call's deadline (--timeout)"  # generation's advice looks for it


def _short(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return TIMED_OUT
    # A provider's text: its control characters dropped (an escape sequence in a 400's message reached the terminal
    # through the run's summary and validate), on one line, bounded.
    text = str(exc)
    # litellm puts its own traceback in some messages: the file paths of this machine are no provider's complaint.
    return clean_text(text.split("Traceback (most recent call last)", 1)[0] or text, 301)
