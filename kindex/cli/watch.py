"""``kindex watch``: keep a KB's index current as its documents change."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import click
import orjson

from kindex.cli.index import model_opts, options_from
from kindex.cli.options import kb_arg, sigterm_as_ctrl_c
from kindex.errors import InterruptedRun, KBNotFoundError
from kindex.kb import KnowledgeBase, Settings
from kindex.scan import kb_folder
from kindex.watch import DEFAULT_DEBOUNCE_MS, Update, Watcher


@click.command()
@kb_arg
@click.option(
    "--debounce",
    type=click.IntRange(50, 60_000),
    default=DEFAULT_DEBOUNCE_MS,
    show_default=True,
    help="Milliseconds of quiet before a batch of changes is handled.",
)
@model_opts
def watch(kb: str, debounce: int, **kw: Any) -> None:
    """Reindex KB as its documents change, until Ctrl-C (or SIGTERM).

    Starts with a reindex once the folder is watched (cached answers make it cheap: it indexes what changed while
    nothing watched), then handles each batch of changes with the smallest steps: an edited or added document is
    one model call (its entry and its theme index, nothing else), a deleted one rewrites its theme index from
    cached answers, a new or vanished theme re-asks the root, an edited kindex.toml runs the whole pipeline. A
    batch ends after --debounce milliseconds without a change, so a burst of saves is one update. One line per
    update on stdout (--json: one JSON object per line).

    A batch that fails because the model is unreachable or overloaded (documents got stand-in entries), or
    because another writer holds the KB, is tried again after 30 s, then after twice as long each time (at most
    10 minutes between tries; 8 tries, a new change joining it counting as one), paying only for what failed.
    One that fails on the documents (a broken kindex.toml) or on answers unusable even after a repair request
    waits for a change of those documents, or a restart.

    \b
    Example:
      kindex watch sample_kb --model openai/gpt-4o-mini
    """
    as_json = kw.pop("as_json")
    kb_folder(kb)  # a wrong path says so as every command does, before the model is set up
    options = options_from(kb, kw, None)
    handle = KnowledgeBase(kb, Settings(generation=options))
    stop = threading.Event()
    watcher = Watcher(
        handle,
        lambda u: _emit(u, as_json, stop.is_set()),
        debounce_ms=debounce,
        stop_event=stop,
        on_ready=lambda: click.echo(f"kindex: watching {kb} (Ctrl-C to stop)", err=True),
        reconcile=True,  # the reindex it starts with, after the watch is set: no change is missed, failures retried
    )
    # SIGTERM (systemd, `docker stop`) stops it as Ctrl-C does: between steps, said, exit 0; not killed mid-write.
    interrupted = False
    try:
        with sigterm_as_ctrl_c():
            watcher.run()
    except (KeyboardInterrupt, InterruptedRun):  # Ctrl-C between steps, or inside one (its answers are cached)
        stop.set()
        interrupted = True
    if not interrupted and not Path(kb).is_dir():
        # It exited 0: a supervisor restarting on failure never watched the folder a sync job deleted and cloned.
        raise KBNotFoundError(f"knowledge folder '{kb}' is gone: stopped watching it (start the watch again)")
    click.echo("kindex: stopped watching; every index file is complete", err=True)


def _emit(update: Update, as_json: bool, stopping: bool) -> None:
    if as_json:
        line = {
            "changed": update.changed,
            "removed": update.removed,
            "steps": update.steps,
            "calls": update.calls,
            "written": update.written,
            "error": update.error,
            "retry_in": update.retry_in,
            "retry_at": update.retry_at,
        }
        click.echo(orjson.dumps(line).decode())
    else:
        what = ", ".join([*update.changed, *(f"-{r}" for r in update.removed)]) or "start"
        done = (
            f"{'; '.join(update.steps) or ('failed' if update.error else 'nothing to do')}: {update.calls} model calls"
        )
        wrote = f", wrote {', '.join(update.written)}" if update.written else ""
        click.echo(f"{what} -> {done}{wrote}")
        if update.error and stopping:  # the error says when it is tried again
            click.echo(f"kindex: {update.error}", err=True)
        elif update.error:
            again = (
                "a change of these documents, or a restart of the watch, tries again"
                if update.retry_in is None
                else f"trying again in {update.retry_in:g} s"
            )
            click.echo(f"kindex: {update.error} ({again})", err=True)
    sys.stdout.flush()
