"""Reading: a unit's documents in order, in batches of about `batch_bytes`, bad documents skipped and counted.

Every input kind has one reader (`Reader`), which feeds a `_Collector` (the bad-document policy and batching).
"""

from __future__ import annotations

import bisect
import codecs
import functools
import os
import re
from typing import Iterable, Iterator, Protocol, Sequence

from ..errors import PretokError
from .arrow_text import INVALID, MISSING, as_string_array, decode_each, is_text_type, utf8_valid
from .arrow_text import byte_lengths as _byte_lengths
from .inputs import DocBatch, SourceOptions, Unit, compile_separator
from .plan import _load_hf, _parquet_file, _text_column_index
from . import read_ahead
from .prefetch import prefetched
from .remote import is_url
from .remote_file import RemoteFile, open_input, read_bytes
from .streams import jsonl_lines, parse_jsonl_line, without_bom

# Kinds of skipped (damaged or unusable) documents: text null / key missing / not a string / empty / invalid
# (bad UTF-8, a lone surrogate, a line that is not JSON or not an object).
BAD_DOC_KINDS = ("null", "missing", "nonstring", "empty", "invalid")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a JSONL line that may decode to a lone surrogate


def _has_surrogate(text: str) -> bool:
    """Whether the text holds a lone surrogate (from a JSON escape or undecodable bytes): no tokenizer encodes
    one. Strict UTF-8 encoding fails on exactly those, and is ~10x faster than a regex search."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _Collector:
    """Applies the bad-document policy and cuts documents into batches of about `batch_bytes`."""

    def __init__(self, opts: SourceOptions):
        self.opts, self.texts, self.bytes = opts, [], 0
        self.skipped = dict.fromkeys(BAD_DOC_KINDS, 0)

    def bad(self, kind: str, where: str, detail: str) -> None:
        if self.opts.bad_docs == "fail":
            raise PretokError(f"{detail} (use --bad-docs skip to skip and count such documents)", where)
        self.skipped[kind] += 1

    def add(self, text, where: str, nbytes: int | None = None, check_surrogates: bool = False) -> None:
        """Add one document or count it as skipped; `check_surrogates`: the text may hold lone surrogates (from
        JSON escapes or undecodable bytes), which no tokenizer can encode."""
        if text is None:
            return self.bad("null", where, f"null '{self.opts.text_column}'")
        if text is MISSING:
            return self.bad("missing", where, f"no key '{self.opts.text_column}'")
        if text is INVALID:
            return self.bad("invalid", where, "invalid UTF-8")
        if not isinstance(text, str):
            return self.bad("nonstring", where, f"'{self.opts.text_column}' is {type(text).__name__}, not a string")
        if not text:
            return self.bad("empty", where, "empty document")
        if check_surrogates and _has_surrogate(text):
            return self.bad("invalid", where, "a lone surrogate (invalid UTF-8 bytes or a JSON \\ud8xx escape)")
        self.texts.append(text)
        self.bytes += len(text) if nbytes is None else nbytes

    def add_arrow(self, arr, where: str) -> Iterator[DocBatch]:
        """Add a string array: bulk when it has no nulls or empty strings (the common case), else per document.
        Yields full batches, cut at document boundaries near `batch_bytes`."""
        import numpy as np

        arr = as_string_array(arr)
        lens = _byte_lengths(arr)
        valid = utf8_valid(arr)
        if arr.null_count or (len(lens) and lens.min() == 0) or not valid:
            for text, nb in zip(arr.to_pylist() if valid else decode_each(arr), lens.tolist()):
                self.add(text, where, nb)
                if self.full():
                    yield self.take()
            return
        ends = np.cumsum(lens)
        start = 0
        while start < len(arr):
            room = self.opts.batch_bytes - self.bytes + (int(ends[start - 1]) if start else 0)
            stop = max(start + 1, int(np.searchsorted(ends, room, side="right")))
            self.texts.extend(arr.slice(start, stop - start).to_pylist())
            self.bytes += int(ends[stop - 1] - (ends[start - 1] if start else 0))
            start = stop
            if self.full():
                yield self.take()

    def full(self) -> bool:
        return self.bytes >= self.opts.batch_bytes

    def take(self) -> DocBatch:
        out = DocBatch(self.texts, self.bytes, {k: v for k, v in self.skipped.items() if v})
        self.texts, self.bytes, self.skipped = [], 0, dict.fromkeys(BAD_DOC_KINDS, 0)
        return out


class Reader(Protocol):
    """The contract of an input kind's reader: the unit's documents, in order, added to the collector (which
    applies the bad-document policy); yields each batch as the collector fills."""

    def __call__(self, unit: Unit, c: _Collector) -> Iterator[DocBatch]:
        ...


def _read_parquet(unit: Unit, c: _Collector) -> Iterator[DocBatch]:
    """The unit's rows of the text column: decoded one row group (or streamed batch) ahead in a thread, so the
    decompression and decoding, which run without the GIL, overlap the encoding of the batch before."""
    path = unit.paths[0]
    remote = RemoteFile(path) if is_url(path) else None
    identity = None
    if remote is None:
        st = os.stat(path)
        identity = (path, st.st_size, st.st_mtime_ns)
        meta, starts = _local_footer(*identity)
        pf = _parquet_file(path, metadata=meta)
    else:
        pf = _parquet_file(path, remote)
        starts = _row_starts(pf.metadata)
    col = _text_column_index(pf, path, c.opts.text_column)
    if remote is not None:  # the unit's text column chunks, consecutive ones fetched together
        remote.expect(_chunk_ranges(pf.metadata, col, unit.start, unit.stop))
    try:
        for arr, where in prefetched(_parquet_arrays(pf, col, unit, c.opts, starts, identity)):
            yield from c.add_arrow(arr, where)
    except PretokError:
        raise
    except Exception as e:
        raise PretokError(f"corrupt parquet data ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None


def _row_starts(meta) -> tuple[int, ...]:
    """The first row of every row group, and the total rows last."""
    starts = [0]
    for rg in range(meta.num_row_groups):
        starts.append(starts[-1] + meta.row_group(rg).num_rows)
    return tuple(starts)


@functools.lru_cache(maxsize=64)
def _local_footer(path: str, size: int, mtime_ns: int) -> tuple[object, tuple[int, ...]]:
    """A local parquet file's footer and row-group starts, parsed once per process and file version: a worker
    reads many units of one file, and parsing a footer of 970 row groups and walking it to the unit cost ~6 ms a
    unit (23% of the workers' CPU on 2 GB cut into 2 MB units)."""
    meta = _parquet_file(path).metadata
    return meta, _row_starts(meta)


def _parquet_arrays(pf, col: int, unit: Unit, opts: SourceOptions, starts: tuple[int, ...],
                    identity: tuple | None = None) -> Iterator[tuple[object, str]]:
    """(text array, where) of the unit's rows, row group by row group (`starts`: each group's first row, found by
    bisection); the only code that reads `pf`, but for a first row group read ahead (`read_ahead`) of the file of
    this `identity` (path, size, mtime_ns; None: remote, never read ahead)."""
    meta = pf.metadata
    rg = _first_row_group(starts, unit)
    ahead = None if identity is None else _ahead_key(identity, rg, opts)
    while rg < meta.num_row_groups and starts[rg] < unit.stop:
        rgm, first = meta.row_group(rg), starts[rg]
        lo, hi = max(unit.start, first), min(unit.stop, first + rgm.num_rows)
        if lo < hi:
            where = f"{unit.paths[0]} (row group {rg})"
            for arr in _row_group_arrays(pf, rg, rgm, col, lo - first, hi - first, opts, ahead):
                yield arr, where
        rg, ahead = rg + 1, None


def _chunk_ranges(meta, col: int, start: int, stop: int) -> list[tuple[int, int]]:
    """Byte ranges [a, b) of column `col`'s chunks in the row groups holding rows [start, stop)."""
    out, first = [], 0
    for rg in range(meta.num_row_groups):
        rgm = meta.row_group(rg)
        if first < stop and start < first + rgm.num_rows:
            cm = rgm.column(col)
            a = cm.dictionary_page_offset if cm.has_dictionary_page else cm.data_page_offset
            out.append((a, a + cm.total_compressed_size))
        first += rgm.num_rows
    return out


def _first_row_group(starts: tuple[int, ...], unit: Unit) -> int:
    """The row group holding the unit's first row (`starts`: each group's first row)."""
    return max(0, bisect.bisect_right(starts, unit.start) - 1)


def _small_row_group(rgm, col: int, opts: SourceOptions) -> bool:
    """Whether a row group's text column is read whole (else streamed in batches: bounded memory)."""
    return rgm.column(col).total_uncompressed_size <= 4 * opts.batch_bytes


def _whole_row_group(pf, rg: int, name: str):
    """One row group's text column, read whole as one Arrow array."""
    return pf.read_row_group(rg, columns=[name], use_threads=False).column(0).combine_chunks()


def _ahead_key(identity: tuple, rg: int, opts: SourceOptions) -> tuple:
    """What a row group read ahead is found by: the file's version (path, size, mtime_ns), the group, the column."""
    return (*identity, rg, opts.text_column)


def _row_group_arrays(pf, rg: int, rgm, col: int, lo: int, hi: int, opts: SourceOptions,
                      ahead: tuple | None = None) -> Iterator[object]:
    """Rows [lo, hi) of one row group's text column: read whole if small (fast), streamed in batches if big
    (bounded memory).

    Args:
        pf: the open ParquetFile; rg, rgm: the row group's index and metadata; col: the text column's leaf index.
        lo, hi: the rows within the row group; opts: the text column's name and the batch size.
        ahead: the key this row group was read ahead under, if it may have been (`read_ahead.take`).
    """
    name = opts.text_column
    if _small_row_group(rgm, col, opts):
        arr = read_ahead.take(ahead) if ahead is not None else None
        if arr is None:
            arr = _whole_row_group(pf, rg, name)
        yield arr.slice(lo, hi - lo)
        return
    avg = max(1, rgm.total_byte_size // max(rgm.num_rows, 1))
    pos = 0
    for batch in pf.iter_batches(batch_size=max(1, opts.batch_bytes // avg), row_groups=[rg], columns=[name],
                                   use_threads=False):
        a, b = max(lo - pos, 0), min(hi - pos, batch.num_rows)
        pos += batch.num_rows
        if a < b:
            yield batch.column(0).slice(a, b - a)
        if pos >= hi:
            break


def _json_kind(value) -> str:
    """The JSON name of a parsed value's type (for the one-line error of a line that is not an object)."""
    if isinstance(value, bool) or value is None:
        return "literal " + ("null" if value is None else str(value).lower())
    return {list: "array", str: "string"}.get(type(value), "number")


def _read_jsonl(unit: Unit, c: _Collector) -> Iterator[DocBatch]:
    path, key = unit.paths[0], c.opts.text_column
    for line, pos in jsonl_lines(path, unit.kind, unit.start, unit.stop):
        line = without_bom(line, pos)
        if not line.strip():
            continue
        where = f"{path} (byte {pos})"
        rec, why = parse_jsonl_line(line, pos)
        if why is not None:
            c.bad("invalid", where, why)
            continue
        if not isinstance(rec, dict):  # JSON but not a record (a damaged line, not a record without the key)
            c.bad("invalid", where, f"a JSON {_json_kind(rec)}, not an object")
            continue
        c.add(rec.get(key, MISSING), where, len(line), check_surrogates=_SURROGATE_ESCAPE.search(line) is not None)
        line = rec = None  # not kept by this frame while the batch is encoded (jsonl_lines holds the line itself)
        if c.full():
            yield c.take()


def _read_txt(unit: Unit, c: _Collector) -> Iterator[DocBatch]:
    """Text files: one document per file, or split by the separator. Invalid UTF-8 damages only the document
    holding it (bytes are decoded with surrogateescape, documents holding an escape are skipped as invalid); a
    UTF-8 BOM at the start of a file is dropped."""
    if c.opts.separator is None:  # one document per file
        for path in unit.paths:
            data = read_bytes(path)
            try:
                text = data.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                c.bad("invalid", path, f"invalid UTF-8 at byte {e.start}")
            else:
                c.add(text, path, len(data))
            data = text = None  # a huge document: its bytes are not kept while the batch is encoded
            if c.full():
                yield c.take()
        return
    # Stream the file in blocks and split as on the whole file (split_stream); each piece is one document.
    path, sep = unit.paths[0], compile_separator(c.opts.separator)
    utf8 = codecs.getincrementaldecoder("utf-8-sig")(errors="surrogateescape")

    def blocks() -> Iterator[tuple[str, bool]]:
        with open_input(path) as fh:
            while True:
                block = fh.read(c.opts.batch_bytes)
                yield utf8.decode(block, final=not block), not block
                if not block:
                    return

    for doc in split_stream(sep, blocks()):
        if doc:  # separators at the edges (or adjacent) give empty pieces: not documents
            c.add(doc, path, check_surrogates=True)
        if c.full():
            yield c.take()


SEPARATOR_WINDOW = 1 << 16  # characters that a separator's match, with what it looks at around it, may span


def split_stream(sep: re.Pattern, chunks: Iterable[tuple[str, bool]], window: int = SEPARATOR_WINDOW
                 ) -> Iterator[str]:
    """The pieces between `sep`'s matches in the concatenated (text, is_last) chunks, as `re.split` without groups
    on the whole text gives them, in bounded memory: a match is taken only once `window` characters follow it, and
    searched with up to `window` characters before it, so a separator whose match and look-arounds span at most
    `window` characters (look-behinds, `\\b`, `(?m)^`, lazy tails) splits exactly as on the whole text. Captured
    groups are not pieces (they would be separators taken for documents)."""
    text, doc, scan, taken = "", 0, 0, None   # text[doc:] is pending; the next search starts at scan
    for chunk, last in chunks:
        text += chunk
        settle = len(text) if last else len(text) - window
        first_open = None
        for m in sep.finditer(text, scan):
            if taken is not None and m.start() == taken[0] and m.end() == taken[1]:
                continue  # the match taken last round, found again: the search restarts at its start
            if m.end() > settle:
                first_open = m.start()
                break
            yield text[doc:m.start()]
            doc, taken = m.end(), (m.start(), m.end())
        if last:
            yield text[doc:]
            return
        if taken is not None and taken[0] >= scan:
            scan = taken[0]  # search again from the last taken match (empty-match adjacency as in one search)
        resume = min(len(text) - window, len(text) if first_open is None else first_open)
        if resume > max(scan, doc, taken[1] if taken else 0):
            scan, taken = resume, None  # nothing can start before `resume`: no need to search it again
        cut = max(0, min(scan, doc) - window)  # keep `window` characters before for look-behinds
        if cut:
            text, doc, scan = text[cut:], doc - cut, scan - cut
            taken = (taken[0] - cut, taken[1] - cut) if taken else None


def _read_hf(unit: Unit, c: _Collector) -> Iterator[DocBatch]:
    ds = _load_hf(unit.paths[0]).with_format("arrow")
    step = 1024
    for s in range(unit.start, unit.stop, step):
        col = ds[s : min(unit.stop, s + step)].column(c.opts.text_column)
        if is_text_type(col.type):  # invalid UTF-8 (a damaged file) skips the documents holding it
            yield from c.add_arrow(col, unit.paths[0])
            continue
        for text in col.to_pylist():
            c.add(text, unit.paths[0])
            if c.full():
                yield c.take()

_READERS: dict[str, Reader] = {"parquet": _read_parquet, "jsonl": _read_jsonl, "jsonl.gz": _read_jsonl,
                               "jsonl.zst": _read_jsonl, "txt": _read_txt, "hf-disk": _read_hf}


def start_reading_ahead(unit: Unit, opts: SourceOptions) -> None:
    """Start decoding the first row group of `unit` (a local Parquet unit whose first group is read whole) in a
    thread, for `read_unit(unit, opts)` to take when it begins (`read_ahead.py`); anything else: nothing. The
    caller's thread only stats the file and finds the group in its (cached) footer."""
    path = unit.paths[0] if unit.paths else ""
    if unit.kind != "parquet" or is_url(path):
        return
    try:
        st = os.stat(path)
        identity = (path, st.st_size, st.st_mtime_ns)
        meta, starts = _local_footer(*identity)
    except Exception:  # the unit's own read meets it and says what is wrong
        return
    rg = _first_row_group(starts, unit)
    if rg >= meta.num_row_groups:
        return

    def decode():  # None (not read ahead): a group streamed in batches, not read whole
        pf = _parquet_file(path, metadata=meta)
        small = _small_row_group(meta.row_group(rg), _text_column_index(pf, path, opts.text_column), opts)
        return _whole_row_group(pf, rg, opts.text_column) if small else None

    read_ahead.start(_ahead_key(identity, rg, opts), decode)


def read_unit(unit: Unit, opts: SourceOptions) -> Iterator[DocBatch]:
    """Yield the unit's documents in order, in batches of about `opts.batch_bytes`; the last batch may be empty
    of texts but still carries skip counts."""
    c = _Collector(opts)
    try:
        yield from _READERS[unit.kind](unit, c)
    except OSError as e:  # a read failing at the boundary: one line naming the file and the errno text
        raise PretokError(f"cannot read: {e.strerror or e}", e.filename or unit.paths[0]) from None
    except UnicodeError as e:
        raise PretokError(f"cannot decode: {e}", unit.paths[0]) from None
    except Exception as e:  # Arrow's errors on damaged files (HF datasets); anything else is a bug: traceback
        if not type(e).__module__.startswith("pyarrow"):
            raise
        raise PretokError(f"corrupt data ({type(e).__name__}: {str(e).splitlines()[0]})", unit.paths[0]) from None
    yield c.take()


def sample_texts(units: Sequence[Unit], opts: SourceOptions, max_bytes: int = 512_000) -> list[str]:
    """The first documents of the given units, up to about `max_bytes`, for checking a tokenizer backend."""
    out, total = [], 0
    lenient = SourceOptions(opts.text_column, opts.separator, "skip", opts.part_bytes, min(opts.batch_bytes, max_bytes))
    for unit in units:
        for batch in read_unit(unit, lenient):
            for t in batch.texts:
                out.append(t[:max_bytes])
                total += len(out[-1])
                if total >= max_bytes:
                    return out
    return out
