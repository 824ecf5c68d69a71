"""Readers of the pretokenized formats for training: padded rows, token lists (packed), memmap (packed).

Each opens a `pretok tokenize` output through its manifest (validated: format, tokenizer, sequence length)
and serves samples by global order position: `sample(epoch, k)`. The parquet formats read part footers at open
and decode row groups on demand into a bounded cache (`parquet_rows.py`: memory independent of the dataset
size); each part is checked against its manifest checksum when a process first reads it. The memmap format is
memory-mapped and never loaded, so its data files are checked only with `verify_on_open=True` (`verify_open.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..datapaths import window
from ..errors import PretokError
from ..formats.manifest import data_identity, read_manifest
from ..formats.memmap import MemmapDataset
from ..formats.parquet import check_ids
from .collate import collate_padded
from .order import ORDERS, block_permutation, block_windows, epoch_permutation
from .packing import PackedIndex, Sample, assemble, boundaries
from .parquet_rows import ParquetRows
from .shared_index import share_state, shareable, shared, unshare_state, unshared
from .source import EXACT
from .verify_open import verify_files

CACHE_MB = 128  # decoded row groups kept per process (parquet formats; at least 2 block windows)
BLOCK_GROUPS = 16  # row groups per window of the "block" order


def open_checked(path: str | os.PathLike, fmt: str, tokenizer_fingerprint: str | None) -> dict:
    """The manifest of `path`, refusing another format or tokenizer."""
    m = read_manifest(path, expect_format=fmt)
    if tokenizer_fingerprint and m["tokenizer"]["fingerprint"] != tokenizer_fingerprint:
        raise PretokError(f"was tokenized with {m['tokenizer']['spec']} ({m['tokenizer']['fingerprint'][:19]}…), "
                          f"not the requested tokenizer ({tokenizer_fingerprint[:19]}…)", Path(path) / "manifest.json")
    return m


def _order_args(order: str, block_groups: int) -> tuple[str, int]:
    if order not in ORDERS:
        raise PretokError(f"unknown data order '{order}' (choose from {', '.join(ORDERS)})")
    if block_groups < 1:
        raise PretokError(f"block_groups must be >= 1 (got {block_groups})")
    return order, block_groups


class _Output:
    """A `pretok tokenize` output opened through its manifest `m`."""

    path: Path
    m: dict

    def data_identity(self) -> str:
        """The data served (`manifest.data_identity`): loader states of other data are refused."""
        return data_identity(self.m)


class _ParquetOrder(_Output):
    """The order identity of the parquet sources (`rows`, `order`, `block_groups`)."""

    rows: ParquetRows
    order: str
    block_groups: int

    def order_identity(self) -> dict:
        """The order served, for loader states: the block order over at most `block_groups` row groups is the
        exact permutation, so it resumes states of either (and of readers from before orders existed)."""
        if self.order == "block" and len(self.rows.group_rows) > self.block_groups:
            return {"order": "block", "block_groups": self.block_groups}
        return dict(EXACT)


class BlockReadAhead:
    """Block order: when the stream enters a window of row groups, that window's and the next one's groups are
    decoded in a background thread (`ParquetRows.prefetch`). Changes timing only, never the samples."""

    def __init__(self, rows: ParquetRows, seed: int, shuffle: bool, block: int):
        self.rows, self.seed, self.shuffle, self.block = rows, seed, shuffle, block
        self.epoch: int | None = None
        self.window = -1

    def at(self, epoch: int, position: int, last: int | None = None) -> None:
        """The stream is at row `position` of `epoch`'s order (or at rows [position, last) at once)."""
        if epoch != self.epoch:
            self.epoch, self.window = epoch, -1
            self.groups, self.starts = block_windows(self.rows.group_rows, self.seed, epoch, self.shuffle, self.block)
        w = int(np.searchsorted(self.starts, position, side="right")) - 1
        end = w if last is None else int(np.searchsorted(self.starts, last - 1, side="right")) - 1
        if end != self.window:
            self.window = end
            self.rows.prefetch(self.groups[w * self.block : (end + 2) * self.block])


