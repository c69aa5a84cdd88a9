"""The prompts ship inside the wheel and load from an installed, non-editable copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # builds a wheel with pip and imports it in a fresh interpreter

PROBE = """
import sys, kindex, kindex.cli  # the CLI and its command modules are part of the wheel too
from kindex import templating
from kindex.generators import doc_messages, root_messages
assert kindex.__file__.startswith(sys.argv[1]), kindex.__file__
names = templating.template_names()
assert names == ["doc_system.j2", "doc_user.j2", "repair.j2", "root_system.j2", "root_user.j2"], names
s = kindex.scan(sys.argv[2])
for m in root_messages(s) + doc_messages(s.themes["billing"][0]):
    assert m["content"], m
print(templating.render("repair.j2", error="E", shape="S"))
"""


def test_every_template_renders_from_an_installed_wheel(tmp_path: Path, sample_kb: Path) -> None:
    wheels, site, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "src"
    # From a copy without build/: setuptools reuses a stale build/lib, which would hide a missing package and ship
    # modules that no longer exist.
    ignore = shutil.ignore_patterns("build", ".git", ".venv*", "*.egg-info", "__pycache__", ".kindex", "index.json")
    shutil.copytree(REPO, src, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)], check=True, cwd=tmp_path
    )
    (wheel,) = wheels.glob("kindex-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp_path)

    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(site), str(sample_kb)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Your previous answer could not be used: E.")
    # Every module of the source tree ships: a package missing from pyproject's list is absent from the wheel.
    source = {p.relative_to(REPO).as_posix() for p in (REPO / "kindex").rglob("*.py")}
    shipped = {p.relative_to(site).as_posix() for p in (site / "kindex").rglob("*.py") if "prompts" not in p.parts}
    assert source == shipped
    # And every data file: the word tables are read where the package is installed.
    data = {p.name for p in (REPO / "kindex").iterdir() if p.suffix in (".bin", ".txt")}
    assert data == {"zh_words.bin", "en_words.bin", "zh_t2s.txt"}
    assert all((site / "kindex" / name).is_file() for name in data)
