"""Megatron indexed-dataset format: round trip, interop with megatron-core both ways, validation, hashes
(joining datasets and parts: test_memmap_concat.py)."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import numpy as np
import xxhash
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pretok_lib.errors import PretokError
from pretok_lib.formats.memmap import (
    MEMMAP_DTYPES,
    MemmapDataset,
    PartWriter,
    concat_datasets,
    concat_parts,
    pointer_chunk,
)

HEADER = 34  # magic(9) + version(8) + dtype code(1) + sequence count(8) + document-index count(8)


def megatron():
    """megatron-core's own indexed_dataset module (imports torch; warns about missing Apex/TE)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def random_docs(rng: np.random.Generator, n: int, vocab: int) -> list[np.ndarray]:
    lengths = rng.integers(0, 50, size=n)
    lengths[rng.random(n) < 0.15] = 0  # length-0 documents are legal in Megatron
    return [rng.integers(0, vocab, size=int(k)) for k in lengths]


def write_part(prefix: Path, docs: list[np.ndarray], dtype: str, batch: int = 7) -> dict:
    """Write `docs` as one part, in several add() calls (the last ones may be empty)."""
    with PartWriter(prefix, dtype) as w:
        for i in range(0, len(docs) + batch, batch):
            chunk = docs[i : i + batch]
            tokens = np.concatenate(chunk) if chunk else np.zeros(0, np.int64)
            w.add(tokens, np.array([len(d) for d in chunk], dtype=np.int64))
    return w.close()


def build(tmp_path: Path, dtype: str, parts: list[list[np.ndarray]], name: str = "data") -> tuple[Path, dict]:
    prefixes = []
    for k, docs in enumerate(parts):
        prefixes.append(tmp_path / "parts" / f"{name}-{k:05d}")
        stats = write_part(prefixes[-1], docs, dtype)
        assert stats == {
            "documents": len(docs),
            "tokens": sum(map(len, docs)),
            "bin_bytes": sum(map(len, docs)) * np.dtype(dtype).itemsize,
        }
    out = tmp_path / name
    return out, concat_parts(prefixes, out, dtype, chunk_bytes=64)  # tiny chunks: exercise the chunk loops


@pytest.fixture(params=["uint16", "int32"])
def dtype(request) -> str:
    return request.param


@pytest.fixture
def dataset(tmp_path: Path, dtype: str) -> tuple[Path, list[np.ndarray], dict]:
    rng = np.random.default_rng(0)
    vocab = 65_536 if dtype == "uint16" else 200_000
    parts = [random_docs(rng, 40, vocab), [], random_docs(rng, 25, vocab)]  # middle part has zero docs
    parts[2][3] = np.array([vocab - 1, 0, vocab - 1])  # extremes of the id range
    out, stats = build(tmp_path, dtype, parts)
    return out, [d for p in parts for d in p], stats


def test_round_trip(dataset, dtype):
    prefix, docs, stats = dataset
    assert stats["documents"] == len(docs) == 65 and stats["tokens"] == sum(map(len, docs))
    assert not list(prefix.parent.rglob("*.tmp"))
    ds = MemmapDataset(prefix, expect_dtype=dtype)
    assert ds.dtype == np.dtype(dtype) and len(ds) == ds.num_documents == len(docs)
    assert ds.num_tokens == stats["tokens"]
    assert any(len(d) == 0 for d in docs)
    for i, doc in enumerate(docs):
        assert ds[i].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(ds[i], doc)
        if len(doc) >= 3:
            np.testing.assert_array_equal(ds.get(i, 1, 2), doc[1:3])
            np.testing.assert_array_equal(ds.get(i, 2), doc[2:])
    np.testing.assert_array_equal(ds[-1], docs[-1])
    np.testing.assert_array_equal(ds.document_indices, np.arange(len(docs) + 1))
    np.testing.assert_array_equal(ds.tokens, np.concatenate(docs))
    with pytest.raises(IndexError):
        ds[len(docs)]
    with pytest.raises(IndexError):
        ds.get(0, 0, len(docs[0]) + 1)


