"""Skill libraries: validation, whole-package indexing, per-skill search, ZIP import/export, deps, sync."""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import kindex
from kindex import skills
from kindex.cli import main
from kindex.errors import KindexError


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def skill_md(name: str, description: str, extra: str = "") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n# {name}\n\n{description}\n"


@pytest.fixture
def library(tmp_path: Path) -> Path:
    kb = tmp_path / "skills"
    write(
        kb / "data-services" / "SKILL.md",
        skill_md(
            "data-services",
            "Manage data services.",
            "skill_dependencies: [auth-helper]\ntool_dependencies: [psql]\nmcp_dependencies: [db-mcp]\n"
            "metadata:\n  tags: [database]\nallowed-tools: Bash Read\n",
        ),
    )
    write(
        kb / "data-services" / "reference" / "backup.md",
        "# Cross-region backup and restore\n\nTake snapshots, replicate them to another region and restore a "
        "database from a snapshot in a different region after an outage.\n",
    )
    write(kb / "data-services" / "reference" / "README.md", "# Reference\n\nDetailed guides for the data services.\n")
    write(
        kb / "auth-helper" / "SKILL.md",
        skill_md(
            "auth-helper",
            "Authenticate against internal services with tokens.",
            "skill_dependencies: [data-services, vault-helper]\ntool_dependencies: [vault, psql]\n",
        ),
    )
    write(
        kb / "vault-helper" / "SKILL.md",
        skill_md("vault-helper", "Read secrets from the vault.", "mcp_dependencies: [vault-mcp]\n"),
    )
    write(kb / "pdf-tools" / "SKILL.md", skill_md("pdf-tools", "Create, merge and edit PDF documents."))
    write(kb / "pdf-tools" / "examples" / "SKILL.md", "# Not a skill\n\nAn example SKILL.md inside a package.\n")
    kindex.reindex(kb)
    return kb


