"""Checking an index on disk against the scan and the JSON contract (``kindex validate``)."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import orjson

from kindex.model import INDEX_FILE, INDEX_VERSION, doc_item_from, theme_item_from
from kindex.scan import scan
from kindex.store import root_index_path, theme_index_path


def validate(kb: str | os.PathLike[str]) -> list[str]:
    """Every way the KB's index files break the contract, as readable sentences; empty when all is well."""
    s = scan(kb)
    problems: list[str] = []
    root = _load(root_index_path(s.kb), INDEX_FILE, problems)
    if root is not None:
        problems += _entries(root, INDEX_FILE, "themes", "dir")
        problems += _entries(root, INDEX_FILE, "documents", "path")
        dirs = [t.get("dir") for t in _list(root, "themes")]
        for name, n in Counter(dirs).items():
            if n > 1:
                problems.append(f"{INDEX_FILE}: theme {name!r} has {n} entries")
        for t in _list(root, "themes"):
            if t.get("dir") not in s.themes:
                problems.append(f"{INDEX_FILE}: theme {t.get('dir')!r} is not a scanned theme")
            elif t.get("index_file") != f"{t['dir']}/{INDEX_FILE}":
                problems.append(f"{INDEX_FILE}: theme {t['dir']!r} has index_file {t.get('index_file')!r}")
        for name in sorted(set(s.themes) - set(dirs)):
            problems.append(f"{INDEX_FILE}: theme {name!r} has no entry")
        problems += _coverage(root, INDEX_FILE, {d.path_in_theme for d in s.root_docs})
    for name, docs in s.themes.items():
        label = f"{name}/{INDEX_FILE}"
        index = _load(theme_index_path(s.kb, name), label, problems)
        if index is None:
            continue
        if _list(index, "themes"):
            problems.append(f"{label}: 'themes' must be empty in a theme index")
        problems += _entries(index, label, "documents", "path")
        problems += _coverage(index, label, {d.path_in_theme for d in docs})
    return problems


def _load(path: Any, label: str, problems: list[str]) -> dict[str, Any] | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        problems.append(f"{label}: missing (run `kindex reindex`)")
        return None
    except OSError as exc:
        problems.append(f"{label}: cannot be read ({exc.strerror or exc}): a folder or special file in its place?")
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        problems.append(f"{label}: not valid JSON ({exc})")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{label}: not a JSON object")
        return None
    if obj.get("version") != INDEX_VERSION:
        problems.append(f"{label}: version is {obj.get('version')!r}, expected {INDEX_VERSION}")
    for key in ("themes", "documents"):
        if not isinstance(obj.get(key), list):
            problems.append(f"{label}: {key!r} is missing or not a list")
    return obj


def _list(obj: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = obj.get(key)
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


# Keys an entry may carry that its cleaned form leaves out when empty.
_OPTIONAL = frozenset({"paths", "questions", "tags"})


def _entries(obj: dict[str, Any], label: str, key: str, id_field: str) -> list[str]:
    problems = []
    raw = obj.get(key)
    for i, entry in enumerate(raw if isinstance(raw, list) else []):
        where = f"{label}: {key}[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where} is not an object")
            continue
        for name in (id_field, "title", "summary"):
            if not isinstance(entry.get(name), str) or not entry[name].strip():
                problems.append(f"{where} has no {name}")
        tags = entry.get("tags")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            problems.append(f"{where} 'tags' is not a list of strings")
        for optional in ("paths", "questions"):
            value = entry.get(optional)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                problems.append(f"{where} {optional!r} is not a list of strings")
        problems += _bounds(entry, where, key)
    ids = [e.get(id_field) for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    names = [x for x in ids if isinstance(x, str)]
    if len(names) == len(ids) and names != sorted(names):
        problems.append(f"{label}: {key!r} are not sorted by {id_field}")
    return problems


def _bounds(entry: dict[str, Any], where: str, key: str) -> list[str]:
    """What the contract's cleaning would change in ``entry``: a bound broken, a key it does not have.

    The contract is the cleaning kindex applies to every entry it writes (``kindex.model``), so an entry is valid
    exactly when cleaning it changes nothing.
    """
    ident = entry.get("dir" if key == "themes" else "path")
    if not isinstance(ident, str):
        return []
    clean = (theme_item_from(entry, ident) if key == "themes" else doc_item_from(entry, ident)).to_dict()
    out = [
        f"{where} has a key the contract does not have: {k!r}" for k in entry if k not in clean and k not in _OPTIONAL
    ]
    for name, value in clean.items():
        if name in entry and entry[name] != value and name not in ("index_file",):
            out.append(f"{where} {name!r} breaks the contract's bounds or form (kindex would write {value!r})")
    return out


def _coverage(obj: dict[str, Any], label: str, scanned: set[str]) -> list[str]:
    problems = []
    paths = [d.get("path") for d in _list(obj, "documents")]
    for path, n in Counter(paths).items():
        if n > 1:
            problems.append(f"{label}: document {path!r} has {n} entries")
        if path not in scanned:
            problems.append(f"{label}: document {path!r} is not a scanned document here")
    for path in sorted(scanned - set(paths)):
        problems.append(f"{label}: scanned document {path!r} has no entry")
    return problems
