"""Schemathesis over the service's OpenAPI schema: no 5xx, and every response matches its schema."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

import kindex
from kindex.server import create_app
from tests.conftest import SAMPLE_KB

_ROOT = Path(tempfile.mkdtemp(prefix="kindex-fuzz-"))
shutil.copytree(SAMPLE_KB, _ROOT / "agent1", ignore=shutil.ignore_patterns(".kindex", "index.json"))
kindex.reindex(_ROOT / "agent1")
app = create_app(_ROOT, llm=kindex.LLMSettings())
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api(case: schemathesis.Case) -> None:
    if "agent_id" in (case.path_parameters or {}) and case.path_parameters["agent_id"] not in ("agent1",):
        case.path_parameters["agent_id"] = "agent1" if hash(case.path_parameters["agent_id"]) % 2 else "nobody"
    case.call_and_validate()