def make_zip(files: Mapping[str, str | bytes], *, modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names some tests need
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in files.items():
                info = zipfile.ZipInfo(name.split("#dup")[0])
                info.compress_type = zipfile.ZIP_DEFLATED
                mode = (modes or {}).get(name)
                if mode is not None:
                    info.external_attr = mode << 16
                z.writestr(info, data)
    return buf.getvalue()


def test_validation_names_the_file_and_the_rule(library: Path) -> None:
    write(library / "Bad_Skill" / "SKILL.md", skill_md("Bad_Skill", "x"))
    write(library / "other" / "SKILL.md", skill_md("different", "x"))
    write(library / "loner" / "SKILL.md", skill_md("loner", "x", "skill_dependencies: [loner, ghost]\n"))
    write(library / "nofront" / "SKILL.md", "# no frontmatter\n")

    problems = [str(p) for p in kindex.validate_skills(library)]

    assert "Bad_Skill/SKILL.md: name must be 1 to 64 characters of a-z, 0-9 and -" in problems
    assert "other/SKILL.md: name 'different' must equal the folder name 'other'" in problems
    assert "loner/SKILL.md: a skill cannot depend on itself" in problems
    assert "loner/SKILL.md: skill_dependencies names an unknown skill 'ghost'" in problems
    assert any(p.startswith("nofront/SKILL.md: has no YAML frontmatter") for p in problems)
    result = CliRunner().invoke(main, ["skills", "validate", str(library)])
    assert result.exit_code == 1 and "loner/SKILL.md: a skill cannot depend on itself" in result.stdout


def test_every_file_is_indexed_and_the_skill_entry_is_its_frontmatter(library: Path) -> None:
    root = orjson.loads((library / "index.json").read_bytes())
    data = next(t for t in root["themes"] if t["dir"] == "data-services")
    assert (data["title"], data["summary"]) == ("data-services", "Manage data services.")
    assert data["tags"] == ["database", "Bash", "Read"]
    pdf = orjson.loads((library / "pdf-tools" / "index.json").read_bytes())
    assert sorted(d["path"] for d in pdf["documents"]) == ["SKILL.md", "examples/SKILL.md"]
    assert kindex.validate(library) == []


def test_a_capability_written_only_in_a_reference_file_is_found(library: Path) -> None:
    hits = kindex.find_skills(library, "how do I restore a backup in another region")

    assert hits[0].name == "data-services"
    assert hits[0].uri == "data-services/reference/backup.md" and hits[0].level == 2
    assert (hits[0].root_uri, hits[0].skill_md_uri) == ("data-services/", "data-services/SKILL.md")
    assert hits[0].description == "Manage data services."
    assert len({h.name for h in hits}) == len(hits)  # one hit per skill
    hit = hits[0]
    assert hit.skill_dependencies == ("auth-helper", "vault-helper")  # transitive, cycle back to data-services ignored
    assert hit.tool_dependencies == ("psql", "vault") and hit.mcp_dependencies == ("db-mcp", "vault-mcp")


def test_limit_counts_skills_and_levels_filter_before_grouping(library: Path) -> None:
    query = "data services backup restore region snapshot"
    assert [h.name for h in kindex.find_skills(library, query, limit=1)] == ["data-services"]
    summaries = kindex.find_skills(library, query, levels=[0])
    assert summaries and all(h.level == 0 for h in summaries) and summaries[0].name == "data-services"
    assert summaries[0].uri in ("data-services/", "data-services/SKILL.md")
    result = CliRunner().invoke(main, ["find", str(library), query, "--json", "--level", "2"])
    assert result.exit_code == 0
    assert orjson.loads(result.stdout)[0]["uri"] == "data-services/reference/backup.md"


def test_import_installs_indexes_and_renames_on_conflict(library: Path, tmp_path: Path) -> None:
    package = make_zip(
        {
            "csv-tools/SKILL.md": skill_md("csv-tools", "Clean and convert CSV files."),
            "csv-tools/guide/encoding.md": "# Encodings\n\nFix GBK and UTF-8 mojibake in CSV files.\n",
        }
    )
    result = skills.import_skill(library, package)
    assert (result.name, result.replaced, result.renamed_from, result.files) == ("csv-tools", False, None, 2)
    assert kindex.find_skills(library, "fix mojibake encoding in csv files")[0].uri == "csv-tools/guide/encoding.md"

    # The very package again is the one installed: indexed again, not copied as csv-tools-v2.
    same = skills.import_skill(library, package)
    assert (same.name, same.renamed_from, same.same, same.replaced) == ("csv-tools", None, True, False)
    assert not (library / "csv-tools-v2").exists()
    changed = make_zip(
        {
            "csv-tools/SKILL.md": skill_md("csv-tools", "Clean and convert CSV files."),
            "csv-tools/guide/encoding.md": "# Encodings\n\nFix GBK, UTF-16 and UTF-8 mojibake in CSV files.\n",
        }
    )
    again = skills.import_skill(library, changed)
    assert (again.name, again.renamed_from, again.same) == ("csv-tools-v2", "csv-tools", False)
    assert "name: csv-tools-v2" in (library / "csv-tools-v2" / "SKILL.md").read_text(encoding="utf-8")
    assert skills.import_skill(library, changed).name == "csv-tools-v3"  # csv-tools-v2's SKILL.md names it so
    assert kindex.validate_skills(library) == [] and kindex.validate(library) == []


def test_an_import_killed_while_indexing_is_completed_by_importing_again(library: Path, tmp_path: Path) -> None:
    # kill -9 after the package was moved into place, before its entries were written: the retry made NAME-v2 and
    # left the first copy unindexed.
    package = make_zip({"csv-tools/SKILL.md": skill_md("csv-tools", "Clean and convert CSV files.")})
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        archive.extractall(library)  # as the killed import left it: in place, in no index
    assert any("csv-tools" in problem for problem in kindex.validate(library))
    result = skills.import_skill(library, package)
    assert (result.name, result.same) == ("csv-tools", True) and not (library / "csv-tools-v2").exists()
    assert kindex.validate(library) == [] and kindex.find_skills(library, "convert csv files")[0].name == "csv-tools"
    (tmp_path / "csv.zip").write_bytes(package)
    cli = CliRunner().invoke(main, ["skills", "import", str(library), str(tmp_path / "csv.zip")])
    assert "skill csv-tools is already installed with these very files: indexed again" in cli.output, cli.output


@pytest.mark.parametrize(
    "frontmatter",
    ['"name": demo\ndescription: d', "{name: demo, description: d}", "name: >-\n  demo\ndescription: d"],
    ids=["quoted-key", "flow-mapping", "folded"],
)
def test_a_rename_never_edits_the_body_or_half_a_name(library: Path, frontmatter: str) -> None:
    # The rename to NAME-v2 rewrote the first `name:` line anywhere: the body's YAML example, or the first line of
    # a folded name, reported success and left a skill that broke the rules.
    body = "# Body\n\nConfig example:\n\n```yaml\nname: my-service\n```\n"
    package = make_zip({"demo/SKILL.md": f"---\n{frontmatter}\n---\n{body}"})
    skills.import_skill(library, package)
    other = make_zip({"demo/SKILL.md": f"---\n{frontmatter}\n---\n{body}More.\n"})
    with pytest.raises(kindex.SkillError, match="cannot rename the skill to 'demo-v2'"):
        skills.import_skill(library, other)
    assert not (library / "demo-v2").exists() and kindex.validate_skills(library) == []
    plain = make_zip({"demo/SKILL.md": f"---\nname: 'demo'  # the id\ndescription: d\n---\n{body}"})
    assert skills.import_skill(library, plain).name == "demo-v2"
    text = (library / "demo-v2" / "SKILL.md").read_text(encoding="utf-8")
    assert text.startswith("---\nname: demo-v2\ndescription: d\n") and text.endswith(body)
    # Line endings as written: the rename turned a CRLF file into LF.
    crlf = make_zip({"demo/SKILL.md": f"---\nname: demo\ndescription: d\n---\n{body}".replace("\n", "\r\n")})
    assert skills.import_skill(library, crlf).name == "demo-v3"
    assert (library / "demo-v3" / "SKILL.md").read_bytes().startswith(b"---\r\nname: demo-v3\r\ndescription: d\r\n")


@pytest.mark.parametrize(
    ("files", "modes", "message"),
    [
        ({"../evil/SKILL.md": "x"}, None, "climbs out of the package"),
        ({"/etc/SKILL.md": "x"}, None, "is an absolute path"),
        ({"C:/x/SKILL.md": "x"}, None, "is an absolute path"),
        ({"s/SKILL.md": "x", "s/link": "/etc/passwd"}, {"s/link": stat.S_IFLNK | 0o777}, "is a symbolic link"),
        ({"s/SKILL.md": "x", "s/dev": ""}, {"s/dev": stat.S_IFCHR | 0o644}, "is a device, pipe or socket"),
        ({"s/SKILL.md": "x", "s/a.md": "1", "s/a.md#dup": "2"}, None, "appears twice"),
        ({"s/a.md": "no skill here"}, None, "no SKILL.md"),
        ({"a/SKILL.md": "x", "b/SKILL.md": "y"}, None, "one skill per ZIP"),
        ({"s/SKILL.md": "---\nname: Bad Name\ndescription: x\n---\n"}, None, "name must be 1 to 64 characters"),
    ],
)
def test_hostile_or_broken_archives_are_refused_and_touch_nothing(
    library: Path, files: dict[str, str], modes: dict[str, int] | None, message: str
) -> None:
    before = sorted(p.name for p in library.iterdir())
    with pytest.raises(kindex.SkillError, match=message):
        skills.import_skill(library, make_zip(files, modes=modes))
    assert sorted(p.name for p in library.iterdir()) == before
    assert not (library.parent / "evil").exists()
    staging = library / ".kindex" / "import"
    assert not staging.exists() or list(staging.iterdir()) == []


def test_a_zip_bomb_is_refused_before_it_fills_the_disk(library: Path) -> None:
    bomb = make_zip({"s/SKILL.md": skill_md("s", "x"), "s/zeros.md": b"\0" * (2 * 1024 * 1024)})
    assert len(bomb) < 50_000
    with pytest.raises(kindex.SkillError, match="more than the limit of 1000000"):
        skills.import_skill(library, bomb, max_bytes=1_000_000)
    many = make_zip({"s/SKILL.md": skill_md("s", "x"), **{f"s/{i}.md": "x" for i in range(30)}})
    with pytest.raises(kindex.SkillError, match="31 files, more than the limit of 20"):
        skills.import_skill(library, many, max_files=20)


@pytest.mark.parametrize("shape", ["plain", "zip64", "stray-locator", "offset-lookalike", "long-comment"])
def test_an_archive_listing_too_many_entries_is_refused_before_they_are_read(
    library: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    # zipfile made an object per entry before the file limit was checked: 20 MB of minimal entries (380,000) cost
    # 268 MB, 1.2 GB for 16 uploads. The count comes from the raw headers, whatever the end record's total says,
    # and from where zipfile itself finds them: a locator's signature in an entry's comment, an end record's
    # signature inside its own offset field, or a comment one byte longer than a search window sent a first
    # count elsewhere while zipfile read every entry.
    import struct
    import zlib

    name, data = b"s/SKILL.md", skill_md("s", "x").encode()
    crc = zlib.crc32(data)
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0)
    body = local + name + data
    last = b"PK\x06\x07" + b"\0" * 16 if shape == "stray-locator" else b""

    def header(n: bytes, comment: bytes = b"") -> bytes:
        fields = (20, 20, 0, 0, 0, 0, crc, len(data), len(data), len(n), 0, len(comment), 0, 0, 0, 0)
        return struct.pack("<4s6H3L5H2L", b"PK\x01\x02", *fields) + n + comment

    cd = b"".join(header(b"d/%05d" % i) for i in range(40)) + header(b"d/last", last)
    comment = b"c" * 65535 if shape == "long-comment" else b""
    # zipfile finds the directory from the end record's own place: an offset field holding the bytes of a
    # signature is read as the offset, and need not be true.
    offset = struct.unpack("<L", b"PK\x05\x06")[0] if shape == "offset-lookalike" else len(body)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(cd), offset, len(comment)) + comment  # 1: a lie
    if shape == "zip64":
        record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, len(cd), len(body))
        locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(body) + len(cd), 1)
        end = record + locator + end
    opened: list[bool] = []
    monkeypatch.setattr(zipfile, "ZipFile", lambda *a, **k: opened.append(True))
    with pytest.raises(kindex.SkillError, match="lists more than 40 entries, for a limit of 20 files"):
        skills.import_skill(library, body + cd + end, max_files=20)
    assert opened == []


