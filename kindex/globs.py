"""``paths`` globs (SPEC §6.4) and the file paths a chat message mentions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a glob is compiled: most questions name no file (~12 ms of `kindex context`)
    from wcmatch import fnmatch as wcfnmatch
    from wcmatch import glob as wcglob

# A path-like token: has a folder separator or a file extension; Windows separators are accepted.
_PATH_IN_TEXT = re.compile(
    r"(?<![\w/\\.-])((?:[A-Za-z]:)?[\w.\\/-]*[\w-]\.[A-Za-z][A-Za-z0-9]{0,7}|[\w.-]+(?:[\\/][\w.-]+)+)"
)


# A drive letter, then any run of "./" and "/" (one regex pass: a loop of slices is quadratic on "./" * 100000).
_LEADING = re.compile(r"\A(?:[A-Za-z]:/)?(?:\.?/)*")


def normalize_path(path: str) -> str:
    """Forward slashes, no leading ``./`` or ``/``, no drive letter, no empty or ``.`` folder (``a//b``, ``a/./b``):
    the form globs are matched against, and the one name a document has."""
    return without_dot_folders(_LEADING.sub("", path.strip().replace("\\", "/")))


def without_dot_folders(path: str) -> str:
    """``path`` without its empty and ``.`` folders (``./a.md``, ``a//b.md``, ``a/./b.md``: ``a.md``, ``a/b.md``),
    nothing else changed: spaces and backslashes may be part of a file's name."""
    if "//" in path or "./" in path:
        return "/".join(part for part in path.split("/") if part not in ("", "."))
    return path


def paths_in_text(text: str) -> list[str]:
    """File paths mentioned in a message (``src/App.tsx``, ``./web/a.tsx``, ``C:\\proj\\b.tsx``), normalised."""
    return list(dict.fromkeys(path for _, _, path in path_spans(text)))


def path_spans(text: str) -> list[tuple[int, int, str]]:
    """Where ``text`` mentions a file path, and the path normalised: one per mention, in order."""
    out: list[tuple[int, int, str]] = []
    for m in _PATH_IN_TEXT.finditer(text):
        p = normalize_path(m.group(1).rstrip("."))
        if p:
            out.append((m.start(1), m.end(1), p))
    return out


def file_path_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` names a file or a folder, as a chat message pastes one: of the path-like tokens
    :func:`paths_in_text` finds, those with two separators or more (``src/components/``, a trailing one counted),
    or one and a file name with its extension (``src/App.tsx``). ``TCP/IP``, ``CI/CD`` and ``and/or`` are words and
    a bare ``Node.js`` is a name, though a rule's glob may still match them."""
    out: list[tuple[int, int]] = []
    for m in _PATH_IN_TEXT.finditer(text):
        start, end = m.span(1)
        if text[end : end + 1] in ("/", "\\"):
            end += 1
        path = text[start:end].replace("\\", "/")
        if path.count("/") >= 2:
            out.append((start, end))
        elif "/" in path:
            stem, dot, ext = path.rstrip("/").rpartition("/")[2].rpartition(".")
            if dot and stem and 1 <= len(ext) <= 8 and ext[0].isalpha() and ext.isalnum():
                out.append((start, end))
    return out


# Bounds that make matching cheap whatever a message or an author writes: wcmatch's regex work grows with the
# number of path segments raised to the number of "**" in the glob, so both are capped. No real path is longer
# than PATH_MAX (4096) or deeper than 64 folders; a glob needs at most two "**" (e.g. src/**/components/**/*.tsx).
MAX_PATH_CHARS = 4096
MAX_PATH_SEGMENTS = 64
MAX_GLOBSTARS = 2
MAX_STARS = 8
"""Stars in all (a ``**`` counts two): with braces, each one multiplies the ways a deep path can be split among
them (``{*,*/}{*,*/}{*,*/}/**/*/**/*b`` took 0.8 s, an 18-star one 31 s); eight keep every case tried under
15 ms, and real globs use five at most (``src/**/components/**/*.{ts,tsx}``)."""
_BRACE_LIMIT = 64
MAX_COMPILED_EXPANSIONS = 16_384
"""Brace expansions one cache of compiled globs (a loaded index's: :func:`any_match`) compiles in all. Each costs
up to 0.4 ms (a 64-way glob 27 ms, and an entry may hold 16 of them): a KB whose entries held 1,600 such globs made
its first question with a file path take 32 s. Only globs whose literal start fits a path asked about are compiled
(a monorepo's ``pkg0001/**/*.{ts,tsx}`` per package: one package's), so a real KB stays far below; past the
budget, further globs match nothing and :attr:`Compiled.exhausted` says so."""
_GLOB_SYNTAX = "*?[{\\"


class Matcher:
    """A compiled glob, read as SPEC §6.4 reads it: globstar, braces and classes, a glob without ``/`` matching a
    file name (wcmatch's glob), and ``*`` matching across folders as well (wcmatch's fnmatch, for which ``/`` is a
    character like any other): ``web/*.tsx`` matches ``web/src/App.tsx``, as an author who wrote it expects."""

    __slots__ = ("_across", "_glob")

    def __init__(self, glob: wcglob.WcMatcher[str], across: wcfnmatch.WcMatcher[str] | None) -> None:
        self._glob = glob
        self._across = across

    def match(self, path: str) -> bool:
        return bool(self._glob.match(path)) or (self._across is not None and bool(self._across.match(path)))


@lru_cache(maxsize=4096)
def _compile(glob: str) -> Matcher | None:
    from wcmatch import fnmatch as wcfnmatch
    from wcmatch import glob as wcglob

    glob = normalize_path(glob)
    if not glob or glob.count("**") > MAX_GLOBSTARS or glob.count("*") > MAX_STARS:
        return None
    flags = wcglob.GLOBSTAR | wcglob.BRACE | wcglob.IGNORECASE | wcglob.MATCHBASE | wcglob.DOTGLOB
    try:
        matcher = wcglob.compile([glob], flags=flags, limit=_BRACE_LIMIT)
        across = None
        if "/" in glob and "*" in glob:  # else both readings agree
            across_flags = wcfnmatch.BRACE | wcfnmatch.IGNORECASE | wcfnmatch.DOTMATCH
            across = wcfnmatch.compile([_only_stars_cross(glob)], flags=across_flags, limit=_BRACE_LIMIT)
    except Exception:  # wcmatch raises assorted errors (brace limit, bad pattern) for globs it cannot use
        return None
    return Matcher(matcher, across)


def _only_stars_cross(glob: str) -> str:
    """``glob`` for the fnmatch reading, where ``/`` is a character like any other: ``?`` and a negated class
    ``[!…]`` are kept from matching it, so only a star crosses folders (one linear pass; escapes kept)."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        ch = glob[i]
        if ch == "\\" and i + 1 < n:
            out.append(glob[i : i + 2])
            i += 2
        elif ch == "?":
            out.append("[!/]")
            i += 1
        elif ch == "[" and i + 1 < n and glob[i + 1] in "!^":
            out.append("[" + glob[i + 1] + "/")
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def split_globs(text: str) -> list[str]:
    """The globs of one frontmatter string, split at the commas outside braces and classes: Cursor's rules write
    ``globs: src/**/*.ts, src/**/*.tsx``, which was kept as one glob that no path matched, and the rule was never
    shown (one linear pass)."""
    out, start, depth = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "{[":
            depth += 1
        elif ch in "}]" and depth:
            depth -= 1
        elif ch == "," and not depth:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [glob for glob in out if glob]


def usable_glob(glob: str) -> bool:
    """Whether ``glob`` is within the bounds (at most two ``**`` and eight stars in all, at most 64 brace
    expansions), told by expanding its braces, not by compiling it: every scan and every index read checks the
    globs of every entry, and compiling a 64-way glob takes 27 ms. It is compiled when a path is matched."""
    return _expansions(glob) > 0


def _expansions(glob: str) -> int:
    """How many patterns ``glob``'s braces expand to, or 0 when it is out of the bounds."""
    import bracex  # wcmatch's own brace expander, imported with it

    glob = normalize_path(glob)
    if not glob or glob.count("**") > MAX_GLOBSTARS or glob.count("*") > MAX_STARS:
        return 0
    try:
        return sum(1 for _ in bracex.iexpand(glob, limit=_BRACE_LIMIT))
    except Exception:  # bracex raises its own error past the limit, and others for patterns it cannot read
        return 0


def _usable_path(path: str) -> bool:
    return 0 < len(path) <= MAX_PATH_CHARS and path.count("/") < MAX_PATH_SEGMENTS


def glob_matches(glob: str, path: str) -> bool:
    """Whether ``path`` matches ``glob`` (globstar, braces, classes; a glob without ``/`` matches a file name).

    A path longer than ``MAX_PATH_CHARS`` or deeper than ``MAX_PATH_SEGMENTS`` matches nothing: it is no real
    file, and bounding it keeps matching fast.
    """
    path = normalize_path(path)
    matcher = _compile(glob)
    return matcher is not None and _usable_path(path) and bool(matcher.match(path))


class Compiled:
    """A cache of compiled globs (a loaded index keeps one for all of its globs, which the process-wide cache of
    :func:`glob_matches` may be too small to hold), compiling at most ``MAX_COMPILED_EXPANSIONS`` brace expansions
    in all, unless ``bounded`` is false: the settings' ``exclude``, which a KB's owner writes and which must never
    stop excluding."""

    def __init__(self, *, bounded: bool = True) -> None:
        self.matchers: dict[str, Matcher | None] = {}
        self.starts: dict[str, tuple[str, bool]] = {}
        self.spent = 0
        self.bounded = bounded
        self.exhausted = False
        """A glob was left uncompiled for the budget: it matches nothing, though it might have."""

    def get(self, glob: str) -> Matcher | None:
        if glob in self.matchers:
            return self.matchers[glob]
        cost = _expansions(glob)
        matcher = None
        if cost and (not self.bounded or self.spent + cost <= MAX_COMPILED_EXPANSIONS):
            self.spent += cost
            matcher = _compile.__wrapped__(glob)
        elif cost:
            self.exhausted = True
        self.matchers[glob] = matcher
        return matcher

    def may_match(self, glob: str, paths: Sequence[str]) -> bool:
        """Whether one of ``paths`` (normalised) starts as ``glob``'s literal start demands: of the whole path when
        the glob holds a ``/``, else of the file name (a glob without ``/`` matches a name at any depth). Cheap, and
        never false for a path the glob matches; a start with letters beyond ASCII is not compared (case rules)."""
        start = self.starts.get(glob)
        if start is None:
            normal = normalize_path(glob)
            cut = min((i for i in map(normal.find, _GLOB_SYNTAX) if i >= 0), default=len(normal))
            start = self.starts[glob] = (normal[:cut].lower() if normal[:cut].isascii() else "", "/" in normal)
        prefix, whole = start
        if not prefix:
            return True
        return any((p if whole else p.rsplit("/", 1)[-1]).lower().startswith(prefix) for p in paths)


class Scope:
    """The paths a question is asked about, normalised once, and which globs match one of them, each glob looked
    at once: entries often share their globs (``**/*.ts`` on every rule of a front-end folder), and matching every
    entry's globs afresh took 198 ms for a question of 100 paths over 1,444 entries of 16 globs drawn from 40 (10.5
    ms this way). Entries whose globs all differ cost what they did."""

    def __init__(self, paths: Iterable[str], compiled: Compiled | None = None) -> None:
        self.usable = [p for p in (normalize_path(p) for p in paths) if _usable_path(p)]
        self.compiled = compiled
        """The caller's cache of compiled globs (:class:`Compiled`), else the process-wide one."""
        self._seen: dict[str, bool] = {}

    def matches(self, glob: str) -> bool:
        """Whether ``glob`` matches one of the paths."""
        seen = self._seen.get(glob)
        if seen is None:
            seen = self._seen[glob] = self._matches(glob)
        return seen

    def _matches(self, glob: str) -> bool:
        compiled = self.compiled
        if not self.usable or (compiled is not None and not compiled.may_match(glob, self.usable)):
            return False
        matcher = _compile(glob) if compiled is None else compiled.get(glob)
        return matcher is not None and any(matcher.match(p) for p in self.usable)

    def first(self, globs: Iterable[str]) -> str | None:
        """The first of ``globs`` that matches one of the paths, or ``None``."""
        return next((g for g in globs if self.matches(g)), None) if self.usable else None


def any_match(globs: Iterable[str], paths: Iterable[str], compiled: Compiled | None = None) -> str | None:
    """The first glob that matches one of ``paths``, or ``None``; ``compiled``: the caller's cache (:class:`Compiled`),
    else the process-wide one."""
    return Scope(paths, compiled).first(globs)
