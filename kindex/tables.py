"""Scoring tables for retrieval: BM25 postings in flat numpy arrays, saved under ``.kindex/`` and memory-cheap.

A table maps each term to the documents holding it, with that document's BM25 contribution already computed
(field-weighted term frequency, saturation, length normalisation and rarity), so answering a question is a few
vectorised additions. Tables are saved without pickle (plain arrays and UTF-8 text), so a hostile KB folder cannot
run code through them.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from kindex.store import atomic_write

K1, B = 1.2, 0.5
FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int32]


class Table:
    """BM25 postings over ``n_docs`` documents."""

    def __init__(
        self,
        vocab: list[str],
        offsets: npt.NDArray[np.int64],
        post_doc: IntArray,
        post_w: FloatArray,
        idf: FloatArray,
        n_docs: int,
    ) -> None:
        self.vocab = vocab
        self.term_id = {t: i for i, t in enumerate(vocab)}
        self.offsets = offsets
        self.post_doc = post_doc
        self.post_w = post_w
        self.idf = idf
        self.n_docs = n_docs
        self.idf_unseen = math.log(1 + (n_docs + 0.5) / 0.5)

    @classmethod
    def build(cls, rows: Sequence[Mapping[str, float]]) -> Table:
        """A table from one ``{term: weighted frequency}`` row per document."""
        n = len(rows)
        lengths = np.array([sum(r.values()) for r in rows], dtype=np.float64)
        avg = float(lengths.mean()) if n and lengths.mean() > 0 else 1.0
        norm = 1 - B + B * lengths / avg
        vocab_ids: dict[str, int] = {}
        t_ids: list[int] = []
        d_ids: list[int] = []
        w_list: list[float] = []
        for doc, row in enumerate(rows):
            for term, weight in row.items():
                t_ids.append(vocab_ids.setdefault(term, len(vocab_ids)))
                d_ids.append(doc)
                w_list.append(weight)
        t = np.array(t_ids, dtype=np.int64)
        d = np.array(d_ids, dtype=np.int32)
        w = np.array(w_list, dtype=np.float64)
        order = np.lexsort((d, t))  # by term, then by document: each term's documents end up sorted
        t, d, w = t[order], d[order], w[order]
        counts = np.bincount(t, minlength=len(vocab_ids))
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        idf = np.log(1 + (n - counts + 0.5) / (counts + 0.5)).astype(np.float32)
        sat = w * (K1 + 1) / (w + K1 * norm[d]) if len(d) else w
        post_w = (sat * idf[t]).astype(np.float32)
        vocab = sorted(vocab_ids, key=vocab_ids.__getitem__)
        return cls(vocab, offsets, d, post_w, idf, n)

    def postings(self, term: str) -> tuple[IntArray, FloatArray, float] | None:
        """The documents holding ``term``, their BM25 contributions and the term's idf; ``None`` if none does."""
        tid = self.term_id.get(term)
        if tid is None:
            return None
        lo, hi = self.offsets[tid], self.offsets[tid + 1]
        return self.post_doc[lo:hi], self.post_w[lo:hi], float(self.idf[tid])

    def score(self, query: Mapping[str, float], into: FloatArray) -> None:
        """Add ``query``'s BM25 scores into ``into`` (one slot per document)."""
        for term, qw in query.items():
            hit = self.postings(term)
            if hit is not None:
                into[hit[0]] += hit[1] * qw

    def rarity(self, term: str) -> float:
        """The term's idf, or the idf of a term no document holds."""
        tid = self.term_id.get(term)
        return float(self.idf[tid]) if tid is not None else self.idf_unseen

    def holds(self, term: str, doc: int) -> bool:
        tid = self.term_id.get(term)
        if tid is None:
            return False
        lo, hi = self.offsets[tid], self.offsets[tid + 1]
        i = int(np.searchsorted(self.post_doc[lo:hi], doc))
        return lo + i < hi and int(self.post_doc[lo + i]) == doc

    def remap(self, mapping: IntArray, n_docs: int) -> Table:
        """The same postings with document ``i`` renumbered ``mapping[i]`` (``-1`` drops it)."""
        new_doc = mapping[self.post_doc]
        keep = new_doc >= 0
        t = np.repeat(np.arange(len(self.vocab)), np.diff(self.offsets))[keep]
        d, w = new_doc[keep], self.post_w[keep]
        order = np.lexsort((d, t))
        t, d, w = t[order], d[order], w[order]
        offsets = np.concatenate(([0], np.cumsum(np.bincount(t, minlength=len(self.vocab))))).astype(np.int64)
        table = Table(self.vocab, offsets, d.astype(np.int32), w, self.idf, n_docs)
        table.term_id = self.term_id
        return table

    def save(self, path: Path, meta: Mapping[str, Any]) -> None:
        """Write the table and ``meta`` (JSON) atomically as one ``.npz`` of plain arrays."""
        buf = io.BytesIO()
        np.savez(
            buf,
            vocab=np.frombuffer("\n".join(self.vocab).encode("utf-8"), dtype=np.uint8),
            offsets=self.offsets,
            post_doc=self.post_doc,
            post_w=self.post_w,
            idf=self.idf,
            meta=np.frombuffer(orjson.dumps({**meta, "n_docs": self.n_docs}), dtype=np.uint8),
        )
        atomic_write(path, buf.getvalue())

    @staticmethod
    def load_meta(path: Path) -> dict[str, Any] | None:
        """Only the meta of a saved table (the arrays are not read)."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = orjson.loads(data["meta"].tobytes())
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError):
            return None
        return meta if isinstance(meta, dict) else None

    @classmethod
    def load(cls, path: Path) -> tuple[Table, dict[str, Any]] | None:
        """The table and its meta, or ``None`` when the file is missing or not a table."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = orjson.loads(data["meta"].tobytes())
                text = data["vocab"].tobytes().decode("utf-8")
                table = cls(
                    text.split("\n") if text else [],
                    data["offsets"],
                    data["post_doc"],
                    data["post_w"],
                    data["idf"],
                    int(meta["n_docs"]),
                )
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError):
            return None
        if not isinstance(meta, dict) or len(table.offsets) != len(table.vocab) + 1:
            return None
        return table, meta
