"""Text analysis for search (SPEC §6.2): one function turns documents and questions alike into terms.

- Text is NFKC-normalised and case-folded, so full-width letters, compatibility forms and case compare equal.
- Traditional Chinese characters are read as their simplified forms (OpenCC's character table, ``zh_t2s.txt``), so
  a question written in either script meets documents written in the other, and the segmenter's dictionary
  (simplified) cuts traditional text into its words; the mainland variant 帐 reads as 账 (帐号, 帳號, 账号 meet).
  Characters only: Taiwan words (軟體, 設定) are not mapped to the mainland ones (软件, 设置).
- Chinese runs are cut into words by jieba-rs (``rjieba``: ~0.2 s to load and ~35 MB, against 1.3 s and ~85 MB for
  the pure-Python ``jieba``, with the same dictionary and algorithm). Long words also yield the dictionary words
  inside them (search mode), so ``中华人民共和国`` meets a question about ``共和国``.
- Importing rjieba builds its 349,046-word dictionary (~0.12 s, most of a one-shot ``kindex context``). Until a
  process has analysed ``LIGHT_BUDGET`` characters, each short text is cut by an empty rjieba segmenter given only
  the dictionary words inside that text (looked up in ``zh_words.bin``, the same dictionary) and the dictionary's
  total frequency: the same words, frequencies and algorithm, so the same cut. A question and a few theme entries
  stay on that path; a reindex or a server moves to the full segmenter after a few texts.
- A KB's own vocabulary (titles, tags, headings) is added on top of the shared segmenter: where consecutive words
  spell a vocabulary term (``企业`` + ``采购`` → ``企业采购``), the term is emitted as well. Keeping the segmenter
  itself shared means one process serves many KBs with one 35 MB dictionary, and each KB's analysis does not
  depend on which other KBs the process has loaded.
- Latin words are stemmed (Snowball English). Identifiers are findable whole and by their parts:
  ``BackgroundTasks`` → ``backgroundtasks``, ``background``, ``task``; ``response_model`` → ``response_model``,
  ``respons``, ``model``.
- Stop words (particles, pronouns, question words, English function words) are no terms at all: they can neither
  make a match nor weigh in the on-topic decision.

- A question's values (a ticket, a user, an address: :func:`value_terms`) and its code identifiers (``X-Nonce``,
  ``next_cursor``: :func:`identifier_terms`) are told apart by the same tokenizer, for the on-topic decision.

Every step is linear in the input: one tokenizing regex without nested quantifiers, bounded word lengths.

Long because the segmenter's light path, its dictionary table and the term rules for documents and questions all
share the one tokenizer, its stop lists and its stemmer.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import mmap
import re
import struct
import sys
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import Stemmer

from kindex.globs import file_path_spans

ANALYZER_VERSION = 24
"""Bumped whenever the terms of a text change: saved search tables of another version are rebuilt. 11: traditional
characters read as simplified; 12: a mapped character's target is never mapped again (薴 → 苎); 13: 於, 麽, 徵, 夥, 剋
mapped too, and 帐 read as 账; 15: chat abbreviations (thx, pls, btw) are stop words; 16: a body read without its
``<head>`` block and MDX import lines (``markdown.outside_raw_blocks``); 17: C#, C++ and their like are terms
(``_NAME_SUFFIX``), and titles keep the suffix; 18: headings keep tags written in code spans or escaped
(``markdown.readable_inline``); 19: HTML headings written on one line are headings; 20: headings without
attribute lists (``{ id="x" }``); 21: headings read reference links as their text; 22: setext
headings; 23: C++17 and C#10 are C++ and C# with a version; 24: links through ``.html`` addresses and site generators'
link tags (Hugo's ``ref``, Jekyll's ``link``) give anchor text."""

_HAN = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
# Either a run of Han (and kana) characters, or a word of letters/digits that may be joined by "_", "-", "." or an
# apostrophe (what's, FastAPI's). The separators are single characters between word characters, so the regex
# cannot backtrack.
_TOKEN = re.compile(rf"(?P<han>[{_HAN}]+)|(?P<word>[^\W{_HAN}]+(?:[-.'’][^\W{_HAN}_]+)*)")
_CONTRACTIONS = ("'s", "'re", "'ll", "'ve", "'d", "'m", "n't")
"""English endings cut off a word ("FastAPI's" is about FastAPI); a whole contraction may be a stop word."""
# The parts of an identifier: camel-case humps, runs of digits. An ASCII word (nearly all) is split directly; any
# other is split over its characters' classes (U upper, L lower, D digit, O a letter without case, S anything
# else; a lower-case letter without a capital of its own, ß, takes its neighbours' case) by the same rules, so that
# letters of every script split alike: ``Zürich`` and ``café`` are one part each.
# Regexes without nested quantifiers: linear.
_ASCII_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_PART = re.compile(r"U+(?=UL)|U?L+|U+|D+|O+")
# What makes a programming language's name of a letter or a word: C#, F#, C++, Notepad++. Without it they were all
# ``c`` (or ``notepad``), and a question about C# ranked the page about C. Only where no letter, ``#`` or ``+``
# follows, nor a digit after "#": ``issue#12`` and ``a+b`` are not names; ``C++17`` is C++ and 17 (and ``C#10``,
# a one-letter name, C# and 10: see :func:`_suffixed`).
_NAME_SUFFIX = re.compile(r"\+\+(?![A-Za-z#+])|#(?![A-Za-z0-9#+])")
_HAN_CHAR = re.compile(rf"[{_HAN}]")
_HAN_RUN = re.compile(rf"[{_HAN}]+")
MAX_WORD = 64
"""Longer Latin "words" are hashes, base64 or garbage: no one searches for them."""
MAX_VOCAB_TERM = 8
"""Longest KB vocabulary term, in characters: a product term, not a sentence."""

_ZH_STOP = frozenset(
    """
    的 了 吗 呢 吧 啊 呀 嘛 哦 哈 么 着 过 地 得 之 其 与 及 和 跟 同 或 而 且 并 也 都 又 还 就 才 只 再 很 太 更 最
    是 有 在 会 能 要 想 让 把 被 给 对 向 从 到 于 以 为 由 将 用 去 来 说 做 使 这 那 哪 谁 啥 咋 我 你 您 他 她 它
    个 些 种 下 上 中 里 内 外 后 前 时 等 如 若 则 但 因 所 即 该 此 每 各 某 其他 其它 一个 一些 一下 一种 一样 一直
    我们 你们 他们 她们 它们 咱们 大家 自己 这个 那个 这些 那些 这样 那样 这么 那么 这里 那里 这儿 那儿 这种 那种
    什么 怎么 怎样 怎么样 如何 为何 为什么 为啥 哪里 哪儿 哪些 哪个 多少 几个 是否 是不是 能否 能不能 可不可以
    可以 可能 应该 需要 必须 得到 知道 告诉 请问 谢谢 麻烦 你好 您好 想要 希望 觉得 认为 一般 通常 已经 现在 然后
    以及 或者 还是 而且 并且 因为 所以 但是 可是 不过 如果 假如 虽然 虽然 即使 只是 就是 不是 没有 有没有 不会
    不能 不要 要不要 会不会 的话 时候 问题 情况 方法 办法 东西 事情 一点 有点 有些 比较 非常 特别 真的 到底 究竟
    吗？ 呢？ 怎么办 怎么弄 咋办 咋弄 请 帮 帮我 给我 我想 我要 想问 问下 问一下 一下子 还有 另外 以后 之后 之前
    关于 起来 出来 上来 下来 过来 过去 进来 进去 回来 之间 今天 明天 昨天 最近 刚才 好 好的 行 对 嗯 哈哈 弄 搞
    拿 放 找 看 看看 写 改 加 叫 讲 聊 玩 吃 喝 能够 可否 是的 不行 一起 一共 总是 经常 有时 有时候
    多久 多长 多长时间 何时 啥时候 几时 多大 多快 多远
    """.split()
)
_EN_STOP = frozenset(
    """
    a an the is are was were be been being am do does did done doing how what why when where which who whom whose
    can could should would will shall may might must i me my mine we us our you your yours he him his she her it its
    they them their of to in on for with at by from and or not no nor this that these those there here please
    thanks thank hi hello hey if then than so as into about any some all get got use using used just also too very
    via vs etc e.g i.e want need like way make does don't doesn't isn't ok okay yes yeah tell know think today
    can't won't aren't wasn't weren't didn't hasn't haven't shouldn't couldn't wouldn't it's what's that's let's
    there's here's who's where's how's i'm i've i'll i'd you're you've you'll we're we've they're they've
    thx thnx tnx ty pls plz lol btw fyi imo imho
    """.split()
)

_stemmer = Stemmer.Stemmer("english")
_stem_cache: dict[str, str] = {}


# Characters no reader sees: soft hyphens, zero-width spaces and joiners, direction marks and isolates, the Arabic
# letter mark, word joiners, variation selectors, Hangul fillers, BOMs; and the marks that a letter of A-Z or a
# Chinese character cannot take as an accent of its own after NFKC (a strike-through: ``C̶O̶R̶S̶``, ``退̶款̶``). Left in,
# they cut a word into letters: ``C\u200bO\u200bR\u200bS`` was four one-letter terms. One regex pass without
# backtracking: a character class, or a run of marks after one letter.
_INVISIBLE = r"\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2069\u3164\ufe00-\ufe0f\ufeff\uffa0"
_UNSEEN = re.compile(rf"[{_INVISIBLE}]|(?<=[A-Za-z\u3400-\u4dbf\u4e00-\u9fff])[\u0300-\u036f]+")
_SEEN = re.compile(rf"[^\s{_INVISIBLE}]")


def visible(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees: not only white space and the characters of ``_UNSEEN``.
    One search that stops at the first such character."""
    return _SEEN.search(text) is not None


