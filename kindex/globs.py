"""``paths`` globs (SPEC §6.4) and the file paths a chat message mentions."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache

# A path-like token: has a folder separator or a file extension; Windows separators are accepted.
_PATH_IN_TEXT = re.compile(
    r"(?<![\w/\\.-])((?:[A-Za-z]:)?[\w.\\/-]*[\w-]\.[A-Za-z][A-Za-z0-9]{0,7}|[\w.-]+(?:[\\/][\w.-]+)+)"
)


def normalize_path(path: str) -> str:
    """Forward slashes, no leading ``./`` or ``/``, no drive letter: the form globs are matched against."""
    path = path.strip().replace("\\", "/")
    path = re.sub(r"^[A-Za-z]:/", "", path)
    while path.startswith(("./", "/")):
        path = path[1:] if path.startswith("/") else path[2:]
    return path


def paths_in_text(text: str) -> list[str]:
    """File paths mentioned in a message (``src/App.tsx``, ``./web/a.tsx``, ``C:\\proj\\b.tsx``), normalised."""
    out: list[str] = []
    for m in _PATH_IN_TEXT.finditer(text):
        p = normalize_path(m.group(1).rstrip("."))
        if p and p not in out:
            out.append(p)
    return out


@cache
def _compile(glob: str) -> re.Pattern[str]:
    glob = normalize_path(glob)
    parts: list[str] = []
    i = 0
    while i < len(glob):
        ch = glob[i]
        if glob.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
            continue
        if ch == "*":
            while i < len(glob) and glob[i] == "*":
                i += 1
            parts.append(".*")  # SPEC §6.4: * and ** both match across folders
            continue
        parts.append("[^/]" if ch == "?" else re.escape(ch))
        i += 1
    return re.compile("".join(parts) + r"\Z", re.IGNORECASE)


def glob_matches(glob: str, path: str) -> bool:
    """Whether ``path`` matches ``glob``; a glob without ``/`` also matches a bare file name."""
    path = normalize_path(path)
    pattern = _compile(glob)
    if pattern.match(path):
        return True
    return "/" not in normalize_path(glob) and pattern.match(path.rsplit("/", 1)[-1]) is not None


def any_match(globs: Iterable[str], paths: Iterable[str]) -> str | None:
    """The first glob that matches one of ``paths``, or ``None``."""
    paths = list(paths)
    return next((g for g in globs for p in paths if glob_matches(g, p)), None)
