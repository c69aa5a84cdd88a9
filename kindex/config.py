"""Per-KB settings: ``<kb>/kindex.toml``, the ``KINDEX_*`` environment, and the defaults (SPEC §3).

Every setting has one definition here: its TOML section and key, its environment variable, its bounds and its
default. Precedence is flag > environment > file > default; :func:`resolve` says for each value where it came
from (``kindex config KB`` prints that). The file is never a document (the scan takes only ``.md`` files).

```toml
[context]
fallback_docs = ["导读.md"]     # overview documents for off-topic messages
min_relevance = 0.3
budget_tokens = 6000
max_docs = 4

[index]
exclude = ["drafts/**", "**/*.draft.md"]   # KB-relative globs the scan leaves out

[model]
model = "openai/gpt-4o-mini"   # any litellm model string; none: the offline extractive generator
api_base = "http://127.0.0.1:8014/v1"
temperature = 0.1
timeout = 60
max_tokens = 600
retries = 4
concurrency = 8
```
"""

from __future__ import annotations

import difflib
import math
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kindex.errors import InvalidDataError, InvalidFileError, UsageError
from kindex.files import regular_file
from kindex.globs import usable_glob

CONFIG_FILE = "kindex.toml"
MAX_CONFIG_BYTES = 64 * 1024

# Bounds shared by every surface (library, CLI, HTTP, MCP).
MIN_BUDGET_TOKENS = 50
MAX_BUDGET_TOKENS = 200_000
MAX_DOCS_LIMIT = 50
MAX_ANSWER_TOKENS = 1_000_000
"""No model answers more; a larger cap (2**64) crashed the cache key and every step of the agent."""
RESPONSE_FORMATS = ("auto", "json_schema", "json_object", "none")


def _text_list(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(x, str) for x in items):
        raise InvalidDataError("expected a list of strings")
    out = tuple(x.strip() for x in items if x.strip())
    if len(out) > 50 or any(len(x) > 1024 for x in out):
        raise InvalidDataError("at most 50 entries of at most 1,024 characters")
    return out


def document_paths(value: object) -> tuple[str, ...]:
    """``value`` as KB-relative document paths (a list, or one comma-separated string), or
    :class:`kindex.InvalidDataError` saying which entry cannot be one: empty, absolute or climbing out with ``..``."""
    if isinstance(value, list | tuple) and any(isinstance(x, str) and not x.strip() for x in value):
        raise InvalidDataError("an empty document path")
    out = _text_list(value)
    # A drive (C:/, C:\\) is absolute; a colon elsewhere is part of a name ("Q: billing.md").
    bad = [
        p
        for p in out
        if p.startswith(("/", "\\")) or ".." in p.replace("\\", "/").split("/") or p[1:3] in (":/", ":\\")
    ]
    if bad:
        raise InvalidDataError(f"{bad[0]!r} is not a KB-relative path")
    return out


def _globs(value: object) -> tuple[str, ...]:
    out = _text_list(value)
    bad = [g for g in out if not usable_glob(g)]
    if bad:
        raise InvalidDataError(f"not a usable glob: {bad[0]!r}")
    return out


def _number(kind: type, low: float | None = None, high: float | None = None) -> Callable[[object], Any]:
    noun = "an integer" if kind is int else "a number"

    def parse(value: object) -> Any:
        if isinstance(value, bool):
            raise InvalidDataError(f"expected {noun}")
        if isinstance(value, str):
            value = value.strip()
        try:
            number = kind(value)  # from the environment's text, or TOML's int/float
        except (TypeError, ValueError, OverflowError):
            raise InvalidDataError(f"expected {noun}") from None
        if kind is int and isinstance(value, float):
            raise InvalidDataError("expected a whole number")
        if not math.isfinite(number):  # nan passes every comparison below, and inf is no bound
            raise InvalidDataError(f"expected a finite number, got {value!r}")
        if (low is not None and number < low) or (high is not None and number > high):
            raise InvalidDataError(f"must be {low if low is not None else '…'} to {high if high is not None else '…'}")
        return number

    return parse


def _optional_text(value: object) -> str | None:
    if not isinstance(value, str):
        raise InvalidDataError("expected a string")
    return value.strip() or None


