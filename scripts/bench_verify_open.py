"""Cost of `verify_on_open` on a memmap dataset: the full check (no stamp yet, files in the page cache and evicted
from it) and the open covered by the stamp.

    PYTHONPATH=. python scripts/bench_verify_open.py /tmp/verify-bench --gb 2

Writes synthetic GPT-2-range tokens (random lengths, ~1000 tokens per document) through the real part writer and
concatenation (`formats/memmap.py`), so data.bin/data.idx and their checksums are what `pretok tokenize` makes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np

from pretok_lib.data.verify_open import STAMP, verify_files
from pretok_lib.formats.memmap import PartWriter, concat_parts


def build(out: Path, gb: float, seed: int = 0) -> dict:
    """A uint16 memmap dataset of about `gb` GB in `out`; returns a manifest dict with its files' checksums."""
    rng = np.random.default_rng(seed)
    tokens_left, parts = int(gb * 1e9) // 2, []
    while tokens_left > 0:
        prefix = out / "parts" / f"part-{len(parts):06d}"
        n = min(tokens_left, 128 << 20)
        lengths = rng.integers(1, 2000, n // 1000 + 1).astype(np.int64)
        lengths = lengths[np.cumsum(lengths) <= n]
        lengths = np.append(lengths, n - lengths.sum()) if lengths.sum() < n else lengths
        with PartWriter(prefix, "uint16", fsync=False) as w:
            w.add(rng.integers(0, 50257, n, dtype=np.uint16), lengths)
        parts.append(prefix)
        tokens_left -= n
    (out / ".pretok").mkdir(exist_ok=True)
    result = concat_parts(parts, out / "data", "uint16")
    shutil.rmtree(out / "parts")
    (out / "manifest.json").write_text("{}")  # identity only: verify_files stamps it beside the data files
    return {"files": result["files"]}


def evict(out: Path, manifest: dict) -> None:
    """Drop these files (only) from the page cache: a cold read, without touching anyone else's cache."""
    for f in manifest["files"]:
        fd = os.open(out / f["path"], os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gb", type=float, default=2.0)
    args = ap.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    t = time.perf_counter()
    manifest = build(args.out, args.gb)
    size = sum(f["size"] for f in manifest["files"])
    print(f"built {size / 1e9:.2f} GB in {time.perf_counter() - t:.1f} s")
    for label, cold in (("full check, files in page cache", False), ("full check, files evicted (disk)", True)):
        (args.out / ".pretok" / STAMP).unlink(missing_ok=True)
        if cold:
            evict(args.out, manifest)
        t = time.perf_counter()
        assert verify_files(args.out, manifest) is True
        dt = time.perf_counter() - t
        print(f"{label}: {dt:.2f} s, {size / 1e9 / dt:.1f} GB/s")
    t = time.perf_counter()
    assert verify_files(args.out, manifest) is False
    print(f"open covered by the stamp: {(time.perf_counter() - t) * 1e3:.2f} ms")
    shutil.rmtree(args.out)


if __name__ == "__main__":
    main()
