"""The generation steps (SPEC §4): preview, root, sub, doc and the whole reindex pipeline.

Every step is a library function that reports progress through a callback and returns a :class:`RunReport`.
Model answers are cached under ``.kindex/`` by what determines them, so an unchanged document is never paid for
twice, and a document whose model answers failed keeps its previous entry (or gets an extractive one).

Long because the runner's steps (root, theme, document, whole run) share one run's state (answer cache,
semaphore, tally, cancel event) and its write order; kept together, the rule "nothing is written after a cancel"
lives in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from kindex import extractive, searchindex, skillmodel
from kindex.cache import Cache
from kindex.config import DEFAULTS
from kindex.errors import (
    AnswerError,
    CancelledRun,
    GenerationFailed,
    IndexMissingError,
    InterruptedRun,
    InvalidFileError,
    KBNotFoundError,
    KindexError,
    ModelError,
    StorageError,
    UsageError,
)
from kindex.files import regular_file
from kindex.generators import (
    Answer,
    Generator,
    Usage,
    doc_messages,
    make_generator,
    root_answer_needed,
    root_docs_apart,
    root_messages,
)
from kindex.jsonextract import TRUNCATED
from kindex.llm import TIMED_OUT, LiteLLMClient, LLMClient, LLMSettings, check_model, import_litellm
from kindex.lock import HOLDER_FILE, HeldLock, write_lock
from kindex.records import INDEX_FILE, DocItem, Index, ThemeItem, doc_item_from, theme_item_from
from kindex.results import Failure, Plan, Preview, RunReport, Skipped, StepProgress, TokenEstimate
from kindex.sanitize import doc_entry, root_index, theme_index
from kindex.scan import DEFAULT_EXCERPT_CHARS, SCAN_FILE, Scan, ScannedDoc, scan
from kindex.store import (
    STATE_DIR,
    index_bytes,
    note_stand_ins,
    read_index,
    refuse_foreign,
    refuse_knowledge_folders,
    refuse_theme_folder,
    root_index_path,
    theme_index_path,
    write_index,
)
from kindex.tokenize import estimate_tokens

T = TypeVar("T")
DEFAULT_CONCURRENCY: int = DEFAULTS["concurrency"]
# What a typical answer costs, for estimates: a document entry ~150 tokens, a root entry ~60 per item.
DOC_ANSWER_TOKENS = 150
ROOT_ANSWER_TOKENS_PER_ITEM = 60


@dataclass(frozen=True, slots=True)
class Progress:
    """One finished unit of work: ``completed`` of ``total`` for the running step."""

    step: str
    completed: int
    total: int
    item: str


ProgressCallback = Callable[[Progress], None]


@dataclass
class _Tally:
    """A step's report while it runs (the runner adds to it); :meth:`report` freezes it."""

    step: str
    generator: str
    offline: bool
    total: int = 0
    completed: int = 0
    cache_hits: int = 0
    usage: Usage = field(default_factory=Usage)
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    documents_read: int = 0

    def report(self, wall_seconds: float) -> RunReport:
        u = self.usage
        return RunReport(
            step=self.step,
            generator=self.generator,
            offline=self.offline,
            progress=StepProgress(completed=self.completed, total=self.total),
            calls=u.calls,
            cache_hits=self.cache_hits,
            retries=u.retries,
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            cost=u.cost,
            failures=tuple(self.failures),
            notes=tuple(self.notes),
            written=tuple(self.written),
            skipped=tuple(self.skipped),
            documents_read=self.documents_read,
            wall_seconds=wall_seconds,
        )


@dataclass(frozen=True, slots=True)
class Options:
    """Settings shared by the generation steps."""

    llm: LLMSettings = field(default_factory=LLMSettings)
    client: LLMClient | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    excerpt_chars: int = DEFAULT_EXCERPT_CHARS
    force: bool = False
    """Ask the model again instead of using cached answers, and read every document instead of what the last scan
    remembered of the unchanged ones."""
    wait: float = 0.0
    on_progress: ProgressCallback | None = None
    cancel: threading.Event | None = None
    """Set it to stop the run: no model call is started and no file is written after that."""

    def check(self) -> None:
        if self.concurrency < 1:
            raise UsageError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.excerpt_chars < 100:
            raise UsageError(f"excerpt length must be at least 100 characters, got {self.excerpt_chars}")
        self.llm.check()