def _choice(*choices: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in choices:
            raise InvalidDataError(f"must be one of {', '.join(choices)}")
        return str(value)

    return parse


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: where it lives in the file, its environment variable, how it is checked, its default."""

    name: str
    section: str
    parse: Callable[[object], Any]
    default: Any
    help: str

    @property
    def env(self) -> str:
        return f"KINDEX_{self.name.upper()}"


SETTINGS: tuple[Setting, ...] = (
    Setting("fallback_docs", "context", document_paths, ("导读.md", "00-总则与功能导航.md"), "overview documents"),
    Setting("min_relevance", "context", _number(float, 0.0, 1.0), 0.3, "on-topic threshold (share of weight)"),
    Setting("budget_tokens", "context", _number(int, MIN_BUDGET_TOKENS, MAX_BUDGET_TOKENS), 6000, "context budget"),
    Setting("max_docs", "context", _number(int, 1, MAX_DOCS_LIMIT), 4, "documents per context"),
    Setting("exclude", "index", _globs, (), "KB-relative globs the scan leaves out"),
    Setting("model", "model", _optional_text, None, "litellm model string (none: offline extractive)"),
    Setting("api_base", "model", _optional_text, None, "base URL of an OpenAI-compatible endpoint"),
    Setting("temperature", "model", _number(float, 0.0, 2.0), 0.1, "sampling temperature"),
    Setting("timeout", "model", _number(float, 0.001), 60.0, "seconds per model call"),
    Setting("max_tokens", "model", _number(int, 1, MAX_ANSWER_TOKENS), 600, "answer length cap"),
    Setting("retries", "model", _number(int, 0, 100), 4, "retries on 429/5xx/timeouts"),
    Setting("retry_base_delay", "model", _number(float, 0.0), 1.0, "seconds before the first retry"),
    Setting("response_format", "model", _choice(*RESPONSE_FORMATS), "auto", "how to ask for JSON"),
    Setting("concurrency", "model", _number(int, 1, 256), 8, "model calls at once"),
)
BY_NAME = {s.name: s for s in SETTINGS}
DEFAULTS: Mapping[str, Any] = {s.name: s.default for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class Effective:
    """The settings in force for one KB, and where each came from (``flag``, ``env KINDEX_…``, the file,
    ``default``)."""

    values: Mapping[str, Any]
    sources: Mapping[str, str]
    problem: str | None = None
    """Why ``kindex.toml`` was left out (see ``for_reading`` in :func:`resolve`); ``None`` when it was read."""

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def subset(self, section: str) -> dict[str, Any]:
        """The values of one section (``context``, ``index``, ``model``)."""
        return {s.name: self.values[s.name] for s in SETTINGS if s.section == section}


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name[:100], sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_file(kb: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked values of ``<kb>/kindex.toml`` (empty when there is none); :class:`InvalidFileError` names the
    key and the rule a broken file breaks."""
    root = Path(kb)
    path = root / CONFIG_FILE
    if not os.path.lexists(path):
        return {}
    try:
        real = path.resolve(strict=True)
        st = real.stat()
    except (OSError, RuntimeError) as exc:  # dangling or looping symlink
        raise InvalidFileError(f"{CONFIG_FILE} cannot be read ({exc}): make it a regular file") from None
    if not real.is_relative_to(root.resolve()):
        raise InvalidFileError(f"{CONFIG_FILE} leads outside the knowledge folder: make it a regular file in it")
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InvalidFileError(
            f"{CONFIG_FILE} is {what}: kindex reads the KB's settings from a file of that name; rename or remove it"
        )
    if st.st_size > MAX_CONFIG_BYTES:
        raise InvalidFileError(f"{CONFIG_FILE} is larger than {MAX_CONFIG_BYTES // 1024} KiB")
    import tomllib  # with datetime and its regexes, ~8 ms that a KB without the file never pays

    try:
        # utf-8-sig: Notepad saves UTF-8 with a byte-order mark, which TOML does not allow; it says nothing.
        data = tomllib.loads(real.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidFileError(f"{CONFIG_FILE} cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidFileError(f"{CONFIG_FILE} is not valid TOML ({exc})") from None
    except RecursionError:  # tomllib recurses once per nesting level: a few KB of brackets exhaust the stack
        raise InvalidFileError(f"{CONFIG_FILE} is not valid TOML (nested too deeply)") from None
    out: dict[str, Any] = {}
    for section, table in data.items():
        names = {s.name for s in SETTINGS if s.section == section}
        if not names:
            known = ", ".join(sorted({f"[{s.section}]" for s in SETTINGS}))
            sections = {s.section for s in SETTINGS}
            raise InvalidFileError(
                f"{CONFIG_FILE}: unknown section [{section}]{_did_you_mean(section, sections)} (known: {known})"
            )
        if not isinstance(table, dict):
            raise InvalidFileError(f"{CONFIG_FILE}: {section} must be a section ([{section}]), not a value")
        for key, raw in table.items():
            if key not in names:
                raise InvalidFileError(
                    f"{CONFIG_FILE}: [{section}] has no setting {key!r}{_did_you_mean(key, names)} "
                    f"(known: {', '.join(sorted(names))})"
                )
            setting = BY_NAME[key]
            try:
                if isinstance(raw, str) and isinstance(setting.default, int | float):
                    # Text is how the environment spells numbers; a file says what it means.
                    raise InvalidDataError(f"expected a number, not the string {raw!r}")
                out[key] = setting.parse(raw)
            except InvalidDataError as exc:
                raise InvalidFileError(f"{CONFIG_FILE}: [{section}] {key}: {exc.message}") from None
    return out


LEFT_OUT = ": its settings were left out of this answer (fix the file)"
"""What a broken ``kindex.toml`` costs an answer (:func:`resolve` with ``for_reading``), after the file's problem."""


def resolve(
    kb: str | os.PathLike[str] | None,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    for_reading: bool = False,
) -> Effective:
    """The settings in force: ``flags`` (``None`` values count as not given) > ``KINDEX_*`` environment >
    ``<kb>/kindex.toml`` > defaults. ``kb=None`` skips the file (a server's settings for all its KBs).

    ``for_reading``: for answering a question. A broken ``kindex.toml`` is then left out, the problem said in
    :attr:`Effective.problem`, instead of failing: one typo in the file must not take every chat turn's knowledge
    away. Steps (which the file's ``exclude`` and model settings steer) still refuse it."""
    env = os.environ if env is None else env
    problem = None
    try:
        from_file = read_file(kb) if kb is not None else {}
    except InvalidFileError as exc:
        if not for_reading:
            raise
        from_file, problem = {}, exc.message + LEFT_OUT
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        flag = (flags or {}).get(s.name)
        raw_env = env.get(s.env)
        if flag is not None:
            try:
                values[s.name], sources[s.name] = s.parse(flag), "flag"
            except InvalidDataError as exc:
                raise UsageError(f"{s.name}: {exc.message}") from None
        elif raw_env not in (None, ""):
            try:
                values[s.name], sources[s.name] = s.parse(raw_env), f"env {s.env}"
            except InvalidDataError as exc:
                if not for_reading:
                    raise UsageError(f"{s.env}={raw_env!r}: {exc.message}") from None
                # As a broken file: KINDEX_TEMPERATURE=nan, which no answer uses, failed every `kindex context`.
                said = f"{s.env}={_short(raw_env)}: {exc.message}: left out of this answer (fix the variable)"
                problem = said if problem is None else f"{problem}; {said}"
                values[s.name], sources[s.name] = from_file.get(s.name, s.default), "default"
                if s.name in from_file:
                    sources[s.name] = CONFIG_FILE
        elif s.name in from_file:
            values[s.name], sources[s.name] = from_file[s.name], CONFIG_FILE
        else:
            values[s.name], sources[s.name] = s.default, "default"
    unknown = set(flags or {}) - set(BY_NAME)
    if unknown:
        raise UsageError(f"unknown setting {sorted(unknown)[0]!r}")
    return Effective(values, sources, problem)


def _short(raw: str) -> str:
    return repr(raw if len(raw) <= 60 else raw[:59] + "…")


def excluded(kb: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The scan's exclude globs for ``kb``: ``KINDEX_EXCLUDE``, else the file's ``[index] exclude``, else none."""
    raw = (os.environ if env is None else env).get("KINDEX_EXCLUDE")
    if raw:
        try:
            return _globs(raw)
        except InvalidDataError as exc:
            raise UsageError(f"KINDEX_EXCLUDE={raw!r}: {exc.message}") from None
    return tuple(read_file(kb).get("exclude", ()))


def absent_documents(kb: str | os.PathLike[str], names: Iterable[str]) -> tuple[str, ...]:
    """Those of ``names`` (KB-relative document paths, as ``fallback_docs`` holds them) that are no file of ``kb``:
    the default overview names are the sample KB's, and a KB without them falls back to its README or index page,
    else an overview of its index, which ``kindex config`` says rather than leave the user to find out."""
    root = Path(kb)
    return tuple(n for n in names if not regular_file(root / n))
