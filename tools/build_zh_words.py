"""Write kindex/zh_words.bin: jieba's dictionary (the one rjieba embeds) as a sorted, memory-friendly table.

    python tools/build_zh_words.py        (needs the `jieba` package: pip install -e '.[bench]')

rjieba builds its 349,046-word dictionary when imported (~0.12 s, most of `kindex context`'s start-up); with this
table, kindex.analysis segments a short text by handing rjieba only the dictionary words inside it, with the same
result (tests/test_analysis.py checks that against rjieba itself). Layout, little-endian: b"KXZW1\\0\\0\\0", word
count N (uint32), total frequency (uint64), N + 1 uint32 byte offsets into the word bytes, N uint32 frequencies,
then the words' UTF-8 bytes, sorted bytewise (so a prefix of a word sorts right before it).
"""

from __future__ import annotations

import struct
import sys
from array import array
from pathlib import Path

MAGIC = b"KXZW1\0\0\0"
OUT = Path(__file__).resolve().parent.parent / "kindex" / "zh_words.bin"


def main() -> None:
    import jieba  # the source of the dictionary jieba-rs (rjieba) embeds

    source = Path(jieba.__file__).with_name("dict.txt")
    freqs: dict[bytes, int] = {}
    for line in source.read_text(encoding="utf-8").splitlines():
        word, freq = line.split(" ")[:2]
        freqs[word.encode("utf-8")] = int(freq)
    words = sorted(freqs)
    offsets = array("I", [0])
    for w in words:
        offsets.append(offsets[-1] + len(w))
    counts = array("I", (freqs[w] for w in words))
    if sys.byteorder != "little":
        offsets.byteswap()
        counts.byteswap()
    header = MAGIC + struct.pack("<IQ", len(words), sum(freqs.values())) + b"\0" * 4
    # Replaced, never rewritten in place: a running kindex maps the file, and cutting a mapped file short kills the
    # process that reads it (SIGBUS); a replaced file stays whole for whoever mapped the old one.
    tmp = OUT.with_suffix(".tmp")
    tmp.write_bytes(header + offsets.tobytes() + counts.tobytes() + b"".join(words))
    tmp.replace(OUT)
    print(f"{OUT}: {len(words):,} words, {OUT.stat().st_size:,} bytes, from {source}")


if __name__ == "__main__":
    main()