def preview(kb: str | os.PathLike[str], options: Options | None = None) -> Preview:
    """Scan ``kb`` and estimate a full run; never calls (or imports) a model."""
    opts = options or Options()
    opts.check()
    s = scan(kb, excerpt_chars=opts.excerpt_chars)
    refuse_theme_folder(s.kb)  # what it previews would break the KB above
    refuse_knowledge_folders(s.kb, s.themes)  # or the KBs below
    apart = root_docs_apart(s)  # root documents with calls of their own: in the estimate, not in the steps
    prompt = sum(_tokens_of(doc_messages(d)) for d in s.documents if d.theme is not None or apart)
    prompt += _tokens_of(root_messages(s)) if root_answer_needed(s) else 0
    completion = DOC_ANSWER_TOKENS * (len(s.documents) - len(s.root_docs) + len(apart))
    completion += ROOT_ANSWER_TOKENS_PER_ITEM * (len(s.themes) + len(s.root_docs) - len(apart))
    steps = 1 + sum(len(d) for d in s.themes.values())
    return Preview(
        kb=str(s.kb),
        steps_total=steps,
        top_dirs=tuple(s.themes),
        top_dir_docs={name: tuple(d.path_in_theme for d in docs) for name, docs in s.themes.items()},
        root_docs=tuple(d.rel for d in s.root_docs),
        llm_configured=opts.llm.configured or opts.client is not None,
        model=opts.llm.model,
        skipped=s.skipped,
        warnings=s.warnings,
        estimated_tokens=TokenEstimate(
            prompt=prompt, completion=completion, calls=steps - (not root_answer_needed(s)) + len(apart)
        ),
    )


def _tokens_of(messages: Any) -> int:
    return sum(estimate_tokens(m["content"]) + 4 for m in messages)


def reindex(kb: str | os.PathLike[str], options: Options | None = None) -> RunReport:
    """The whole pipeline: root index, then every theme's documents (concurrently), then the theme indexes."""
    return _run(kb, options, "reindex", lambda r: r.reindex())


def root(kb: str | os.PathLike[str], options: Options | None = None) -> RunReport:
    """Write the root ``index.json`` only."""
    return _run(kb, options, "root", lambda r: r.root())


def sub(kb: str | os.PathLike[str], dir_name: str, options: Options | None = None) -> RunReport:
    """Write ``DIR/index.json``: one entry per scanned document of theme ``dir_name``."""
    dir_name = _theme_arg(dir_name)
    return _run(kb, options, "sub", lambda r: r.theme(dir_name), subject=dir_name)


def doc(
    kb: str | os.PathLike[str],
    dir_name: str,
    path: str,
    options: Options | None = None,
    *,
    clear_dir: bool = False,
) -> RunReport:
    """Merge one document's entry into ``DIR/index.json``; ``clear_dir`` starts that theme index afresh."""
    dir_name = _theme_arg(dir_name)
    if not isinstance(path, str):
        raise UsageError(f"the document must be a path (a string), got {type(path).__name__}")
    return _run(
        kb, options, "doc", lambda r: r.one_doc(dir_name, path, clear_dir), dir_name, read_again=f"{dir_name}/{path}"
    )


def _theme_arg(dir_name: object) -> str:
    """The theme folder a step was given: ``billing/``, as a shell's completion writes it, is ``billing``."""
    if not isinstance(dir_name, str):
        raise UsageError(f"the theme must be a folder name (a string), got {type(dir_name).__name__}")
    return dir_name.rstrip("/") or dir_name


