"""``kindex context``: BuildContext for one chat message. Imports only the retrieval path (no generation)."""

from __future__ import annotations

import codecs
import sys
from collections.abc import Sequence
from typing import BinaryIO

import click
import orjson

from kindex.cli.options import json_opt, kb_arg, shown
from kindex.config import MAX_BUDGET_TOKENS, MAX_DOCS_LIMIT, MIN_BUDGET_TOKENS, resolve
from kindex.retrieve import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_MAX_DOCS,
    DEFAULT_MIN_RELEVANCE,
    MAX_SEARCH_LIMIT,
    Retriever,
)
from kindex.skillmodel import SkillShelf

MAX_MESSAGE_BYTES = 8 * 2**20
"""A message read from a file or standard input: far more than any chat message, and never an endless stream
(``/dev/zero``) or a 50 MB paste held whole in memory for the 20,000 characters retrieval reads of it."""


def _read_message(stream: BinaryIO) -> tuple[str, str | None]:
    """The message of a file or standard input, and what was wrong with its bytes, if anything."""
    data = stream.read(MAX_MESSAGE_BYTES + 1)
    if len(data) > MAX_MESSAGE_BYTES:
        raise click.UsageError(
            f"the message is longer than {MAX_MESSAGE_BYTES // 2**20} MiB: pass a shorter one (only its first and "
            "last 10,000 characters are used, so those are enough)"
        )
    # A byte-order mark says how it was written, as it does for a document (Windows PowerShell pipes UTF-16).
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace"), None
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        # Read all the same, bad bytes as U+FFFD (a lone surrogate of a JavaScript string spoils only itself), but a
        # GBK message read so is noise answered with the overview: the answer says why.
        text = data.decode("utf-8", errors="replace")
        bad = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
        return text, (
            f"the message is not valid UTF-8 ({bad} unreadable byte sequence(s) read as U+FFFD): send it as UTF-8 "
            "(a GBK message: `iconv -f GBK -t UTF-8`)"
        )


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE, whose mark begins it
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


