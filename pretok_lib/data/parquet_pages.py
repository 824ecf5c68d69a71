"""The leaf values of one list column of one row group, decoded straight from its pages (no Arrow list rebuild).

Arrow rebuilds a list column from its repetition/definition levels value by value: for padded rows (a
fixed-size list of seq_len + 1 ids per row) that is ~90% of the cost of reading a row group, while the values
themselves are one PLAIN int32 run per page. The readers know the row layout from the footer (row length, or
per-document lengths), so they need only the values: `leaf_values` walks the column chunk's pages (Thrift
compact page headers), decompresses each and takes the PLAIN values after the levels.

Only the layout pretok writes is taken this way (no dictionary, PLAIN int32 values, no nulls, data pages v1 or
v2, zstd / snappy / uncompressed); anything else returns None and the caller reads the row group with pyarrow.
A part is checked against its manifest checksum before any of its row groups is read (`parquet_rows.py`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

CODECS = {"ZSTD": "zstd", "SNAPPY": "snappy", "UNCOMPRESSED": None}
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN = 0


class _Unsupported(Exception):
    """A layout this reader does not take: the caller falls back to pyarrow."""


class _Compact:
    """Just enough of Thrift's compact protocol to read a parquet PageHeader (unknown fields are skipped)."""

    def __init__(self, buf: memoryview, pos: int):
        self.buf, self.pos = buf, pos

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            out |= (b & 0x7F) << shift
            if b < 0x80:
                return out
            shift += 7

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def struct(self) -> dict:
        """{field id: value}: ints for integer fields, bools, dicts for nested structs; others skipped (None)."""
        out, fid = {}, 0
        while True:
            head = self.buf[self.pos]
            self.pos += 1
            if head == 0:
                return out
            kind, delta = head & 0x0F, head >> 4
            fid = fid + delta if delta else self.zigzag()
            out[fid] = self.value(kind)

    def value(self, kind: int):
        if kind in (1, 2):  # bool true / false (in a struct field)
            return kind == 1
        if kind == 3:
            self.pos += 1
            return None
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.pos += 8
            return None
        if kind == 8:
            n = self.varint()
            self.pos += n
            return None
        if kind in (9, 10):  # list / set
            head = self.buf[self.pos]
            self.pos += 1
            n, elem = head >> 4, head & 0x0F
            if n == 15:
                n = self.varint()
            for _ in range(n):
                if elem in (1, 2):
                    self.pos += 1
                else:
                    self.value(elem)
            return None
        if kind == 11:  # map
            n = self.varint()
            if n:
                types = self.buf[self.pos]
                self.pos += 1
                for _ in range(n):
                    self.value(types >> 4)
                    self.value(types & 0x0F)
            return None
        if kind == 12:
            return self.struct()
        raise _Unsupported(f"thrift type {kind}")


def _levels_v1(body: memoryview, max_rep: int, max_def: int) -> int:
    """Bytes taken by a v1 data page's repetition and definition levels (each: 4-byte length, then RLE)."""
    pos = 0
    for present in (max_rep > 0, max_def > 0):
        if present:
            pos += 4 + int.from_bytes(body[pos : pos + 4], "little")
    return pos


def leaf_values(path: Path, meta: pq.FileMetaData, group: int, column: int, dtype: np.dtype,
                spare: np.ndarray | None = None) -> np.ndarray | None:
    """All values of leaf column `column` in row group `group`, in order, as `dtype` (written into `spare` when
    it has that type and at least that size: a view of it is returned); None for a layout this reader does not
    take (the caller then uses pyarrow)."""
    chunk = meta.row_group(group).column(column)
    leaf = meta.schema.column(column)
    codec = CODECS.get(chunk.compression, "?")
    if codec == "?" or leaf.physical_type != "INT32" or chunk.dictionary_page_offset is not None:
        return None
    start, size = chunk.data_page_offset, chunk.total_compressed_size
    buf = _buffer("raw", size)
    fd = os.open(path, os.O_RDONLY)
    try:
        if os.preadv(fd, [buf], start) != size:
            return None
    finally:
        os.close(fd)
    pos, total = 0, chunk.num_values
    reuse = spare is not None and spare.dtype == dtype and len(spare) >= total
    out, filled = spare[:total] if reuse else np.empty(total, dtype), 0
    try:
        while pos < size:
            reader = _Compact(buf, pos)
            head = reader.struct()
            pos = reader.pos
            ptype, usize, csize = head.get(1), head.get(2), head.get(3)
            if csize is None or usize is None or pos + csize > size:
                return None
            page, pos = buf[pos : pos + csize], pos + csize
            if ptype == DATA_PAGE:
                h = head.get(5) or {}
                if h.get(2) != PLAIN:
                    return None
                body = _decompress(page, codec, usize)
                values = body[_levels_v1(body, leaf.max_repetition_level, leaf.max_definition_level) :]
            elif ptype == DATA_PAGE_V2:
                h = head.get(8) or {}
                if h.get(4) != PLAIN or h.get(2):
                    return None
                skip = h.get(5, 0) + h.get(6, 0)  # levels are stored uncompressed before the values
                rest = page[skip:]
                values = _decompress(rest, codec, usize - skip) if h.get(7, True) else rest
            elif ptype == DICTIONARY_PAGE:
                return None
            else:
                continue  # index pages carry no values
            n = h.get(1)
            if n is None or len(values) != 4 * n or filled + n > total:  # nulls (fewer values than levels)
                return None
            out[filled : filled + n] = np.frombuffer(values, "<i4")  # the cast to the column's type
            filled += n
    except (_Unsupported, IndexError, pa.ArrowException, zstandard.ZstdError):
        return None
    return out if filled == total else None


_scratch = threading.local()  # per thread: a column chunk's bytes and one page decompressed, reused (fresh memory
# costs a page fault per 4 kB)


def _buffer(name: str, size: int) -> memoryview:
    """This thread's reusable buffer `name`, `size` bytes long."""
    buf = getattr(_scratch, name, None)
    if buf is None or len(buf) < size:
        buf = bytearray(max(size, 1 << 20))
        setattr(_scratch, name, buf)
    return memoryview(buf)[:size]


def _decompress(page: memoryview, codec: str | None, size: int) -> memoryview:
    if codec is None:
        return page
    if codec != "zstd":
        return memoryview(pa.decompress(page, decompressed_size=size, codec=codec))
    view, got = _buffer("page", size), 0
    dctx = getattr(_scratch, "zstd", None)
    if dctx is None:  # one per thread: a fresh context allocates its window every page
        dctx = _scratch.zstd = zstandard.ZstdDecompressor()
    with dctx.stream_reader(page) as r:
        while got < size:
            n = r.readinto(view[got:])
            if not n:
                raise _Unsupported("zstd page shorter than its header says")
            got += n
    return view