def _nfkc(text: str) -> str:
    """NFKC without the characters no reader sees (see ``_UNSEEN``): what every analysis starts from."""
    return _UNSEEN.sub("", unicodedata.normalize("NFKC", text))


def normalize(text: str) -> str:
    """NFKC plus case folding: full-width letters, compatibility forms and case all compare equal; characters no
    reader sees (zero-width spaces, soft hyphens, a strike-through's marks) are dropped; traditional Chinese
    characters read as simplified (:func:`simplified`), as analysis reads them."""
    return simplified(_nfkc(text).casefold())


def title_key(text: str) -> str:
    """A title or a question as compared character for character: case, width, script and punctuation aside, but
    for the ``#`` or ``++`` of a name (C#, C++ and C are three titles: see ``_NAME_SUFFIX``)."""
    text = normalize(text)
    if "#" not in text and "+" not in text:
        return "".join(c for c in text if c.isalnum())
    kept = []
    for i, c in enumerate(text):
        if c.isalnum() or (c in "#+" and _name_suffix_at(text, i)):
            kept.append(c)
    return "".join(kept)


def _name_suffix_at(text: str, i: int) -> bool:
    """Whether the ``#`` or ``+`` at ``text[i]`` belongs to a name's suffix (``C#``, ``C++``): its run starts right
    after a letter and is ``_NAME_SUFFIX``; the second ``+`` of ``C++`` is judged with the first."""
    start = i - 1 if text[i] == "+" and i and text[i - 1] == "+" else i
    letter = start > 0 and text[start - 1].isascii() and text[start - 1].isalpha()
    return letter and _NAME_SUFFIX.match(text, start) is not None