@click.command()
@kb_arg
@click.argument("message", required=False)
@click.option(
    "--message-file",
    type=click.File("rb"),
    help="Read the message from this file (`-`: standard input); for messages too long for a command line. "
    f"UTF-8; at most {MAX_MESSAGE_BYTES // 2**20} MiB (only its first and last 10,000 characters are used).",
)
@click.option("--path", "paths", multiple=True, metavar="P", help="A file the user is working on (repeatable).")
@click.option(
    "--budget",
    type=click.IntRange(MIN_BUDGET_TOKENS, MAX_BUDGET_TOKENS),
    help=f"Token budget of the assembled text (default {DEFAULT_BUDGET_TOKENS}) "
    "[env KINDEX_BUDGET_TOKENS, kindex.toml].",
)
@click.option(
    "--max-docs",
    type=click.IntRange(1, MAX_DOCS_LIMIT),
    help=f"At most this many documents (default {DEFAULT_MAX_DOCS}) [env KINDEX_MAX_DOCS, kindex.toml].",
)
@click.option(
    "--min-relevance",
    type=click.FloatRange(0.0, 1.0),
    help="On topic when a document covers this share of the question's informative weight (and, if the "
    "question holds words the KB never uses, shares a subject of the KB with it); else the overview; 0: any match "
    f"is on topic (default {DEFAULT_MIN_RELEVANCE}) [env KINDEX_MIN_RELEVANCE, kindex.toml].",
)
@click.option(
    "--fallback",
    "fallback_docs",
    multiple=True,
    metavar="DOC",
    help="Overview document for off-topic messages (repeatable; default 导读.md, 00-总则与功能导航.md, then the "
    "KB's README.md/index.md, followed by an overview of the root index) [env KINDEX_FALLBACK_DOCS, kindex.toml].",
)
@json_opt
def context(
    kb: str,
    message: str | None,
    message_file: BinaryIO | None,
    paths: tuple[str, ...],
    budget: int | None,
    max_docs: int | None,
    min_relevance: float | None,
    fallback_docs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Print the context for MESSAGE: the chosen documents' original text, within the budget.

    MESSAGE "-" reads the message from standard input (for long messages). Stdout holds only the text (--json:
    the whole result); stderr lists each chosen document (path, score, why), says when the question fell back to
    the overview documents, and notes what is wrong with the index.

    \b
    Example:
      kindex context sample_kb "退款多久到账"
      kindex context sample_kb "改一下金额组件" --path web/src/Money.tsx --json
      echo "发票怎么开" | kindex context sample_kb -
    """
    if message is not None and message_file is not None:
        raise click.UsageError("give MESSAGE or --message-file, not both")
    unreadable = None
    if message_file is not None:
        message, unreadable = _read_message(message_file)
    elif message == "-":
        message, unreadable = _read_message(sys.stdin.buffer)
    elif message is None:
        raise click.UsageError("give the chat message: MESSAGE, `-` for standard input, or --message-file FILE")
    # The retriever and the skill shelf alone, not the whole KB handle: a one-shot command loads only the read path.
    flags = {"budget_tokens": budget, "max_docs": max_docs, "min_relevance": min_relevance}
    settings = resolve(kb, {**flags, "fallback_docs": fallback_docs or None}, for_reading=True)
    retriever = Retriever(kb)
    ctx = retriever.context(
        message,
        paths=paths,
        budget_tokens=settings["budget_tokens"],
        max_docs=settings["max_docs"],
        min_relevance=settings["min_relevance"],
        fallback_docs=settings["fallback_docs"],
    )
    if retriever.skill_library:
        ctx = SkillShelf(kb).attach(ctx)
    problems = tuple(p for p in (unreadable, settings.problem) if p is not None)
    if problems:
        ctx = ctx.model_copy(update={"warnings": (*ctx.warnings, *problems)})
    if as_json:
        click.echo(orjson.dumps(ctx.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        for item in ctx.items:
            flag = ", truncated" if item.truncated else ""
            click.echo(f"# {shown(item.path)}  score {item.score:.2f}  ({item.reason}{flag})", err=True)
        if ctx.fallback:
            click.echo(f"kindex: {ctx.reason}", err=True)
        # As assembled: piped, click strips what looks like a terminal escape, and a file named with one was cited
        # under a path that does not exist.
        click.echo(ctx.text, color=True)
    for path in ctx.missing:
        click.echo(
            f"kindex: {shown(path)} is in the index but cannot be read: skipped (run `kindex reindex`)", err=True
        )
    _note_warnings(ctx.warnings)


def _note_warnings(warnings: Sequence[str]) -> None:
    # Readers never write: until a step saves new tables, every one-shot command rebuilds them (~0.5 s on 150 pages).
    for warning in warnings:  # a warning may quote a file name: one line, escaped
        click.echo(f"kindex: note: {shown(warning)}", err=True)


@click.command()
@kb_arg
@click.argument("question")
@click.option(
    "--limit", type=click.IntRange(1, MAX_SEARCH_LIMIT), default=10, show_default=True, help="Entries to list."
)
@click.option("--path", "paths", multiple=True, metavar="P", help="A file the user is working on (repeatable).")
@click.option(
    "--min-relevance",
    type=click.FloatRange(0.0, 1.0),
    help=f"On-topic threshold, 0 to list whatever matches (default {DEFAULT_MIN_RELEVANCE}) "
    "[env KINDEX_MIN_RELEVANCE, kindex.toml].",
)
@json_opt
def search(
    kb: str, question: str, limit: int, paths: tuple[str, ...], min_relevance: float | None, as_json: bool
) -> None:
    """List the documents QUESTION is about, best first, without their text: path, score, title, summary.

    Nothing listed means the question is off topic for KB (where `kindex context` would hand over the overview).

    \b
    Example:
      kindex search sample_kb "退款多久到账" --limit 3
      kindex search sample_kb "发票" --json | jq '.results[0].path'
    """
    settings = resolve(kb, {"min_relevance": min_relevance}, for_reading=True)
    ranking = Retriever(kb).ranking(
        question, paths=paths, limit=limit, min_relevance=settings["min_relevance"], problem=settings.problem
    )
    results = ranking.results
    _note_warnings(ranking.warnings)
    if as_json:
        click.echo(orjson.dumps(ranking.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    if not results:
        click.echo("kindex: no document matches: the question is off topic for this KB", err=True)
    for r in results:
        # Why it is listed: a path the message names or a rule's glob comes first whatever its score, and says so.
        matched = f"matched {', '.join(r.matched[:6])}" if r.matched else ""
        why = (matched or r.reason) if r.reason == "matched" else "; ".join(x for x in (r.reason, matched) if x)
        click.echo(f"{r.score:7.2f}  {shown(r.path)}  {r.title}")
        click.echo(f"         {r.abstract}  ({why})")
