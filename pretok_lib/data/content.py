"""What a pretokenized output holds, whatever its format, dtype or layout: the token ids of each document.

`content_fingerprint` hashes the documents' lengths and their ids (as little-endian uint16 when the tokenizer's
vocabulary fits, else uint32, whatever the stored dtype, so uint16 and int32 outputs of the same ids agree; memmap,
token-list and padded rows alike, padded rows without their padding). It reads every token (a uint16 memmap is
hashed in place with XXH3: 0.03 s for 200 MB from the page cache, so reading the file dominates), so
`open_mixture` computes it only for datasets whose manifests already agree on the cheap facts (`content_key`:
tokenizer, documents, tokens) — two different datasets almost never do, and the same data twice always does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow.parquet as pq

from ..formats import checksum
from ..formats.memmap import MemmapDataset

CHUNK = 1 << 24  # tokens hashed at a time (64 MB as uint32)


def content_key(m: dict) -> tuple:
    """Facts of a manifest equal for any two outputs of the same token ids (candidates for `content_fingerprint`)."""
    return m["tokenizer"]["fingerprint"], m["counts"]["documents"], m["counts"]["tokens"]


def _memmap(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    ds = MemmapDataset(path / "data")
    yield np.asarray(ds.lengths), np.empty(0, dtype=np.uint32)
    for start in range(0, len(ds.tokens), CHUNK):
        yield np.empty(0, dtype=np.int64), ds.tokens[start:start + CHUNK]


def _parquet(path: Path, m: dict) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for f in m["files"]:
        for batch in pq.ParquetFile(path / f["path"]).iter_batches(batch_size=4096):
            ids = batch.column("input_ids")
            if m["format"] == "padded":
                width = ids.type.list_size
                rows = ids.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
                mask = batch.column("attention_mask").flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
                keep = mask.astype(bool)
                yield keep.sum(axis=1), rows[keep]
            else:
                yield np.diff(ids.offsets.to_numpy()), ids.flatten().to_numpy(zero_copy_only=False)


def content_fingerprint(path: str | os.PathLike, m: dict) -> str:
    """A hash of output `path`'s documents (lengths, then ids), independent of format, dtype and file layout."""
    lengths, tokens = checksum.hasher(), checksum.hasher()
    width = "<u2" if m["tokenizer"]["vocab_size"] <= 1 << 16 else "<u4"    # the same for all of one tokenizer
    chunks = _memmap(Path(path)) if m["format"] == "memmap" else _parquet(Path(path), m)
    for lens, ids in chunks:
        lengths.update(memoryview(np.ascontiguousarray(lens, dtype="<i8")))
        tokens.update(memoryview(np.ascontiguousarray(ids, dtype=width)))
    return f"{checksum.value(lengths)}/{checksum.value(tokens)}"