def _run(
    kb: str | os.PathLike[str],
    options: Options | None,
    step: str,
    body: Callable[[_Runner], Any],
    subject: str | None = None,
    read_again: str | None = None,
) -> RunReport:
    opts = options or Options()
    opts.check()
    started = time.monotonic()  # the scan included: a 2 MB frontmatter took a minute to scan, and "0.1 s" was said
    before = _written(Path(kb))

    def scanned() -> Scan:
        # What the step is about is read from disk whatever the scan remembers; `force` reads every document.
        got = scan(kb, excerpt_chars=opts.excerpt_chars, reuse=not opts.force, read_again=read_again or subject)
        refuse_theme_folder(got.kb)
        refuse_knowledge_folders(got.kb, got.themes)
        if subject is not None:
            got.theme_docs(subject)  # a bad DIR is the caller's mistake: say so before locking or loading a model
        return got

    s = scanned()
    # The lock first: a second writer is refused at once, not after the model adapter has loaded (seconds).
    with write_lock(s.kb, step, wait=opts.wait, cancel=opts.cancel) as held:
        if _written(s.kb) != before:
            # Another writer ran since the scan (this step waited for it, or it ended just before): an edit it
            # indexed, a page it added or removed. Merged from the old scan, this step's write would undo that one's
            # (a later save lost, a deleted page back in the index).
            s = scanned()
        themes = list(s.themes) if step == "reindex" else [subject] if subject is not None else []
        for theme in themes:
            refuse_foreign(theme_index_path(s.kb, theme), f"{theme}/{INDEX_FILE}")
        if step in ("reindex", "root"):
            refuse_foreign(root_index_path(s.kb), INDEX_FILE)
        generator = make_generator(opts.llm, opts.client, opts.cancel)
        remove_stale_temporaries(s)
        runner = _Runner(s, generator, opts, step, held)
        runner.report.skipped = list(s.skipped)
        # The scan's warnings (said by preview only, before), of what the step covers: a theme's for sub and doc.
        within = "" if subject is None else subject + "/"
        runner.report.notes.extend(f"{w.path}: {w.reason}" for w in s.warnings if w.path.startswith(within))
        # A first offline run takes seconds, and until it saves the tables a call could only build them all
        # itself, beside it: calls wait for the whole step then, not only for its table update.
        first = generator.offline and not (s.kb / STATE_DIR / searchindex.SEARCH_FILE).exists()
        try:
            with searchindex.saving(s.kb) if first else contextlib.nullcontext():
                _run_to_end(lambda: runner.run(body))
        except CancelledRun:
            if isinstance(runner.fatal, KindexError):
                raise runner.fatal from None
            raise
        except KeyboardInterrupt:
            done = runner.report.report(time.monotonic() - started)
            if runner.finished:
                # Ctrl-C during the last, uncancellable part (the search tables' update): the event loop says so only
                # once the step is over, and "run the same command again to finish" had the user do it all again.
                raise InterruptedRun(
                    f"interrupted as the step ended, after it had finished ({done.completed} of {done.total} steps): "
                    "every index file and the search tables are written; there is nothing to run again",
                    done,
                ) from None
            # No count of answers: calls made are not answers received (nine failed calls were "9 answers cached").
            again = (
                "run it again without --force to finish (with --force every document is asked again)"
                if opts.force
                else "run the same command again to finish"
            )
            raise InterruptedRun(
                f"interrupted after {done.completed} of {done.total} steps; the answers received are cached and "
                f"every index file is intact: {again}",
                done,
            ) from None
        finally:
            runner.cache.flush()  # a stopped step's offline entries are as good as a finished one's
            runner.cache.close()
    return runner.report.report(time.monotonic() - started)


