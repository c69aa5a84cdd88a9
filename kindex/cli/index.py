"""Generation commands: ``reindex``, ``root``, ``sub``, ``doc``, ``preview`` and ``validate``."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import orjson

from kindex import generate
from kindex.cli.options import EXIT_PARTIAL, F, json_opt, kb_arg, sigterm_as_ctrl_c
from kindex.config import RESPONSE_FORMATS
from kindex.globs import normalize_path
from kindex.hosts import redact_url
from kindex.kb import Settings
from kindex.llm import LLMSettings
from kindex.results import RunReport
from kindex.scan import DEFAULT_EXCERPT_CHARS, kb_folder, scan
from kindex.validate import validate as validate_kb


def concurrency_opt(f: F) -> F:
    return click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        help="Model calls in flight at once, per run (default 8) [env KINDEX_CONCURRENCY, kindex.toml].",
    )(f)


def model_opts(f: F) -> F:
    options = [
        click.option("--model", help="litellm model string, e.g. openai/gpt-4o-mini [env KINDEX_MODEL]."),
        click.option("--api-base", help="Base URL of an OpenAI-compatible endpoint [env KINDEX_API_BASE]."),
        click.option("--temperature", type=float, help="Sampling temperature (default 0.1) [env KINDEX_TEMPERATURE]."),
        click.option("--timeout", type=float, help="Seconds per model call (default 60) [env KINDEX_TIMEOUT]."),
        click.option(
            "--max-tokens",
            type=int,
            help="Answer length cap for one document (default 600; the root may take 300 per theme) "
            "[env KINDEX_MAX_TOKENS].",
        ),
        click.option("--retries", type=int, help="Retries on 429/5xx/timeouts (default 4) [env KINDEX_RETRIES]."),
        click.option(
            "--response-format",
            type=click.Choice(RESPONSE_FORMATS),
            help="Ask for JSON output; auto picks what the provider supports [env KINDEX_RESPONSE_FORMAT].",
        ),
        concurrency_opt,
        click.option(
            "--excerpt-chars",
            type=click.IntRange(min=100),
            default=DEFAULT_EXCERPT_CHARS,
            show_default=True,
            help="Characters of each document shown to the model.",
        ),
        click.option(
            "--force", is_flag=True, help="Ignore cached answers and ask the model again; read every document afresh."
        ),
        click.option("--wait", type=float, default=0.0, show_default=True, help="Seconds to wait for another writer."),
        json_opt,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def options_from(kb: str, kw: dict[str, Any], bar: Callable[[generate.Progress], None] | None) -> generate.Options:
    """The run's options: these flags > ``KINDEX_*`` environment > ``KB/kindex.toml`` > defaults."""
    names = ("model", "api_base", "temperature", "timeout", "max_tokens", "retries", "response_format", "concurrency")
    flags = {name: kw.pop(name) for name in names}
    return replace(
        Settings.resolved(kb, flags).generation,
        excerpt_chars=kw.pop("excerpt_chars"),
        force=kw.pop("force"),
        wait=kw.pop("wait"),
        on_progress=bar,
    )


def _announce(llm: LLMSettings) -> None:
    if llm.configured:
        where = f" at {redact_url(llm.api_base)}" if llm.api_base else ""  # (a password in it stays off the log)
        click.echo(f"kindex: generator: model {llm.model}{where}", err=True)
    else:
        click.echo(
            "kindex: generator: extractive (offline, no model configured; use --model or KINDEX_MODEL for an LLM)",
            err=True,
        )


LOG_PROGRESS_EVERY_S = 30.0
"""When stderr is not a terminal (a log, a pipe, CI), a plain progress line at most this often."""


