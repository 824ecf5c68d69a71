"""Megatron-LM indexed dataset (.bin + .idx): streaming part writer, memory-bounded concat, validated reader.

Byte-compatible with `megatron.core.datasets.indexed_dataset` (version 1, non-multimodal). The .idx is a 34-byte
header (magic, <Q version, <B dtype code, <Q S sequences, <Q D document indices) then int32 lengths[S], int64 byte
pointers into .bin[S], int64 document_indices[D]; the .bin is all tokens back to back, little-endian. We write one
sequence per document (document_indices == arange(S + 1)). Workers write parts (`.bin` + raw int32 `.lens`) that
`concat_parts` (memmap_concat.py) joins without holding token data or a whole index in memory.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import numpy as np

from pretok_lib.errors import PretokError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document-index count (34 bytes)
MEMMAP_DTYPES = {"uint16": 8, "int32": 4}  # dtypes we write: name -> Megatron dtype code
READ_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
_INT32_MAX = 2**31 - 1
_CHECK_CHUNK = 1 << 20  # elements per chunk when scanning index arrays


def _le(name: str) -> np.dtype:
    return np.dtype(name).newbyteorder("<")


def _write_dtype(dtype: str) -> np.dtype:
    if dtype not in MEMMAP_DTYPES:
        raise PretokError(f"unsupported token dtype {dtype!r} (expected one of {', '.join(MEMMAP_DTYPES)})")
    return _le(dtype)


def _identity(path: str) -> tuple[int, int, int, int]:
    """Which file this is and whether it changed: device, inode, size, modification time."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _index_offsets(n_seq: int) -> tuple[int, int]:
    """Byte offsets in the .idx of the pointers (after the int32 lengths) and of the document indices."""
    return _HEADER.size + 4 * n_seq, _HEADER.size + 12 * n_seq


def _map(path: str, dtype: np.dtype | str, offset: int = 0, count: int | None = None) -> np.ndarray:
    """Read-only memmap of `path`; an empty array when there is nothing to map (np.memmap rejects empty files)."""
    dtype = np.dtype(dtype)
    if count is None:
        count = (os.path.getsize(path) - offset) // dtype.itemsize
    if count == 0:
        empty = np.empty(0, dtype)
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def _chunks(arr: np.ndarray, n: int) -> Iterator[np.ndarray]:
    for i in range(0, len(arr), n):
        yield arr[i : i + n]


def _sum_lengths(lengths: np.ndarray, path: str) -> int:
    """Total of `lengths` in int64, scanned chunk-wise; a negative length is corruption."""
    total = 0
    for chunk in _chunks(lengths, _CHECK_CHUNK):
        if chunk.min() < 0:
            raise PretokError("negative sequence length (corrupt lengths)", path)
        total += int(chunk.sum(dtype=np.int64))
    return total


def _check_lengths_and_pointers(lengths: np.ndarray, pointers: np.ndarray, itemsize: int, path: str) -> int:
    """Total of `lengths` (int64), scanned chunk-wise with `pointers`: every length >= 0 and every pointer the
    byte offset where the sequences before it end (what Megatron's builder writes). A permuted, overlapping or
    gapped index is refused here: readers that derive offsets from the lengths (merge, packing) would otherwise
    serve other tokens than readers that follow the pointers."""
    total = 0
    for start in range(0, len(lengths), _CHECK_CHUNK):
        chunk = lengths[start : start + _CHECK_CHUNK]
        if chunk.min() < 0:
            raise PretokError("negative sequence length (corrupt lengths)", path)
        want, end = pointer_chunk(chunk, total * itemsize, itemsize)
        got = pointers[start : start + _CHECK_CHUNK]
        if not np.array_equal(got, want):
            i = start + int(np.argmax(got != want))
            raise PretokError(f"sequence pointers inconsistent with sequence lengths (pointer {i} is {int(pointers[i])}, "
                              f"the lengths before it end at byte {int(want[i - start])}; corrupt index)", path)
        total = end // itemsize
    return total


def pointer_chunk(lengths: np.ndarray, start: int, itemsize: int) -> tuple[np.ndarray, int]:
    """(int64 byte pointers of one chunk of lengths starting at byte `start`, offset after the chunk).

    All arithmetic is int64, so datasets beyond 2**31 tokens or bytes get correct pointers."""
    sizes = np.asarray(lengths, dtype=np.int64) * np.int64(itemsize)
    ends = np.cumsum(sizes, dtype=np.int64) + np.int64(start)
    return ends - sizes, int(ends[-1]) if len(ends) else int(start)


