"""Write kindex/en_words.bin: how often general English uses each word, by the stem kindex's analysis gives it.

    python tools/build_en_words.py [DICTIONARY]   (default: the one the `symspellpy` package ships)

Source: SymSpell's frequency_dictionary_en_82_765.txt (MIT, as shipped by symspellpy): 82,765 English words with
their counts in the Google Books Ngram data (CC BY 3.0). Each word is stemmed as kindex.analysis stems a Latin
word, stop words are left out, and the counts of a stem's words are summed; the total is every word's count, so a
stem's rate is per word of English text. The retrieval weighs a word of an English question by how much more the KB
uses it than English does, as it weighs a Chinese word against the segmenter's dictionary. Layout as zh_words.bin
(tools/build_zh_words.py) under its own magic, b"KXEW1\\0\\0\\0"; counts are divided by a common scale to fit 32
bits (the total with them), which keeps every rate.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kindex.analysis import _EN_STOP, _stem  # the analyzer's own stemmer and stop words

MAGIC = b"KXEW1\0\0\0"
OUT = Path(__file__).resolve().parent.parent / "kindex" / "en_words.bin"


def main() -> None:
    if len(sys.argv) > 1:
        source = Path(sys.argv[1])
    else:
        import symspellpy

        source = Path(symspellpy.__file__).with_name("frequency_dictionary_en_82_765.txt")
    counts: dict[bytes, int] = {}
    total = 0
    for line in source.read_text(encoding="utf-8").splitlines():
        word, count = line.split()[:2]
        total += int(count)
        if word in _EN_STOP:
            continue
        stem = _stem(word).encode("utf-8")
        counts[stem] = counts.get(stem, 0) + int(count)
    scale = math.ceil(max(counts.values()) / 0xFFFFFFFF)
    words = sorted(counts)
    offsets = array("I", [0])
    for w in words:
        offsets.append(offsets[-1] + len(w))
    freqs = array("I", (max(counts[w] // scale, 1) for w in words))
    if sys.byteorder != "little":
        offsets.byteswap()
        freqs.byteswap()
    header = MAGIC + struct.pack("<IQ", len(words), total // scale) + b"\0" * 4
    tmp = OUT.with_suffix(".tmp")  # replaced, never rewritten in place: a running kindex may have it mapped
    tmp.write_bytes(header + offsets.tobytes() + freqs.tobytes() + b"".join(words))
    tmp.replace(OUT)
    print(f"{OUT}: {len(words):,} stems, {OUT.stat().st_size:,} bytes, scale {scale}, from {source}")


if __name__ == "__main__":
    main()
