"""Prompt templates: jinja2 with StrictUndefined, read from the installed ``kindex.prompts`` package."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

import jinja2

_PACKAGE = "kindex.prompts"


def _source(name: str) -> str:
    return resources.files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_source),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )


def template_names() -> list[str]:
    """Every template shipped with kindex."""
    return sorted(p.name for p in resources.files(_PACKAGE).iterdir() if p.name.endswith(".j2"))


def render(name: str, **context: Any) -> str:
    """Render template ``name``; a variable the template needs but was not given is an error, not a blank."""
    return _env().get_template(name).render(**context).strip()


@cache
def version(*names: str) -> str:
    """A short digest of the named templates' text: it changes whenever one of them is edited."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + _source(name).encode() + b"\0")
    return digest.hexdigest()[:16]