class PaddedRows(_ParquetOrder):
    """`pretok-padded`: one document per row, `seq_len + 1` slots; the order permutes rows. Rows are read by
    row group into a bounded cache (`parquet_rows.py`); `order`: "block" (`order.block_permutation` over
    `block_groups` row groups at a time) or "exact" (`order.epoch_permutation`: about one row-group decode per
    sample once the data outgrows the cache)."""

    streaming = False

    def __init__(self, path, seq_len: int, seed: int = 0, shuffle: bool = True, tokenizer_fingerprint=None,
                 verify_on_open: bool = False, order: str = "block", block_groups: int = BLOCK_GROUPS,
                 cache_mb: float = CACHE_MB):
        """Open a padded dataset, checked against its manifest.

        Args:
            path: the `pretok tokenize` output dir; seq_len: tokens per sample (<= its rows' seq_len).
            seed, shuffle: the global order; tokenizer_fingerprint: refuse another tokenizer's data (None: any).
            verify_on_open: check every part against the manifest now (stamped: once per change of the files)
                instead of each part when this process first reads it.
            order, block_groups: "block" (row groups shuffled `block_groups` at a time) or "exact".
            cache_mb: decoded row groups kept per process.
        """
        self.path, self.m = Path(path), open_checked(path, "padded", tokenizer_fingerprint)
        self.order, self.block_groups = _order_args(order, block_groups)
        row, self.window = self.m["policy"]["row_length"], window(seq_len)
        if self.window > row:
            raise PretokError(f"seq_len {seq_len} needs rows of {self.window} tokens; this file holds {row} "
                              f"(pretokenized with --seq-len {row - 1})", self.path)
        self.seed, self.shuffle = seed, shuffle
        self.num_samples = self.m["counts"]["documents"]
        self.rows = ParquetRows(self.path, self.m, "padded", cache_mb=cache_mb, verify_on_open=verify_on_open,
                                min_groups=2 * self.block_groups + 1 if order == "block" else 2)
        if self.rows.num_rows != self.num_samples:
            raise PretokError(f"holds {self.rows.num_rows} rows, manifest.json says {self.num_samples}", self.path)
        self._perm: tuple[int, np.ndarray] | None = None
        self.ahead = BlockReadAhead(self.rows, seed, shuffle, block_groups) if order == "block" else None

    def sample(self, epoch: int, k: int) -> Sample:
        if self.ahead is not None:
            self.ahead.at(epoch, k)
        ids, mask = self.rows.padded_row(int(self.permutation(epoch)[k]), self.window)
        return Sample(ids, mask=mask)

    def batch(self, epoch: int, first: int, last: int) -> dict:
        """Order positions [first, last) gathered and collated at once: the same batch as `collate` of
        `sample(epoch, k)` for each k (what `ShardedBatches` asks of a source that has this)."""
        if self.ahead is not None:
            self.ahead.at(epoch, first, last)
        return collate_padded(*self.rows.padded_batch(self.permutation(epoch)[first:last], self.window))

    def prepare(self, epoch: int) -> None:
        """Build the epoch's order here, before the DataLoader starts its workers (they share it: `shared_index.py`)."""
        self.permutation(epoch)

    def __getstate__(self) -> dict:  # to a spawned DataLoader worker: the order in shared memory when large
        return {**self.__dict__, "_perm": self._perm and (self._perm[0], shareable(self._perm[1]))}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._perm is not None:
            self._perm = (self._perm[0], unshared(self._perm[1]))

    def permutation(self, epoch: int) -> np.ndarray:
        """Global row ids in the epoch's order."""
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, row_order(self.rows.group_rows, self.seed, epoch, self.shuffle, self.order,
                                           self.block_groups))
        return self._perm[1]


def row_order(group_rows: np.ndarray, seed: int, epoch: int, shuffle: bool, order: str, block: int) -> np.ndarray:
    """The epoch's order of rows stored in row groups of `group_rows` rows: exact or block (see order.py)."""
    if order == "block":
        return block_permutation(group_rows, seed, epoch, shuffle, block)
    return epoch_permutation(int(np.sum(group_rows)), seed, epoch, shuffle)


class _Packed(_Output):
    """Shared by token lists and memmap: documents in the epoch's order, cut into windows of seq_len + 1."""

    streaming = False

    def __init__(self, lengths: np.ndarray, seq_len: int, seed: int, shuffle: bool):
        self.doc_lengths, self.window, self.seed, self.shuffle = lengths, window(seq_len), seed, shuffle
        self._index: tuple[int, PackedIndex] | None = None
        self.num_samples = int(lengths.sum()) // self.window  # the same for every epoch

    def doc_order(self, epoch: int) -> np.ndarray:
        return epoch_permutation(len(self.doc_lengths), self.seed, epoch, self.shuffle)

    def prepare(self, epoch: int) -> None:
        """Build the epoch's index here, before the DataLoader starts its workers (they share it: `shared_index.py`)."""
        self.index(epoch)

    def index(self, epoch: int) -> PackedIndex:
        if self._index is None or self._index[0] != epoch:
            self._index = (epoch, PackedIndex(self.doc_lengths, self.doc_order(epoch), self.window))
        return self._index[1]

    def sample(self, epoch: int, k: int) -> Sample:
        return self.index(epoch).sample(k, self.doc_tokens)

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        raise NotImplementedError

    def order_identity(self) -> dict:
        return dict(EXACT)


