"""The ``kindex`` command line: parse arguments, call one core function, print.

Human output goes to stdout, progress bars and notices to stderr; ``--json`` prints one JSON object on stdout.
Exit status: 0 success, 1 failure, 2 usage error, 3 a run that finished but left documents failed, 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click
import orjson

from kindex.commands.options import EXIT_INTERRUPTED
from kindex.errors import InterruptedRun, KindexError, UsageError

# Each command's module is imported only when that command runs (click's lazy sub-commands), so `kindex context`
# loads the retrieval path alone, not generation, the model adapter or the server.
_COMMANDS = {
    "reindex": "kindex.commands.index:reindex",
    "root": "kindex.commands.index:root",
    "sub": "kindex.commands.index:sub",
    "doc": "kindex.commands.index:doc_cmd",
    "preview": "kindex.commands.index:preview",
    "validate": "kindex.commands.index:validate",
    "context": "kindex.commands.context:context",
    "serve": "kindex.commands.serve:serve",
    "find": "kindex.commands.skills:find",
    "skills": "kindex.commands.skills:skills_group",
}


class _Group(click.Group):
    """Loads commands lazily and maps the core's errors to click's in one place: usage errors exit 2, every other
    failure exits 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, name = target.split(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        as_json = "--json" in ctx.args  # the sub-command's own arguments
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise click.UsageError(exc.message) from None
        except InterruptedRun as exc:
            click.echo(f"kindex: {exc.message}", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except KeyboardInterrupt:  # Ctrl-C before a run started (while loading, scanning): nothing was written
            click.echo("kindex: interrupted; nothing was written", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except KindexError as exc:
            if as_json:  # a script reading stdout gets an answer it can parse, failures included
                error = {"ok": False, "error": {"code": exc.code, "message": exc.message}}
                click.echo(orjson.dumps(error, option=orjson.OPT_INDENT_2).decode())
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


if __name__ == "__main__":
    main()
