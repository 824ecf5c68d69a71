"""`parquet_pages.leaf_values`: the leaf values of a list column read straight from its pages equal pyarrow's for
the layouts it takes (PLAIN int32, no nulls, data pages v1 and v2, zstd / snappy / uncompressed, many pages per
row group), and it declines (None: the caller reads with pyarrow) dictionary pages, nulls, other codecs and other
physical types, and levels without a value (nulls, empty lists)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.data.parquet_pages import leaf_values

L = 33


def write(path, column: pa.Array, **kw) -> pq.FileMetaData:
    pq.write_table(pa.table({"ids": column, "other": pa.array(np.arange(len(column)))}), path,
                   row_group_size=70, data_page_size=512, write_statistics=False, **kw)
    return pq.read_metadata(path)


def expected(path, g: int) -> np.ndarray:
    return pq.ParquetFile(path).read_row_group(g, columns=["ids"]).column(0).combine_chunks().flatten().to_numpy()


def fixed(rows: int, dtype=pa.uint16(), seed: int = 0) -> pa.Array:
    vals = np.random.default_rng(seed).integers(0, 50000, rows * L) * (np.arange(rows * L) % L < 9)
    return pa.FixedSizeListArray.from_arrays(pa.array(vals.astype(dtype.to_pandas_dtype()), dtype), L)


@pytest.mark.parametrize("compression", ["zstd", "snappy", "none"])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_values_equal_pyarrow(tmp_path, compression, version):
    path = tmp_path / "a.parquet"
    meta = write(path, fixed(200), compression=compression, data_page_version=version, use_dictionary=False)
    assert meta.num_row_groups > 1 and meta.row_group(0).column(0).total_uncompressed_size > 4 * 512
    spare = np.zeros(70 * L, np.uint16)
    for g in range(meta.num_row_groups):
        got = leaf_values(path, meta, g, 0, np.dtype(np.uint16))
        assert got is not None and got.dtype == np.uint16 and np.array_equal(got, expected(path, g)), g
        again = leaf_values(path, meta, g, 0, np.dtype(np.uint16), spare)
        assert np.array_equal(again, got) and again.base is spare  # written into the spare buffer
    lists = pa.ListArray.from_arrays(pa.array([0, 3, 4, 10]), pa.array(np.arange(10), pa.int32()))
    write(path, lists, compression=compression, data_page_version=version, use_dictionary=False)
    meta = pq.read_metadata(path)
    assert np.array_equal(leaf_values(path, meta, 0, 0, np.dtype(np.int32)), np.arange(10))  # token lists too


def test_declines_other_layouts(tmp_path):
    path = tmp_path / "a.parquet"
    cases = {"dictionary": (fixed(100), dict(use_dictionary=True, compression="zstd")),
             "gzip": (fixed(100), dict(use_dictionary=False, compression="gzip")),
             "int64": (fixed(100, pa.int64()), dict(use_dictionary=False, compression="zstd"))}
    for name, (col, kw) in cases.items():
        meta = write(path, col, **kw)
        assert leaf_values(path, meta, 0, 0, np.dtype(np.uint16)) is None, name
    nulls = pa.ListArray.from_arrays(pa.array([0, 2, 4]), pa.array([1, None, 3, 4], pa.uint16()))
    empty = pa.ListArray.from_arrays(pa.array([0, 2, 2, 4]), pa.array([1, 2, 3, 4], pa.uint16()))
    for name, col in {"null value": nulls, "empty list": empty}.items():  # levels without a value
        meta = write(path, col, use_dictionary=False, compression="zstd")
        assert leaf_values(path, meta, 0, 0, np.dtype(np.uint16)) is None, name
