"""Joining Megatron indexed datasets and worker parts (`formats/memmap_concat.py`): byte-identical to one dataset,
broken parts refused, memory bounded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pretok_lib.errors import PretokError
from pretok_lib.formats.memmap import MemmapDataset, PartWriter, concat_datasets, concat_parts

from .test_memmap import build, dtype, random_docs, truncate, write_part  # noqa: F401  (dtype: a fixture)


def test_concat_datasets_equals_single_dataset(tmp_path, dtype):
    rng = np.random.default_rng(2)
    parts = [random_docs(rng, n, 1000) for n in (10, 0, 17, 5)]
    whole, _ = build(tmp_path, dtype, parts, name="whole")
    a, _ = build(tmp_path, dtype, parts[:2], name="a")
    b, _ = build(tmp_path, dtype, parts[2:], name="b")
    merged = tmp_path / "merged"
    stats = concat_datasets([a, b], merged, dtype)
    assert stats["documents"] == 32
    for ext in (".bin", ".idx"):
        assert Path(f"{merged}{ext}").read_bytes() == Path(f"{whole}{ext}").read_bytes()
    with pytest.raises(PretokError, match="a.idx: dtype"):
        concat_datasets([a], tmp_path / "x", "int32" if dtype == "uint16" else "uint16")


def test_concat_rejects_broken_part(tmp_path):
    write_part(tmp_path / "p0", [np.arange(5)], "int32")
    truncate(f"{tmp_path / 'p0'}.bin", 4)
    with pytest.raises(PretokError, match=r"p0\.bin: size 16 bytes, lengths expect 20"):
        concat_parts([tmp_path / "p0"], tmp_path / "out", "int32")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_concat_memory_is_bounded(tmp_path):
    """8 MB of tokens and 200k documents are concatenated with < 1 MB of Python/numpy allocations."""
    tracemalloc = pytest.importorskip("tracemalloc")
    rng = np.random.default_rng(4)
    prefixes = [tmp_path / f"p{k}" for k in range(2)]
    for prefix in prefixes:
        lengths = rng.multinomial(1 << 20, np.full(100_000, 1e-5))
        with PartWriter(prefix, "int32") as w:
            w.add(rng.integers(0, 100_000, 1 << 20), lengths)
    tracemalloc.start()
    try:
        stats = concat_parts(prefixes, tmp_path / "out", "int32", chunk_bytes=1 << 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats["tokens"] == 2 << 20 and stats["documents"] == 200_000
    assert peak < 1 << 20, f"concat peaked at {peak} traced bytes"
    ds = MemmapDataset(tmp_path / "out", expect_dtype="int32")
    assert ds.num_tokens == 2 << 20 and int(ds.pointers[-1]) + 4 * int(ds.lengths[-1]) == 8 << 20
