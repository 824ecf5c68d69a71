"""Readers of the pretokenized formats for training: padded rows, token lists (packed), memmap (packed).

Each opens a `pretok tokenize` output through its manifest (validated: format, tokenizer, sequence length)
and serves samples by global order position: `sample(epoch, k)`. The parquet formats are loaded into memory
on first use (parquet has no cheap random row access) and every part is checked against its manifest checksum as
it is read; the memmap format is memory-mapped and never loaded, so its data files are checked only with
`verify_on_open=True` (see `verify_open.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import PretokError
from ..formats import checksum
from ..formats import parquet as pqf
from ..formats.manifest import read_manifest
from ..formats.memmap import MemmapDataset
from .order import epoch_permutation
from .packing import PackedIndex, Sample, boundaries
from .verify_open import verify_files


def open_checked(path: str | os.PathLike, fmt: str, tokenizer_fingerprint: str | None) -> dict:
    """The manifest of `path`, refusing another format or tokenizer."""
    m = read_manifest(path, expect_format=fmt)
    if tokenizer_fingerprint and m["tokenizer"]["fingerprint"] != tokenizer_fingerprint:
        raise PretokError(f"was tokenized with {m['tokenizer']['spec']} ({m['tokenizer']['fingerprint'][:19]}…), "
                          f"not the requested tokenizer ({tokenizer_fingerprint[:19]}…)", Path(path) / "manifest.json")
    return m


def _read_table(path: Path, expected: str | None = None):
    """The whole parquet part (read in full anyway, so its manifest checksum is checked too: flipped bytes in a
    zstd page often decode without error into wrong tokens), or a PretokError naming it."""
    if expected and not checksum.matches(path, expected):
        raise PretokError("checksum differs from manifest.json (corrupted or modified)", path)
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise PretokError(f"corrupt parquet data ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None


class PaddedRows:
    """`pretok-padded`: one document per row, `seq_len + 1` slots; the order permutes rows."""

    def __init__(self, path, seq_len: int, seed: int = 0, shuffle: bool = True, tokenizer_fingerprint=None,
                 verify_on_open: bool = False):
        """`verify_on_open`: load (and so check) every part now instead of at the first sample."""
        self.path, self.m = Path(path), open_checked(path, "padded", tokenizer_fingerprint)
        row = self.m["policy"]["row_length"]
        if seq_len + 1 > row:
            raise PretokError(f"seq_len {seq_len} needs rows of {seq_len + 1} tokens; this file holds {row} "
                              f"(pretokenized with --seq-len {row - 1})", self.path)
        self.window, self.seed, self.shuffle = seq_len + 1, seed, shuffle
        self.num_samples = self.m["counts"]["documents"]
        self.rows = self.masks = None
        if verify_on_open:
            self._load()

    def _load(self) -> None:
        rows, masks = [], []
        for f in self.m["files"]:
            meta = pqf.read_contract(self.path / f["path"], "padded")
            t = _read_table(self.path / f["path"], checksum.recorded(f))
            L = meta["row_length"]
            rows.append(t.column("input_ids").combine_chunks().values.to_numpy().reshape(-1, L))
            masks.append(t.column("attention_mask").combine_chunks().values.to_numpy().reshape(-1, L))
        self.rows = np.concatenate(rows)[:, : self.window] if rows else np.zeros((0, self.window), np.int64)
        self.masks = (np.concatenate(masks)[:, : self.window] != 0) if masks else np.zeros((0, self.window), bool)
        if len(self.rows) != self.num_samples:
            raise PretokError(f"holds {len(self.rows)} rows, manifest.json says {self.num_samples}", self.path)

    def sample(self, epoch: int, k: int) -> Sample:
        if self.rows is None:
            self._load()
        i = int(self._perm(epoch)[k])
        return Sample(self.rows[i], mask=self.masks[i])

    def _perm(self, epoch: int) -> np.ndarray:
        if getattr(self, "_perm_epoch", None) != epoch:
            self._perm_cache, self._perm_epoch = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle), epoch
        return self._perm_cache


class _Packed:
    """Shared by token lists and memmap: documents in the epoch's order, cut into windows of seq_len + 1."""

    def __init__(self, lengths: np.ndarray, seq_len: int, seed: int, shuffle: bool):
        self.doc_lengths, self.window, self.seed, self.shuffle = lengths, seq_len + 1, seed, shuffle
        self._index: tuple[int, PackedIndex] | None = None
        self.num_samples = int(lengths.sum()) // self.window  # the same for every epoch

    def index(self, epoch: int) -> PackedIndex:
        if self._index is None or self._index[0] != epoch:
            order = epoch_permutation(len(self.doc_lengths), self.seed, epoch, self.shuffle)
            self._index = (epoch, PackedIndex(self.doc_lengths, order, self.window))
        return self._index[1]

    def sample(self, epoch: int, k: int) -> Sample:
        return self.index(epoch).sample(k, self.doc_tokens)

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        raise NotImplementedError


class TokenListPacked(_Packed):
    """`pretok-token-list`: token lists packed exactly like the on-the-fly padding-free baseline."""

    def __init__(self, path, seq_len: int, seed: int = 0, shuffle: bool = True, tokenizer_fingerprint=None,
                 verify_on_open: bool = False):
        """Every part is read, and checked, here: `verify_on_open` changes nothing."""
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


class MemmapPacked(_Packed):
    """`pretok-memmap`: windows read straight from the memory-mapped Megatron `.bin`."""

    def __init__(self, path, seq_len: int, seed: int = 0, shuffle: bool = True, tokenizer_fingerprint=None,
                 verify_on_open: bool = False):
        """`verify_on_open`: check data.bin and data.idx against the manifest's checksums first (once per change
        of the files: `verify_open.verify_files`); otherwise only the headers and index structure are checked."""
        self.path, self.m = Path(path), open_checked(path, "memmap", tokenizer_fingerprint)
        self.verified_now = verify_files(self.path, self.m) if verify_on_open else None
        self.ds = MemmapDataset(self.path / "data", expect_dtype=self.m["dtype"])
        if len(self.ds) != self.m["counts"]["documents"]:
            raise PretokError(f"data.idx holds {len(self.ds)} documents, manifest.json says "
                              f"{self.m['counts']['documents']}", self.path)
        self.starts = np.asarray(self.ds.pointers, dtype=np.int64) // self.ds.dtype.itemsize
        self.tokens = self.ds.tokens.view(np.ndarray)  # same mapping, without np.memmap's per-slice overhead
        lengths = np.asarray(self.ds.lengths, dtype=np.int64)
        if len(lengths) and not np.array_equal(self.starts[1:], np.cumsum(lengths)[:-1]):  # windows assume this
            raise PretokError("sequence pointers are not contiguous in document order (corrupt index)",
                              self.ds.idx_path)
        super().__init__(np.asarray(self.ds.lengths, dtype=np.int64), seq_len, seed, shuffle)

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        s = int(self.starts[doc])
        return self.tokens[s + a : s + b]

    def sample(self, epoch: int, k: int) -> Sample:
        if not self.shuffle:  # sequential: the window is one contiguous slice of the .bin (nanoGPT's fast path)
            starts, lens = boundaries(self.index(epoch).pieces(k))
            tokens = np.asarray(self.tokens[k * self.window : (k + 1) * self.window], dtype=np.int64)
            return Sample(tokens, starts=starts, doc_lens=lens)
        return super().sample(epoch, k)
