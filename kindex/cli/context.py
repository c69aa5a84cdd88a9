"""``kindex context``: BuildContext for one chat message. Imports only the retrieval path (no generation)."""

from __future__ import annotations

import sys
from typing import TextIO

import click
import orjson

from kindex.cli.options import json_opt, kb_arg
from kindex.retrieve import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_FALLBACK_DOCS,
    DEFAULT_MAX_DOCS,
    DEFAULT_MIN_RELEVANCE,
    MAX_BUDGET_TOKENS,
    MAX_DOCS_LIMIT,
    MIN_BUDGET_TOKENS,
    Retriever,
)
from kindex.skillmodel import SkillShelf


@click.command()
@kb_arg
@click.argument("message", required=False)
@click.option(
    "--message-file",
    type=click.File("r", encoding="utf-8"),
    help="Read the message from this file (`-`: standard input); for messages too long for a command line.",
)
@click.option("--path", "paths", multiple=True, metavar="P", help="A file the user is working on (repeatable).")
@click.option(
    "--budget",
    type=click.IntRange(MIN_BUDGET_TOKENS, MAX_BUDGET_TOKENS),
    default=DEFAULT_BUDGET_TOKENS,
    show_default=True,
    help="Token budget of the assembled text.",
)
@click.option(
    "--max-docs",
    type=click.IntRange(1, MAX_DOCS_LIMIT),
    default=DEFAULT_MAX_DOCS,
    show_default=True,
    help="At most this many documents.",
)
@click.option(
    "--min-relevance",
    type=click.FloatRange(0.0, 1.0),
    default=DEFAULT_MIN_RELEVANCE,
    show_default=True,
    help="On topic when a document covers this share of the question's informative weight; else the overview.",
)
@click.option(
    "--fallback",
    "fallback_docs",
    multiple=True,
    metavar="DOC",
    help="Overview document for off-topic messages (repeatable; default 导读.md, 00-总则与功能导航.md, then the "
    "KB's README.md/index.md, then an overview of the root index).",
)
@json_opt
def context(
    kb: str,
    message: str | None,
    message_file: TextIO | None,
    paths: tuple[str, ...],
    budget: int,
    max_docs: int,
    min_relevance: float,
    fallback_docs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Print the context for MESSAGE: the chosen documents' original text, within the budget.

    MESSAGE "-" reads the message from standard input (for long messages).

    \b
    Example:
      kindex context sample_kb "退款多久到账"
      kindex context sample_kb "改一下金额组件" --path web/src/Money.tsx --json
      echo "发票怎么开" | kindex context sample_kb -
    """
    if message is not None and message_file is not None:
        raise click.UsageError("give MESSAGE or --message-file, not both")
    if message_file is not None:
        message = message_file.read()
    elif message == "-":
        message = sys.stdin.read()
    elif message is None:
        raise click.UsageError("give the chat message: MESSAGE, `-` for standard input, or --message-file FILE")
    # The retriever and the skill shelf alone, not the whole KB handle: a one-shot command loads only the read path.
    retriever = Retriever(kb)
    ctx = retriever.context(
        message,
        paths=paths,
        budget_tokens=budget,
        max_docs=max_docs,
        min_relevance=min_relevance,
        fallback_docs=fallback_docs or DEFAULT_FALLBACK_DOCS,
    )
    if retriever.skill_library:
        ctx = SkillShelf(kb).attach(ctx)
    if as_json:
        click.echo(orjson.dumps(ctx.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        for item in ctx.items:
            flag = ", truncated" if item.truncated else ""
            click.echo(f"# {item.path}  score {item.score:.2f}  ({item.reason}{flag})", err=True)
        if ctx.fallback:
            click.echo(f"kindex: {ctx.reason}", err=True)
        click.echo(ctx.text)
    for path in ctx.missing:
        click.echo(f"kindex: {path} is in the index but cannot be read: skipped (run `kindex reindex`)", err=True)
