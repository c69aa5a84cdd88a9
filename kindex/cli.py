"""The ``kindex`` command line: parse arguments, call one core function, print.

Human output goes to stdout, progress bars and notices to stderr; ``--json`` prints one JSON object on stdout.
Exit status: 0 success, 1 failure, 2 usage error, 3 a run that finished but left documents failed, 130 interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
import orjson

from kindex import generate
from kindex.errors import InterruptedRun, KindexError, UsageError
from kindex.llm import RESPONSE_FORMATS, LLMSettings
from kindex.retrieve import (
    DEFAULT_BUDGET_TOKENS,
    DEFAULT_FALLBACK_DOCS,
    DEFAULT_MAX_DOCS,
    DEFAULT_MIN_RELEVANCE,
    build_context,
)
from kindex.scan import DEFAULT_EXCERPT_CHARS
from kindex.validate import validate as validate_kb

EXIT_PARTIAL = 3
EXIT_INTERRUPTED = 130
F = TypeVar("F", bound=Callable[..., Any])


class _Group(click.Group):
    """Maps the core's errors to click's in one place: usage errors exit 2, every other failure exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise click.UsageError(exc.message) from None
        except InterruptedRun as exc:
            click.echo(f"kindex: {exc.message}", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except KindexError as exc:
            raise click.ClickException(exc.message) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kindex")
def main() -> None:
    """Index a folder of Markdown knowledge for a chat agent.

    \b
    Typical use:
      kindex preview KB            what would be indexed, and how big a model run is
      kindex reindex KB            write KB/index.json and KB/<theme>/index.json
      kindex validate KB           check the index files against the folder
      kindex context KB "问题"      the documents a chat message is about, as prompt text
      kindex serve --kb-root DIR   the same over HTTP, one KB per agent
      kindex find SKILLS "query"   one best hit per skill in an Agent Skills library

    With no model configured kindex uses its offline extractive generator (no network, no key). To use an LLM,
    pass any litellm model string: --model openai/gpt-4o-mini (key from OPENAI_API_KEY), or set KINDEX_MODEL.
    """


def _kb_arg(f: F) -> F:
    return click.argument("kb", type=click.Path(path_type=str))(f)


def _json_opt(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(f)


def _concurrency_opt(f: F) -> F:
    return click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        default=generate.DEFAULT_CONCURRENCY,
        show_default=True,
        envvar="KINDEX_CONCURRENCY",
        help="Model calls in flight at once (per run) [env KINDEX_CONCURRENCY].",
    )(f)


def _model_opts(f: F) -> F:
    options = [
        click.option("--model", help="litellm model string, e.g. openai/gpt-4o-mini [env KINDEX_MODEL]."),
        click.option("--api-base", help="Base URL of an OpenAI-compatible endpoint [env KINDEX_API_BASE]."),
        click.option("--temperature", type=float, help="Sampling temperature (default 0.1) [env KINDEX_TEMPERATURE]."),
        click.option("--timeout", type=float, help="Seconds per model call (default 60) [env KINDEX_TIMEOUT]."),
        click.option("--max-tokens", type=int, help="Answer length cap (default 600) [env KINDEX_MAX_TOKENS]."),
        click.option("--retries", type=int, help="Retries on 429/5xx/timeouts (default 4) [env KINDEX_RETRIES]."),
        click.option(
            "--response-format",
            type=click.Choice(RESPONSE_FORMATS),
            help="Ask for JSON output; auto picks what the provider supports [env KINDEX_RESPONSE_FORMAT].",
        ),
        _concurrency_opt,
        click.option(
            "--excerpt-chars",
            type=click.IntRange(min=100),
            default=DEFAULT_EXCERPT_CHARS,
            show_default=True,
            help="Characters of each document shown to the model.",
        ),
        click.option("--force", is_flag=True, help="Ignore cached answers and ask the model again."),
        click.option("--wait", type=float, default=0.0, show_default=True, help="Seconds to wait for another writer."),
        _json_opt,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _options(kw: dict[str, Any], bar: Callable[[generate.Progress], None] | None) -> generate.Options:
    llm = LLMSettings.from_env(
        model=kw.pop("model"),
        api_base=kw.pop("api_base"),
        temperature=kw.pop("temperature"),
        timeout=kw.pop("timeout"),
        max_tokens=kw.pop("max_tokens"),
        retries=kw.pop("retries"),
        response_format=kw.pop("response_format"),
    )
    return generate.Options(
        llm=llm,
        concurrency=kw.pop("concurrency"),
        excerpt_chars=kw.pop("excerpt_chars"),
        force=kw.pop("force"),
        wait=kw.pop("wait"),
        on_progress=bar,
    )


def _announce(llm: LLMSettings) -> None:
    if llm.configured:
        where = f" at {llm.api_base}" if llm.api_base else ""
        click.echo(f"kindex: generator: model {llm.model}{where}", err=True)
    else:
        click.echo(
            "kindex: generator: extractive (offline, no model configured; use --model or KINDEX_MODEL for an LLM)",
            err=True,
        )


@contextmanager
def _progress_bar(enabled: bool) -> Iterator[Callable[[generate.Progress], None] | None]:
    if not enabled:
        yield None
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


def _emit(report: generate.RunReport, as_json: bool) -> None:
    if as_json:
        click.echo(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        u = report.usage
        cost = "cost unknown" if u.cost is None else f"cost ${u.cost:.4f}"
        tokens = f"{u.prompt_tokens + u.completion_tokens:,} tokens ({cost})" if u.calls else "no tokens"
        click.echo(
            f"{report.step}: {report.completed}/{report.total} steps, {u.calls} model calls, "
            f"{report.cache_hits} cached, {u.retries} retries, {len(report.failures)} failed, {tokens}, "
            f"{report.wall_seconds:.1f} s"
        )
        if report.written:
            click.echo("wrote: " + ", ".join(report.written))
        for f in report.failures:
            click.echo(f"failed: {f.path}: {f.reason} (kept its previous or an extractive entry)")
    if report.failures:
        click.echo(
            f"kindex: {len(report.failures)} item(s) failed; their entries are extractive or previous ones. "
            "Run the command again to retry them.",
            err=True,
        )
        sys.exit(EXIT_PARTIAL)


def _step(kw: dict[str, Any], call: Callable[[generate.Options], generate.RunReport]) -> None:
    as_json = kw.pop("as_json")
    with _progress_bar(True) as bar:
        opts = _options(kw, bar)
        _announce(opts.llm)
        report = call(opts)
    _emit(report, as_json)


@main.command()
@_kb_arg
@_model_opts
@click.option(
    "--dry-run", is_flag=True, help="Print the calls a run would make and their estimated cost; call nothing."
)
def reindex(kb: str, dry_run: bool, **kw: Any) -> None:
    """Write the whole index: KB/index.json, then every theme's KB/<theme>/index.json.

    Unchanged documents are answered from the cache under KB/.kindex/, so a re-run costs only what changed.
    Ctrl-C stops cleanly: what was answered is kept, and running again finishes the job.
    """
    if dry_run:
        as_json = kw.pop("as_json")
        plan = generate.dry_run(kb, _options(kw, None))
        if as_json:
            click.echo(orjson.dumps(plan.to_dict(), option=orjson.OPT_INDENT_2).decode())
            return
        cost = "cost unknown" if plan.cost is None else f"about ${plan.cost:.4f}"
        click.echo(
            f"dry run ({plan.generator}): {len(plan.calls)} model calls, {plan.cached} answers cached, "
            f"~{plan.prompt_tokens:,} prompt + ~{plan.completion_tokens:,} answer tokens, {cost}"
        )
        for item in plan.calls:
            click.echo(f"  call: {item}")
        return
    _step(kw, lambda o: generate.reindex(kb, o))


@main.command()
@_kb_arg
@_model_opts
def root(kb: str, **kw: Any) -> None:
    """Write only the root KB/index.json (root documents and one entry per theme)."""
    _step(kw, lambda o: generate.root(kb, o))


@main.command()
@_kb_arg
@click.argument("dir_name", metavar="DIR")
@_model_opts
def sub(kb: str, dir_name: str, **kw: Any) -> None:
    """Write KB/DIR/index.json: one model call per document of theme DIR."""
    _step(kw, lambda o: generate.sub(kb, dir_name, o))


@main.command("doc")
@_kb_arg
@click.argument("dir_name", metavar="DIR")
@click.argument("path", metavar="PATH")
@click.option("--clear-dir", is_flag=True, help="Start DIR/index.json afresh (the first document of a theme).")
@_model_opts
def doc_cmd(kb: str, dir_name: str, path: str, clear_dir: bool, **kw: Any) -> None:
    """Merge one document's entry into KB/DIR/index.json. PATH is relative to DIR."""
    _step(kw, lambda o: generate.doc(kb, dir_name, path, o, clear_dir=clear_dir))


@main.command()
@_kb_arg
@_json_opt
@click.option("--model", help="Model to estimate for [env KINDEX_MODEL].")
def preview(kb: str, as_json: bool, model: str | None) -> None:
    """Scan KB without calling a model: themes, documents, skipped files and a token estimate."""
    p = generate.preview(kb, generate.Options(llm=LLMSettings.from_env(model=model)))
    if as_json:
        click.echo(orjson.dumps(p.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    d = p.to_dict()
    click.echo(f"knowledge folder: {d['kb']}")
    click.echo(f"root documents ({len(d['root_docs'])}): {', '.join(d['root_docs']) or '-'}")
    click.echo(f"themes ({len(d['top_dirs'])}):")
    for name, docs in d["top_dir_docs"].items():
        click.echo(f"  {name}/  {len(docs)} documents")
    click.echo(f"steps: 1 root + {p.steps_total - 1} documents = {p.steps_total}")
    gen = f"model {p.model}" if p.llm_configured else "extractive (offline, no model configured)"
    click.echo(f"generator: {gen}")
    est = d["estimated_tokens"]
    click.echo(
        f"a full model run: {est['calls']} calls, ~{est['prompt']:,} prompt + ~{est['completion']:,} answer tokens"
    )
    for label, rows in (("skipped", d["skipped"]), ("warnings", d["warnings"])):
        if rows:
            click.echo(f"{label} ({len(rows)}):")
            for row in rows:
                click.echo(f"  {row['path']}: {row['reason']}")


@main.command()
@_kb_arg
@_json_opt
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


@main.command()
@_kb_arg
@click.argument("message")
@click.option("--path", "paths", multiple=True, metavar="P", help="A file the user is working on (repeatable).")
@click.option(
    "--budget",
    type=click.IntRange(min=50),
    default=DEFAULT_BUDGET_TOKENS,
    show_default=True,
    help="Token budget of the assembled text.",
)
@click.option(
    "--max-docs",
    type=click.IntRange(min=1),
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
@_json_opt
def context(
    kb: str,
    message: str,
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
    if message == "-":
        message = sys.stdin.read()
    ctx = build_context(
        kb,
        message,
        paths=paths,
        budget_tokens=budget,
        max_docs=max_docs,
        min_relevance=min_relevance,
        fallback_docs=fallback_docs or DEFAULT_FALLBACK_DOCS,
    )
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


@main.command()
@click.option(
    "--kb-root",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="Folder holding one knowledge folder per agent: KB-ROOT/<agent_id>/.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0 picks a free port.")
@_concurrency_opt
def serve(kb_root: str, host: str, port: int, concurrency: int) -> None:
    """Serve the reindex steps, BuildContext and tasks over HTTP (needs kindex[server]).

    Routes live under /v1/agents/{agent_id}/knowledge/; OpenAPI at /docs. Requests must carry
    `Authorization: Bearer $KINDEX_API_TOKEN`; without that variable the server listens on loopback only.
    The model comes from KINDEX_MODEL / KINDEX_API_BASE (none: the offline extractive generator).
    """
    import ipaddress
    import logging
    import os

    token = os.environ.get("KINDEX_API_TOKEN") or None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if token is None and not loopback:
        raise UsageError(f"refusing to listen on {host} without KINDEX_API_TOKEN: set a token, or use 127.0.0.1")
    try:
        import uvicorn

        from kindex.server import create_app
    except ImportError as exc:
        raise KindexError(
            f"the HTTP service needs its extra ({exc.name} is missing): pip install 'kindex[server]'"
        ) from None
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    app = create_app(kb_root, token=token, llm=LLMSettings.from_env(), concurrency=concurrency)
    auth = "bearer token required" if token else "no token: loopback only"
    click.echo(f"kindex: serving {kb_root} ({auth}); OpenAPI at /docs", err=True)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False, timeout_graceful_shutdown=30)


from kindex.commands import skills as _skills_commands  # noqa: E402,F401  (registers `find` and `skills`)

if __name__ == "__main__":
    main()
