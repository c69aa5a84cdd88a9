"""A skill ZIP whose central directory lists 380,000 minimal entries (about 20 MB, under the upload limit):
the time and peak memory of refusing it, for one or more checkouts, interleaved.

    python bench/zip_flood.py --checkout . --checkout /tmp/wt_old --runs 2

Each run imports the archive in a fresh process with that checkout first on ``sys.path`` (an editable install's
finder is dropped, so the checkout named is the one measured) and reports wall seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ENTRIES = 380_000
_CHILD = """
import sys
tree, lib, archive = sys.argv[1:4]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
import kindex.skills
assert kindex.skills.__file__.startswith(tree), kindex.skills.__file__
import resource
try:
    kindex.skills.import_skill(lib, open(archive, "rb").read())
    said = "imported"
except kindex.KindexError as exc:
    said = exc.message
print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB: {said}")
"""


def flood(path: Path) -> None:
    name, data = b"demo/SKILL.md", b"---\nname: demo\ndescription: d\n---\n"
    crc = zlib.crc32(data)
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0)
    local += name + data
    cd = bytearray()
    for i in range(ENTRIES):
        n = b"d/%07d" % i
        fields = (20, 20, 0, 0, 0, 0, crc, len(data), len(data), len(n), 0, 0, 0, 0, 0, 0)
        cd += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", *fields) + n
    z64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, ENTRIES, ENTRIES, len(cd), len(local))
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(local) + len(cd), 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, len(cd), len(local), 0)
    path.write_bytes(local + bytes(cd) + z64 + locator + end)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkout", action="append", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "flood.zip"
        flood(archive)
        print(f"archive: {archive.stat().st_size / 2**20:.1f} MiB, {ENTRIES} entries")
        for _ in range(args.runs):
            for tree in args.checkout:
                lib = tempfile.mkdtemp(dir=tmp)
                start = time.monotonic()
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(tree.resolve()), lib, str(archive)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                print(f"{tree}: {time.monotonic() - start:.2f} s, {out.stdout.strip()}")


if __name__ == "__main__":
    main()
