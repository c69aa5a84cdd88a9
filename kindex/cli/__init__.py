"""The ``kindex`` command line: parse arguments, call one core function, print.

Human output goes to stdout, progress bars and notices to stderr; ``--json`` prints one JSON object on stdout.
Exit status: 0 success, 1 failure, 2 usage error, 3 a run that finished but left documents failed, 130 interrupted.
"""

from __future__ import annotations

import codecs
import contextlib
import difflib
import importlib
import io
import os
import re
import sys
from typing import Any, NoReturn

# A one-shot command needs no pydantic plugin, and looking for them scans every installed distribution's entry
# points (~80 ms of `kindex context` here). The records' schemas are built on first use (defer_build), after this
# line; a user who sets the variable keeps their choice.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import click
import orjson

from kindex.cli.options import EXIT_INTERRUPTED
from kindex.errors import KindexError, StorageError, UsageError


class _Group(click.Group):
    """Loads commands lazily (``add_lazy_command``) and maps the core's errors to exit statuses in one place, from the
    ``exit_code`` each error class carries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy: dict[str, str] = {}

    def add_lazy_command(self, name: str, target: str) -> None:
        """Register ``name`` as the command at ``target`` (``module:attribute``), imported only when it runs."""
        self._lazy[name] = target

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self._lazy, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, name = target.split(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = click.utils.make_str(args[0]) if args else ""
        if args and self.get_command(ctx, name) is None and not name.startswith("-"):
            # click suggests a mistyped option but not a mistyped command: `kindex reindx` should say reindex.
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.75)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        as_json = "--json" in ctx.args  # the sub-command's own arguments
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C before a run started (while loading, scanning): nothing was written
            click.echo("kindex: interrupted; nothing was written", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.UsageError as exc:  # click's own: a bad option value, a missing argument
            command = exc.ctx.info_name if exc.ctx is not None else None
            if isinstance(exc, click.NoSuchOption) and (
                not _OPTION_LIKE.fullmatch(exc.option_name) or (command in _TAKE_TEXT and not exc.possibilities)
            ):
                # `kindex context KB "-h 参数是什么"` said only "No such option '- '"; `-x CORS` had no hint, and the
                # hint named `context` to `search`.
                name = exc.option_name.strip()
                text = exc.option_name if " " in name else "-h 参数是什么" if name == "-" else f"{name} …"
                hint = f" A message or path that starts with '-' goes after `--`: kindex {command} KB -- \"{text}\""
                exc = click.UsageError(exc.message + hint, exc.ctx)
            if as_json:
                _json_error(UsageError.code, exc.format_message())
            raise exc from None
        except KindexError as exc:
            _fail(exc, as_json)
        except BrokenPipeError:  # `kindex search KB q | head -3`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error flushing at exit
            sys.exit(1)
        except MemoryError:
            # A memory limit (`ulimit -v`, a container's) met while building a large KB's tables: a traceback said
            # nothing more, and the index files are whole (each is replaced only once written out).
            _fail(
                StorageError(
                    "ran out of memory; every index file is as it was or complete: raise the memory limit of this "
                    "process (ulimit -v, the container's) and run the command again"
                ),
                as_json,
            )
        except (OSError, RuntimeError) as exc:
            # What a command could not read or write outside kindex's own checks (its output on a full disk, an
            # argument that is a link loop, which pathlib raises as a RuntimeError): said, never a traceback.
            if isinstance(exc, RuntimeError) and not str(exc).startswith("Symlink loop"):
                raise
            where = getattr(exc, "filename", None)
            _fail(StorageError(f"{getattr(exc, 'strerror', None) or exc}{f': {where}' if where else ''}"), as_json)


def _fail(exc: KindexError, as_json: bool) -> NoReturn:
    """Each error class carries its exit status: usage errors exit 2 (with click's usage hint), an interrupted
    run 130, every other failure 1."""
    if as_json:  # a script reading stdout gets an answer it can parse, failures included
        with contextlib.suppress(OSError):  # the output itself may be what failed
            _json_error(exc.code, exc.message)
    if exc.exit_code == click.UsageError.exit_code:
        raise click.UsageError(exc.message) from None
    if exc.exit_code != 1:
        click.echo(f"kindex: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    raise click.ClickException(exc.message) from None


_TAKE_TEXT = {"context", "search", "find"}
"""The commands whose argument is a person's text, which may start with '-'."""
_OPTION_LIKE = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")
"""What a mistyped option looks like; anything else click took for one was text (a message starting with '-')."""


def _json_error(code: str, message: str) -> None:
    error = {"ok": False, "error": {"code": code, "message": message}}
    click.echo(orjson.dumps(error, option=orjson.OPT_INDENT_2).decode())


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
      kindex search KB "问题"       the same ranking, without the text
      kindex config KB             the settings in force (flags, KINDEX_*, KB/kindex.toml, defaults)
      kindex watch KB              reindex as documents change
      kindex serve --kb-root DIR   the same over HTTP, one KB per agent
      kindex worker --kb-root DIR --queue redis://…   run the steps of `serve --queue` replicas
      kindex mcp KB                the KB as an MCP server (stdio; --http for streamable HTTP)
      kindex find SKILLS "query"   one best hit per skill in an Agent Skills library

    With no model configured kindex uses its offline extractive generator (no network, no key). To use an LLM,
    pass any litellm model string: --model openai/gpt-4o-mini (key from OPENAI_API_KEY), or set KINDEX_MODEL.

    Results go to stdout (--json: one JSON object, failures included); progress, notes and warnings to stderr.
    Exit status: 0 done, 1 failed, 2 wrong usage, 3 some documents failed (they kept a stand-in entry: run again
    to retry them), 130 interrupted (nothing half-written).
    """
    # Output in an encoding that cannot hold every character (a Windows redirect in cp1252, a GBK locale meeting
    # an emoji) prints those as "?" instead of ending the command in a traceback after its work was done.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and codecs.lookup(stream.encoding).name != "utf-8":
            stream.reconfigure(errors="replace")


# Each command's module is imported only when that command runs, so `kindex context` loads the retrieval path
# alone, not generation, the model adapter or the server.
for _name, _target in {
    "reindex": "kindex.cli.index:reindex",
    "root": "kindex.cli.index:root",
    "sub": "kindex.cli.index:sub",
    "doc": "kindex.cli.index:doc_cmd",
    "preview": "kindex.cli.index:preview",
    "validate": "kindex.cli.index:validate",
    "context": "kindex.cli.context:context",
    "search": "kindex.cli.context:search",
    "config": "kindex.cli.config:config_cmd",
    "watch": "kindex.cli.watch:watch",
    "serve": "kindex.cli.serve:serve",
    "worker": "kindex.cli.serve:worker",
    "mcp": "kindex.cli.mcp:mcp_cmd",
    "find": "kindex.cli.skills:find",
    "skills": "kindex.cli.skills:skills_group",
}.items():
    main.add_lazy_command(_name, _target)
