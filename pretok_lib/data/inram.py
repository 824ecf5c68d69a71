"""The parquet readers as they were before bounded memory: every part loaded whole into memory (in every process).

Kept as the reference the bounded readers (`pretokenized.PaddedRows`, `TokenListPacked`) are tested against and
benchmarked beside (`pretok bench loaders --memory`); not used by training. Same sample stream as the bounded
readers in their default `exact` order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..datapaths import window
from ..errors import PretokError
from ..formats import checksum
from ..formats import parquet as pqf
from .order import epoch_permutation
from .packing import Sample
from .pretokenized import _Packed, open_checked
from .source import EXACT


def _read_table(path: Path, expected: str | None = None):
    """The whole parquet part, checked against its manifest checksum, or a PretokError naming it."""
    if expected and not checksum.matches(path, expected):
        raise PretokError("checksum differs from manifest.json (corrupted or modified)", path)
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise PretokError(f"corrupt parquet data ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None


class InRamPaddedRows:
    """`pretok-padded` loaded whole: one document per row, `seq_len + 1` slots; the order permutes rows."""

    streaming = False

    def __init__(self, path, seq_len: int, seed: int = 0, shuffle: bool = True, tokenizer_fingerprint=None):
        self.path, self.m = Path(path), open_checked(path, "padded", tokenizer_fingerprint)
        self.window, self.seed, self.shuffle = window(seq_len), seed, shuffle
        self.num_samples = self.m["counts"]["documents"]
        rows, masks = [], []
        for f in self.m["files"]:
            meta = pqf.read_contract(self.path / f["path"], "padded")
            t = _read_table(self.path / f["path"], checksum.recorded(f))
            L = meta["row_length"]
            rows.append(t.column("input_ids").combine_chunks().values.to_numpy().reshape(-1, L))
            masks.append(t.column("attention_mask").combine_chunks().values.to_numpy().reshape(-1, L))
        self.rows = np.concatenate(rows)[:, : self.window] if rows else np.zeros((0, self.window), np.int64)
        self.masks = (np.concatenate(masks)[:, : self.window] != 0) if masks else np.zeros((0, self.window), bool)
        self._perm = (None, None)

    def order_identity(self) -> dict:
        return dict(EXACT)

    def sample(self, epoch: int, k: int) -> Sample:
        if self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle))
        i = int(self._perm[1][k])
        return Sample(self.rows[i], mask=self.masks[i])


class InRamTokenList(_Packed):
    """`pretok-token-list` loaded whole, packed like the on-the-fly padding-free baseline."""

    def __init__(self, path, seq_len: int, seed: int = 0, shuffle: bool = True, tokenizer_fingerprint=None):
        self.path, self.m = Path(path), open_checked(path, "token-list", tokenizer_fingerprint)
        values, offsets, base = [], [np.zeros(1, np.int64)], 0
        for f in self.m["files"]:
            pqf.read_contract(self.path / f["path"], "token-list")
            col = _read_table(self.path / f["path"], checksum.recorded(f)).column("input_ids").combine_chunks()
            values.append(col.values.to_numpy())
            offsets.append(col.offsets.to_numpy()[1:].astype(np.int64) + base)
            base += len(values[-1])
        self.values = np.concatenate(values) if values else np.zeros(0, np.int64)
        self.offsets = np.concatenate(offsets)
        super().__init__(np.diff(self.offsets), seq_len, seed, shuffle)

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        o = int(self.offsets[doc])
        return self.values[o + a : o + b]