@contextmanager
def _progress_bar(enabled: bool) -> Iterator[Callable[[generate.Progress], None] | None]:
    if not enabled:
        yield None
        return
    if sys.stderr is None:  # started with stderr closed (2>&-): nowhere to say it
        yield None
        return
    if not sys.stderr.isatty():
        # No bar in a log (it would fill with \r frames), but a model run lasts minutes: a line now and then.
        said = time.monotonic()

        def log(p: generate.Progress) -> None:
            nonlocal said
            if time.monotonic() - said >= LOG_PROGRESS_EVERY_S:
                said = time.monotonic()
                click.echo(f"kindex: progress: {p.completed}/{p.total} steps ({p.item})", err=True)

        yield log
        return
    from tqdm import tqdm

    bar: Any = None

    def update(p: generate.Progress) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=p.total, unit="step", file=sys.stderr, dynamic_ncols=True, leave=False)
        bar.total = p.total
        bar.set_postfix_str(p.item[-40:], refresh=False)
        bar.update(p.completed - bar.n)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def _emit(report: RunReport, as_json: bool) -> None:
    if as_json:
        click.echo(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        u = report
        cost = "cost unknown" if u.cost is None else f"cost ${u.cost:.4f}"
        tokens = f"{u.prompt_tokens + u.completion_tokens:,} tokens ({cost})" if u.calls else "no tokens"
        click.echo(
            f"{report.step}: {report.completed}/{report.total} steps, {u.calls} model calls, "
            f"{report.cache_hits} cached, {u.retries} retries, {len(report.failures)} failed, {tokens}, "
            f"{report.documents_read} document{'' if report.documents_read == 1 else 's'} re-analysed for search, "
            f"{report.wall_seconds:.1f} s"
        )
        if report.written:
            click.echo("wrote: " + ", ".join(report.written))
        for f in report.failures:
            click.echo(f"failed: {f.path}: {f.reason} (kept its previous or an extractive entry)")
        for x in report.skipped[:MAX_SKIPPED_SHOWN]:
            click.echo(f"kindex: skipped {x.path}: {x.reason}", err=True)
        if len(report.skipped) > MAX_SKIPPED_SHOWN:  # 100,000 stray files were 100,000 lines
            more = len(report.skipped) - MAX_SKIPPED_SHOWN
            click.echo(f"kindex: skipped {more:,} more (`kindex preview KB --json` or --json lists them all)", err=True)
        for note in report.notes:
            click.echo(f"kindex: note: {note}", err=True)
    if report.failures:
        click.echo(
            f"kindex: {len(report.failures)} item(s) failed; their entries are extractive or previous ones. "
            "Run the command again to retry them.",
            err=True,
        )
        sys.exit(EXIT_PARTIAL)


MAX_SKIPPED_SHOWN = 50
"""Skipped files a step's human output lists one by one."""


def _step(kb: str, kw: dict[str, Any], call: Callable[[generate.Options], RunReport]) -> None:
    as_json = kw.pop("as_json")
    kb_folder(kb)  # a wrong path is reported before the generator is announced
    with _progress_bar(True) as bar, sigterm_as_ctrl_c():
        opts = options_from(kb, kw, bar)
        _announce(opts.llm)
        report = call(opts)
    _emit(report, as_json)


@click.command()
@kb_arg
@model_opts
@click.option(
    "--dry-run", is_flag=True, help="Print the calls a run would make and their estimated cost; call nothing."
)
def reindex(kb: str, dry_run: bool, **kw: Any) -> None:
    """Write the whole index: KB/index.json, then every theme's KB/<theme>/index.json.

    Unchanged documents are answered from the cache under KB/.kindex/, so a re-run costs only what changed.
    Ctrl-C stops cleanly: what was answered is kept, and running again (without --force) finishes the job.

    \b
    Example:
      kindex reindex sample_kb                                 offline, no key needed
      kindex reindex docs/ --model openai/gpt-4o-mini --dry-run   what a model run would cost
      kindex reindex docs/ --model openai/gpt-4o-mini
    """
    if dry_run:
        as_json = kw.pop("as_json")
        plan = generate.dry_run(kb, options_from(kb, kw, None))
        if as_json:
            click.echo(orjson.dumps(plan.to_dict(), option=orjson.OPT_INDENT_2).decode())
            return
        cost = "cost unknown" if plan.estimated_cost is None else f"about ${plan.estimated_cost:.4f}"
        click.echo(
            f"dry run ({plan.generator}): {plan.calls} model calls, {plan.cached} answers cached, "
            f"~{plan.estimated_prompt_tokens:,} prompt + ~{plan.estimated_completion_tokens:,} answer tokens, {cost}"
        )
        for item in plan.items:
            click.echo(f"  call: {item}")
        for problem in plan.problems:
            click.echo(f"kindex: note: {problem}", err=True)
        return
    _step(kb, kw, lambda o: generate.reindex(kb, o))


@click.command()
@kb_arg
@model_opts
def root(kb: str, **kw: Any) -> None:
    """Write only the root KB/index.json (root documents and one entry per theme).

    After a theme folder is added, renamed or emptied. A new or renamed theme needs its own index too: `kindex sub
    KB DIR` (or `kindex reindex KB` for both). A theme folder left with no document loses the index.json kindex
    wrote in it.

    \b
    Example:
      kindex root sample_kb
    """
    _step(kb, kw, lambda o: generate.root(kb, o))


@click.command()
@kb_arg
@click.argument("dir_name", metavar="DIR")
@model_opts
def sub(kb: str, dir_name: str, **kw: Any) -> None:
    """Write KB/DIR/index.json: one model call per document of theme DIR (a first-level folder).

    \b
    Example:
      kindex sub sample_kb billing --model openai/gpt-4o-mini
    """
    _step(kb, kw, lambda o: generate.sub(kb, _named(dir_name), o))


@click.command("doc")
@kb_arg
@click.argument("dir_name", metavar="DIR")
@click.argument("path", metavar="[PATH]", required=False)
@click.option(
    "--clear-dir",
    is_flag=True,
    help="Start DIR/index.json afresh with only this document's entry (the first document of a theme); the theme's "
    "other documents come back with `kindex doc` or `kindex sub` (until then `kindex validate` lists them).",
)
@model_opts
def doc_cmd(kb: str, dir_name: str, path: str | None, clear_dir: bool, **kw: Any) -> None:
    """Merge one document's entry into KB/DIR/index.json. PATH is relative to DIR; the path as search prints it
    (DIR/PATH) works too. A document directly under KB is in the root index: `kindex root KB` writes it.

    One model call for an edited or added document; the theme's other entries are kept.

    \b
    Example:
      kindex doc sample_kb billing 退款政策.md
      kindex doc sample_kb billing/企业采购/对公转账.md
    """
    if path is None:
        rel = _in_kb(kb, dir_name)
        if "/" not in rel:
            root = f"the root index holds the entries of documents directly under it: run `kindex root {kb}`"
            if rel in ("", "."):
                raise click.UsageError(f"'{dir_name}' is the knowledge folder itself: {root}")
            if rel.endswith(".md") and (Path(kb) / rel).is_file():
                raise click.UsageError(f"'{dir_name}' is directly under the knowledge folder: {root}")
            if rel.endswith(".md"):  # a theme left out (`kindex doc KB cors.md`): it was sent to `kindex root`
                raise click.UsageError(_where_is(kb, rel))
            raise click.UsageError(
                "give the document: `kindex doc KB DIR PATH` (PATH relative to DIR), or DIR/PATH as search prints it"
            )
        dir_name, path = rel.split("/", 1)
    _step(kb, kw, lambda o: generate.doc(kb, _named(dir_name), _named(path), o, clear_dir=clear_dir))


def _named(arg: str) -> str:
    """A theme or a path as written on a command line, ``./-name`` being ``-name`` (how `validate` writes a name
    that starts with ``-``, which click would read as an option)."""
    return arg.removeprefix("./")


def _where_is(kb: str, name: str) -> str:
    """What to run for a document named without its theme: the documents of the KB that have that name."""
    found = [d.rel for d in scan(kb).documents if d.rel.rsplit("/", 1)[-1] == name]
    if not found:
        return f"'{name}' is not a document of {kb} (none of its documents has that name): check the name"
    fixes = " or ".join(f"`kindex doc {shlex.quote(kb)} {shlex.quote(rel)}`" for rel in found[:5])
    return f"'{name}' is not directly under the knowledge folder; its documents of that name: {fixes}"


def _in_kb(kb: str, given: str) -> str:
    """``given`` as a KB-relative path: as written (``billing/a.md``, ``./billing/a.md``, ``billing\\a.md``), or
    a path to the file itself, absolute or from here, that lies in KB (``/srv/kb/billing/a.md``). A path the KB
    holds as written is the KB's: from inside ``KB/tutorial``, ``index.md`` is the root one, not the folder's."""
    try:
        if (Path(kb) / normalize_path(given)).exists():
            return normalize_path(given)
        target = Path(given).resolve()
        if (Path(given).is_absolute() or target.exists()) and target.is_relative_to(root := Path(kb).resolve()):
            return target.relative_to(root).as_posix()
    except (OSError, ValueError):  # a name too long, a NUL
        pass
    return normalize_path(given)


@click.command()
@kb_arg
@json_opt
@click.option("--model", help="Model to estimate for [env KINDEX_MODEL].")
def preview(kb: str, as_json: bool, model: str | None) -> None:
    """Scan KB without calling a model: themes, documents, skipped files and a token estimate."""
    p = generate.preview(kb, Settings.resolved(kb, {"model": model}).generation)
    if as_json:
        click.echo(orjson.dumps(p.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    d = p.to_dict()
    click.echo(f"knowledge folder: {d['kb']}")
    click.echo(f"root documents ({len(d['root_docs'])}): {', '.join(d['root_docs']) or '-'}")
    click.echo(f"themes ({len(d['top_dirs'])}):")
    for name, docs in d["top_dir_docs"].items():
        click.echo(f"  {name}/  {len(docs)} document{'' if len(docs) == 1 else 's'}")
    click.echo(
        f"steps: 1 root (its themes and {len(d['root_docs'])} root documents) + {p.steps_total - 1} theme documents "
        f"= {p.steps_total}"
    )
    gen = f"model {p.model}" if p.llm_configured else "extractive (offline, no model configured)"
    click.echo(f"generator: {gen}")
    est = d["estimated_tokens"]
    apart = est["calls"] - p.steps_total  # -1 when there is no root call (nothing to describe)
    each = f" (the root's {apart} documents one call each: more than fit one root answer)" if apart > 0 else ""
    click.echo(
        f"a full model run: {est['calls']} calls{each}, ~{est['prompt']:,} prompt + ~{est['completion']:,} answer "
        "tokens"
    )
    if not d["root_docs"] and not d["top_dir_docs"]:
        # As reindex says it: an empty plan with no word why looked like a KB that needs nothing.
        click.echo(
            "kindex: note: no Markdown document found (only .md files are indexed): is this the folder that holds "
            "your documents?",
            err=True,
        )
    for label, rows in (("skipped", d["skipped"]), ("warnings", d["warnings"])):
        if rows:
            click.echo(f"{label} ({len(rows)}):")
            for row in rows:
                click.echo(f"  {row['path']}: {row['reason']}")


@click.command()
@kb_arg
@json_opt
def validate(kb: str, as_json: bool) -> None:
    """Check KB's index files against the folder and the JSON contract; exit 1 listing any problem."""
    problems = validate_kb(kb)
    if as_json:
        click.echo(orjson.dumps({"ok": not problems, "problems": problems}, option=orjson.OPT_INDENT_2).decode())
    elif problems:
        for p in problems:
            click.echo(p)
    else:
        click.echo("index is valid")
    if problems:
        click.echo(f"kindex: {len(problems)} problem(s) found", err=True)
        sys.exit(1)
