"""Watch mode: keep a KB's index current as its documents change (``kindex watch``, the HTTP service per agent).

Changes are gathered by ``watchfiles`` and debounced, then each batch becomes the smallest steps that bring the
index up to date: an edited or added document is one ``doc`` step (its entry and its theme index, one model call),
a deleted one rewrites its theme index from cached answers (no call), a document at the root or a theme that
appeared or vanished re-asks the root, and an edited ``kindex.toml`` runs the whole pipeline (answers cached:
only what its new settings change is paid). kindex's own writes (``index.json``, ``.kindex/``) are not changes.

Long because the watch loop (restarted when the file watcher itself fails), the batching and the retry of a
failed batch share one watcher's state.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import watchfiles

from kindex.config import CONFIG_FILE
from kindex.errors import BusyError, CancelledRun, InterruptedRun, KindexError, ModelError, StorageError
from kindex.files import identity, regular_file, walk
from kindex.generate import Options
from kindex.kb import KnowledgeBase
from kindex.lock import WatchLock, watch_lock
from kindex.records import INDEX_FILE
from kindex.results import RunReport
from kindex.scan import scan
from kindex.store import read_index, refuse_theme_folder, root_index_path, theme_index_path

DEFAULT_DEBOUNCE_MS = 1600
"""Changes arriving within this time of each other are handled as one batch (an editor's save-rename-delete)."""
WRITER_WAIT_SECONDS = 300.0
"""How long an update waits for another writer (a reindex over HTTP, a CLI run) before it reports busy."""
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 600.0
RETRY_LIMIT = 8
"""A batch that failed for a reason that may pass (the model unreachable, overloaded or answering badly, so that
documents got stand-in entries; another writer busy; a full disk) is tried again after ``RETRY_FIRST_S``, then
after twice as long each time up to ``RETRY_MAX_S``, at most ``RETRY_LIMIT`` times (about 45 minutes), unless a new
change joins it first. One that failed on the documents (a broken ``kindex.toml``) waits for a change: trying it
again would fail again. Answers already paid for are cached, so a retry pays only for what failed."""
_MAY_PASS = (ModelError, BusyError, StorageError)
_STOPPED = "stopped before the update was done: it is tried again when the folder is watched again"
_clock = time.monotonic  # a name of this module, so a test can move time without sleeping


@dataclass(frozen=True, slots=True)
class Update:
    """One batch of changes and what was done about it."""

    changed: tuple[str, ...]
    """KB-relative paths added or modified."""
    removed: tuple[str, ...]
    steps: tuple[str, ...]
    """The steps run, e.g. ``doc billing/退款政策.md``, ``sub billing``, ``root``, ``reindex``."""
    reports: tuple[RunReport, ...] = ()
    error: str | None = None
    """Set when a step failed; the index files stay as they were or complete."""
    retry_in: float | None = None
    """After a failure that may pass (see ``RETRY_FIRST_S``): seconds until the batch is tried again unasked.
    ``None``: the next change tries again."""
    retry_at: float | None = None
    """When that is (seconds since the epoch)."""

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.reports)

    @property
    def written(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(w for r in self.reports for w in r.written))


DOCS_PER_THEME_STEP = 2
"""Changed documents of one theme in a batch that are merged one by one; more make one step for the theme."""


@dataclass
class _Plan:
    reindex: bool = False
    root: bool = False
    subs: set[str] = field(default_factory=set)
    docs: list[tuple[str, str]] = field(default_factory=list)


def relevant(kb: Path, path: str) -> str | None:
    """The KB-relative path of a change worth handling (a document or ``kindex.toml``), else ``None``."""
    full = Path(path)
    if not full.is_relative_to(kb):  # watchfiles reports paths under the (resolved) folder it was given
        return None
    rel = full.relative_to(kb).as_posix()
    if any(part.startswith(".") for part in rel.split("/")):
        return None
    if rel == CONFIG_FILE or (rel.endswith(".md") and not rel.endswith(INDEX_FILE)):
        return rel
    return None


