"""Input readers and unit planning: every input kind yields exactly its documents, whatever the part size."""

from __future__ import annotations

import json
import os
import time
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.errors import PretokError
from pretok_lib.sources import SourceOptions, expand_inputs, plan_units, read_unit, shard_units

from ..conftest import PYDOCS_JSONL, WIKI_FR


def read_all(inputs, **kw) -> list[str]:
    opts = SourceOptions(**kw)
    return [t for u in plan_units(expand_inputs([str(i) for i in inputs]), opts) for b in read_unit(u, opts)
            for t in b.texts]


@pytest.fixture(scope="module")
def fr_docs() -> list[str]:
    return [v["extract"] for v in json.loads(WIKI_FR.read_text()).values()][:2000]


@pytest.mark.parametrize("part_bytes", [1 << 14, 100_000, 1 << 30])
def test_parquet_row_ranges_cover_every_row_once(tmp_path, fr_docs, part_bytes, monkeypatch):
    monkeypatch.setattr("pretok_lib.sources.plan.SPLIT_ROW_GROUP_BYTES", 50_000)  # exercise splitting on small data
    p = tmp_path / "fr.parquet"
    pq.write_table(pa.table({"text": fr_docs, "id": list(range(len(fr_docs)))}), p, row_group_size=700)
    assert read_all([p], part_bytes=part_bytes, batch_bytes=10_000) == fr_docs
    units = plan_units(expand_inputs([str(p)]), SourceOptions(part_bytes=part_bytes))
    assert [u.start for u in units[1:]] == [u.stop for u in units[:-1]] and units[-1].stop == len(fr_docs)
    if part_bytes == 1 << 14:
        assert len(units) > 3 * 3  # big row groups are split, not only joined


@pytest.mark.parametrize("part_bytes", [50_000, 1 << 30])
def test_jsonl_byte_ranges_are_newline_aligned(part_bytes):
    expect = [json.loads(line)["text"] for line in PYDOCS_JSONL.open()]
    assert read_all([PYDOCS_JSONL], part_bytes=part_bytes) == expect


def test_hf_dataset_saved_to_disk(tmp_path, fr_docs):
    import datasets

    ds = datasets.Dataset.from_dict({"text": fr_docs, "n": list(range(len(fr_docs)))})
    ds.save_to_disk(str(tmp_path / "ds"))
    assert read_all([tmp_path / "ds"], part_bytes=100_000) == fr_docs
    ds.filter(lambda r: r["n"] % 2 == 0).save_to_disk(str(tmp_path / "even"))
    assert read_all([tmp_path / "even"], part_bytes=100_000) == fr_docs[::2]
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(PretokError, match="DatasetDict"):
        expand_inputs([str(tmp_path / "dd")])


def test_globs_are_sorted_and_text_files_one_doc_each(tmp_path, fr_docs):
    for i, d in enumerate(fr_docs[:30]):
        (tmp_path / f"doc{i:02d}.txt").write_text(d)
    assert read_all([tmp_path / "doc*.txt"], part_bytes=2000) == fr_docs[:30]
    with pytest.raises(PretokError, match="no input matches"):
        expand_inputs([str(tmp_path / "nothing*.parquet")])
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(PretokError, match="unknown input type"):
        expand_inputs([str(tmp_path / "x.csv")])


def test_shards_partition_units_contiguously(tmp_path, fr_docs):
    p = tmp_path / "fr.parquet"
    pq.write_table(pa.table({"text": fr_docs}), p, row_group_size=100)
    units = plan_units(expand_inputs([str(p)]), SourceOptions(part_bytes=20_000))
    for n in (1, 2, 3, 7, len(units) + 3):
        parts = [shard_units(units, n, i) for i in range(n)]
        assert [u for s in parts for u in s] == units
    with pytest.raises(PretokError):
        shard_units(units, 2, 2)


@pytest.mark.parametrize("typ", ["string", "large_string"])
def test_byte_lengths_from_offsets_match_arrow(typ):
    import pyarrow as pa
    import pyarrow.compute as pc

    from pretok_lib.sources import _byte_lengths

    arr = pa.array(["héllo", "", None, "日本語テキスト", "x" * 1000, "a"], type=getattr(pa, typ)())
    for a in (arr, arr.slice(1, 4), arr.slice(5), arr.slice(0, 0)):
        expected = pc.binary_length(a).fill_null(0).to_numpy(zero_copy_only=False)
        assert _byte_lengths(a).tolist() == expected.tolist()


