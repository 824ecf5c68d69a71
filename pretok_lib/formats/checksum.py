"""Checksums of data files and inputs: `"<algorithm>:<32 hex digits>"`.

- `xxh3_128`: XXH3-128 of the whole file (`xxh128sum` prints the same digits): parquet parts, `.idx` files.
- `xxh3_128-parts` (a memmap `data.bin`): a hash tree whose leaves are the file's byte ranges written by each
  part, listed with the file's record as `leaves: [[bytes, xxh3_128 hex], ...]`; the root is XXH3-128 of the
  leaves' (8-byte little-endian size, 16-byte digest) in order. Workers hash the parts they write, so no process
  hashes the whole file, and a check can say which part is damaged.
- `xxh3_128-blocks` (an input): the same tree over fixed 64 MiB blocks of the input (an HF dataset directory:
  of each of its files in sorted order, an empty file one empty block), so the blocks can be hashed by many
  workers at once; the leaves follow from the sizes and are not recorded.
- `sha256`: written by earlier versions, still verified.

XXH3 runs at >10 GB/s on one core, sha256 at ~2 GB/s. The checksum guards against corruption (truncated copies,
flipped bits, edited files), not against tampering. The tokenizer fingerprint and the manifest's self-checksum
stay sha256 (identity, small inputs).
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
from pathlib import Path
from typing import Sequence

import xxhash

ALGORITHM = "xxh3_128"
PARTS = "xxh3_128-parts"  # a tree over the byte ranges its parts wrote (the leaves are recorded)
BLOCKS = "xxh3_128-blocks"  # a tree over fixed BLOCK_BYTES blocks (inputs)
BLOCK_BYTES = 64 << 20
_NEW = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
_TREES = (PARTS, BLOCKS)

Leaf = tuple[int, str]  # (bytes, XXH3-128 hex digest) of one range


def leaf_of(data) -> str:
    """The leaf digest of a buffer (hex)."""
    return xxhash.xxh3_128_hexdigest(data)


def tree_value(leaves: Sequence[Leaf], algorithm: str = PARTS) -> str:
    """The root of a hash tree: XXH3-128 over each leaf's 8-byte little-endian size and 16-byte digest, in order."""
    h = xxhash.xxh3_128()
    for size, digest in leaves:
        h.update(int(size).to_bytes(8, "little") + bytes.fromhex(digest))
    return f"{algorithm}:{h.hexdigest()}"


def file_leaves(path: str | os.PathLike, sizes: Sequence[int], chunk: int = 64 << 20) -> list[Leaf] | None:
    """The leaves of `path` cut into consecutive ranges of `sizes` (None when the file's size is not their sum)."""
    out = []
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size != sum(sizes):
            return None
        for size in sizes:
            h, left = xxhash.xxh3_128(), size
            while left and (block := fh.read(min(chunk, left))):
                h.update(block)
                left -= len(block)
            if left:
                return None
            out.append((size, h.hexdigest()))
    return out


def block_ranges(path: str | os.PathLike) -> list[tuple[str, int, int]]:
    """The (file, offset, size) blocks of an input's `xxh3_128-blocks` tree (a directory: its files, sorted)."""
    files = sorted(str(q) for q in Path(path).rglob("*") if q.is_file()) if os.path.isdir(path) else [os.fspath(path)]
    out = []
    for f in files:
        size = os.path.getsize(f)
        out += [(f, off, min(BLOCK_BYTES, size - off)) for off in range(0, size, BLOCK_BYTES)] or [(f, 0, 0)]
    return out


def range_leaf(path: str, offset: int, size: int) -> Leaf:
    """The leaf of `size` bytes of `path` from `offset` (OSError if the file ends before)."""
    h, left = xxhash.xxh3_128(), size
    with open(path, "rb") as fh:
        fh.seek(offset)
        while left and (block := fh.read(min(8 << 20, left))):
            h.update(block)
            left -= len(block)
    if left:
        raise OSError(errno.EIO, f"ends {left} bytes before the end of a block it had when planned", path)
    return size, h.hexdigest()


def hasher(algorithm: str = ALGORITHM):
    """A running hash (`update(buffer)`, then `value(h)`), by default of the default algorithm."""
    return _NEW[algorithm]()


def value(h, algorithm: str = ALGORITHM) -> str:
    """The `"algorithm:hexdigest"` string recorded in manifests, for a `hasher(algorithm)`."""
    return f"{algorithm}:{h.hexdigest()}"


def algorithm_of(expected: str) -> str:
    """The algorithm a recorded `"algorithm:hex"` value names (ValueError if unknown)."""
    algorithm = expected.split(":", 1)[0]
    if algorithm not in _NEW and algorithm not in _TREES:
        raise ValueError(f"unknown checksum algorithm {algorithm!r} in {expected!r}")
    return algorithm


def of_file(path: str | os.PathLike, algorithm: str = ALGORITHM, chunk: int = 64 << 20) -> str:
    """Checksum of a whole file (or an input directory, for `xxh3_128-blocks`), hashed straight from read-only
    mappings (no copy through Python), one `chunk` at a time: at most one chunk of the file is mapped (and so
    resident in this process) at once. Not for `xxh3_128-parts`, whose leaves come with the record (`matches`)."""
    if algorithm == BLOCKS:
        return tree_value([range_leaf(*b) for b in block_ranges(path)], BLOCKS)
    if algorithm not in _NEW:
        raise ValueError(f"a {algorithm} checksum needs its recorded leaves")
    h = _NEW[algorithm]()
    chunk = max(mmap.ALLOCATIONGRANULARITY, chunk // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        for off in range(0, size, chunk):
            n = min(chunk, size - off)
            with mmap.mmap(fh.fileno(), n, access=mmap.ACCESS_READ, offset=off) as mm, memoryview(mm) as view:
                h.update(view)
    return f"{algorithm}:{h.hexdigest()}"


def recorded(entry: dict) -> str | None:
    """The checksum a manifest entry records (`checksum`; `sha256` in outputs of earlier versions)."""
    return entry.get("checksum") or entry.get("sha256")


def matches(path: str | os.PathLike, expected: str, leaves: Sequence[Leaf] | None = None) -> bool:
    """Whether the file's checksum (by the algorithm `expected` names) equals `expected`; a `xxh3_128-parts` value
    is checked with its recorded `leaves` (`damaged_leaf`)."""
    if algorithm_of(expected) == PARTS:
        return damaged_leaf(path, expected, leaves) is None
    return of_file(path, algorithm_of(expected)) == expected


def entry_matches(path: str | os.PathLike, entry: dict) -> bool:
    """Whether the file matches the checksum of its manifest `files` entry (its leaves included)."""
    return matches(path, recorded(entry), entry.get("leaves"))


def damaged_leaf(path: str | os.PathLike, expected: str, leaves: Sequence[Leaf] | None) -> int | None:
    """For a `xxh3_128-parts` checksum: None when the file is intact, else the index of the first leaf whose bytes
    differ (-1: the leaves themselves do not give `expected`, or the file's size is not theirs)."""
    if not isinstance(leaves, (list, tuple)) or tree_value([tuple(x) for x in leaves], PARTS) != expected:
        return -1
    got = file_leaves(path, [int(size) for size, _ in leaves])
    if got is None:
        return -1
    return next((k for k, (a, b) in enumerate(zip(got, leaves)) if a[1] != b[1]), None)