def _written(kb: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What a step writes, as (file, inode, mtime, size): the index files, the search tables and the scan memory.
    Each is replaced whole (a new inode), so a write shows even where times are counted in whole seconds."""
    files = [root_index_path(kb), kb / STATE_DIR / searchindex.SEARCH_FILE, kb / STATE_DIR / SCAN_FILE]
    try:
        with os.scandir(kb) as entries:
            files.extend(theme_index_path(kb, e.name) for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        pass  # the scan says what is wrong with the folder
    out = []
    for f in files:
        try:
            st = os.stat(f)
        except (OSError, ValueError):
            continue
        out.append((f.relative_to(kb).as_posix(), st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


MAX_ANSWER_NOTES = 20
"""Notes said of one answer: an answer listing 9,000 invented themes made 9,000 lines on stderr, in the report and
in a service's task record."""


def _bounded(notes: list[str]) -> list[str]:
    if len(notes) <= MAX_ANSWER_NOTES:
        return notes
    return [*notes[:MAX_ANSWER_NOTES], f"{len(notes) - MAX_ANSWER_NOTES} more notes like these"]


def _advice(reason: str, opts: Options) -> str:
    """What to change when a document failed this way, said once per run (running it again as it is pays for the
    same failure again)."""
    if TIMED_OUT in reason:
        # Only a server of one's own has "slots"; a provider's API takes many calls at once.
        slots = (
            f"; with {opts.concurrency} calls at once, a local server answers only as many at a time as it has slots "
            "(llama.cpp -np, vLLM --max-num-seqs) and the rest wait out their deadline: set --concurrency "
            "(KINDEX_CONCURRENCY) to its slots"
            if opts.llm.api_base and opts.concurrency > 2
            else ""
        )
        return f"calls ran out of time: raise --timeout (KINDEX_TIMEOUT){slots}"
    if TRUNCATED in reason:
        return "an answer was cut off by the token limit: raise --max-tokens (KINDEX_MAX_TOKENS) and run again"
    return ""


def _run_to_end(coroutine: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a step's coroutine to its end from synchronous code, also when this thread already runs an event loop
    (a notebook, an async chat backend calling the sync API): then on a thread of its own, which this one waits for.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        in_loop = False
    else:
        in_loop = True
    if not in_loop:  # run outside the except block: a failure would otherwise be chained to "no running event loop"
        asyncio.run(coroutine())
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kindex-run") as pool:
        pool.submit(asyncio.run, coroutine()).result()


def remove_stale_temporaries(s: Scan) -> None:
    """Delete temporary files a killed writer left behind: of the index files, and of the search tables, the scan
    memory and the holder record in ``.kindex/`` (a 1,445-page KB's tables are 9 MB, and ten kills left six). The
    caller holds the lock, and only a writer holding it writes these, so none is live. A watcher's record is written
    under its own lock: not touched."""
    for folder in (s.kb, *(s.kb / name for name in s.themes)):
        for tmp in folder.glob(f".{INDEX_FILE}.*.tmp"):
            tmp.unlink(missing_ok=True)
    for name in (searchindex.SEARCH_FILE, SCAN_FILE, HOLDER_FILE):
        for tmp in (s.kb / STATE_DIR).glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def dry_run(kb: str | os.PathLike[str], options: Options | None = None) -> Plan:
    """What ``reindex`` would send to the model (cache and ``force`` considered), without sending anything."""
    opts = options or Options()
    opts.check()
    s = scan(kb, excerpt_chars=opts.excerpt_chars)
    refuse_theme_folder(s.kb)
    refuse_knowledge_folders(s.kb, s.themes)
    generator = make_generator(opts.llm, opts.client)
    if generator.offline:
        return _plan(generator.name, [], 0, 0, 0, None)
    cache = Cache(s.kb)
    calls: list[str] = []
    prompt = completion = cached = 0
    apart = root_docs_apart(s)
    pending = [
        (
            "index.json",
            generator.root_key(s),
            root_messages(s),
            ROOT_ANSWER_TOKENS_PER_ITEM * (len(s.themes) + len(s.root_docs) - len(apart)),
        )
    ][: 1 if root_answer_needed(s) else 0]
    pending += [
        (d.rel, generator.doc_key(d), doc_messages(d), DOC_ANSWER_TOKENS) for d in s.documents if d.theme or apart
    ]
    for label, key, messages, answer_tokens in pending:
        if not opts.force and cache.get(key) is not None:
            cached += 1
            continue
        calls.append(label)
        prompt += _tokens_of(messages)
        completion += answer_tokens
    # A client of the caller's own is priced by no one here; litellm's model string is checked and priced.
    cost = _price(opts.llm, prompt, completion) if opts.client is None else None
    problems: list[str] = []
    if calls and opts.client is None:
        try:
            LiteLLMClient(opts.llm).check_ready()
        except ModelError as exc:  # a plan of calls that would not be sent says so (it priced them all the same)
            problems.append(f"{exc.message}: a run would stop at its first call")
    return _plan(generator.name, calls, cached, prompt, completion, cost, problems)


def _plan(
    generator: str,
    calls: list[str],
    cached: int,
    prompt: int,
    completion: int,
    cost: float | None,
    problems: Sequence[str] = (),
) -> Plan:
    return Plan(
        generator=generator,
        calls=len(calls),
        items=tuple(calls),
        cached=cached,
        estimated_prompt_tokens=prompt,
        estimated_completion_tokens=completion,
        estimated_cost=cost,
        problems=tuple(problems),
    )


def _price(llm: LLMSettings, prompt: int, completion: int) -> float | None:
    if not llm.model:
        return None
    litellm = import_litellm()
    check_model(litellm, llm.model)  # a plan for a model no call could reach is no plan
    try:
        info = litellm.get_model_info(llm.model)
    except Exception:  # litellm raises assorted errors for models it has no price for
        return None
    inp, out = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    return prompt * float(inp) + completion * float(out or 0) if inp else None


class _Runner:
    def __init__(self, s: Scan, generator: Generator, opts: Options, step: str, held: HeldLock) -> None:
        self.scan = s
        self.held = held
        """The writer lock: checked before each write, so a step whose lock was deleted under it stops."""
        self.generator = generator
        self.opts = opts
        self.cache = Cache(s.kb)
        self.live_keys: set[str] = set()
        self.live_labels: set[str] = set()
        """What this step described (documents, ``index.json``): after a whole offline run, the kept offline entries
        of the others are of documents gone."""
        self.report = _Tally(step=step, generator=generator.name, offline=generator.offline)
        if self.cache.set_aside is not None:  # said: its answers are paid for again, and nothing else said why
            self.report.notes.append(
                f"the answer cache could not be read (damaged, or another program's database): set aside as "
                f"{STATE_DIR}/{self.cache.set_aside.name}; the answers it held are asked for again"
            )
        self._sem: asyncio.Semaphore | None = None
        self.fatal: BaseException | None = None
        """What failed the whole run (a bad key, an unknown model, no server): no further call starts, and the run
        ends with it, whichever task's error reaches the top first (another's said only "stopped after a fatal
        model error")."""
        self._reached = False
        """A model call of this run reached the server (an error status counts): a connection failure after it is
        one document's, not the run's, unless they follow one another (``_unreachable_in_a_row``)."""
        self._unreachable_in_a_row = 0
        self.indexed: set[str] = set()
        """Documents whose entries this step made from the scan's read (a failed one keeps an older entry)."""
        self.finished = False
        """The step did all its work (a Ctrl-C the event loop reports after that interrupted nothing)."""
        self.kept_on_force: list[str] = []
        """Items whose forced call failed and whose cached answer for the same prompt was used."""

    @property
    def sem(self) -> asyncio.Semaphore:
        # Created lazily so that it belongs to the running event loop.
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.opts.concurrency)
        return self._sem

    def _tick(self, step: str, item: str) -> None:
        self.report.completed += 1
        if self.opts.on_progress is not None:
            self.opts.on_progress(Progress(step, self.report.completed, self.report.total, item))

    def _check_cancel(self) -> None:
        if self.opts.cancel is not None and self.opts.cancel.is_set():
            raise CancelledRun("the run was cancelled; every index file is as it was before the cancel")

    def _write(self, path: Path, index: Index) -> None:
        self._check_cancel()
        self.held.check()
        if not path.parent.is_dir():  # writing would recreate a folder someone deleted during the run
            raise KBNotFoundError(
                f"{path.parent.relative_to(self.scan.kb).as_posix() or 'the knowledge folder'} disappeared during "
                "the run: nothing more was written"
            )
        if write_index(path, index):
            self.report.written.append(path.relative_to(self.scan.kb).as_posix())

    def _settle(self, settled: Callable[[str], bool]) -> None:
        """After an index file was written: the record of its stand-in entries (:func:`note_stand_ins`), which
        ``validate`` reports. ``settled``: the labels (document paths, ``index.json``) that file's entries are for;
        those of themes the scan no longer has go too (a theme renamed and renamed back must not bring back a
        record its entries no longer match)."""
        themes = self.scan.themes

        def covered(label: str) -> bool:
            return settled(label) or ("/" in label and label.split("/", 1)[0] not in themes)

        failed = {f.path: f.reason for f in self.report.failures if settled(f.path)}
        note_stand_ins(self.scan.kb, covered, failed, self.opts.llm.model or "")

    async def _answer(
        self, key: str, label: str, ask: Callable[[], Any], made_from: Collection[str] | None = None
    ) -> Answer | None:
        """The cached answer for ``key``, or a fresh one (cached at once); ``None`` when generation failed.
        ``made_from``: the documents the answer describes (default: ``label``'s)."""
        self.live_keys.add(key)
        self.live_labels.add(label)
        offline = self.generator.offline
        if not self.opts.force:
            cached = self.cache.derived(key, label) if offline else self.cache.get(key)
            if cached is not None:
                self.report.cache_hits += 1
                return Answer(cached, cached=True)
        async with self.sem:
            self._check_cancel()
            if self.fatal is not None:  # a slot freed by the failed call must not start another before the cancel
                raise CancelledRun("stopped after a fatal model error")
            try:
                answer: Answer = await ask()
            except GenerationFailed as exc:
                self.report.usage.merge(exc.usage)
                self._unreachable_in_a_row = self._unreachable_in_a_row + 1 if exc.unreachable else 0
                self._reached = self._reached or not exc.unreachable  # an error is an answer: the server is there
                if self._unreachable_in_a_row and not self._reached:
                    # Nothing has answered yet: a wrong --api-base or a server that is down, not one document's
                    # bad luck. Stopping here says so at once, instead of every document failing the same way.
                    check = (
                        "check the API base (--api-base, KINDEX_API_BASE or [model] api_base in kindex.toml) and "
                        "that the server is running"
                        if self.opts.llm.api_base
                        else "check this machine's network connection to the provider (or --api-base for a local or "
                        "proxy server)"
                    )
                    self.fatal = ModelError(f"{exc.message}: no call of this run has reached the model; {check}")
                    raise self.fatal from None
                if self._unreachable_in_a_row >= 2 * max(self.opts.concurrency, 2):
                    # Every call in flight when the server went away, and as many started after, found nobody:
                    # the rest would only fail the same way, each after its retries.
                    self.fatal = ModelError(
                        f"{exc.message}: the model stopped answering ({self._unreachable_in_a_row} calls in a row "
                        "could not connect); the answers so far are cached: run again when it is back"
                    )
                    raise self.fatal from None
                cached = self.cache.get(key) if self.opts.force else None
                if cached is not None:
                    # --force asked again and the call failed: the answer given before for this same prompt stands,
                    # as it would without --force. The entry is an answer, not a stand-in: said, not failed.
                    self.kept_on_force.append(f"{label} ({exc.message})")
                    return Answer(cached)
                self.report.failures.append(Failure(path=label, reason=exc.message, transient=exc.transient))
                advice = _advice(exc.message, self.opts)
                if advice and advice not in self.report.notes:
                    self.report.notes.append(advice)
                return None
            except BaseException as exc:
                # The first: the calls cancelled because of it end here too, with CancelledError.
                self.fatal = self.fatal or exc
                raise
        self.report.usage.merge(answer.usage)
        self._reached = True
        self._unreachable_in_a_row = 0
        self._check_cancel()  # a late answer after a cancel is not used
        if not offline:
            self.cache.put(key, answer.obj, label)
        elif self.scan.stand_ins.isdisjoint((label,) if made_from is None else made_from):
            # An entry made from the excerpt of a document that changed under the run is not the entry of the
            # content its key names: not kept.
            self.cache.keep_derived(key, label, answer.obj)
        if answer.cut_off:
            # What the model finished is used and the rest filled in (a root answer's missing entries extractive, each
            # noted): without this, nothing said why, nor that --max-tokens mends it.
            advice = _advice(TRUNCATED, self.opts)
            if advice not in self.report.notes:
                self.report.notes.append(advice)
        return answer

    # -- root -------------------------------------------------------------------------------------------------

    async def root(self, *, counted: bool = True) -> None:
        s = self.scan
        if counted:
            self.report.total = 1
        previous = read_index(root_index_path(s.kb)) or Index()
        authored = {
            sk.folder: sk.theme_item() for sk in skillmodel.load_skills(s.kb)[0].values() if sk.folder in s.themes
        }
        theme_defaults: dict[str, ThemeItem] = {}
        for name, docs in s.themes.items():
            old = next((t for t in previous.themes if t.dir == name), None)
            theme_defaults[name] = old or theme_item_from(extractive.describe_theme(name, docs), name)
        # Many root documents (a flat folder of notes) are described one call each, beside the root answer.
        offline = self.generator.offline
        apart = root_docs_apart(s) if not offline else ()
        in_answer = s.root_docs if not apart else ()
        doc_defaults = {d.path_in_theme: self._fallback_doc(d, previous) for d in in_answer}
        answer = None
        # An empty KB's root index is empty; a model is asked only when the root answer has something to describe.
        if (s.themes or s.root_docs) if offline else root_answer_needed(s):
            answer = await self._answer(
                self.generator.root_key(s),
                "index.json",
                lambda: self.generator.describe_root(s),
                made_from=[d.rel for d in s.root_docs],
            )
        index = None
        if answer is not None:
            try:
                index, notes = root_index(
                    answer.obj, theme_defaults=theme_defaults, doc_defaults=doc_defaults, fill_lists=not offline
                )
            except AnswerError as exc:  # a stored answer that no longer validates: as a failed call
                reason = f"{'stored answer' if answer.cached else 'answer'} unusable: {exc}"
                self.report.failures.append(Failure(path="index.json", reason=reason, transient=False))
            else:
                if not answer.cached:  # a no-op run repeated the same five notes on every run
                    self.report.notes.extend(f"index.json: {n}" for n in _bounded(notes))
                self.indexed.update(d.rel for d in in_answer)
        if index is None:
            index = Index(themes=tuple(theme_defaults.values()), documents=tuple(doc_defaults.values())).sorted()
        if apart:
            items = await _all(self._doc_entry(d, previous, root=True) for d in apart)
            index = Index(themes=index.themes, documents=(*index.documents, *items)).sorted()
        if authored:
            themes = tuple(authored.get(t.dir, t) for t in index.themes)
            index = Index(themes=themes, documents=index.documents).sorted()
        self._write(root_index_path(s.kb), index)
        self._settle(lambda label: "/" not in label)  # the root's own entries (gone themes' go in _settle)
        self._drop_gone_themes(previous)
        self._tick("root", "index.json")

    def _drop_gone_themes(self, previous: Index) -> None:
        """Remove the index of a theme the root no longer lists (its folder holds no document now): left behind,
        it would go on listing deleted documents. Only a whole index as kindex writes it, and never when the scan
        missed folders."""
        s = self.scan
        if s.unreadable:
            return
        # On a case-insensitive file system "Docs" renamed "docs" is the same folder, its index just written.
        current = {name.casefold() for name in s.themes}
        for theme in previous.themes:
            if theme.dir.casefold() in current or not _own_index(theme_index_path(s.kb, theme.dir)):
                continue
            try:
                # The folder is opened without following a link, and the file removed inside what was opened: a
                # folder swapped for a link meanwhile leads nowhere else.
                folder = os.open(s.kb / theme.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    os.unlink(INDEX_FILE, dir_fd=folder)
                finally:
                    os.close(folder)
            except OSError:
                continue  # a link, or a file kindex may not remove: it stays
            self.report.notes.append(f"removed {theme.dir}/{INDEX_FILE}: the folder holds no document any more")

    def _fallback_doc(self, d: ScannedDoc, previous: Index) -> DocItem:
        """The previous entry of ``d`` if the index has one, else an extractive entry: it stays navigable. A root
        document's globs are its author's as they are now: root documents are overviews, which only their author
        makes conditional (the previous entry's kept a page hidden from every chat after its globs were removed)."""
        old = previous.document(d.path_in_theme)
        if old is None:
            return doc_item_from(extractive.describe_doc(d, self.scan.read_text(d)), d.path_in_theme)
        return old if d.theme is not None else old.model_copy(update={"paths": tuple(d.signals.paths)})

    # -- documents and themes ---------------------------------------------------------------------------------

    async def _doc_entry(self, d: ScannedDoc, previous: Index, *, root: bool = False) -> DocItem:
        """``d``'s entry from its own call; a root document's (``root``: the root step's work, not a step of its own)
        is conditional only if its author made it so, as the root answer's are."""
        answer = await self._answer(self.generator.doc_key(d), d.rel, lambda: self.generator.describe_doc(self.scan, d))
        item: DocItem | None = None
        if answer is not None:
            try:
                item = doc_entry(answer.obj, d.path_in_theme, d.signals.paths, "" if root else d.excerpt)
            except AnswerError as exc:  # a cached answer that no longer validates: treat as a failure
                self.report.failures.append(
                    Failure(path=d.rel, reason=f"stored answer unusable: {exc}", transient=False)
                )
        if item is None:
            item = self._fallback_doc(d, previous)
        else:
            self.indexed.add(d.rel)
        if not root:
            self._tick("doc", d.rel)
        return item

    async def theme(self, dir_name: str, *, counted: bool = True) -> None:
        docs = self.scan.theme_docs(dir_name)
        if counted:
            self.report.total = len(docs)
        path = theme_index_path(self.scan.kb, dir_name)
        previous = read_index(path, self.scan.kb) or Index()
        items = await _all(self._doc_entry(d, previous) for d in docs)
        self._write(path, theme_index(items))
        self._settle(lambda label: label.startswith(f"{dir_name}/"))

    async def one_doc(self, dir_name: str, rel_path: str, clear_dir: bool) -> None:
        d = self.scan.theme_doc(dir_name, rel_path)
        self.report.total = 1
        path = theme_index_path(self.scan.kb, dir_name)
        held = read_index(path, self.scan.kb)
        others = {x.path_in_theme for x in self.scan.theme_docs(dir_name)} - {d.path_in_theme}
        if not clear_dir and others and (held is None or not held.documents):
            # Merging into a missing or unreadable theme index, or one with no usable entry (``{}``), would write
            # one without the theme's other documents: the whole theme is written instead (cached answers cost
            # nothing). An index that lacks only some is merged into: ``--clear-dir`` builds one document at a time.
            self.report.notes.append(
                f"{dir_name}/index.json was missing, unreadable or empty: the whole theme was written"
            )
            await self.theme(dir_name)
            return
        previous = Index() if clear_dir else (held or Index())
        item = await self._doc_entry(d, previous)
        # Re-read just before writing: the lock makes this the only writer, and the merge keeps every other entry.
        current = Index() if clear_dir else (read_index(path, self.scan.kb) or Index())
        scanned = {x.path_in_theme for x in self.scan.theme_docs(dir_name)}
        kept = [x for x in current.documents if x.path in scanned and x.path != item.path]
        self._write(path, theme_index([*kept, item]))
        self._settle(lambda label: label.startswith(f"{dir_name}/") if clear_dir else label == d.rel)
        dropped = len([x for x in held.documents if x.path != item.path]) if clear_dir and held is not None else 0
        if dropped:
            self.report.notes.append(
                f"{dir_name}/index.json was started afresh (clear_dir): it lists only {item.path} now; "
                f"{dropped} other {'entry is' if dropped == 1 else 'entries are'} gone until a doc or sub step adds "
                f"{'it' if dropped == 1 else 'them'}"
            )

    async def run(self, body: Callable[[_Runner], Any]) -> None:
        """Run a step, then bring the search index up to date so the first question after it is answered fast.

        Only documents whose entry or content changed are analysed again (a `doc` step on an edited document costs
        that document's work).
        """
        await body(self)
        if self.kept_on_force:
            kept = self.kept_on_force
            shown = "; ".join(kept[:3]) + (f"; and {len(kept) - 3} more" if len(kept) > 3 else "")
            self.report.notes.append(
                f"{len(kept)} forced call(s) failed and kept the answer cached for the same text: {shown}"
            )
        if self.generator.offline and self.report.written and len(self.cache):
            self.report.notes.append(
                f"this KB holds {len(self.cache)} cached model answers, and this offline run wrote extractive entries "
                "in their place: run the step with the model again (--model, KINDEX_MODEL or [model] in kindex.toml) "
                "to bring them back, with no new model call for unchanged documents"
            )
        if self.generator.offline:
            whole = self.report.step == "reindex" and not self.scan.unreadable
            self.cache.flush(self.live_labels if whole else None)
        if root_index_path(self.scan.kb).exists():
            self._check_cancel()
            self.held.check()
            try:
                self.report.documents_read = searchindex.update(self.scan.kb, self.scan)
            except StorageError:
                # The index files are written: remembered so, or validate would call their edits unindexed after a
                # full disk refused only the tables (the next call rebuilds those and says so).
                self.scan.remember(self.indexed.__contains__)
                raise
        if self.scan.stand_ins:
            # Their entries describe them as the scan read them; said here, not only by a later validate.
            moved = sorted(self.scan.stand_ins)
            shown = ", ".join(moved[:5]) + (f" and {len(moved) - 5} more" if len(moved) > 5 else "")
            self.report.notes.append(
                f"changed while the step ran: {shown}: indexed as they were when it started; the next step (or "
                "the watcher) indexes them as they are now"
            )
        self.held.check()
        self.scan.remember(self.indexed.__contains__)
        self.finished = True

    async def reindex(self) -> None:
        s = self.scan
        self.report.total = 1 + sum(len(d) for d in s.themes.values())
        if not s.documents:
            self.report.notes.append(
                f"no usable Markdown document: the {len(s.skipped)} files found were skipped (listed with their reason)"
                if s.skipped
                else "no Markdown document found (only .md files are indexed): the index is empty; is this the folder "
                "that holds your documents?"
            )
        # The root call does not depend on the documents' answers: it runs alongside them.
        await _all([self.root(counted=False), *(self.theme(name, counted=False) for name in s.themes)])
        if not self.generator.offline and not s.unreadable:
            # A folder kindex may not read now holds answers already paid for: kept until it is readable again.
            self.cache.compact(self.live_keys)


def _own_index(path: Path) -> bool:
    """Whether ``path`` is a regular file (not a link) holding a whole index as kindex writes it: ``version`` 1,
    ``themes`` and ``documents`` lists, nothing else. An empty file, ``{}`` or a manifest with a ``version`` of
    its own may be the user's: kept."""
    if path.is_symlink() or not regular_file(path):
        return False
    try:
        obj = orjson.loads(index_bytes(path))
    except (OSError, InvalidFileError, IndexMissingError, orjson.JSONDecodeError):
        return False
    return (
        isinstance(obj, dict)
        and obj.keys() == {"version", "themes", "documents"}
        and obj["version"] == 1
        and isinstance(obj["themes"], list)
        and isinstance(obj["documents"], list)
    )


async def _all(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``coros`` concurrently; the first exception cancels the others (no call is sent after a fatal error)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
