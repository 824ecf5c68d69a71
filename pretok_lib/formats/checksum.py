"""Checksums of data files: `"xxh3_128:<32 hex digits>"` (XXH3, 128-bit; `xxh128sum` prints the same digits).

XXH3 runs at >10 GB/s on one core, sha256 at ~2 GB/s: the main process hashes every output byte as it appends
parts, so with tens of workers sha256 would become the engine's ceiling. The checksum guards against corruption
(truncated copies, flipped bits, edited files), not against tampering. Values written as `"sha256:<hex>"` are
still verified. The tokenizer fingerprint and the manifest's self-checksum stay sha256 (identity, small inputs).
"""

from __future__ import annotations

import hashlib
import mmap
import os

import xxhash

ALGORITHM = "xxh3_128"
_NEW = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}


def hasher(algorithm: str = ALGORITHM):
    """A running hash (`update(buffer)`, then `value(h)`), by default of the default algorithm."""
    return _NEW[algorithm]()


def value(h, algorithm: str = ALGORITHM) -> str:
    """The `"algorithm:hexdigest"` string recorded in manifests, for a `hasher(algorithm)`."""
    return f"{algorithm}:{h.hexdigest()}"


def algorithm_of(expected: str) -> str:
    """The algorithm a recorded `"algorithm:hex"` value names (ValueError if unknown)."""
    algorithm = expected.split(":", 1)[0]
    if algorithm not in _NEW:
        raise ValueError(f"unknown checksum algorithm {algorithm!r} in {expected!r}")
    return algorithm


def of_file(path: str | os.PathLike, algorithm: str = ALGORITHM, chunk: int = 64 << 20) -> str:
    """Checksum of a whole file, hashed straight from read-only mappings (no copy through Python), one `chunk` at
    a time: at most one chunk of the file is mapped (and so resident in this process) at once."""
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


def matches(path: str | os.PathLike, expected: str) -> bool:
    """Whether the file's checksum (by the algorithm `expected` names) equals `expected`."""
    return of_file(path, algorithm_of(expected)) == expected