def _vanished_folder(root: Path, full: Path) -> str | None:
    """For a deleted path that was no document: a placeholder under the folder's theme (``theme/``), so the
    theme is rewritten; ``None`` for kindex's own files and hidden ones."""
    if not full.is_relative_to(root):
        return None
    rel = full.relative_to(root).as_posix()
    parts = rel.split("/")
    if any(part.startswith(".") for part in parts) or parts[-1] in (INDEX_FILE, CONFIG_FILE) or "." in parts[-1]:
        return None
    return f"{parts[0]}/" if len(parts) > 1 else f"{rel}/"


def plan(
    themes_before: set[str],
    themes_after: set[str],
    changed: Iterable[str],
    removed: Iterable[str],
    unindexed: Iterable[str] = (),
) -> _Plan:
    """The smallest steps that bring the index up to date with these changes. ``unindexed``: themes without their
    index file (never indexed, deleted by hand), written whole so the index is not left partial."""
    out = _Plan(subs=set(unindexed) & themes_after)
    if themes_before != themes_after:
        out.root = True
    for rel in changed:
        if rel == CONFIG_FILE:
            out.reindex = True
        elif "/" not in rel:
            out.root = True
        else:
            theme, path = rel.split("/", 1)
            if not path:  # a folder placeholder: its theme is written whole
                if theme in themes_after:
                    out.subs.add(theme)
            elif theme in themes_after and theme in themes_before:
                out.docs.append((theme, path))
            elif theme in themes_after:
                out.subs.add(theme)  # a new theme: its index is written whole
    for rel in removed:
        if rel == CONFIG_FILE:
            out.reindex = True
        elif "/" not in rel:
            out.root = True
        else:
            theme = rel.split("/", 1)[0]
            if theme in themes_after:
                out.subs.add(theme)  # rewritten from cached answers: the deleted entry goes, nothing is paid
    docs = list(dict.fromkeys(out.docs))
    per_theme = Counter(t for t, _ in docs)
    # Each step pays for its KB (a scan, the search tables updated and saved): a burst of 30 edits in one theme was
    # 30 doc steps, 59 s at 7,000 documents. One theme step asks the model only what changed (the rest is cached).
    out.subs |= {t for t, n in per_theme.items() if n > DOCS_PER_THEME_STEP}
    out.docs = [(t, p) for t, p in docs if t not in out.subs]
    return out


def _relevant_changes(root: Path, changes: Iterable[tuple[watchfiles.Change, str]]) -> tuple[set[str], set[str]]:
    """The documents (and ``kindex.toml``) added or modified, and removed, in a batch of ``watchfiles`` events."""
    changed: set[str] = set()
    removed: set[str] = set()
    for change, path in changes:
        full = Path(path)
        if change == watchfiles.Change.added and full.is_dir():
            # Files written into a new folder before its watch was set up are reported by nobody: the folder's
            # documents are taken as added. A hidden folder holds none; one gone again (a build's temporary tree)
            # holds nothing any more.
            if full.is_relative_to(root) and not any(p.startswith(".") for p in full.relative_to(root).parts):
                for here, _, dirnames, filenames, _ in walk(full):
                    dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                    changed.update(r for name in filenames if (r := relevant(root, str(here / name))) is not None)
            continue
        rel = relevant(root, path)
        if rel is None and change == watchfiles.Change.deleted:
            # A folder moved away (or renamed to a hidden name) is one event for the folder, none for its files:
            # its theme is rewritten (from cached answers), or the root re-asked if it was one.
            rel = _vanished_folder(root, full)
        if rel is None:
            continue
        if change == watchfiles.Change.deleted:
            removed.add(rel)
            changed.discard(rel)
        else:
            changed.add(rel)
            removed.discard(rel)
    # A batch is a set: a save that replaces the file (JetBrains' safe write, an editor's rename over it) is a deletion
    # and an addition of one path in no order, and whichever came last in the set was reported. What is there decides.
    back = {rel for rel in removed if not rel.endswith("/") and regular_file(root / rel)}
    return changed | back, removed - back


def _links_to(root: Path, paths: Iterable[str], candidates: Iterable[str]) -> list[str]:
    """Those of ``candidates`` (KB-relative, not among ``paths``) that are symbolic links leading to one of ``paths``
    (whether or not it still exists). One ``lstat`` per candidate, and none when ``paths`` holds no document."""
    given = [p for p in paths if p != CONFIG_FILE and not p.endswith("/")]
    if not given:
        return []
    targets = {os.path.realpath(root / p) for p in given}
    return [
        c for c in candidates if c not in given and (root / c).is_symlink() and os.path.realpath(root / c) in targets
    ]