def test_on_disk_layout(dataset, dtype):
    prefix, docs, _ = dataset
    raw = Path(f"{prefix}.idx").read_bytes()
    n = len(docs)
    assert struct.unpack("<9sQBQQ", raw[:HEADER]) == (b"MMIDIDX\x00\x00", 1, MEMMAP_DTYPES[dtype], n, n + 1)
    assert MEMMAP_DTYPES == {"uint16": 8, "int32": 4}
    lengths = np.frombuffer(raw, "<i4", n, HEADER)
    pointers = np.frombuffer(raw, "<i8", n, HEADER + 4 * n)
    np.testing.assert_array_equal(lengths, [len(d) for d in docs])
    np.testing.assert_array_equal(pointers, np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize)
    assert len(raw) == HEADER + 12 * n + 8 * (n + 1)


def test_megatron_reads_our_dataset(dataset, dtype):
    prefix, docs, _ = dataset
    m = megatron()
    for mmap in (True, False):
        ds = m.IndexedDataset(str(prefix), multimodal=False, mmap=mmap)
        assert ds.index.dtype == np.dtype(dtype).type and len(ds) == len(docs)
        np.testing.assert_array_equal(ds.sequence_lengths, [len(d) for d in docs])
        np.testing.assert_array_equal(ds.document_indices, np.arange(len(docs) + 1))
        for i, doc in enumerate(docs):
            np.testing.assert_array_equal(ds[i], doc)
            assert ds[i].dtype == np.dtype(dtype)
            if len(doc) >= 3:
                np.testing.assert_array_equal(ds.get(i, offset=1, length=2), doc[1:3])
        np.testing.assert_array_equal(np.concatenate(ds[0 : len(docs)]), np.concatenate(docs))


