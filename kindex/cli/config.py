"""``kindex config``: the settings in force for a KB, and where each came from."""

from __future__ import annotations

from pathlib import Path

import click

from kindex.cli.options import json_opt, kb_arg, print_json
from kindex.config import CONFIG_FILE, SETTINGS, absent_documents, resolve
from kindex.errors import KBNotFoundError
from kindex.hosts import redact_url


@click.command("config")
@kb_arg
@json_opt
def config_cmd(kb: str, as_json: bool) -> None:
    """Print the effective settings of KB and where each came from.

    Precedence: a command's flag > the KINDEX_* environment > KB/kindex.toml > the default. The file holds
    [context] fallback_docs, min_relevance, budget_tokens, max_docs; [index] exclude; [model] model, api_base,
    temperature, timeout, max_tokens, retries, retry_base_delay, response_format, concurrency.

    \b
    Example KB/kindex.toml:
      [context]
      budget_tokens = 4000
      [index]
      exclude = ["drafts/**"]
      [model]
      model = "openai/gpt-4o-mini"
    """
    if not Path(kb).is_dir():
        what = "is not a folder" if Path(kb).exists() else "does not exist"
        raise KBNotFoundError(f"knowledge folder '{kb}' {what}")
    eff = resolve(kb)
    shown = {
        s.name: redact_url(v) if s.name == "api_base" and isinstance(v := eff[s.name], str) else eff[s.name]
        for s in SETTINGS
    }
    absent = absent_documents(kb, eff["fallback_docs"])
    if as_json:
        out = {s.name: {"value": _json(shown[s.name]), "source": eff.sources[s.name]} for s in SETTINGS}
        out["fallback_docs"]["absent"] = list(absent)
        print_json(out)
        return
    click.echo(f"# settings of {kb} (flag > environment > {CONFIG_FILE} > default)")
    section = ""
    for s in SETTINGS:
        if s.section != section:
            section = s.section
            click.echo(f"[{section}]")
        value = shown[s.name]
        line = f"# {s.name} is unset" if value is None else f"{s.name} = {_toml(value)}"
        note = ""
        if s.name == "fallback_docs" and absent:
            note = (
                " (none of them is in this KB: its README.md or index.md serves, else an overview of the index)"
                if len(absent) == len(value)
                else f" ({', '.join(absent)}: not in this KB)"
            )
        click.echo(f"{line}  # {eff.sources[s.name]}: {s.help}{note}")


def _json(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _toml(value: object) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value).lower() if isinstance(value, bool) else str(value)