def test_a_failed_replace_restores_the_old_package_and_its_entries(
    library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_files = sorted(p.relative_to(library).as_posix() for p in (library / "pdf-tools").rglob("*"))
    old_root = (library / "index.json").read_bytes()
    package = make_zip({"pdf-tools/SKILL.md": skill_md("pdf-tools", "A new PDF skill."), "pdf-tools/new.md": "# new"})

    def failing_sub(*args: object, **kw: object) -> None:
        raise KindexError("model exploded while indexing")

    monkeypatch.setattr(kindex.generate, "sub", failing_sub)
    with pytest.raises(
        kindex.SkillError,
        match="installing 'pdf-tools' failed and the previous state was restored: model exploded while indexing",
    ):
        skills.import_skill(library, package, replace=True)

    assert sorted(p.relative_to(library).as_posix() for p in (library / "pdf-tools").rglob("*")) == old_files
    assert (library / "index.json").read_bytes() == old_root
    assert kindex.validate(library) == []
    monkeypatch.undo()

    result = skills.import_skill(library, package, replace=True)
    assert result.replaced and not (library / "pdf-tools" / "examples").exists()
    pdf = orjson.loads((library / "pdf-tools" / "index.json").read_bytes())
    assert sorted(d["path"] for d in pdf["documents"]) == ["SKILL.md", "new.md"]  # no stale entry
    assert kindex.validate(library) == []


def test_export_and_delete(library: Path, tmp_path: Path) -> None:
    out = tmp_path / "data.zip"
    result = CliRunner().invoke(main, ["skills", "export", str(library), "data-services", "-o", str(out)])
    assert result.exit_code == 0
    names = sorted(zipfile.ZipFile(out).namelist())
    assert names == ["data-services/SKILL.md", "data-services/reference/README.md", "data-services/reference/backup.md"]

    query = "restore a backup in another region"
    assert kindex.find_skills(library, query)[0].name == "data-services"
    result = CliRunner().invoke(main, ["skills", "delete", str(library), "data-services"])
    assert result.exit_code == 0, result.output
    assert not (library / "data-services").exists()
    root = orjson.loads((library / "index.json").read_bytes())
    assert "data-services" not in [t["dir"] for t in root["themes"]]
    assert "data-services" not in [h.name for h in kindex.find_skills(library, query)]  # found before, not now

    back = skills.import_skill(library, out.read_bytes())
    assert back.name == "data-services" and kindex.find_skills(library, "restore backup region")[0].name == back.name


def test_sync_sends_only_changes_and_lists_removed_skills(library: Path, tmp_path: Path) -> None:
    dest = tmp_path / "workspace"
    first = skills.sync_skills(library, dest)
    assert first.synced == ("auth-helper", "data-services", "pdf-tools", "vault-helper") and first.removed == ()
    manifest = orjson.loads((dest / ".sync-manifest.json").read_bytes())
    assert {s["name"] for s in manifest["skills"]} == set(first.synced) and "syncedAt" in manifest
    assert not (dest / "pdf-tools" / "index.json").exists()

    write(library / "pdf-tools" / "SKILL.md", skill_md("pdf-tools", "Create, merge, split and edit PDF documents."))
    second = skills.sync_skills(library, dest)
    assert second.synced == ("pdf-tools",) and len(second.unchanged) == 3

    third = skills.sync_skills(library, dest, only=["pdf-tools", "data-services"], zip_out=tmp_path / "sync.zip")
    assert third.removed == ("auth-helper", "vault-helper") and not (dest / "auth-helper").exists()
    assert orjson.loads((dest / ".sync-manifest.json").read_bytes())["removed"] == ["auth-helper", "vault-helper"]
    assert zipfile.ZipFile(tmp_path / "sync.zip").namelist() == [".sync-manifest.json"]  # nothing changed


def test_an_interrupted_sync_leaves_the_previous_skills_intact(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "workspace"
    skills.sync_skills(library, dest)
    before = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    write(library / "data-services" / "reference" / "backup.md", "# Changed\n\nnew text\n")
    write(library / "pdf-tools" / "SKILL.md", skill_md("pdf-tools", "Changed too."))
    calls = 0
    real = shutil.copyfile

    def dying_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str | os.PathLike[str]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(shutil, "copyfile", dying_copy)  # the module kindex.skills copies with
    with pytest.raises(OSError, match="No space left"):
        skills.sync_skills(library, dest)
    assert calls == 2

    after = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert {k: v for k, v in after.items() if not k.startswith(".sync-new-")} == before


def test_build_context_lists_the_chosen_skills_dependencies(library: Path) -> None:
    ctx = kindex.build_context(library, "how do I restore a backup in another region")
    assert ctx.items[0].path == "data-services/reference/backup.md"
    assert ctx.skills[0].to_dict() == {
        "name": "data-services",
        "skill_dependencies": ["auth-helper", "vault-helper"],
        "tool_dependencies": ["psql", "vault"],
        "mcp_dependencies": ["db-mcp", "vault-mcp"],
    }


def test_import_cli_limits_and_messages(library: Path, tmp_path: Path) -> None:
    package = tmp_path / "p.zip"
    package.write_bytes(make_zip({"big/SKILL.md": skill_md("big", "x"), "big/a.md": "y" * 5000}))
    result = CliRunner().invoke(main, ["skills", "import", str(library), str(package), "--max-bytes", "1000"])
    assert result.exit_code == 1 and "more than the limit of 1000" in result.stderr
    result = CliRunner().invoke(main, ["skills", "import", str(library), str(package)])
    assert result.exit_code == 0 and result.stdout.startswith("installed skill big: 2 files indexed")


def test_replace_never_touches_a_folder_that_is_not_a_skill(library: Path) -> None:
    write(library / "billing" / "refunds.md", "# Refunds\n\nHow refunds work.\n")
    kindex.reindex(library)
    package = make_zip({"billing/SKILL.md": skill_md("billing", "Billing helper.")})

    with pytest.raises(kindex.SkillError, match="not a skill: replacing it is refused"):
        skills.import_skill(library, package, replace=True)

    assert (library / "billing" / "refunds.md").read_text(encoding="utf-8").startswith("# Refunds")
    assert not (library / "billing" / "SKILL.md").exists()


def test_a_replaced_skill_stays_in_the_backup(library: Path) -> None:
    package = make_zip({"pdf-tools/SKILL.md": skill_md("pdf-tools", "A new PDF toolkit.")})
    assert skills.import_skill(library, package, replace=True).replaced
    backups = list((library / ".kindex" / "backup").glob("pdf-tools-*"))
    assert len(backups) == 1 and "Create, merge and edit" in (backups[0] / "SKILL.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("work", ["import", "backup", "trash"])
def test_kindexs_work_folders_linked_elsewhere_are_refused_not_followed(
    library: Path, tmp_path: Path, work: str
) -> None:
    # A tenant's link at .kindex/import made an import delete another agent's skill-* folders and unpack there;
    # at .kindex/backup a replace moved the old package into the other agent's KB, which then served it.
    bob = tmp_path / "bob"
    write(bob / "skill-notes" / "keep.md", "# keep\n\nbob's\n")
    (library / ".kindex" / work).symlink_to(bob, target_is_directory=True)
    package = make_zip({"pdf-tools/SKILL.md": skill_md("pdf-tools", "A new PDF toolkit.")})
    with pytest.raises(kindex.StorageError, match=f"{work} in the knowledge folder is not a folder"):
        if work == "trash":
            skills.delete_skill(library, "pdf-tools")
        else:
            skills.import_skill(library, package, replace=True)
    assert sorted(p.relative_to(bob).as_posix() for p in bob.rglob("*")) == ["skill-notes", "skill-notes/keep.md"]
    assert "Create, merge and edit" in (library / "pdf-tools" / "SKILL.md").read_text(encoding="utf-8")


def test_one_keyword_finds_its_skill(library: Path) -> None:
    assert kindex.find_skills(library, "PDF")[0].uri.startswith("pdf-tools/")
    assert kindex.find_skills(library, "vault")[0].uri.startswith("vault-helper/")


@pytest.mark.parametrize("manifest", [{"skills": 5}, {"skills": [{"name": ["x"], "version": "1"}]}, [1, 2]])
def test_a_malformed_sync_manifest_is_a_clear_error(library: Path, tmp_path: Path, manifest: object) -> None:
    with pytest.raises(kindex.SkillError, match="sync manifest is malformed"):
        skills.sync_skills(library, tmp_path / "ws", previous=manifest)  # type: ignore[arg-type]


def _broken_zips() -> dict[str, bytes]:
    import struct

    good = {"x/SKILL.md": skill_md("x", "X."), "x/ref.md": "# ref\n\n" + "body " * 200}
    out: dict[str, bytes] = {}
    data = bytearray(make_zip(good))
    at = data.find(b"PK\x03\x04", data.find(b"PK\x03\x04") + 4)  # the second member's local header
    data[at + 40] ^= 0xFF  # a byte of its compressed data
    out["bad CRC or data"] = bytes(data)
    data = bytearray(make_zip(good))
    central = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, 10)  # the last member claims 10 bytes
    out["lying size"] = bytes(data)
    data = bytearray(make_zip(good))
    for sig, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # the "encrypted" flag bit
        p = 0
        while (p := data.find(sig, p)) >= 0:
            struct.pack_into("<H", data, p + offset, 1)
            p += 4
    out["encrypted member"] = bytes(data)
    data = bytearray(make_zip(good))
    for sig, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # compression method 99
        p = 0
        while (p := data.find(sig, p)) >= 0:
            struct.pack_into("<H", data, p + offset, 99)
            p += 4
    out["unknown compression"] = bytes(data)
    out["file and folder clash"] = make_zip({**good, "x/ref.md/inner.md": "# inner\n"})
    out["2,000 levels"] = make_zip({**good, "x/" + "d/" * 2000 + "f.md": "# deep\n"})
    out["300-character name"] = make_zip({**good, "x/" + "n" * 300 + ".md": "# long\n"})
    out["deep YAML"] = make_zip({"x/SKILL.md": "---\nname: x\ndescription: X.\nmetadata: " + "[" * 500 + "]" * 500})
    return out


@pytest.mark.parametrize("kind", list(_broken_zips()))
def test_a_broken_zip_is_a_clear_error_and_changes_nothing(library: Path, kind: str) -> None:
    before = sorted(p.relative_to(library).as_posix() for p in library.rglob("*") if ".kindex" not in p.parts)
    with pytest.raises(kindex.SkillError):
        skills.import_skill(library, _broken_zips()[kind])
    after = sorted(p.relative_to(library).as_posix() for p in library.rglob("*") if ".kindex" not in p.parts)
    assert after == before


def test_a_symlinked_skill_folder_is_neither_exported_nor_synced(library: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside-skill"
    write(outside / "SKILL.md", skill_md("outside-skill", "Secrets from elsewhere."))
    write(outside / "secret.md", "# secret\n\ntop secret\n")
    (library / "outside-skill").symlink_to(outside, target_is_directory=True)

    with pytest.raises(kindex.NotFoundError, match="no skill named 'outside-skill'"):
        skills.export_skill(library, "outside-skill")
    result = skills.sync_skills(library, tmp_path / "workspace")
    assert not (tmp_path / "workspace" / "outside-skill").exists()
    assert "outside-skill" not in result.synced and "pdf-tools" in result.synced


def test_a_skill_md_linked_out_of_its_folder_makes_no_skill(library: Path, tmp_path: Path) -> None:
    # The scan skipped it, but the skill list followed the link: MCP's read_skill served the outside file's
    # frontmatter (another agent's skill, or any file), and export answered an empty ZIP.
    write(tmp_path / "outside.md", skill_md("leak", "OUTSIDE-SKILL-SECRET hunter3"))
    (library / "leak").mkdir()
    (library / "leak" / "SKILL.md").symlink_to(tmp_path / "outside.md")
    handle = kindex.KnowledgeBase(library)
    with pytest.raises(kindex.NotFoundError, match="no skill named 'leak'"):
        handle.skill("leak")
    with pytest.raises(kindex.NotFoundError, match="no skill named 'leak'"):
        skills.export_skill(library, "leak")
    assert "leak" not in {hit.name for hit in kindex.find_skills(library, "OUTSIDE-SKILL-SECRET")}


def test_a_skill_that_is_not_there_or_a_folder_that_is_no_library_is_not_found(library: Path, tmp_path: Path) -> None:
    # Deleting a skill twice answered 422 invalid_skill ("a package is broken"); `kindex find` on a plain KB said
    # "no skill matches", where HTTP and MCP said it is no skill library.
    skills.delete_skill(library, "pdf-tools")
    for call in (lambda: skills.delete_skill(library, "pdf-tools"), lambda: skills.export_skill(library, "pdf-tools")):
        with pytest.raises(kindex.NotFoundError, match="no skill named 'pdf-tools'"):
            call()
    plain = tmp_path / "plain"
    write(plain / "a.md", "# a\n\n退款\n")
    with pytest.raises(kindex.NotFoundError, match="not a skill library"):
        kindex.find_skills(plain, "退款")


def test_sync_onto_the_library_itself_is_refused(library: Path) -> None:
    # `kindex skills sync LIB LIB` reported success and deleted every skill's .git/, .env and index.json.
    (library / "data-services" / ".env").write_text("TOKEN=1", encoding="utf-8")
    for dest in (library, library / "data-services", library.parent):
        with pytest.raises(kindex.SkillError, match=r"is the library .*, or inside it, or holds it"):
            skills.sync_skills(library, dest)
    assert (library / "data-services" / ".env").exists() and kindex.validate(library) == []


def test_a_zip_is_never_written_over_a_file_of_the_library_or_the_workspace(library: Path, tmp_path: Path) -> None:
    # `skills export -o lib/pdf-tools/SKILL.md` and `sync --zip lib/index.json` replaced those files with a ZIP.
    before = {p: p.read_bytes() for p in library.rglob("*") if p.is_file() and ".kindex" not in p.parts}
    for out in (library / "pdf-tools" / "SKILL.md", library / "index.json", library / "new.zip"):
        with pytest.raises(kindex.SkillError, match=rf"^{re.escape(str(out))} is inside the library .*: write the ZIP"):
            skills.export_skill(library, "pdf-tools", out)
        with pytest.raises(kindex.SkillError, match="is inside the library"):
            skills.sync_skills(library, None, zip_out=out)
    ws = tmp_path / "ws"
    skills.sync_skills(library, ws)
    with pytest.raises(kindex.SkillError, match="is inside the workspace"):
        skills.sync_skills(library, ws, zip_out=ws / "pdf-tools" / "SKILL.md")
    assert {p: p.read_bytes() for p in library.rglob("*") if p.is_file() and ".kindex" not in p.parts} == before


def test_a_sync_manifest_names_only_skills_and_is_bounded(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Names no skill can have were reported "removed" back to a client that might delete what they name; a 10 GB
    # manifest took 19 GB of memory.
    ws = tmp_path / "ws"
    skills.sync_skills(library, ws)
    manifest = orjson.loads((ws / ".sync-manifest.json").read_bytes())
    manifest["skills"] += [{"name": n, "version": "v"} for n in ("../victim", "..", "", "/tmp/x", "gone-skill")]
    (ws / ".sync-manifest.json").write_bytes(orjson.dumps(manifest))
    assert skills.sync_skills(library, ws).removed == ("gone-skill",)

    monkeypatch.setattr(skills, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(kindex.SkillError, match=r"unreadable \(\.sync-manifest\.json is larger than"):
        skills.sync_skills(library, ws)


def test_an_import_keeps_away_from_a_special_file_in_place_of_the_root_index(library: Path) -> None:
    # The root index was read to be restored on failure: a FIFO there blocked the import for good.
    (library / "index.json").unlink()
    os.mkfifo(library / "index.json")
    package = make_zip({"csv-tools/SKILL.md": skill_md("csv-tools", "Clean and convert CSV files.")})
    with pytest.raises(kindex.SkillError, match=r"the library's index.json cannot be kept .*not a regular file"):
        skills.import_skill(library, package)
    assert not (library / "csv-tools").exists()


def test_an_imported_skill_is_readable_as_the_umask_allows_and_old_staging_is_cleared(library: Path) -> None:
    # The staging folder's 0700 stayed with the installed skill: a chat backend running as another user could not
    # read it. And the staging of an import killed mid-way stayed under .kindex/import for good.
    debris = library / ".kindex" / "import" / "skill-killed"
    debris.mkdir(parents=True)
    (debris / "big.bin").write_bytes(b"x" * 1000)
    old = os.umask(0o022)
    try:
        result = skills.import_skill(library, make_zip({"csv-tools/SKILL.md": skill_md("csv-tools", "Clean CSV.")}))
    finally:
        os.umask(old)
    assert stat.S_IMODE((library / result.name).stat().st_mode) == 0o755
    assert list((library / ".kindex" / "import").iterdir()) == []


def test_a_description_is_listed_as_one_line_without_control_characters(library: Path) -> None:
    # An ESC, a NUL or U+0085 in a SKILL.md's description reached `find --json` and the HTTP service as written.
    write(
        library / "pdf-tools" / "SKILL.md",
        skill_md("pdf-tools", '"Create\\x1b[31m and\\u0085merge\\x00 PDF\\nfiles."'),
    )
    kindex.reindex(library)
    [hit] = [h for h in kindex.find_skills(library, "merge PDF files") if h.name == "pdf-tools"]
    assert hit.description == "Create and merge PDF files."


def test_a_skill_whose_frontmatter_cannot_be_read_is_refused_without_saying_its_body_is_indexed(library: Path) -> None:
    # The refusal quoted the document rule: "frontmatter is longer than 16 KiB: ignored, the body is indexed".
    long = make_zip({"big/SKILL.md": "---\nname: big\ndescription: " + "x" * 17_000 + "\n---\n# big\n"})
    with pytest.raises(kindex.SkillError) as refused:
        skills.import_skill(library, long)
    assert "frontmatter is longer than 16 KiB" in refused.value.message and "ignored" not in refused.value.message


def test_a_zip_never_replaces_a_device_a_pipe_or_a_link_to_one(library: Path, tmp_path: Path) -> None:
    # As root, `-o /dev/null` turned the system's /dev/null into a file: the rename replaced the node itself.
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    to_pipe = tmp_path / "to-pipe.zip"
    to_pipe.symlink_to(pipe)
    for out in (pipe, to_pipe):
        with pytest.raises(kindex.SkillError, match="is not a regular file: give the path of the ZIP file"):
            skills.export_skill(library, "pdf-tools", out)
        with pytest.raises(kindex.SkillError, match="is not a regular file"):
            skills.sync_skills(library, None, zip_out=out)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and to_pipe.is_symlink()
    # A link to a file is written through, as before.
    real = tmp_path / "real.zip"
    real.write_bytes(b"old")
    (tmp_path / "link.zip").symlink_to(real)
    skills.export_skill(library, "pdf-tools", tmp_path / "link.zip")
    assert zipfile.ZipFile(real).namelist()[0].startswith("pdf-tools/") and (tmp_path / "link.zip").is_symlink()


def test_export_to_standard_output(library: Path) -> None:
    result = CliRunner().invoke(main, ["skills", "export", str(library), "pdf-tools", "-o", "-"])
    assert result.exit_code == 0, result.output
    assert zipfile.ZipFile(io.BytesIO(result.stdout_bytes)).namelist()[0].startswith("pdf-tools/")
    assert result.stderr.startswith("wrote ") and "to standard output" in result.stderr
    result = CliRunner().invoke(main, ["skills", "sync", str(library), "--zip", "-"])
    assert result.exit_code == 2 and "--zip needs a file path, not `-`" in result.stderr


def test_sync_removes_a_link_put_in_a_skills_place_not_what_it_leads_to(library: Path, tmp_path: Path) -> None:
    dest = tmp_path / "workspace"
    skills.sync_skills(library, dest)
    # A developer's own checkout linked where the synced copy was (common with ~/.claude/skills).
    shutil.rmtree(dest / "pdf-tools")
    mine = tmp_path / "my-pdf-tools"
    write(mine / "SKILL.md", skill_md("pdf-tools", "My own version."))
    (dest / "pdf-tools").symlink_to(mine, target_is_directory=True)
    result = skills.sync_skills(library, dest, only=["auth-helper", "data-services", "vault-helper"])
    assert result.removed == ("pdf-tools",) and not (dest / "pdf-tools").is_symlink()
    assert (mine / "SKILL.md").is_file()  # the link went, the folder behind it stays
    manifest = orjson.loads((dest / ".sync-manifest.json").read_bytes())
    assert manifest["removed"] == ["pdf-tools"]
    # Synced again, the copy takes the link's place the same way.
    (dest / "pdf-tools").symlink_to(mine, target_is_directory=True)
    assert skills.sync_skills(library, dest).synced == ("pdf-tools",)
    assert (dest / "pdf-tools").is_dir() and not (dest / "pdf-tools").is_symlink() and (mine / "SKILL.md").is_file()
    assert sorted(p.name for p in dest.iterdir() if p.name.startswith(".sync-")) == [".sync-manifest.json"]


def test_a_workspace_that_cannot_be_made_is_a_clear_error(library: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(kindex.StorageError, match=f"cannot sync into the workspace {blocker / 'sub'}: Not a directory"):
        skills.sync_skills(library, blocker / "sub")
    result = CliRunner().invoke(main, ["skills", "sync", str(library), str(blocker / "sub"), "--json"])
    assert result.exit_code == 1 and orjson.loads(result.stdout)["error"]["code"] == "storage_error"


def test_wrong_argument_types_are_usage_errors_not_type_errors(library: Path) -> None:
    for kwargs, said in [
        ({"limit": None}, "limit must be a whole number of at least 1, got None"),
        ({"limit": 0}, "limit must be a whole number of at least 1, got 0"),
        ({"levels": 1.5}, "levels must be a list of the levels 0, 1 and 2, got 1.5"),
        ({"levels": [3]}, "levels must be a list of the levels 0, 1 and 2, got [3]"),
        ({"levels": "01"}, "levels must be a list of the levels 0, 1 and 2, got '01'"),
    ]:
        with pytest.raises(kindex.UsageError) as raised:
            kindex.find_skills(library, "pdf", **kwargs)  # type: ignore[arg-type]
        assert raised.value.message == said
    assert [h.level for h in kindex.find_skills(library, "merge pdf", levels=[0])] == [0]
    for call in (skills.export_skill, skills.delete_skill):
        with pytest.raises(kindex.UsageError, match="a skill's name is a string, got int"):
            call(library, 7)  # type: ignore[arg-type]
