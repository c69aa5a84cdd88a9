"""The skill routes of the HTTP service."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import pytest
from fastapi import FastAPI

from kindex import LLMSettings
from kindex.server import create_app
from kindex.server.errors import MAX_UPLOAD_BYTES
from tests.test_server import TOKEN, call
from tests.test_skills import library, make_zip, skill_md  # noqa: F401  (library is a fixture)

BASE = "/v1/agents/lib/skills"


@pytest.fixture
def app(library: Path, tmp_path: Path) -> FastAPI:  # noqa: F811
    root = tmp_path / "agents"
    root.mkdir()
    shutil.move(str(library), root / "lib")
    return create_app(root, token=TOKEN, llm=LLMSettings())


def test_find_import_export_delete_and_sync(app: FastAPI) -> None:
    hits = call(app, "POST", f"{BASE}/find", json={"query": "restore a backup in another region", "limit": 2})
    assert hits.status_code == 200
    assert hits.json()[0]["uri"] == "data-services/reference/backup.md"
    assert hits.json()[0]["skill_dependencies"] == ["auth-helper", "vault-helper"]

    package = make_zip({"csv-tools/SKILL.md": skill_md("csv-tools", "Clean and convert CSV files.")})
    r = call(app, "POST", f"{BASE}/import", files={"file": ("csv.zip", package, "application/zip")})
    assert r.status_code == 200 and r.json()["name"] == "csv-tools"
    r = call(app, "POST", f"{BASE}/import", files={"file": ("csv.zip", package, "application/zip")})
    assert r.json()["name"] == "csv-tools" and r.json()["same"] is True  # the very package: not installed twice
    other = make_zip({"csv-tools/SKILL.md": skill_md("csv-tools", "Clean, convert and merge CSV files.")})
    r = call(app, "POST", f"{BASE}/import", files={"file": ("csv.zip", other, "application/zip")})
    assert r.json()["name"] == "csv-tools-v2" and r.json()["renamed_from"] == "csv-tools" and not r.json()["same"]

    exported = call(app, "GET", f"{BASE}/csv-tools/export")
    assert exported.status_code == 200 and exported.headers["content-type"] == "application/zip"
    assert zipfile.ZipFile(io.BytesIO(exported.content)).namelist() == ["csv-tools/SKILL.md"]

    assert call(app, "DELETE", f"{BASE}/csv-tools-v2").status_code == 204
    gone = call(app, "GET", f"{BASE}/csv-tools-v2/export")  # a skill that is not there: 404, not "broken"
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert call(app, "DELETE", f"{BASE}/csv-tools-v2").status_code == 404

    sync = call(app, "POST", f"{BASE}/sync", json={"only": ["pdf-tools"]})
    names = zipfile.ZipFile(io.BytesIO(sync.content)).namelist()
    assert sync.status_code == 200 and "pdf-tools/SKILL.md" in names and ".sync-manifest.json" in names


def test_hostile_packages_and_oversized_uploads_are_refused(app: FastAPI) -> None:
    evil = make_zip({"../x/SKILL.md": "x"})
    r = call(app, "POST", f"{BASE}/import", files={"file": ("evil.zip", evil, "application/zip")})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_skill"
    assert "climbs out of the package" in r.json()["error"]["message"]

    huge = b"0" * (MAX_UPLOAD_BYTES + 1)
    r = call(app, "POST", f"{BASE}/import", files={"file": ("big.zip", huge, "application/zip")})
    assert r.status_code == 413

    r = call(app, "POST", "/v1/agents/lib/knowledge/context", content=b"x" * (300 * 1024))
    assert r.status_code == 413  # the larger upload limit is for skill packages only


def test_an_upload_is_parsed_off_the_event_loop(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    # FastAPI parsed the multipart form on the event loop before the route ran: 24 uploads of 20 MiB put another
    # agent's context call at 2.3 s.
    import threading

    import kindex.server.routes as routes

    threads: list[str] = []
    real = routes._uploaded

    def recording(content_type: str, body: bytes) -> bytes:
        threads.append(threading.current_thread().name)
        return real(content_type, body)

    monkeypatch.setattr(routes, "_uploaded", recording)
    package = make_zip({"csv-tools/SKILL.md": skill_md("csv-tools", "Clean and convert CSV files.")})
    r = call(app, "POST", f"{BASE}/import", files={"file": ("csv.zip", package, "application/zip")})
    assert r.status_code == 200 and r.json()["name"] == "csv-tools"
    assert threads and threads[0] != threading.main_thread().name
    missing = call(app, "POST", f"{BASE}/import", files={"other": ("csv.zip", package, "application/zip")})
    assert missing.status_code == 422 and "multipart form field `file`" in missing.json()["error"]["message"]


def test_a_malformed_sync_manifest_is_a_422_not_a_500(app: FastAPI) -> None:
    for manifest in ({"skills": 5}, {"skills": [{"name": ["x"], "version": "1"}]}):
        r = call(app, "POST", f"{BASE}/sync", json={"manifest": manifest})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_skill", r.text


@pytest.mark.parametrize(
    "body",
    [b"garbage", b"\r\n--zz\r\n\r\n"],
    ids=["not-multipart", "no-field-name"],
)
def test_a_multipart_body_that_does_not_parse_gets_401_first_without_the_token(app: FastAPI, body: bytes) -> None:
    headers = {"Content-Type": "multipart/form-data; boundary=zz"}
    r = call(app, "POST", f"{BASE}/import", auth=False, content=body, headers=headers)

    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    with_token = call(app, "POST", f"{BASE}/import", content=body, headers=headers)
    assert with_token.status_code == 422 and with_token.json()["error"]["code"] == "invalid_request"
    assert with_token.json()["error"]["message"].startswith("the body could not be read: send a JSON object in UTF-8")


def test_skill_routes_on_a_plain_knowledge_folder_say_what_it_lacks(app: FastAPI, tmp_path: Path) -> None:
    # It answered kb_not_found "has no skill library" for a folder that exists; the MCP tool said not_found.
    plain = tmp_path / "agents" / "plain"
    plain.mkdir()
    (plain / "a.md").write_text("# a\n\ntext\n", encoding="utf-8")
    r = call(app, "POST", "/v1/agents/plain/skills/find", json={"query": "pdf"})
    assert r.status_code == 404 and r.json()["error"] == {
        "code": "not_found",
        "message": "the knowledge folder of agent 'plain' is not a skill library (no folder holds a SKILL.md)",
    }


@pytest.mark.parametrize("limit", ["5", True, 2.0])
def test_find_takes_a_json_integer_limit_as_the_other_bodies_do(app: FastAPI, limit: object) -> None:
    # "5" and true were read as 5 and 1, where budget_tokens and max_docs refuse them.
    r = call(app, "POST", f"{BASE}/find", json={"query": "pdf", "limit": limit})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request" and "limit" in r.text
