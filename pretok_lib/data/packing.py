"""Packing documents into fixed windows of `seq_len + 1` tokens, addressable in O(log #docs) per window.

The stream is the documents concatenated in an epoch's document order; window k is tokens
[k*W, (k+1)*W) of it (W = seq_len + 1, non-overlapping); a last partial window is dropped. A window records
where documents start inside it, so the loss can be masked where it crosses into a new document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .shared_index import share_state, unshare_state

_NO_STARTS = np.zeros(0, dtype=np.int64)


@dataclass
class Sample:
    """One training row: `tokens` (W ids); `mask` (W bools, padded rows only); `starts`: positions > 0 where a
    new document begins (packed rows only); `doc_lens`: lengths of the document pieces in the row (packed);
    `origin`: the dataset of a mixture it came from (mixtures only)."""

    tokens: np.ndarray
    mask: np.ndarray | None = None
    starts: np.ndarray | None = None
    doc_lens: np.ndarray | None = None
    origin: int | None = None


class PackedIndex:
    """Window → document pieces, for documents of known `lengths` taken in `order`."""

    def __init__(self, lengths: np.ndarray, order: np.ndarray, window: int):
        self.lengths, self.order, self.window = np.asarray(lengths, np.int64), order, window
        self.ends = np.cumsum(self.lengths[order]) if len(order) else np.zeros(0, np.int64)
        self.num_windows = int(self.ends[-1]) // window if len(self.ends) else 0

    ARRAYS = ("lengths", "order", "ends")

    def __getstate__(self) -> dict:  # to a spawned DataLoader worker: in shared memory (`shared_index.py`)
        return share_state(self.__dict__, self.ARRAYS)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(unshare_state(state, self.ARRAYS))

    def pieces(self, k: int) -> list[tuple[int, int, int]]:
        """[(document id, start, stop)] making up window k, in order."""
        t, need, out = k * self.window, self.window, []
        p = int(np.searchsorted(self.ends, t, side="right"))
        offset = t - (int(self.ends[p - 1]) if p else 0)
        while need:
            doc = int(self.order[p])
            take = min(need, int(self.lengths[doc]) - offset)
            if take > 0:
                out.append((doc, offset, offset + take))
                need -= take
            p, offset = p + 1, 0
        return out

    def sample(self, k: int, doc_tokens: Callable[[int, int, int], np.ndarray]) -> Sample:
        return assemble(self.pieces(k), doc_tokens)


def boundaries(pieces: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(positions > 0 where a document starts, lengths of the pieces) of a window made of `pieces`."""
    lens = np.array([b - a for _, a, b in pieces], dtype=np.int64)
    pos = np.concatenate([[0], np.cumsum(lens)[:-1]])
    starts = np.array([p for p, (_, a, _) in zip(pos, pieces) if a == 0 and p > 0], dtype=np.int64)
    return starts, lens


def assemble(pieces: list[tuple[int, int, int]], doc_tokens: Callable[[int, int, int], np.ndarray]) -> Sample:
    """Concatenate document pieces into one packed Sample (a piece starting at 0 is a document start)."""
    if len(pieces) == 1:  # most windows lie inside one document: no boundary to record
        d, a, b = pieces[0]
        return Sample(np.asarray(doc_tokens(d, a, b), dtype=np.int64), starts=_NO_STARTS, doc_lens=np.array([b - a]))
    starts, lens = boundaries(pieces)
    tokens = np.concatenate([doc_tokens(d, a, b) for d, a, b in pieces]).astype(np.int64, copy=False)
    return Sample(tokens, starts=starts, doc_lens=lens)
