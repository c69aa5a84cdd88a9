"""Checking an index on disk against the scan and the JSON contract (``kindex validate``).

The contract's form and bounds are the schema of :class:`kindex.records.Index`: a file is reported exactly where
that schema rejects it (the same schema the HTTP service publishes). On top, validate checks what no schema of one
file can: that the entries match the scanned folder, once each, in the contract's order, and (as far as the scan
memory tells) that no document changed since the step that wrote its entry read it, and (as ``.kindex/stand_ins.json``
tells) which entries are stand-ins a failed model call left.
"""

from __future__ import annotations

import os
import shlex
from collections import Counter
from typing import Any

import orjson

from kindex.errors import KindexError
from kindex.records import BOM, INDEX_FILE, INDEX_VERSION, schema_errors
from kindex.scan import PATH_TOO_LONG, UNREADABLE_FOLDER, scan
from kindex.store import (
    StandIn,
    index_bytes,
    read_stand_ins,
    refusal,
    refuse_theme_folder,
    root_index_path,
    theme_index_path,
)

_ACCEPT = " (with `--model ''` an extractive entry is written and accepted)"


def _retry(fix: str, entry: StandIn) -> str:
    """The step that tries a stand-in's call again: with the model it asked, which a step run without one (no
    ``--model``, ``KINDEX_MODEL`` or ``kindex.toml``) would not ask, writing and accepting an extractive entry."""
    if not entry.model:
        return f"run `{fix}` with the model it asked to try again{_ACCEPT}"
    return f"run `{fix} --model {shlex.quote(entry.model)}` (and the --api-base it used, if any) to try again{_ACCEPT}"


def validate(kb: str | os.PathLike[str]) -> list[str]:
    """Every way the KB's index files break the contract or miss the folder's documents as they are now (one
    changed since its entry was written, when ``.kindex/scan.json`` can tell; one whose model call failed and
    left a stand-in entry), as readable sentences; empty when all is well."""
    s = scan(kb)
    refuse_theme_folder(s.kb, reading=True)
    kb_arg = _arg(os.fspath(kb))  # the fixes name the folder as it was given: a command to paste
    # A folder kindex may not read holds documents no index lists: "index is valid" of a KB whose theme the
    # permissions hid said nothing of it.
    problems = [
        f"{k.path}/: {k.reason}: its documents are not indexed"
        + ("" if k.reason.endswith(PATH_TOO_LONG) else " (give kindex read access)")
        for k in s.skipped
        if k.reason.startswith(f"folder {UNREADABLE_FOLDER}")
    ]
    root = _load(root_index_path(s.kb), INDEX_FILE, problems, f"kindex reindex {kb_arg}")
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
            problems.append(f"{INDEX_FILE}: theme {name!r} has no entry (run `kindex root {kb_arg}`)")
        problems += _coverage(root, INDEX_FILE, {d.path_in_theme for d in s.root_docs}, f"kindex root {kb_arg}")
    for name, docs in s.themes.items():
        label = f"{name}/{INDEX_FILE}"
        step = f"kindex sub {kb_arg} {_arg(name)}"
        index = _load(theme_index_path(s.kb, name), label, problems, step)
        if index is None:
            continue
        if _list(index, "themes"):
            problems.append(f"{label}: 'themes' must be empty in a theme index")
        problems += _entries(index, label, "documents", "path")
        problems += _coverage(index, label, {d.path_in_theme for d in docs}, step)
    changed = set(s.changed())
    stand_ins = read_stand_ins(s.kb)
    if root is not None and INDEX_FILE in stand_ins:
        entry = stand_ins[INDEX_FILE]
        problems.append(
            f"{INDEX_FILE}: its theme and root-document entries are stand-ins (previous or extractive ones): its "
            f"model call failed ({entry.reason}); {_retry(f'kindex root {kb_arg}', entry)}"
        )
    for d in s.documents:
        # The theme and the path apart: `DIR/PATH` reads a backslash in a name (a\\b.md) as a folder.
        fix = (
            f"kindex root {kb_arg}"
            if d.theme is None
            else f"kindex doc {kb_arg} {_arg(d.theme)} {_arg(d.path_in_theme)}"
        )
        if d.rel in changed:
            problems.append(f"{d.rel}: changed since its entry was written (run `{fix}`, or `kindex reindex {kb_arg}`)")
        if d.theme is not None and d.rel in stand_ins:
            problems.append(
                f"{d.rel}: its entry is a stand-in (its previous or an extractive one): its model call failed "
                f"({stand_ins[d.rel].reason}); {_retry(fix, stand_ins[d.rel])}"
            )
    documents = {d.rel for d in s.documents}
    listed = [e for rel, e in stand_ins.items() if rel == INDEX_FILE or rel in documents]
    if len(listed) > 1:
        # After a run the model stopped answering, one `doc` per document is a chore; one reindex asks again only
        # what has no cached answer.
        models = {e.model for e in listed}
        model = f" --model {shlex.quote(models.pop())}" if len(models) == 1 and "" not in models else ""
        problems.append(
            f"{len(listed)} entries are stand-ins: `kindex reindex {kb_arg}{model}` (and the --api-base it used, if "
            "any) tries them all again in one run, and asks the model only what it has no cached answer for"
        )
    return problems


