"""Options and conventions shared by the command modules (no core imports: cheap for every command)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import click
import orjson

EXIT_PARTIAL = 3
"""A run that finished but left documents failed."""
EXIT_INTERRUPTED = 130
F = TypeVar("F", bound=Callable[..., Any])


def kb_arg(f: F) -> F:
    return click.argument("kb", type=click.Path(path_type=str))(f)


def kb_root_opt(help: str) -> Callable[[F], F]:
    """``--kb-root``: the existing folder holding one KB per agent (``serve``, ``worker``)."""
    return click.option("--kb-root", required=True, type=click.Path(file_okay=False, exists=True), help=help)


def json_opt(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(f)


def shown(name: str) -> str:
    """A file name as one line a terminal prints as it is: a newline in a name forged an output line, and other
    control characters (``\\x01``, ESC) reached the terminal raw. Escaped as Python writes them."""
    return name if name.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def print_json(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode())


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (``timeout``, the end of a CI job, systemd, ``docker stop``) stops the block as Ctrl-C does: cleanly,
    with its summary, instead of ending the process without a word. Off the main thread (the CLI embedded in a
    program), where Python takes no signal handler, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(sig: int, frame: FrameType | None) -> None:
    # Sent on as SIGINT, so that whatever handles Ctrl-C at that moment handles it: inside a step, asyncio cancels
    # its task at an await (a KeyboardInterrupt raised here would land in the middle of a task's code, and asyncio
    # then printed "Task exception was never retrieved" tracebacks). Where SIGINT is ignored (a background job of a
    # shell script), it is raised here.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        raise KeyboardInterrupt
    signal.raise_signal(signal.SIGINT)