@dataclass(frozen=True, slots=True)
class Batch:
    """Changes handled together: documents (and ``kindex.toml``) changed and removed, KB-relative."""

    changed: frozenset[str]
    removed: frozenset[str]
    whole: bool = False
    """The whole KB: the reindex a watcher starts with (see ``reconcile``)."""


@dataclass(frozen=True, slots=True)
class Pending:
    """A batch waiting to be tried again, with its tries so far and when it is due: what a watcher stopped before
    hands to the next (``resume``), so that stopping and starting does not skip the backoff or the limit."""

    batch: Batch
    tries: int
    due: float
    """``time.monotonic`` value."""


class _Replaced(KindexError):
    """The watched folder's name now leads to another folder: it is watched again."""


def _indexed_themes(kb: Path) -> set[str] | None:
    """The themes the root index on disk lists (``None``: it cannot be read): what a batch is planned against. A
    step that failed may already have rewritten the root, so a set kept in memory can be wrong either way."""
    index = read_index(root_index_path(kb))
    return None if index is None else {t.dir for t in index.themes}


MAX_RESTARTS_PER_MINUTE = 10
"""How often the file watcher may fail and be started again within a minute before the watch stops, said."""


class Watcher:
    """Keeps one KB's index current until :meth:`stop` (or ``stop_event``) ends :meth:`run`.

    ``reconcile``: once the folder is watched, start with a reindex of the whole KB (cached answers make it cheap),
    so that what changed while nobody watched is indexed; it fails and is retried as any batch is. ``resume``: the
    :attr:`pending` batch of a watcher stopped before, tried again when it is due."""

    def __init__(
        self,
        kb: KnowledgeBase,
        on_update: Callable[[Update], None],
        *,
        debounce_ms: int = DEFAULT_DEBOUNCE_MS,
        on_ready: Callable[[], None] | None = None,
        stop_event: threading.Event | None = None,
        retry_s: float = RETRY_FIRST_S,
        reconcile: bool = False,
        resume: Pending | None = None,
    ) -> None:
        self.kb = kb
        self.on_update = on_update
        self.on_ready = on_ready
        self.debounce_ms = debounce_ms
        self.stopped = stop_event or threading.Event()
        self.ready = threading.Event()
        """Set once the folder is watched: every change after it is seen."""
        self.retry_s = retry_s
        self.reconcile = reconcile
        self._pending: Batch | None = resume.batch if resume else None
        """The batch that failed for a reason that may pass, until it is done or given up."""
        self._retry_at = resume.due if resume else 0.0
        self._tries = resume.tries if resume else 0
        """Attempts at the pending batch since its first failure, a new change joining it included."""
        self._lock: WatchLock | None = None

    def stop(self) -> None:
        self.stopped.set()

    def claim(self) -> None:
        """Take the KB's watch lock now (:class:`BusyError` when another watch holds it, in this process or any
        other) rather than when :meth:`run` starts: a caller that runs it on a thread can refuse at once. Held until
        :meth:`run` ends."""
        if self._lock is None:
            self._lock = watch_lock(self.kb.path)

    @property
    def pending(self) -> Pending | None:
        """The batch waiting to be tried again, if any: what a watcher started later can ``resume``."""
        return None if self._pending is None else Pending(self._pending, self._tries, self._retry_at)

    def run(self) -> None:
        """Watch until stopped (or until the folder itself is gone). Each batch is handled before the next is
        gathered; failures are reported through ``on_update``, not raised, except an interrupted step
        (:class:`InterruptedRun`, Ctrl-C), which ends the watch, a folder that is a theme of the KB above it
        (:class:`ThemeFolderError` before anything is watched: no step could ever succeed there), and another
        watch of the folder (:class:`BusyError`, see :meth:`claim`) or one that cannot be written
        (:class:`StorageError`)."""
        root = self.kb.path
        try:  # a lock claimed before run (the service's) is released whatever ends it, a refusal here included
            refuse_theme_folder(root)
            self.claim()
            self._run(root)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _run(self, root: Path) -> None:
        try:
            scan(root)
        except KindexError as exc:  # a broken kindex.toml: said, and watched until it is fixed
            self.on_update(Update((), (), (), (), exc.message))
        restarts: list[float] = []
        while not self.stopped.is_set():
            try:
                self._watch(root, first=not self.ready.is_set())  # a restart before the first yield is the first
                return
            except (RuntimeError, _Replaced) as exc:  # watchfiles' own failure (a file name that is not UTF-8)
                now = _clock()
                restarts = [t for t in restarts if now - t < 60.0] + [now]
                if len(restarts) > MAX_RESTARTS_PER_MINUTE:
                    self.on_update(Update((), (), (), (), f"the file watcher keeps failing ({exc}): stopped watching"))
                    self.stopped.set()
                    return
                # Watched again from scratch, then the whole KB reconciled: what changed meanwhile is not lost.
                said = str(exc) if isinstance(exc, _Replaced) else f"the file watcher failed ({exc})"
                self.on_update(Update((), (), (), (), f"{said}: watching again"))

    def _watch(self, root: Path, *, first: bool) -> None:
        ready = False
        watched = identity(root)
        for changes in watchfiles.watch(
            root,
            # `step` is the quiet time that ends a batch; `debounce` only caps how long one batch may grow.
            step=self.debounce_ms,
            debounce=max(10 * self.debounce_ms, 10_000),
            stop_event=self.stopped,
            yield_on_timeout=True,
            rust_timeout=max(200, self.debounce_ms),
            raise_interrupt=True,
        ):
            if not ready:
                ready = True  # the first yield comes after the watch is registered: no change can be missed now
                if first:
                    self.ready.set()
                    if self.on_ready is not None:
                        self.on_ready()
                if self.reconcile or not first:
                    self._apply(Batch(frozenset(), frozenset(), whole=True))
            if changes and not root.is_dir():
                self.on_update(Update((), (), (), (), f"{root} is gone: stopped watching it"))
                self.stopped.set()
                return
            now = identity(root)
            if now is not None and now != watched:
                # A new folder under the name (a deploy's `mv new kb`, rm -rf and a fresh copy): the watch follows the
                # old one, wherever it went, and heard nothing of the new.
                raise _Replaced(f"{root} was replaced by another folder of that name")
            try:
                self._handle(changes)
            except InterruptedRun:
                raise
            except Exception as exc:  # outside a step (reading the events, the root index): said, and watched on
                self.on_update(Update((), (), (), (), f"unexpected {type(exc).__name__}: {exc}"))

    def _handle(self, changes: set[tuple[watchfiles.Change, str]]) -> None:
        """One batch of events (none: a quiet interval), and the pending batch if it is due."""
        changed, removed = _relevant_changes(self.kb.path, changes)
        pending = self._pending
        if changed or removed:
            if pending is not None:  # a failed batch joins this one; what just happened to a path wins
                changed, removed = changed | (pending.changed - removed), removed | (pending.removed - changed)
                self._tries += 1  # an attempt at the failed batch too: the limit holds on a busy KB
            self._apply(Batch(frozenset(changed), frozenset(removed), pending is not None and pending.whole))
        elif pending is not None and _clock() >= self._retry_at:
            # Only when due: kindex's own writes and other files are events too, and must not bring it forward.
            self._tries += 1
            self._apply(pending)

    def _apply(self, batch: Batch) -> None:
        changed, removed = sorted(batch.changed), sorted(batch.removed)
        try:
            s = scan(self.kb.path)
        except KindexError as exc:
            self._report(batch, (), [], [exc.message], isinstance(exc, _MAY_PASS))
            return
        # A changed file the scan did not take (not UTF-8, empty, too large, a symlink out…) is gone from the index.
        scanned = {d.rel for d in s.documents}
        skipped = {x.path: x.reason for x in s.skipped}
        # A document that is a link to another changes with it, and is read no more once it is gone; watchfiles
        # reports only the file written or deleted, so its links are looked for here.
        changed = sorted({*changed, *_links_to(self.kb.path, changed, scanned)})
        removed = sorted({*removed, *_links_to(self.kb.path, removed, skipped)})
        notes = tuple(f"{rel}: skipped: {skipped[rel]}" for rel in changed if rel in skipped)
        unscannable = [rel for rel in changed if rel != CONFIG_FILE and rel not in scanned]
        changed = [rel for rel in changed if rel not in unscannable]
        indexed = _indexed_themes(self.kb.path)
        unindexed = [t for t in s.themes if not theme_index_path(self.kb.path, t).is_file()]
        before = set() if indexed is None else indexed
        steps = plan(before, set(s.themes), changed, sorted({*removed, *unscannable}), unindexed)
        steps.reindex = steps.reindex or batch.whole
        steps.root = steps.root or indexed is None
        reports: list[RunReport] = []
        done: list[str] = []
        try:
            if steps.reindex:
                reports.append(self.kb.reindex(self._options()))
                done.append("reindex")
            else:
                if steps.root:
                    reports.append(self.kb.root(self._options()))
                    done.append("root")
                for theme in sorted(steps.subs):
                    reports.append(self.kb.sub(theme, self._options()))
                    done.append(f"sub {theme}")
                for theme, path in steps.docs:
                    reports.append(self.kb.doc(theme, path, options=self._options()))
                    done.append(f"doc {theme}/{path}")
        except InterruptedRun as exc:
            # Ctrl-C ends the watch: the interrupted batch is said, and the next watch's reindex picks it up.
            self.stopped.set()
            update = Update(tuple(changed), tuple(removed), tuple(done), (*reports, exc.report), _STOPPED)
            self.on_update(update)
            raise
        except CancelledRun:
            # Stopped mid-step (a DELETE …/watch, a shutdown): the batch is not done, whatever its failure count.
            self._pending = batch
            self.on_update(Update(tuple(changed), tuple(removed), tuple(done), tuple(reports), _STOPPED))
            return
        except KindexError as exc:
            self._report(batch, tuple(done), reports, [*notes, exc.message], isinstance(exc, _MAY_PASS))
            return
        except Exception as exc:  # a watcher's thread must outlive a failure it did not foresee
            problem = f"unexpected {type(exc).__name__}: {exc}"
            self._report(batch, tuple(done), reports, [*notes, problem], True)
            return
        failures = [f for r in reports for f in r.failures]
        if failures:  # stand-in entries: the model failed on some documents after its own retries
            shown = "; ".join(f"{f.path}: {f.reason}" for f in failures[:3]) + ("; …" if len(failures) > 3 else "")
            problem = f"stand-in entries for {len(failures)} documents (the model's answers failed): {shown}"
            # Only a failed call may pass; an answer unusable even after a repair request would be paid again.
            self._report(batch, tuple(done), reports, [*notes, problem], any(f.transient for f in failures))
            return
        self._pending, self._tries = None, 0
        update = Update(tuple(changed), tuple(removed), tuple(done), tuple(reports), "; ".join(notes) or None)
        self.on_update(update)

    def _report(
        self,
        batch: Batch,
        done: tuple[str, ...],
        reports: list[RunReport],
        problems: list[str],
        may_pass: bool,
    ) -> None:
        """Reports a failed batch, kept to be tried again if its failure may pass and it has not been tried
        ``RETRY_LIMIT`` times (see ``RETRY_FIRST_S``)."""
        changed, removed = tuple(sorted(batch.changed)), tuple(sorted(batch.removed))
        if not may_pass or self._tries >= RETRY_LIMIT:
            self._pending, self._tries = None, 0
            if may_pass:
                problems = [*problems, f"gave up after {RETRY_LIMIT} tries"]
            self.on_update(Update(changed, removed, done, tuple(reports), "; ".join(problems)))
            return
        delay = min(self.retry_s * 2**self._tries, max(RETRY_MAX_S, self.retry_s))
        self._pending, self._retry_at = batch, _clock() + delay
        update = Update(changed, removed, done, tuple(reports), "; ".join(problems), delay, time.time() + delay)
        self.on_update(update)

    def _options(self) -> Options:
        # Waits for another writer rather than failing, and a stop cancels a step in flight before its next write.
        return replace(self.kb.settings.generation, wait=WRITER_WAIT_SECONDS, cancel=self.stopped)