def test_parquet_text_column_after_nested_columns(tmp_path, fr_docs):
    """Sizes come from the text column's own Parquet leaf, counted past struct, list and map columns before it."""
    from pretok_lib.sources import _parquet_file, _text_column_index, estimate_text_bytes

    n = 300
    table = pa.table({
        "meta": pa.array([{"a": i, "b": {"c": str(i), "d": [i]}} for i in range(n)]),
        "tags": pa.array([[str(i)] * 3 for i in range(n)], pa.list_(pa.string())),
        "attrs": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
        "text": fr_docs[:n],
        "id": list(range(n)),
    })
    p = tmp_path / "nested.parquet"
    pq.write_table(table, p, row_group_size=100)
    meta = pq.ParquetFile(p).metadata
    leaf = [meta.row_group(0).column(i).path_in_schema for i in range(meta.num_columns)].index("text")
    assert leaf == 6  # meta.a, meta.b.c, meta.b.d.list.element, tags, attrs key + value
    assert _text_column_index(_parquet_file(str(p)), str(p), "text") == leaf
    text_size = sum(meta.row_group(r).column(leaf).total_uncompressed_size for r in range(meta.num_row_groups))
    assert estimate_text_bytes(expand_inputs([str(p)]), "text") == text_size
    assert read_all([p], part_bytes=50_000) == fr_docs[:n]


def test_reading_leaves_no_reference_cycles(tmp_path, fr_docs):
    """Objects left in cycles wait for a rare full collection; a pyarrow footer in one kept each worker's memory
    growing with the input. Every reader must free everything as it goes."""
    import gc

    pq.write_table(pa.table({"text": fr_docs}), tmp_path / "a.parquet", row_group_size=50)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in fr_docs[:200]))
    (tmp_path / "c.txt").write_text(fr_docs[0])
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for name in ("a.parquet", "b.jsonl", "c.txt"):
            docs = read_all([tmp_path / name], part_bytes=20_000, batch_bytes=5_000)
            assert docs, name
            gc.collect()
            assert not gc.garbage, (name, sorted({type(o).__name__ for o in gc.garbage}))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("name", ["shard[1].jsonl", "q?.jsonl", "all*.jsonl", "[ab].jsonl", "x[!0].jsonl"])
def test_an_input_named_with_glob_characters_is_that_file(tmp_path, name):
    """A file that exists as named is taken as it is, not as a pattern: `shard[1].jsonl` was refused (no match)
    or, beside a `shard1.jsonl`, silently read that other file instead."""
    import glob as globmod

    (tmp_path / name).write_text('{"text": "literal"}\n')
    decoys = ["shard1.jsonl", "qa.jsonl", "allx.jsonl", "a.jsonl", "xa.jsonl"]
    for decoy in decoys:
        (tmp_path / decoy).write_text('{"text": "decoy"}\n')
    spec = str(tmp_path / name)
    assert set(globmod.glob(spec)) - {spec}, "the name must also match a decoy as a pattern"
    assert [f.path for f in expand_inputs([spec])] == [spec]
    (tmp_path / name).unlink()   # without the literal file it is a pattern again
    assert spec not in [f.path for f in expand_inputs([spec])]


def test_units_of_a_parquet_file_share_one_parsed_footer_and_read_only_their_row_groups(tmp_path):
    """A worker reads many units of one file: each unit parsed the whole footer and walked every row group before
    it (~6 ms a unit at 970 row groups, quadratic in the file's size). The footer is now parsed once per file
    version and the unit's first row group found by bisection; every unit still reads exactly its rows, and a
    rewritten file is parsed again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pretok_lib.sources import read as read_mod

    docs = [f"document {i} " * (1 + i % 7) for i in range(3000)]
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=7)   # 429 row groups, the last one short
    files = expand_inputs([str(path)])
    opts = SourceOptions(part_bytes=2_000)
    units = plan_units(files, opts)
    assert len(units) > 50
    read_mod._local_footer.cache_clear()
    got = [t for u in units for b in read_unit(u, opts) for t in b.texts]
    assert got == docs and read_mod._local_footer.cache_info().misses == 1
    walked = []
    real = read_mod._row_group_arrays
    with mock.patch.object(read_mod, "_row_group_arrays", lambda pf, rg, *a: walked.append(rg) or real(pf, rg, *a)):
        list(read_unit(units[-1], opts))
    last = units[-1]
    assert walked == list(range(last.start // 7, (last.stop - 1) // 7 + 1))  # its row groups, each once
    pq.write_table(pa.table({"text": docs[::-1]}), path, row_group_size=7)
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)  # another version of the file, whatever the clock's grain
    assert [t for u in plan_units(expand_inputs([str(path)]), opts) for b in read_unit(u, opts) for t in b.texts] \
        == docs[::-1] and read_mod._local_footer.cache_info().misses == 2