_T2S_FILE = Path(__file__).with_name("zh_t2s.txt")  # written by tools/build_zh_t2s.py
_t2s: dict[int, int] | None = None


def simplified(run: str) -> str:
    """``run`` with its traditional Chinese characters in their simplified forms (發票 → 发票, 驗證 → 验证); other
    characters as they are. The table is read on the first use (4,109 characters)."""
    global _t2s
    table = _t2s
    if table is None:
        traditional, simple = _T2S_FILE.read_text(encoding="utf-8").splitlines()
        table = _t2s = str.maketrans(traditional, simple)
    return run.translate(table)


def has_han(text: str) -> bool:
    """Whether ``text`` holds a Han or kana character."""
    return _HAN_CHAR.search(text) is not None


BACKGROUND_TOKENS = 60_000_000
"""About the number of tokens behind the segmenter's dictionary frequencies (jieba's reference corpus)."""


def background_rate(word: str) -> float:
    """How often ``word`` occurs per token in general Chinese, from the segmenter's dictionary frequencies.

    A word the dictionary does not hold gets the small frequency it would need to be cut whole.
    """
    return max(int(_segmenter(word).suggest_freq(word)), 1) / BACKGROUND_TOKENS


_EN_FILE = Path(__file__).with_name("en_words.bin")  # written by tools/build_en_words.py
_EN_MAGIC = b"KXEW1\0\0\0"
_english: list[_Dictionary | None] = []  # loaded on first use; [None] when the table is missing or damaged
_english_rates: dict[str, float | None] = {}
MAX_KEPT_RATES = 100_000
"""English rates kept once looked up: a long paste of words a KB does not hold would look each one up on every
call, and a flood of made-up words must not grow the memo without bound."""


