"""Write kindex/zh_t2s.txt: traditional Chinese characters and the simplified ones analysis reads them as.

    python tools/build_zh_t2s.py        (needs the `opencc-python-reimplemented` package: pip install -e '.[bench]')

From OpenCC's character tables (Apache-2.0, https://github.com/BYVoid/OpenCC, as that package ships them):
``TSCharacters.txt`` (traditional → simplified, the first candidate), after ``TWVariantsRev.txt`` and
``HKVariantsRev.txt`` (the Taiwan and Hong Kong forms of a character → OpenCC's traditional one: 啟 → 啓 → 启).
A character whose own form is among its candidates (乾 → 干 乾, 瞭 → 瞭 了, 覆 → 覆 复) is written in simplified text
too, and is left as it is: mapping it would change simplified documents' words; except the five that are Taiwan's
and Hong Kong's everyday forms and a mainland variant at most (於, 麽, 徵, 夥, 剋: 關於, 什麽, 特徵, 夥伴). And one
mainland variant is folded into the standard form: 帐 into 账 (帐号, 记帐 are written as often as 账号, 记账, and
Taiwan's 帳號 reads 帐号), so either meets the other. Characters only, no phrases: a Taiwan word (軟體, 設定) reads
as its characters' simplified forms (软体, 设定), not as the mainland word.

The file: line 1 the traditional characters, line 2 the simplified ones, position for position.
"""

from __future__ import annotations

from pathlib import Path

import opencc

OUT = Path(__file__).resolve().parent.parent / "kindex" / "zh_t2s.txt"
ALSO_MAPPED = frozenset("於麽徵夥剋")
VARIANTS = {"帐": "账"}


def _table(name: str) -> dict[str, list[str]]:
    path = Path(opencc.__file__).resolve().parent / "dictionary" / name
    out: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, values = line.split("\t")
        if len(key) == 1:
            out[key] = values.split()
    return out


def main() -> None:
    ts = _table("TSCharacters.txt")
    mapping = {k: c[0] for k, c in ts.items() if k not in c or k in ALSO_MAPPED}
    mapping.update(VARIANTS)
    for variants in ("TWVariantsRev.txt", "HKVariantsRev.txt"):
        for k, c in _table(variants).items():
            if k in c or k in ts:
                continue
            standard = c[0]
            simple = ts.get(standard, [standard])
            if standard not in simple:
                mapping[k] = simple[0]
    # A target that is itself mapped (薴 → 苧 → 苎) is followed to its end: one pass reads the same as two.
    for k in mapping:
        seen = {k}
        while mapping[k] in mapping and mapping[k] not in seen:
            seen.add(mapping[k])
            mapping[k] = mapping[mapping[k]]
    pairs = sorted((k, v) for k, v in mapping.items() if k != v)
    assert all(len(k) == len(v) == 1 for k, v in pairs)
    OUT.write_text("".join(k for k, _ in pairs) + "\n" + "".join(v for _, v in pairs) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(pairs)} characters")


if __name__ == "__main__":
    main()
