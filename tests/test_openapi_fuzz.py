"""Schemathesis over the service's OpenAPI schema: no 5xx, and every response matches its schema.

The agents' folder is made by a fixture when the test runs (not at import) and removed after it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

import kindex
from kindex.server import create_app
from tests.conftest import SAMPLE_KB

AGENTS = ("agent1", "lib")


# The app is made at import (that touches no file); its agents' folder only when the test runs, and it is removed
# after. (schemathesis.pytest.from_fixture would defer the app too, but it breaks on pytest 9.2.)
ROOT = Path(tempfile.gettempdir()) / f"kindex-fuzz-{os.getpid()}"
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(ROOT, llm=kindex.LLMSettings()))


@pytest.fixture(scope="module", autouse=True)
def agents_root() -> Iterator[Path]:
    """A KB (agent1) and a skill library (lib), both indexed, in a folder removed after the test."""
    shutil.rmtree(ROOT, ignore_errors=True)
    try:
        shutil.copytree(SAMPLE_KB, ROOT / "agent1", ignore=shutil.ignore_patterns(".kindex", "index.json"))
        kindex.reindex(ROOT / "agent1")
        (ROOT / "lib" / "pdf-tools").mkdir(parents=True)
        (ROOT / "lib" / "pdf-tools" / "SKILL.md").write_text(
            "---\nname: pdf-tools\ndescription: Create and merge PDF files.\n---\n# PDF tools\n", encoding="utf-8"
        )
        kindex.reindex(ROOT / "lib")
        yield ROOT
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api(case: schemathesis.Case[Any]) -> None:
    params = case.path_parameters or {}
    if "agent_id" in params and params["agent_id"] not in AGENTS:
        params["agent_id"] = (*AGENTS, "nobody")[len(params["agent_id"]) % 3]  # mostly agents that exist
    # A schema-valid upload need not be a valid skill package: refusing it (422 invalid_skill) is correct, so the
    # check that every schema-valid request is accepted does not apply to this API.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