def test_we_read_megatron_builder_output(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    m = megatron()
    rng = np.random.default_rng(1)
    docs = random_docs(rng, 30, 60_000)
    prefix = str(tmp_path / "mega")
    builder = m.IndexedDatasetBuilder(prefix + ".bin", dtype=np.dtype(dtype).type)
    for doc in docs:
        builder.add_item(torch.from_numpy(doc))
        builder.end_document()
    builder.add_document(torch.from_numpy(np.arange(6)), [2, 4])  # one document of two sequences
    builder.finalize(prefix + ".idx")
    ds = MemmapDataset(prefix, expect_dtype=dtype)
    assert len(ds) == len(docs) + 2 and ds.num_documents == len(docs) + 1
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(ds[i], doc)
    np.testing.assert_array_equal(ds[len(docs) + 1], [2, 3, 4, 5])
    np.testing.assert_array_equal(ds.document_indices[-3:], [len(docs) - 1, len(docs), len(docs) + 2])
    # and concat_datasets keeps Megatron's multi-sequence documents intact
    concat_datasets([prefix, prefix], tmp_path / "twice", dtype)
    twice = m.IndexedDataset(str(tmp_path / "twice"))
    n = len(docs) + 2
    expected = np.concatenate([ds.document_indices, ds.document_indices[1:] + n])
    np.testing.assert_array_equal(twice.document_indices, expected)
    np.testing.assert_array_equal(twice[n + len(docs)], [0, 1])
    np.testing.assert_array_equal(twice[2 * n - 1], [2, 3, 4, 5])


def test_empty_dataset(tmp_path, dtype):
    out, stats = build(tmp_path, dtype, [[], []])
    assert stats["documents"] == stats["tokens"] == 0
    assert Path(f"{out}.bin").stat().st_size == 0 and Path(f"{out}.idx").stat().st_size == HEADER + 8
    ds = MemmapDataset(out, expect_dtype=dtype)
    assert len(ds) == ds.num_tokens == ds.num_documents == 0 and ds.tokens.shape == (0,)
    # Megatron reads it with mmap=False; its mmap=True reader cannot map the empty .bin (np.memmap limitation)
    mds = megatron().IndexedDataset(str(out), mmap=False)
    assert len(mds) == 0 and list(mds.document_indices) == [0]


def test_pointer_chunk_is_64_bit():
    big = np.full(5, 2**31 - 1, dtype=np.int32)
    ptrs, end = pointer_chunk(big, 0, 4)
    assert ptrs.dtype == np.int64 and ptrs.tolist() == [k * (2**31 - 1) * 4 for k in range(5)]
    assert end == 5 * (2**31 - 1) * 4
    ptrs2, end2 = pointer_chunk(big[:2], end, 2)  # running offset continues past 2**35
    assert ptrs2.tolist() == [end, end + (2**31 - 1) * 2] and end2 == end + 2 * (2**31 - 1) * 2
    empty, same = pointer_chunk(np.zeros(0, np.int32), 123, 2)
    assert empty.size == 0 and same == 123


def test_checksums_match_files(dataset):
    prefix, _, stats = dataset
    names = [f["path"] for f in stats["files"]]
    assert names == [prefix.name + ".bin", prefix.name + ".idx"]
    for f in stats["files"]:
        data = (prefix.parent / f["path"]).read_bytes()
        assert f["size"] == len(data) and f["checksum"] == "xxh3_128:" + xxhash.xxh3_128(data).hexdigest()


def test_uint16_overflow_rejected_at_write(tmp_path):
    w = PartWriter(tmp_path / "p", "uint16")
    with pytest.raises(PretokError, match=r"p\.bin: token id 65536 does not fit uint16"):
        w.add(np.array([1, 65536, 2]), np.array([3]))
    with pytest.raises(PretokError, match="token id -1"):
        w.add(np.array([-1]), np.array([1]))
    with pytest.raises(ValueError):
        w.add(np.array([1, 2]), np.array([3]))
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_crash_leaves_no_final_part(tmp_path):
    with pytest.raises(RuntimeError):
        with PartWriter(tmp_path / "p", "int32") as w:
            w.add(np.arange(4), np.array([4]))
            raise RuntimeError("worker died")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- validation on open


@pytest.fixture
def good(tmp_path) -> Path:
    docs = random_docs(np.random.default_rng(3), 20, 500)
    docs[5] = np.arange(10)
    return build(tmp_path, "uint16", [docs])[0]


def patch(path: str, offset: int, data: bytes) -> None:
    raw = bytearray(Path(path).read_bytes())
    raw[offset : offset + len(data)] = data
    Path(path).write_bytes(bytes(raw))


def truncate(path: str, nbytes: int) -> None:
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw[:-nbytes])


def expect_error(prefix: Path, pattern: str, **kw) -> PretokError:
    with pytest.raises(PretokError, match=pattern) as info:
        MemmapDataset(prefix, **kw)
    assert "\n" not in str(info.value)
    return info.value


def test_good_dataset_opens(good):
    assert len(MemmapDataset(good)) == 20


def test_missing_idx(good):
    Path(f"{good}.idx").unlink()
    err = expect_error(good, r"data\.idx: missing")
    assert err.path == f"{good}.idx"


def test_missing_bin(good):
    Path(f"{good}.bin").unlink()
    expect_error(good, r"data\.bin: missing")


def test_bad_magic(good):
    patch(f"{good}.idx", 0, b"XXXX")
    expect_error(good, r"data\.idx: bad magic \(not a Megatron indexed dataset\)")


def test_unsupported_version(good):
    patch(f"{good}.idx", 9, struct.pack("<Q", 2))
    expect_error(good, r"data\.idx: unsupported version 2")


def test_unknown_dtype_code(good):
    patch(f"{good}.idx", 17, struct.pack("<B", 9))
    expect_error(good, r"data\.idx: unknown dtype code 9")


def test_expect_dtype_mismatch(good):
    expect_error(good, r"data\.idx: dtype uint16, expected int32", expect_dtype="int32")


def test_other_megatron_dtype_codes_read(good):
    patch(f"{good}.idx", 17, struct.pack("<B", 3))  # int16: same itemsize, readable
    assert MemmapDataset(good).dtype == np.int16


