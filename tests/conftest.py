from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from kindex import LLMSettings, Options
from tests.fakeclient import FakeClient
from tests.fakellm import FakeLLM

REPO = Path(__file__).resolve().parent.parent
SAMPLE_KB = REPO / "sample_kb"
CORPORA = Path(os.environ.get("KINDEX_CORPORA") or REPO.parent / "shared" / "corpora")

# CI runs the property tests on a fixed sequence of examples: a new example found there would turn main red on a
# commit that changed nothing it tests. Local runs keep drawing fresh ones (and remembering the failures).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def sample_kb(tmp_path: Path) -> Path:
    """A fresh copy of the sample KB (kindex writes into the folder it indexes)."""
    dest = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB, dest, ignore=shutil.ignore_patterns(".kindex", "index.json"))
    return dest


@pytest.fixture
def fake_llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    server = FakeLLM().start()
    try:
        yield server
    finally:
        server.stop()


def llm_settings(server: FakeLLM, **overrides: object) -> LLMSettings:
    base: dict[str, object] = {
        "model": "openai/fake-model",
        "api_base": server.url,
        "timeout": 5.0,
        "retries": 2,
        "retry_base_delay": 0.01,
    }
    base.update(overrides)
    return LLMSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
def llm_options(fake_llm: FakeLLM) -> Options:
    return Options(llm=llm_settings(fake_llm), concurrency=4)


@pytest.fixture
def fake_llm_settings_short_excerpt(fake_llm: FakeLLM) -> Options:
    return Options(llm=llm_settings(fake_llm), excerpt_chars=150)


@pytest.fixture
def fake_client() -> FakeClient:
    """An in-process model: for tests of the pipeline, not of the litellm adapter (see tests/fakeclient.py)."""
    return FakeClient()


def client_options(client: FakeClient, **overrides: Any) -> Options:
    """Options that send every model call to ``client`` (the model name only shapes the cache keys)."""
    base: dict[str, Any] = {"llm": LLMSettings(model="fake-model"), "client": client, "concurrency": 4}
    base.update(overrides)
    return Options(**base)


@pytest.fixture
def fake_options(fake_client: FakeClient) -> Options:
    return client_options(fake_client)
