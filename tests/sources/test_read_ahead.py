"""A unit's first row group read ahead (sources/read_ahead.py, `start_reading_ahead`): taken by that unit's read,
the same documents as a read without it, never served for another file version, another row group or another
column, and nothing kept once taken."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.sources import SourceOptions, expand_inputs, plan_units, read_ahead, read_unit
from pretok_lib.sources.read import start_reading_ahead


def _texts(unit, opts) -> list[str]:
    return [t for b in read_unit(unit, opts) for t in b.texts]


@settings(max_examples=25, deadline=None)
@given(groups=st.lists(st.integers(1, 12), min_size=1, max_size=6), part=st.integers(1, 400),
       batch=st.integers(20, 5000), ahead=st.lists(st.booleans(), min_size=1, max_size=20))
def test_units_read_with_or_without_read_ahead_give_the_same_documents(tmp_path_factory, groups, part, batch, ahead):
    """Any row groups, unit cuts and batch sizes; each unit read ahead or not (as a worker holding its next task,
    or not): the documents of every unit are those of a read without any read-ahead."""
    d = tmp_path_factory.mktemp("ra")
    docs = [f"doc {i} " + "x" * (i * 7 % 53) for i in range(sum(groups))]
    path = d / "c.parquet"
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as w:
        start = 0
        for n in groups:
            w.write_table(pa.table({"text": docs[start:start + n]}))
            start += n
    opts = SourceOptions(part_bytes=part, batch_bytes=batch)
    units = plan_units(expand_inputs([str(path)]), opts)
    plain = [_texts(u, opts) for u in units]
    got = []
    for i, u in enumerate(units):
        if i + 1 < len(units) and ahead[i % len(ahead)]:
            start_reading_ahead(units[i + 1], opts)     # while this unit is read, the next one's first group decodes
        got.append(_texts(u, opts))
    assert got == plain and sum(plain, []) == docs
    assert len(read_ahead.pending()) <= read_ahead.SLOTS


def test_a_read_ahead_is_taken_once_and_never_for_a_changed_file(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["one", "two", "three"]}), path, row_group_size=2)
    opts = SourceOptions()
    (unit,) = plan_units(expand_inputs([str(path)]), opts)
    start_reading_ahead(unit, opts)
    key = read_ahead.pending()[-1]
    assert key[0] == str(path) and key[-2:] == (0, "text")
    assert _texts(unit, opts) == ["one", "two", "three"] and key not in read_ahead.pending()   # taken
    start_reading_ahead(unit, opts)
    stale = read_ahead.pending()[-1]
    st0 = os.stat(path)
    pq.write_table(pa.table({"text": ["uno", "dos", "tres", "cuatro"]}), path, row_group_size=2)
    os.utime(path, ns=(st0.st_atime_ns, st0.st_mtime_ns + 10**9))   # another version, whatever the clock's grain
    (unit,) = plan_units(expand_inputs([str(path)]), opts)
    assert _texts(unit, opts) == ["uno", "dos", "tres", "cuatro"]    # read again, not the old version's group
    assert stale in read_ahead.pending()                            # left, to be dropped by the next ones
    for other in ("title", None):                                   # another column / a file that is not parquet
        start_reading_ahead(unit, SourceOptions(text_column=other) if other else opts)
    txt = tmp_path / "a.txt"
    txt.write_text("plain text")
    (tunit,) = plan_units(expand_inputs([str(txt)]), opts)
    before = read_ahead.pending()
    start_reading_ahead(tunit, opts)
    assert read_ahead.pending() == before and len(before) <= read_ahead.SLOTS