def english_rate(term: str) -> float | None:
    """How often general English uses ``term`` (a stem, as :func:`analyze` gives it) per word, from the Google Books
    counts of tools/build_en_words.py; ``None`` for a word English does not hold (a name: FastAPI, nginx, Django) or
    when the table is missing."""
    if term in _english_rates:
        return _english_rates[term]
    if not _english:
        _english.append(_mapped(_EN_FILE, _EN_MAGIC))  # two threads may both map it; either mapping serves
    table = _english[0]
    rate = None
    if table is not None and term.isascii():
        _, count = table.lookup(term.encode("ascii"))
        rate = count / table.total if count and table.total else None
    if len(_english_rates) < MAX_KEPT_RATES:
        _english_rates[term] = rate
    return rate


# -- the segmenter ------------------------------------------------------------------------------------------------

LIGHT_BUDGET = 4_000
"""Characters a process cuts on the light path before it builds the full segmenter (see the module docstring)."""
_WORDS_FILE = Path(__file__).with_name("zh_words.bin")  # written by tools/build_zh_words.py
_MAGIC = b"KXZW1\0\0\0"
_MAX_WORD_CHARS = 16
"""The longest word of the dictionary, in characters."""


class _Dictionary:
    """The dictionary of ``zh_words.bin``: its words' UTF-8 bytes sorted bytewise, their frequencies, its total.
    Lookups bisect the table where it lies (the file mapped into memory), so loading it reads and builds nothing:
    a question touches a few dozen of its pages."""

    def __init__(self, data: mmap.mmap | bytes) -> None:
        n, self.total = struct.unpack_from("<IQ", data, len(_MAGIC))
        start = len(_MAGIC) + 16
        view = memoryview(data)
        self.offsets = view[start : start + 4 * (n + 1)].cast("I")
        self.freqs = view[start + 4 * (n + 1) : start + 4 * (2 * n + 1)].cast("I")
        self.data = data
        self.base = start + 4 * (2 * n + 1)
        self.n = n

    def _word(self, i: int) -> bytes:
        return self.data[self.base + self.offsets[i] : self.base + self.offsets[i + 1]]

    def lookup(self, key: bytes) -> tuple[bool, int]:
        """(whether some word starts with ``key``, the frequency of ``key`` itself or 0)."""
        lo, hi = 0, self.n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._word(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        if lo == self.n:
            return False, 0
        word = self._word(lo)
        return word.startswith(key), self.freqs[lo] if word == key else 0


class _Segmenters:
    """The full segmenter (rjieba, built on first need) and the light path before it (see the module docstring)."""

    def __init__(self) -> None:
        self._full: Any = None
        self._light: tuple[_Dictionary, Any] | bool | None = False  # False: not tried yet; None: unavailable
        self._used = 0
        self._lock = threading.Lock()

    def full(self) -> Any:
        if self._full is None:
            with self._lock:
                if self._full is None:
                    import rjieba  # builds the whole dictionary: ~0.12 s and ~35 MB

                    self._full = rjieba
                    self._light = None  # the table is not needed any more (5.8 MB)
        return self._full

    def for_text(self, text: str) -> Any:
        """A segmenter that cuts ``text`` (and any part of it) as rjieba does."""
        if self._full is not None or self._used + len(text) > LIGHT_BUDGET:
            return self.full()
        light = self._light_parts()
        if light is None:
            return self.full()
        self._used += len(text)  # racing threads may count a little less: the budget only bounds the light path
        dictionary, jieba = light
        segmenter = jieba.empty()
        added = 0
        seen: set[str] = set()
        for i in range(len(text)):
            for j in range(i + 1, min(len(text), i + _MAX_WORD_CHARS) + 1):
                piece = text[i:j]
                is_prefix, freq = dictionary.lookup(piece.encode("utf-8"))
                if freq and piece not in seen:
                    seen.add(piece)
                    segmenter.add_word(piece, freq, None)
                    added += freq
                if not is_prefix:
                    break
        if added > dictionary.total:  # a damaged table: its frequencies do not add up
            return self.full()
        # The rest of the dictionary's weight, on a word no text holds: a route's probability is a word's frequency
        # over the total, so the cut is the full segmenter's.
        segmenter.add_word("\ue000", dictionary.total - added, None)
        return segmenter

    def _light_parts(self) -> tuple[_Dictionary, Any] | None:
        if self._light is False:
            with self._lock:
                if self._light is False:
                    self._light = _load_light()
        return self._light if isinstance(self._light, tuple) else None


def _mapped(path: Path, magic: bytes) -> _Dictionary | None:
    """The table of ``path`` (the layout of tools/build_zh_words.py), or ``None`` when it is missing or damaged."""
    if sys.byteorder != "little":
        return None
    try:
        # Mapped, not read: a question touches a few dozen pages of it. Installers and the tools that write these
        # tables replace the file rather than rewrite it, so a mapping never sees it cut short.
        with path.open("rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None
    if data[: len(magic)] != magic:
        return None
    try:
        dictionary = _Dictionary(data)
        whole = dictionary.base + dictionary.offsets[dictionary.n] == len(data)
    except (struct.error, TypeError, IndexError):  # cut short: its header or tables end before they should
        return None
    return dictionary if whole else None


def _load_light() -> tuple[_Dictionary, Any] | None:
    """The dictionary table and rjieba's segmenter class, loaded without rjieba's package, whose import builds the
    full dictionary; ``None`` when either is missing (the full segmenter then serves every text)."""
    dictionary = _mapped(_WORDS_FILE, _MAGIC)
    if dictionary is None:
        return None
    jieba = sys.modules["rjieba"].Jieba if "rjieba" in sys.modules else _jieba_class()
    return (dictionary, jieba) if jieba is not None else None


def _jieba_class() -> Any:
    """rjieba's compiled ``Jieba`` class, its package's ``__init__`` not run. Registered as ``rjieba.rjieba``, so a
    later ``import rjieba`` uses this module instead of loading the library a second time."""
    spec = importlib.util.find_spec("rjieba")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"rjieba{suffix}"
            if path.is_file():
                ext = importlib.util.spec_from_file_location("rjieba.rjieba", path)
                if ext is None or ext.loader is None:
                    return None
                module = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(module)
                sys.modules["rjieba.rjieba"] = module
                return module.Jieba
    return None


_SEGMENTERS = _Segmenters()
_segmenter = _SEGMENTERS.for_text


def stems(words: Sequence[str]) -> list[str]:
    """The terms :func:`analyze` gives these lower-case ASCII words alone (their Snowball stems), uncached: for the
    spelling variants of a word, made by the hundred and not asked for again."""
    return list(_stemmer.stemWords(list(words)))


def stem(word: str) -> str:
    """The term :func:`analyze` gives one lower-case Latin word alone (its Snowball stem), cached."""
    found = _stem_cache.get(word)
    if found is None:
        found = _stemmer.stemWord(word) if word.isascii() and word.isalpha() else word
        if len(_stem_cache) < 200_000:
            _stem_cache[word] = found
    return found


def _char_class(c: str) -> str:
    if c.isupper():
        return "U"
    if c.islower():
        # ß has no capital of its own in most text (STRAßE): it takes its neighbours' case, or it would cut the
        # word as a lower-case hump does (str, ass).
        return "C" if len(c.upper()) > 1 else "L"
    if c.isdigit():
        return "D"
    return "O" if c.isalpha() else "S"


def _parts(word: str) -> list[str]:
    """The parts of an identifier: camel-case humps, runs of digits, letters between separators."""
    if word.isascii():
        return _ASCII_PART.findall(word)
    classes = list(map(_char_class, word))
    cased = next((c for c in classes if c in "UL"), "L")
    for i, c in enumerate(classes):
        if c == "C":
            classes[i] = cased
        elif c in "UL":
            cased = c
    return [word[m.start() : m.end()] for m in _PART.finditer("".join(classes))]


def _fold_accents(word: str) -> str:
    """``word`` with the accents of Latin letters taken off (``Zürich`` → ``Zurich``, ``café`` → ``cafe``): people
    type names without them. Marks on other scripts' letters (Devanagari vowel signs, kana) are part of the letter
    and stay. One pass over the word."""
    if word.isascii():
        return word
    out: list[str] = []
    latin = False
    for ch in unicodedata.normalize("NFD", word):
        if latin and unicodedata.combining(ch):
            continue  # a mark on an ASCII letter, or on such a mark
        out.append(ch)
        latin = ch.isascii() and ch.isalpha()
    return unicodedata.normalize("NFC", "".join(out))


def _word_terms(word: str) -> Iterator[str]:
    """A Latin word, stemmed; an identifier whole (unstemmed) and each of its parts stemmed."""
    word = _fold_accents(word.replace("\u2019", "'"))
    folded = word.casefold()
    if folded in _EN_STOP:
        return
    if "'" in folded:
        ending = next((e for e in _CONTRACTIONS if folded.endswith(e)), "")
        if ending:
            word, folded = word[: -len(ending)], folded[: -len(ending)]
            if not folded or folded in _EN_STOP:
                return
    parts = [p.casefold() for p in _parts(word)]
    if len(parts) <= 1:
        yield stem(folded)
        return
    yield folded
    for p in parts:
        if len(p) > 1 and not p.isdigit() and p not in _EN_STOP:  # "v1.2.3" is not about "2"
            yield stem(p)


def _search_words(word: str, segmenter: Any) -> Iterator[str]:
    """The dictionary words of two and three characters inside a long word (jieba's search mode)."""
    for size in (2, 3):
        if len(word) > size:
            for i in range(len(word) - size + 1):
                gram = word[i : i + size]
                if segmenter.has_word(gram) and gram not in _ZH_STOP:
                    yield gram


def _han_terms(run: str, vocab: frozenset[str]) -> Iterator[str]:
    segmenter = _segmenter(run)
    words = segmenter.cut(run)
    for w in words:
        if w in _ZH_STOP:
            continue
        yield w
        if len(w) > 2:
            yield from _search_words(w, segmenter)
    if vocab and len(words) > 1:
        for i in range(len(words) - 1):
            joined = words[i]
            for j in range(i + 1, len(words)):
                joined += words[j]
                if len(joined) > MAX_VOCAB_TERM:
                    break
                if joined in vocab:
                    yield joined


def analyze(text: str, vocab: frozenset[str] = frozenset()) -> list[str]:
    """The search terms of ``text`` in order (repeats kept): documents and questions go through this alike.

    ``vocab`` is the KB's own vocabulary (see :func:`vocabulary`): multi-word terms that are emitted whole too.
    """
    out: list[str] = []
    text = _nfkc(text)
    for m in _TOKEN.finditer(text):
        han = m.group("han")
        if han is not None:
            out.extend(_han_terms(simplified(han.casefold()), vocab))
        else:
            word = m.group("word")
            if len(word) <= MAX_WORD:
                out.extend(_word_terms(word))
                if (named := _suffixed(word, text, m.end())) is not None:
                    out.append(named.casefold())
    return out


def _suffixed(word: str, text: str, end: int) -> str | None:
    """``word`` with the ``#`` or ``++`` that follows it at ``end`` in ``text`` (``C#``, ``C++``), if it is a word
    of ASCII letters so followed (see ``_NAME_SUFFIX``): a term of its own, beside the word's."""
    if end < len(text) and text[end] in "#+" and word.isascii() and word.isalpha():
        suffix = _NAME_SUFFIX.match(text, end)
        if suffix is not None:
            return word + suffix.group()
        if len(word) == 1 and text[end] == "#" and text[end + 1 : end + 2].isdigit():
            return word + "#"  # C#10, F#6: a version after a one-letter name
    return None


def surface_forms(text: str) -> dict[str, str]:
    """Each term of a Latin-script word of ``text`` with the word as written (``cor``: ``CORS``, ``background``:
    ``BackgroundTasks``, ``cors``: ``ＣＯＲＳ`` if that is how it was typed): what a person reads in "matched", where
    the stems mean nothing. The first word wins."""
    forms: dict[str, str] = {}
    typed = _UNSEEN.sub("", text)
    for m in _TOKEN.finditer(typed):  # the words as typed; each normalised as analysis does
        word = m.group("word")
        if word is not None and len(word) <= MAX_WORD:
            # The suffix read as analysis reads it: ``Ｃ＃`` typed full-width is C#, shown as typed.
            plain = _nfkc(word)
            if (named := _suffixed(plain, _nfkc(typed[m.end() : m.end() + 3]), 0)) is not None:
                forms.setdefault(named.casefold(), word + typed[m.end() : m.end() + len(named) - len(plain)])
            for normal in _TOKEN.finditer(_nfkc(word)):
                folded = normal.group("word")
                if folded is not None:
                    terms = list(_word_terms(folded))
                    # A part of an identifier shows as that part (``word`` of ``word4``): a page matching only
                    # the part holds no ``word4``, and "matched word4" said it did.
                    parts = {stem(p.casefold()): p for p in _parts(_fold_accents(folded))} if len(terms) > 1 else {}
                    for term in terms:
                        forms.setdefault(term, parts.get(term, word) if term != terms[0] else word)
    return forms


def traditional_runs(text: str) -> list[tuple[str, str]]:
    """Each run of Chinese in ``text`` written with traditional characters: (as analysis reads it, as written),
    position for position (the table maps one character to one), so a term's written form is the same slice of
    the run: what "matched" shows a person who wrote 發票 (:func:`surface_forms` does it for Latin words)."""
    out: list[tuple[str, str]] = []
    if simplified(text) == text:  # nearly every question: one pass in C
        return out
    for m in _TOKEN.finditer(_nfkc(text)):
        run = m.group("han")
        if run is not None and (simple := simplified(run)) != run and len(simple) == len(run):
            out.append((simple, run))
    return out


def is_number(term: str) -> bool:
    """A number as a term: digits, with the separators a word may hold (``42``, ``0.17``, ``1.0``, ``2024-05-18``):
    a quantity, a version or a date, which the retrieval weighs as a value, not as a name."""
    return term[:1].isdigit() and all(c.isdigit() or c in ".-'’" for c in term)


def mixes_letters_and_digits(word: str) -> bool:
    """A ticket, a host, an error code, a version-numbered name (``INC0012345``, ``0x87D1041C``, ``HTTP2``): the
    one test of such a word, for values (:func:`value_terms`) and identifiers (:func:`identifier_terms`) alike."""
    return any(c.isdigit() for c in word) and any(c.isalpha() for c in word)


MIN_PASTED_WORDS = 3
"""Latin-script words in a row, with no Chinese between them, that make an English sentence or a program's output
quoted in a Chinese question (an error message, a log line, a traceback), not names a Chinese sentence drops in
(``Excel``, ``Word 和 Excel``, ``Nginx 怎么用 limit_req 按 IP 限流``)."""
_EXCEPTION_ENDINGS = ("Error", "Exception", "Warning")


@dataclass(frozen=True, slots=True)
class Pasted:
    """What a Chinese question quotes in English (see :func:`pasted_english`)."""

    prose: frozenset[str]
    """The terms of its plain English words (one part each, English has them: :func:`english_rate`)."""
    compounds: Mapping[str, tuple[str, ...]]
    """Its words of two parts or more that are not a product's name, each whole term with its parts' terms: code
    names (``model_attributes_type``, ``GraphMemoryExceeded``, a module path ``fastapi.exceptions.FastAPIError``),
    header and hyphenated names (``Access-Control-Allow-Origin``) and exception names (``TypeError``: a capitalised
    word of two parts ending in Error, Exception or Warning, the convention of every language that has them).
    Capitalised words of two parts otherwise (``MySQL``, ``PowerShell``) and words that mix letters and digits
    (values: :func:`value_terms`) are not among them."""


def pasted_english(text: str) -> Pasted:
    """The English that ``text`` quotes: its runs of ``MIN_PASTED_WORDS`` Latin-script words or more with no Chinese
    between them (``Traceback (most recent call last)``, ``has been blocked by CORS policy``,
    ``{"type":"model_attributes_type","loc":["body"]}``). Linear: the tokenizer's own regex."""
    prose: set[str] = set()
    compounds: dict[str, tuple[str, ...]] = {}
    run: list[str] = []
    for m in _TOKEN.finditer(_nfkc(text)):
        word = m.group("word")
        if word is not None:
            run.append(word)
            continue
        if len(run) >= MIN_PASTED_WORDS:
            _pasted_run(run, prose, compounds)
        run = []
    if len(run) >= MIN_PASTED_WORDS:
        _pasted_run(run, prose, compounds)
    return Pasted(frozenset(prose), MappingProxyType(compounds))


def _pasted_run(words: list[str], prose: set[str], compounds: dict[str, tuple[str, ...]]) -> None:
    for word in words:
        if len(word) > MAX_WORD or mixes_letters_and_digits(word):
            continue
        word = _fold_accents(word)
        parts = _parts(word)
        terms = list(_word_terms(word))
        if len(parts) == 1:
            if word.isalpha():
                prose.update(t for t in terms if english_rate(t) is not None)
            continue
        if len(parts) == 2 and word[0].isupper() and word.isalpha() and not word.endswith(_EXCEPTION_ENDINGS):
            continue  # a product's name: GreptimeDB, PowerShell
        # The whole and two parts at least where only case joins them ("MySQL" is mysql and sql: "my" is a stop
        # word); a word joined by "_", "." or "-" is code whatever is left of it (get_db: db).
        joined = any(c in "_.-" for c in word.strip("_.-"))
        if len(terms) >= (2 if joined else 3):
            compounds[terms[0]] = tuple(terms[1:])


def value_terms(text: str) -> frozenset[str]:
    """The terms of ``text`` that come only from its values: URLs, e-mail addresses, file paths (``src/App.tsx``,
    ``C:\\logs\\app.log``, ``docs/guide/``) and words that mix letters and digits (a ticket ``INC0012345``, a
    host ``DESKTOP-8F3K2J``, a user ``zhangsan01``, a code ``0x80180014``).

    A question names its subject with words; a value it carries (whom, which machine, which error) is about the
    asker's case, as a number is. Linear: a split on white space and Chinese runs, the tokenizer's own regex.
    """
    values: list[str] = []
    rest: list[str] = []
    for token in _nfkc(text).split():
        for piece in _HAN_RUN.split(token) if _HAN_CHAR.search(token) else (token,):
            if "://" in piece or "@" in piece:
                values.append(piece)
                continue
            if "/" in piece or "\\" in piece:  # a path may be glued to punctuation: 见src/App.tsx，
                kept, start = [], 0
                for begin, end in file_path_spans(piece):
                    values.append(piece[begin:end])
                    kept.append(piece[start:begin])
                    start = end
                kept.append(piece[start:])
                piece = " ".join(kept)
            for m in _TOKEN.finditer(piece):
                word = m.group("word")
                (values if word and mixes_letters_and_digits(word) else rest).append(m.group())
    if not values:
        return frozenset()
    return frozenset(analyze(" ".join(values))) - frozenset(analyze(" ".join(rest)))


def identifier_terms(text: str) -> dict[str, tuple[str, ...]]:
    """The identifiers of ``text``, each as its whole term and the terms of its parts: names joined by ``_``
    (``next_cursor``), ``X-`` header names (``X-Nonce``, ``x-request-id``), lower camel case (``useEffect``),
    capitalised camel case of three parts or more (``RequestValidationError``, ``MDMWinsOverGP``), and words that
    mix letters and digits (an error code ``0x87D1041C``, ``HMAC-SHA256``, ``k8s``).

    An identifier names one thing exactly: where a document mentions it, even once in passing or deep in a long
    reference page, the document speaks of that thing, which an everyday word mentioned once does not show; and
    its parts (``next``, ``cursor``) say little once the whole is found. Capitalised words of two parts
    (``GreptimeDB``, ``PowerShell``, ``iPhone``) are product names, and hyphenated words without the header prefix
    prose whatever their case (``Content-Type`` is a header, ``High-Performance``, ``Check-In`` are not, and no
    spelling tells them apart), so neither is an identifier; class and setting names run longer. Linear: the
    tokenizer's own regex.
    """
    out: dict[str, tuple[str, ...]] = {}
    for m in _TOKEN.finditer(_nfkc(text)):
        word = m.group("word")
        if word and len(word) <= MAX_WORD and _is_identifier(word := _fold_accents(word)):
            terms = list(_word_terms(word))
            # One part, stemmed, is no whole term (``__init__``); nor is a number left by a contraction (``1'd``).
            if terms and len(_parts(word)) > 1 and not terms[0].isdigit():
                out[terms[0]] = tuple(terms[1:])
    return out


def _is_identifier(word: str) -> bool:
    if "_" in word.strip("_") or mixes_letters_and_digits(word):
        return True
    if word[:2] in ("X-", "x-") and len(word) > 2:  # a header name: X-Nonce, x-request-id
        return True
    lower = len(word) - len(word.lstrip("abcdefghijklmnopqrstuvwxyz"))
    if lower >= 2 and word[lower : lower + 1].isupper():
        return True
    return word[:1].isupper() and len(_parts(word)) >= 3


def term_counts(text: str, vocab: frozenset[str] = frozenset()) -> Counter[str]:
    """How often each term of ``text`` occurs."""
    return Counter(analyze(text, vocab))


def vocabulary(phrases: Iterable[str]) -> frozenset[str]:
    """The multi-word Chinese terms among ``phrases`` (titles, tags, headings) that the segmenter would split.

    Each Han run of 2..``MAX_VOCAB_TERM`` characters that the segmenter cuts into several words becomes a term, so
    a product term like ``企业采购`` matches as one term as well as by its words.
    """
    out: set[str] = set()
    for phrase in phrases:
        for m in _TOKEN.finditer(normalize(phrase)):
            run = m.group("han")
            if run is None or not 2 <= len(run) <= MAX_VOCAB_TERM:
                continue
            segmenter = _segmenter(run)
            pieces = segmenter.cut(run)
            content = [p for p in pieces if p not in _ZH_STOP]
            # A piece that is a stop word makes a phrase, not a term (数据的导入), unless the whole run is a word
            # of the dictionary that its frequencies cut apart: 时区 is 时 (a stop word) and 区 everywhere else.
            # Stop words alone never make a term (请用 in a heading "请用 HTTPS" would match every "请用中文…").
            if len(pieces) > 1 and content and (len(content) == len(pieces) or segmenter.has_word(run)):
                out.add(run)
    return frozenset(out)
