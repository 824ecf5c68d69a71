"""Joining Megatron indexed datasets: worker parts (`concat_parts`) or finished datasets (`concat_datasets`) into
one `.bin` + `.idx`, streamed (memory bounded whatever the size), every input checked against its checksum."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pretok_lib.errors import PretokError
from pretok_lib.formats import checksum
from pretok_lib.formats.memmap import (_HEADER, MAGIC, MEMMAP_DTYPES, VERSION, MemmapDataset, _chunks, _map,
                                       _sum_lengths, _write_dtype, pointer_chunk)


@dataclass
class _Source:
    bin_path: str
    lengths: np.ndarray  # int32, mapped
    document_indices: np.ndarray | None  # None: one sequence per document
    tokens: int
    documents: int
    expect: str | None = None  # the .bin's recorded checksum, checked as its bytes stream through the copy
    leaves: list | None = None  # its recorded leaves, for a tree checksum (`checksum.PARTS`)


CORRUPT = "checksum differs from its manifest.json (corrupted or modified since it was written)"


class _HashingWriter:
    """Context-managed file writer that checksums and counts everything written (fsync on clean exit)."""

    def __init__(self, path: str):
        self.f, self.hash, self.size = open(path, "wb"), checksum.hasher(), 0

    def write(self, data) -> None:
        view = memoryview(data)
        self.f.write(view)
        self.hash.update(view)
        self.size += view.nbytes

    def __enter__(self) -> _HashingWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.f.flush()
            os.fsync(self.f.fileno())
        self.f.close()


def _part_source(prefix: str | os.PathLike, itemsize: int) -> _Source:
    prefix = os.fspath(prefix)
    bin_path, lens_path = prefix + ".bin", prefix + ".lens"
    for path in (lens_path, bin_path):
        if not os.path.isfile(path):
            raise PretokError("missing (part not finished?)", path)
    if os.path.getsize(lens_path) % 4:
        raise PretokError(f"size {os.path.getsize(lens_path)} bytes, not a multiple of 4 (corrupt lengths)", lens_path)
    lengths = _map(lens_path, "<i4")
    tokens = _sum_lengths(lengths, lens_path)
    if os.path.getsize(bin_path) != tokens * itemsize:
        raise PretokError(f"size {os.path.getsize(bin_path)} bytes, lengths expect {tokens * itemsize}", bin_path)
    return _Source(bin_path, lengths, None, tokens, len(lengths))


def _write_bin(out: _HashingWriter, sources: list[_Source], itemsize: int, chunk_bytes: int) -> list | None:
    """Copy the sources' bytes in order, checking each against its recorded checksum as the bytes stream through.
    Returns the leaves of the output's tree checksum when every source has one (their leaves in order), else None
    (the output gets a flat checksum)."""
    biggest = max((s.tokens for s in sources), default=0) * itemsize
    buf = memoryview(bytearray(max(1, min(chunk_bytes, biggest))))  # the only data buffer
    leaves: list | None = []
    for s in sources:
        algorithm = s.expect and checksum.algorithm_of(s.expect)
        tree = algorithm == checksum.PARTS
        if tree and (not isinstance(s.leaves, list) or checksum.tree_value(s.leaves) != s.expect
                     or sum(int(n) for n, _ in s.leaves) != s.tokens * itemsize):
            raise PretokError(CORRUPT, s.bin_path)
        ranges = [int(n) for n, _ in s.leaves] if tree else [s.tokens * itemsize]
        h = checksum.hasher(algorithm) if algorithm and not tree else None
        copied = 0
        with open(s.bin_path, "rb", buffering=0) as f:
            for k, size in enumerate(ranges):
                leaf = checksum.hasher() if tree else None
                while size and (n := f.readinto(buf[: min(len(buf), size)])):
                    out.write(buf[:n])
                    for x in (h, leaf):
                        if x is not None:
                            x.update(buf[:n])
                    copied, size = copied + n, size - n
                if tree and leaf.hexdigest() != s.leaves[k][1]:
                    raise PretokError(CORRUPT, s.bin_path)
            if f.read(1):
                copied += 1
        if copied != s.tokens * itemsize:
            raise PretokError(f"changed while copying ({copied} bytes, expected {s.tokens * itemsize})", s.bin_path)
        if h is not None and checksum.value(h, algorithm) != s.expect:
            raise PretokError(CORRUPT, s.bin_path)
        leaves = leaves + [list(x) for x in s.leaves] if tree and leaves is not None else None
    return leaves


def _write_idx(out: _HashingWriter, sources: list[_Source], dtype: str, step: int) -> None:
    n_seq = sum(len(s.lengths) for s in sources)
    out.write(_HEADER.pack(MAGIC, VERSION, MEMMAP_DTYPES[dtype], n_seq, sum(s.documents for s in sources) + 1))
    for s in sources:
        for chunk in _chunks(s.lengths, step):
            out.write(np.ascontiguousarray(chunk, dtype="<i4"))
    offset, itemsize = 0, _write_dtype(dtype).itemsize
    for s in sources:
        for chunk in _chunks(s.lengths, step):
            pointers, offset = pointer_chunk(chunk, offset, itemsize)
            out.write(pointers.astype("<i8", copy=False))
    out.write(np.zeros(1, "<i8"))
    base = 0
    for s in sources:
        if s.document_indices is None:
            for lo in range(0, len(s.lengths), step):
                out.write(np.arange(base + lo + 1, base + min(lo + step, len(s.lengths)) + 1, dtype="<i8"))
        else:
            for chunk in _chunks(s.document_indices[1:], step):
                out.write((chunk.astype(np.int64) + base).astype("<i8", copy=False))
        base += len(s.lengths)


def _concat(sources: list[_Source], out_prefix: str | os.PathLike, dtype: str, chunk_bytes: int) -> dict:
    """Write `sources` in order as one dataset: .bin, then .idx, via temp names; the .idx is renamed last."""
    itemsize, out_prefix = _write_dtype(dtype).itemsize, os.fspath(out_prefix)
    paths = [out_prefix + ".bin", out_prefix + ".idx"]
    os.makedirs(os.path.dirname(out_prefix) or ".", exist_ok=True)
    try:
        with _HashingWriter(paths[0] + ".tmp") as bin_out:
            leaves = _write_bin(bin_out, sources, itemsize, chunk_bytes)
        with _HashingWriter(paths[1] + ".tmp") as idx_out:
            _write_idx(idx_out, sources, dtype, max(1, chunk_bytes // 8))
    except BaseException:
        for path in paths:
            if os.path.exists(path + ".tmp"):
                os.remove(path + ".tmp")
        raise
    if os.path.exists(paths[1]):  # the .idx is the commit marker: never pair an old .idx with a new .bin
        os.remove(paths[1])
    for path in paths:
        os.replace(path + ".tmp", path)
    files = [{"path": os.path.basename(p), "size": w.size, "checksum": checksum.value(w.hash)}
             for p, w in zip(paths, (bin_out, idx_out))]
    if leaves and sources:  # every source had a tree checksum: so does the output (an unsharded run's, when merged)
        files[0] = {**files[0], "checksum": checksum.tree_value(leaves), "leaves": leaves}
    return {
        "documents": sum(s.documents for s in sources),
        "sequences": sum(len(s.lengths) for s in sources),
        "tokens": sum(s.tokens for s in sources),
        "files": files,
    }


def concat_parts(
    part_prefixes: Sequence[str | os.PathLike], out_prefix: str | os.PathLike, dtype: str, chunk_bytes: int = 64 << 20
) -> dict:
    """Concatenate parts (in order) into one Megatron dataset `<out_prefix>.bin` + `<out_prefix>.idx`.

    Memory-bounded: .bin bytes are copied through one `chunk_bytes` buffer; the .idx is streamed section by
    section (lengths, int64 pointers with a running offset, document indices) from the parts' memory-mapped
    `.lens` files, `chunk_bytes // 8` entries at a time, so no O(#docs) array is ever materialised. Writes to
    `.tmp` names, then renames .bin first and .idx last. Returns {"documents", "sequences", "tokens",
    "files": [{"path", "size", "checksum"}, ...]} with checksums computed while writing.
    """
    itemsize = _write_dtype(dtype).itemsize
    return _concat([_part_source(p, itemsize) for p in part_prefixes], out_prefix, dtype, chunk_bytes)


def concat_datasets(
    prefixes: Sequence[str | os.PathLike], out_prefix: str | os.PathLike, dtype: str, chunk_bytes: int = 64 << 20,
    expect: Sequence[dict[str, str]] | None = None,
) -> dict:
    """Like `concat_parts`, but the inputs are finished (validated) Megatron datasets; their document indices
    are carried over shifted, as Megatron's `IndexedDatasetBuilder.add_index` does.

    `expect`: per dataset its recorded checksums `{"bin": ..., "idx": ...}` (from its manifest; `"bin_leaves"`:
    the leaves of a tree checksum). Each `.idx` is checked before it is used (it is small); each `.bin` as its
    bytes stream through the copy, not re-read (a tree: leaf by leaf). A mismatch is a one-line PretokError naming
    the file, and no output file is left. When every `.bin` has a tree checksum, the output's is their leaves'
    tree."""
    sources = []
    for k, prefix in enumerate(prefixes):
        want = expect[k] if expect is not None else {}
        if want.get("idx") and not checksum.matches(os.fspath(prefix) + ".idx", want["idx"]):
            raise PretokError(CORRUPT, os.fspath(prefix) + ".idx")
        ds = MemmapDataset(prefix, expect_dtype=dtype)
        sources.append(_Source(ds.bin_path, ds.lengths, ds.document_indices, ds.num_tokens, ds.num_documents,
                               want.get("bin"), want.get("bin_leaves")))
    return _concat(sources, out_prefix, dtype, chunk_bytes)


def write_index(lens_path: str | os.PathLike, idx_path: str | os.PathLike, dtype: str,
                chunk_bytes: int = 64 << 20) -> dict:
    """Write the `.idx` for a `.bin` whose per-document int32 lengths are in the raw file `lens_path`.

    Streams from the memory-mapped lengths (no O(#docs) array), writes `<idx_path>.tmp` and renames it.
    Returns {"path", "size", "checksum"} of the index."""
    lens_path, idx_path = os.fspath(lens_path), os.fspath(idx_path)
    lengths = _map(lens_path, "<i4")
    source = _Source("", lengths, None, _sum_lengths(lengths, lens_path), len(lengths))
    try:
        with _HashingWriter(idx_path + ".tmp") as out:
            _write_idx(out, [source], dtype, max(1, chunk_bytes // 8))
    except BaseException:
        if os.path.exists(idx_path + ".tmp"):
            os.remove(idx_path + ".tmp")
        raise
    os.replace(idx_path + ".tmp", idx_path)
    return {"path": os.path.basename(idx_path), "size": out.size, "checksum": checksum.value(out.hash)}
