"""``kindex find`` and ``kindex skills …``: skill libraries (Agent Skills folders)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click

from kindex import skills
from kindex.cli.index import model_opts, options_from
from kindex.cli.options import json_opt, kb_arg, print_json, shown
from kindex.kb import KnowledgeBase, Settings
from kindex.skillmodel import validate_skills


@click.command()
@kb_arg
@click.argument("query")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True, help="Distinct skills to return.")
@click.option(
    "--level",
    "levels",
    type=click.IntRange(0, 2),
    multiple=True,
    help="Only hits of this level (repeatable): 0 skill summary, 1 folder overview, 2 file.",
)
@json_opt
def find(kb: str, query: str, limit: int, levels: tuple[int, ...], as_json: bool) -> None:
    """Find the skills of library KB that match QUERY: one best hit per skill, best first.

    \b
    Example:
      kindex find skills/ "跨区域备份怎么恢复" --limit 3
    """
    hits = KnowledgeBase(kb).find_skills(query, limit=limit, levels=levels or None)
    if as_json:
        print_json([h.to_dict() for h in hits])
        return
    if not hits:
        click.echo("no skill matches", err=True)
    for h in hits:
        deps = f"  needs: {', '.join(h.skill_dependencies)}" if h.skill_dependencies else ""
        click.echo(f"{h.score:7.2f}  {h.name}  ->  {h.uri} (level {h.level}){deps}")


@click.group("skills")
def skills_group() -> None:
    """Manage a skill library: validate, import and export ZIP packages, delete, sync to a workspace."""


@skills_group.command("validate")
@kb_arg
@json_opt
def validate_cmd(kb: str, as_json: bool) -> None:
    """Check every SKILL.md against the Agent Skills rules and the dependencies; exit 1 listing problems."""
    problems = validate_skills(kb)
    if as_json:
        print_json({"ok": not problems, "problems": [{"file": p.file, "rule": p.rule} for p in problems]})
    else:
        for p in problems:
            click.echo(str(p))
        if not problems:
            click.echo("skills are valid")
    if problems:
        sys.exit(1)


@skills_group.command("import")
@kb_arg
@click.argument("package", type=click.Path(dir_okay=False, exists=True))
@click.option("--replace", is_flag=True, help="Replace a skill of the same name (backed up; restored on failure).")
@click.option(
    "--max-bytes",
    type=click.IntRange(min=1),
    default=skills.DEFAULT_MAX_ZIP_BYTES,
    show_default=True,
    help="Refuse archives that unpack to more bytes.",
)
@click.option(
    "--max-files",
    type=click.IntRange(min=1),
    default=skills.DEFAULT_MAX_ZIP_FILES,
    show_default=True,
    help="Refuse archives with more files.",
)
@model_opts
def import_cmd(kb: str, package: str, replace: bool, max_bytes: int, max_files: int, **kw: Any) -> None:
    """Install a one-skill ZIP into KB and index it. A taken name becomes NAME-v2 unless --replace."""
    as_json = kw.pop("as_json")
    result = skills.import_skill(
        kb, package, replace=replace, options=options_from(kb, kw, None), max_bytes=max_bytes, max_files=max_files
    )
    if as_json:
        print_json(result.to_dict())
        return
    if result.same:
        click.echo(f"skill {result.name} is already installed with these very files: indexed again")
        return
    how = "replaced" if result.replaced else "installed"
    renamed = f" (renamed from {result.renamed_from}: that name was taken)" if result.renamed_from else ""
    click.echo(f"{how} skill {result.name}{renamed}: {result.files} files indexed")


@skills_group.command("export")
@kb_arg
@click.argument("name")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="The ZIP file to write (`-`: standard output).",
)
def export_cmd(kb: str, name: str, output: str) -> None:
    """Write skill NAME of KB as a ZIP package.

    \b
    Example:
      kindex skills export LIB pdf-tools -o pdf-tools.zip
      kindex skills export LIB pdf-tools -o - | ssh host 'cat > pdf-tools.zip'
    """
    if output == "-":
        data = skills.export_skill(kb, name)
        stream = sys.stdout.buffer
        stream.write(data)
        stream.flush()
        click.echo(f"wrote {len(data)} bytes to standard output", err=True)
        return
    data = skills.export_skill(kb, name, output)
    click.echo(f"wrote {shown(output)} ({len(data)} bytes)")


@skills_group.command("delete")
@kb_arg
@click.argument("name")
@click.option("--wait", type=float, default=0.0, show_default=True, help="Seconds to wait for another writer.")
def delete_cmd(kb: str, name: str, wait: float) -> None:
    """Remove skill NAME from KB, and its entries from the index."""
    skills.delete_skill(kb, name, dataclasses.replace(Settings.resolved(kb).generation, wait=wait))
    click.echo(f"deleted skill {name}")


@skills_group.command("sync")
@click.argument("src", type=click.Path(file_okay=False, exists=True))
@click.argument("dest", type=click.Path(file_okay=False), required=False)
@click.option("--only", multiple=True, metavar="NAME", help="Sync only these skills (repeatable).")
@click.option("--zip", "zip_out", type=click.Path(dir_okay=False), help="Write the changes as one ZIP instead.")
@json_opt
def sync_cmd(src: str, dest: str | None, only: tuple[str, ...], zip_out: str | None, as_json: bool) -> None:
    """Copy the skills of library SRC into workspace DEST, sending only what changed since the last sync."""
    if dest is None and zip_out is None:
        raise click.UsageError("give DEST, --zip OUT.zip, or both")
    if zip_out == "-":  # standard output carries the summary (or --json)
        raise click.UsageError("--zip needs a file path, not `-`: write the ZIP to a file")
    result = skills.sync_skills(src, dest, only=only, zip_out=zip_out)
    if as_json:
        print_json(result.to_dict())
        return
    click.echo(
        f"synced {len(result.synced)} skill(s), {len(result.unchanged)} unchanged, {len(result.removed)} removed"
    )
    for name in result.synced:
        click.echo(f"  updated: {name}")
    for name in result.removed:
        click.echo(f"  removed: {name}")