class TokenListPacked(_ParquetOrder, _Packed):
    """`pretok-token-list`: token lists packed exactly like the on-the-fly padding-free baseline. Document
    lengths come from the part footers; tokens are read by row group into a bounded cache (`parquet_rows.py`).
    `order`: "block" or "exact" (documents permuted by `order.block_permutation` / `epoch_permutation`)."""

    def __init__(self, path, seq_len: int, seed: int = 0, shuffle: bool = True, tokenizer_fingerprint=None,
                 verify_on_open: bool = False, order: str = "block", block_groups: int = BLOCK_GROUPS,
                 cache_mb: float = CACHE_MB):
        """Open a token-list dataset, checked against its manifest. Args: as for `PaddedRows`."""
        self.path, self.m = Path(path), open_checked(path, "token-list", tokenizer_fingerprint)
        self.order, self.block_groups = _order_args(order, block_groups)
        self.rows = ParquetRows(self.path, self.m, "token-list", cache_mb=cache_mb, verify_on_open=verify_on_open,
                                min_groups=2 * self.block_groups + 1 if order == "block" else 2)
        counts = self.m["counts"]
        got = (self.rows.num_rows, int(self.rows.lengths.sum()))
        if got != (counts["documents"], counts["tokens"]):
            raise PretokError(f"holds {got[0]} documents of {got[1]} tokens, manifest.json says "
                              f"{counts['documents']} of {counts['tokens']}", self.path)
        super().__init__(self.rows.lengths, seq_len, seed, shuffle)
        self.ahead = BlockReadAhead(self.rows, seed, shuffle, block_groups) if order == "block" else None

    def sample(self, epoch: int, k: int) -> Sample:
        index = self.index(epoch)
        if self.ahead is not None:  # the document position where window k starts
            self.ahead.at(epoch, int(np.searchsorted(index.ends, k * self.window, side="right")))
        pieces = index.pieces(k)
        slices = iter(self.rows.doc_slices(pieces))
        return assemble(pieces, lambda d, a, b: next(slices))  # called once per piece, in order

    def doc_order(self, epoch: int) -> np.ndarray:
        return row_order(self.rows.group_rows, self.seed, epoch, self.shuffle, self.order, self.block_groups)

    def __getstate__(self) -> dict:
        return share_state(self.__dict__, ("doc_lengths",))

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(unshare_state(state, ("doc_lengths",)))

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        return self.rows.doc_tokens(doc, a, b)


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
        lengths = self._views()  # contiguous in document order (MemmapDataset checks the pointers): windows assume it
        self.vocab = int(self.m["tokenizer"]["vocab_size"])  # every window served is checked to lie in [0, vocab)
        self.signed = self.ds.dtype.kind == "i"  # uint16 ids cannot be negative: only their maximum is checked
        super().__init__(lengths, seq_len, seed, shuffle)

    def _views(self) -> np.ndarray:
        """Set the token view and document starts from the mapped files; return the document lengths."""
        self.starts = np.asarray(self.ds.pointers, dtype=np.int64) // self.ds.dtype.itemsize
        self.tokens = self.ds.tokens.view(np.ndarray)  # same mapping, without np.memmap's per-slice overhead
        return np.asarray(self.ds.lengths, dtype=np.int64)

    def __getstate__(self) -> dict:
        """A DataLoader worker started by spawn or forkserver gets the paths (`MemmapDataset.__getstate__`), not
        the tokens: they are mapped again there. The arrays derived from the index (starts, lengths) travel in
        shared memory when large (`shared_index.py`), else are derived again there; the epoch's index (when
        built) travels in shared memory when large, else by value."""
        return {**self.__dict__, "tokens": None, "starts": shared(self.starts),
                "doc_lengths": shared(self.doc_lengths)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.starts is None or self.doc_lengths is None:  # small, or no shared memory: derived again here
            self.doc_lengths = self._views()
        else:
            self.starts, self.doc_lengths = unshared(self.starts), unshared(self.doc_lengths)
            self.tokens = self.ds.tokens.view(np.ndarray)

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        s = int(self.starts[doc])
        return self.tokens[s + a : s + b]

    def sample(self, epoch: int, k: int) -> Sample:
        if not self.shuffle:  # sequential: the window is one contiguous slice of the .bin (nanoGPT's fast path)
            starts, lens = boundaries(self.index(epoch).pieces(k))
            tokens = np.asarray(self.tokens[k * self.window : (k + 1) * self.window], dtype=np.int64)
            out = Sample(tokens, starts=starts, doc_lens=lens)
        else:
            out = super().sample(epoch, k)
        # the ids served, exactly (a check of whole chunks would read far more than a shuffled window on first use)
        if out.tokens.size and (int(out.tokens.max()) >= self.vocab or (self.signed and int(out.tokens.min()) < 0)):
            check_ids(out.tokens, self.vocab, self.ds.bin_path)  # raises, naming the id
        return out