class PartWriter:
    """Writes one numbered part, streaming and append-only: `<prefix>.bin` (flat tokens) + `<prefix>.lens` (raw int32).

    Data goes to `<prefix>.bin.tmp` / `<prefix>.lens.tmp`, renamed at `close()` (.bin first, .lens last), so a
    crash never leaves a final-named half part. As a context manager, an exception aborts (removes the temp files).
    """

    def __init__(self, prefix: str | os.PathLike, dtype: str, fsync: bool = True):
        self.dtype, self.fsync = _write_dtype(dtype), fsync
        self.prefix = os.fspath(prefix)
        self.bin_path, self.lens_path = self.prefix + ".bin", self.prefix + ".lens"
        os.makedirs(os.path.dirname(self.prefix) or ".", exist_ok=True)
        self._bin = open(self.bin_path + ".tmp", "wb")
        self._lens = open(self.lens_path + ".tmp", "wb")
        self._docs = self._tokens = 0
        self._stats: dict | None = None

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: `tokens` flat (any integer dtype, range-checked), `lengths` per document."""
        if self._stats is not None:
            raise ValueError(f"{self.prefix}: part already closed")
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        if tokens.ndim != 1 or lengths.ndim != 1:
            raise ValueError("tokens and lengths must be 1-D arrays")
        for name, arr in (("tokens", tokens), ("lengths", lengths)):
            if arr.size and arr.dtype.kind not in "iu":
                raise ValueError(f"{name} must be an integer array, got {arr.dtype}")
        if lengths.size and (lengths.min() < 0 or lengths.max() > _INT32_MAX):
            bad = lengths.min() if lengths.min() < 0 else lengths.max()
            raise PretokError(f"document length {bad} out of range (0..{_INT32_MAX})", self.bin_path)
        if int(lengths.sum(dtype=np.int64)) != tokens.size:
            raise ValueError(f"lengths sum to {int(lengths.sum(dtype=np.int64))} but {tokens.size} tokens were given")
        if tokens.size:
            lo, hi, top = tokens.min(), tokens.max(), np.iinfo(self.dtype).max
            if lo < 0 or hi > top:
                bad = lo if lo < 0 else hi
                hint = "; write with dtype int32" if self.dtype.itemsize == 2 else ""
                raise PretokError(f"token id {bad} does not fit {self.dtype.name} (0..{top}){hint}", self.bin_path)
        self._append(np.ascontiguousarray(tokens, dtype=self.dtype), np.ascontiguousarray(lengths, dtype=_le("int32")))

    def _append(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Write already-checked, contiguous little-endian tokens (the part's dtype) and int32 lengths."""
        self._bin.write(memoryview(tokens))
        self._lens.write(memoryview(lengths))
        self._docs += lengths.size
        self._tokens += tokens.size

    def close(self) -> dict:
        """Finish the part; returns {"documents", "tokens", "bin_bytes"}. Idempotent."""
        if self._stats is None:
            for f, final in ((self._bin, self.bin_path), (self._lens, self.lens_path)):
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
                f.close()
                os.replace(f.name, final)
            nbytes = self._tokens * self.dtype.itemsize
            self._stats = {"documents": self._docs, "tokens": self._tokens, "bin_bytes": nbytes}
        return dict(self._stats)

    def abort(self) -> None:
        """Drop the unfinished part (temp files removed, nothing final-named is created)."""
        if self._stats is None:
            for f in (self._bin, self._lens):
                try:
                    f.close()
                except OSError:  # flushing the buffer failed (e.g. disk full): the file goes anyway
                    pass
                if os.path.exists(f.name):
                    os.remove(f.name)
            self._stats = {"documents": 0, "tokens": 0, "bin_bytes": 0}

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close() if exc_type is None else self.abort()