def test_bin_truncated(good):
    truncate(f"{good}.bin", 1)
    expect_error(good, r"data\.bin: size \d+ bytes, index expects \d+ \(truncated\?\)")


def test_idx_truncated(good):
    truncate(f"{good}.idx", 8)
    expect_error(good, r"data\.idx: size \d+ bytes, header expects \d+ .*truncated\?")
    Path(f"{good}.idx").write_bytes(Path(f"{good}.idx").read_bytes()[:20])
    expect_error(good, r"data\.idx: truncated header")


def test_trailing_bytes(good):
    Path(f"{good}.idx").write_bytes(Path(f"{good}.idx").read_bytes() + bytes(20))  # 20 sequences: looks multimodal
    expect_error(good, r"data\.idx: size \d+ bytes, header expects \d+ .*multimodal datasets are not supported")
    Path(f"{good}.idx").write_bytes(Path(f"{good}.idx").read_bytes() + bytes(1))
    expect_error(good, r"data\.idx: .*trailing bytes\?")


def test_bin_trailing_bytes(good):
    Path(f"{good}.bin").write_bytes(Path(f"{good}.bin").read_bytes() + bytes(2))
    expect_error(good, r"data\.bin: size \d+ bytes, index expects \d+ \(trailing bytes\?\)")


def test_edited_length_detected(good):
    patch(f"{good}.idx", HEADER + 4 * 5, struct.pack("<i", 11))  # doc 5 really has 10 tokens
    expect_error(good, r"data\.idx: sequence pointers inconsistent with sequence lengths")


def test_edited_last_length_detected(good):
    patch(f"{good}.idx", HEADER + 4 * 19, struct.pack("<i", 1000))
    expect_error(good, r"data\.bin: size \d+ bytes, index expects \d+")


def test_decreasing_document_indices(good):
    patch(f"{good}.idx", HEADER + 12 * 20 + 8 * 4, struct.pack("<q", 1))
    expect_error(good, r"data\.idx: document indices decrease")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_pointers_that_do_not_follow_the_lengths_are_refused(tmp_path_factory, data):
    """Any index whose pointers are not the running byte sum of the lengths — middle documents stored in another
    order (the first pointer and the last end still agree), a pointer shifted, duplicated or made negative — is
    refused at open: `pretok merge` and the packed loader derive offsets from the lengths, Megatron and verify's
    sample follow the pointers, so they would serve different tokens."""
    dtype = data.draw(st.sampled_from(["uint16", "int32"]))
    n = data.draw(st.integers(4, 12))
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    docs = [np.arange(k) + 10 * i for i, k in enumerate(lengths)]
    prefix, _ = build(tmp_path_factory.mktemp("ptr"), dtype, [docs])
    item = np.dtype(dtype).itemsize
    good = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * item
    ptr = good.copy()
    how = data.draw(st.sampled_from(["permute", "shift", "duplicate", "negative"]))
    i = data.draw(st.integers(1, n - 2))
    if how == "permute":  # the middle documents in another order in .bin, pointers following them
        order = [0, *data.draw(st.permutations(range(1, n - 1))), n - 1]
        if order == list(range(n)):
            order[1], order[2] = order[2], order[1]
        at = 0
        for j in order:
            ptr[j], at = at, at + lengths[j] * item
        Path(f"{prefix}.bin").write_bytes(b"".join(docs[j].astype(dtype).tobytes() for j in order))
    elif how == "shift":
        ptr[i] += item * data.draw(st.sampled_from([-1, 1]))
    elif how == "duplicate":
        ptr[i] = ptr[i - 1]
    else:
        ptr[i] = -item
    assume(not np.array_equal(ptr, good))
    patch(f"{prefix}.idx", HEADER + 4 * n, ptr.astype("<i8").tobytes())
    expect_error(prefix, r"data\.idx: sequence pointers inconsistent with sequence lengths \(pointer \d+ is ")