def _arg(value: str) -> str:
    """``value`` as an argument of a command to paste: quoted, and a name starting with ``-`` written ``./-…`` (it
    was read as an option: `kindex sub KB --help` printed the help)."""
    return shlex.quote(f"./{value}" if value.startswith("-") else value)


def _load(path: Any, label: str, problems: list[str], fix: str) -> dict[str, Any] | None:
    try:
        data = index_bytes(path)
    except (FileNotFoundError, NotADirectoryError):
        problems.append(f"{label}: missing (run `{fix}`)")
        return None
    except (OSError, KindexError) as exc:
        reason = exc.message if isinstance(exc, KindexError) else exc.strerror or exc
        # Not a guess (a 200 MB file was asked whether it was a folder): the reason says what it is.
        problems.append(f"{label}: cannot be read ({reason}); move it away, then run `{fix}`")
        return None
    if data.startswith(BOM):  # read as retrieval reads it; a step writes it without
        problems.append(f"{label}: starts with a byte-order mark (an editor's; run `{fix}` to rewrite it)")
        data = data[len(BOM) :]
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        problems.append(f"{label}: not valid JSON ({exc}){_replace_advice(path, label, fix)}")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{label}: not a JSON object{_replace_advice(path, label, fix)}")
        return None
    errors = schema_errors(data)
    if errors and not obj.keys() & {"version", "themes", "documents"}:
        # Another tool's JSON (an OpenAPI document): one problem, not one per key and per missing entry, each
        # advising a step that refuses to replace the file.
        keys = ", ".join(sorted(obj)[:5])
        problems.append(
            f"{label}: not a kindex index (an object with the keys {keys}){_replace_advice(path, label, fix)}"
        )
        return None
    problems.extend(f"{label}: {p}" for p in errors)
    if isinstance(obj.get("version"), (bool, float)):  # JSON true and 1.0 equal 1 in Python: the schema let them by
        problems.append(f"{label}: version breaks the contract: the integer {INDEX_VERSION}, not {obj['version']!r}")
    return obj


def _replace_advice(path: Any, label: str, fix: str) -> str:
    """What to run for an index file that holds no index: the step itself when it will replace the file (kindex's
    own, damaged), else moving the file away first (a step refuses to overwrite another tool's file, and advising
    only the step sent its reader round in circles)."""
    if refusal(path, label):
        return f"; it is not kindex's: move it away, then run `{fix}`"
    return f"; run `{fix}` to write it afresh"


def _list(obj: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = obj.get(key)
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _entries(obj: dict[str, Any], label: str, key: str, id_field: str) -> list[str]:
    raw = obj.get(key)
    ids = [e.get(id_field) for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    names = [x for x in ids if isinstance(x, str)]
    if len(names) == len(ids) and names != sorted(names):
        return [f"{label}: {key!r} are not sorted by {id_field}"]
    return []


def _coverage(obj: dict[str, Any], label: str, scanned: set[str], fix: str) -> list[str]:
    """Entries for documents the scan does not have, and documents without an entry, each with the step (``fix``)
    that rewrites that index from the scan (cached answers are not paid again)."""
    problems = []
    paths = [d.get("path") for d in _list(obj, "documents")]
    for path, n in Counter(paths).items():
        if n > 1:
            problems.append(f"{label}: document {path!r} has {n} entries")
        if path not in scanned:
            problems.append(
                f"{label}: document {path!r} is in the index but not in the folder (deleted, renamed, or skipped: "
                f"`kindex preview` says why) (run `{fix}`)"
            )
    for path in sorted(scanned - set(paths)):
        problems.append(f"{label}: scanned document {path!r} has no entry (run `{fix}`)")
    return problems