class MemmapDataset:
    """Read-only view of a Megatron indexed dataset, validated on open.

    Each failed check is a one-line PretokError naming the file: both files exist; magic; version 1; known dtype
    code (== `expect_dtype`); .idx size exactly as the header counts imply; document_indices run 0..S, never
    decreasing; lengths >= 0; every pointer == the bytes of the sequences before it (sum of their lengths x
    itemsize); .bin size == sum(lengths) * itemsize. One chunked pass over the index arrays; tokens are mapped, not
    read."""

    def __init__(self, prefix: str | os.PathLike, expect_dtype: str | None = None):
        self.prefix = os.fspath(prefix)
        self.bin_path, self.idx_path = self.prefix + ".bin", self.prefix + ".idx"
        for path in (self.idx_path, self.bin_path):
            if not os.path.isfile(path):
                raise PretokError("missing (a Megatron dataset is a <prefix>.bin + <prefix>.idx pair)", path)
        idx, idx_size = self.idx_path, os.path.getsize(self.idx_path)
        with open(idx, "rb") as f:
            head = f.read(_HEADER.size)
        if head[: len(MAGIC)] != MAGIC[: len(head)]:
            raise PretokError("bad magic (not a Megatron indexed dataset)", idx)
        if len(head) < _HEADER.size:
            raise PretokError(f"truncated header ({idx_size} bytes, need {_HEADER.size})", idx)
        _, version, code, n_seq, n_doc_idx = _HEADER.unpack(head)
        if version != VERSION:
            raise PretokError(f"unsupported version {version} (expected {VERSION})", idx)
        if code not in READ_DTYPES:
            raise PretokError(f"unknown dtype code {code} (known: {sorted(READ_DTYPES)})", idx)
        self.dtype = _le(READ_DTYPES[code])
        if expect_dtype is not None and self.dtype != _le(expect_dtype):
            raise PretokError(f"dtype {self.dtype.name}, expected {np.dtype(expect_dtype).name}", idx)
        expected = _index_offsets(n_seq)[1] + 8 * n_doc_idx
        if idx_size != expected:
            hint = "truncated?" if idx_size < expected else "trailing bytes?"
            if idx_size == expected + n_seq > expected:
                hint = "has sequence modes: multimodal datasets are not supported"
            raise PretokError(
                f"size {idx_size} bytes, header expects {expected} ({n_seq} sequences, {n_doc_idx} doc indices; {hint})", idx
            )
        if n_doc_idx < 1:
            raise PretokError("no document indices (expected at least [0])", idx)
        self._layout = (n_seq, n_doc_idx)
        self._map_index()
        self._check_document_indices(n_seq)
        itemsize = self.dtype.itemsize
        self._num_tokens = _check_lengths_and_pointers(self.lengths, self.pointers, itemsize, idx)
        bin_size, want = os.path.getsize(self.bin_path), self._num_tokens * itemsize
        if bin_size != want:
            hint = "truncated?" if bin_size < want else "trailing bytes?"
            raise PretokError(f"size {bin_size} bytes, index expects {want} ({hint})", self.bin_path)
        self.tokens = _map(self.bin_path, self.dtype)
        self._files = (_identity(self.idx_path), _identity(self.bin_path))

    def _map_index(self) -> None:
        n_seq, n_doc_idx = self._layout
        o_ptr, o_doc = _index_offsets(n_seq)
        self.lengths = _map(self.idx_path, "<i4", _HEADER.size, n_seq)
        self.pointers = _map(self.idx_path, "<i8", o_ptr, n_seq)
        self.document_indices = _map(self.idx_path, "<i8", o_doc, n_doc_idx)

    def __getstate__(self) -> dict:
        """Pickled (for a DataLoader worker started by spawn or forkserver: macOS, and Linux from Python 3.14) as
        its paths and checked layout: the files are mapped again there, never copied into the pickle."""
        mapped = ("lengths", "pointers", "document_indices", "tokens")
        return {k: v for k, v in self.__dict__.items() if k not in mapped}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for path, seen in zip((self.idx_path, self.bin_path), self._files):
            if _identity(path) != seen:
                raise PretokError("changed since the dataset was opened (rewritten or replaced)", path)
        self._map_index()
        self.tokens = _map(self.bin_path, self.dtype)

    def _check_document_indices(self, n_seq: int) -> None:
        di = self.document_indices
        if int(di[0]) != 0 or int(di[-1]) != n_seq:
            raise PretokError(f"document indices must run 0..{n_seq}, got {int(di[0])}..{int(di[-1])}", self.idx_path)
        prev = 0
        for chunk in _chunks(di, _CHECK_CHUNK):
            if int(chunk[0]) < prev or (len(chunk) > 1 and bool((np.diff(chunk) < 0).any())):
                raise PretokError("document indices decrease (corrupt index)", self.idx_path)
            prev = int(chunk[-1])

    def __len__(self) -> int:
        """Number of sequences (== documents for datasets pretok writes)."""
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        """Tokens of sequence `i` (a read-only view into the mapped .bin)."""
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `offset : offset + length` of sequence `i` (bounds-checked, unlike Megatron's `get`)."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences")
        i = int(i) % len(self)
        n = int(self.lengths[i])
        length = n - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > n:
            raise IndexError(f"slice [{offset}:{offset + length}] out of range for sequence {i} of length {n}")
        start = int(self.pointers[i]) // self.dtype.itemsize + offset
        return self.tokens[start : start + length]


# the concatenation lives beside (it reads the layout defined above); its names stay importable from here
from pretok_lib.formats.memmap_concat import CORRUPT, concat_datasets, concat_parts, write_index  # noqa: E402
