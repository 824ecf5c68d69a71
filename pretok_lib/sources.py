"""Input readers: parquet / JSONL(.gz, .zst) / plain text / HF datasets on disk → planned units → batches of texts.

The input is cut into *units* before any tokenization: consecutive parquet row groups, newline-aligned byte
ranges of a JSONL file, whole compressed files, groups of text files, row ranges of an HF dataset. The plan
depends only on the inputs and the part size, never on the worker count, so every unit becomes one numbered
output part and outputs are identical for any number of workers and shards.
"""

from __future__ import annotations

import codecs
import functools
import glob
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from .arrow_text import INVALID, MISSING, as_string_array, decode_each, is_text_type, parquet_leaves, utf8_valid
from .arrow_text import byte_lengths as _byte_lengths
from .errors import PretokError
from .input_checks import check_shape
from .remote import expand_all as expand_urls
from .remote import is_url
from .remote_file import RemoteFile, open_input, read_bytes
from .streams import jsonl_lines, parse_jsonl_line, without_bom

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
# Kinds of skipped (damaged or unusable) documents: text null / key missing / not a string / empty / invalid
# (bad UTF-8, a lone surrogate, a line that is not JSON).
BAD_DOC_KINDS = ("null", "missing", "nonstring", "empty", "invalid")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a JSONL line that may decode to a lone surrogate
# Row groups are split across units only above this size: every unit reading a slice of a row group must
# decode the group up to its slice, so splitting small groups costs more decoding than it gains in parallelism.
SPLIT_ROW_GROUP_BYTES = 64_000_000


@dataclass(frozen=True)
class InputFile:
    """One input as given: a file, or an HF dataset directory."""

    path: str
    kind: str  # parquet | jsonl | jsonl.gz | jsonl.zst | txt | hf-disk
    size: int
    mtime_ns: int
    version: tuple[tuple[str, str], ...] = ()  # a URL's version identity in its store (ETag, version id, ...)

    def record(self) -> dict:
        """The input as the manifest (and the output's config, for change detection) records it."""
        if is_url(self.path):
            return {"path": self.path, "kind": self.kind, "size": self.size, "version": dict(self.version)}
        return {"path": self.path, "kind": self.kind, "size": self.size, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class Unit:
    """A deterministic slice of the input, tokenized into one numbered output part."""

    index: int
    kind: str
    paths: tuple[str, ...]
    start: int = 0  # row (parquet row group, hf row) or byte offset
    stop: int = 0
    est_bytes: int = 0


@dataclass(frozen=True)
class SourceOptions:
    """How documents are read from the inputs."""

    text_column: str = "text"
    separator: str | None = None  # txt: a Python `re.split` pattern; None = one document per file
    bad_docs: str = "skip"  # skip (and count) | fail
    part_bytes: int = 64 << 20
    batch_bytes: int = 1_000_000


@dataclass
class DocBatch:
    """A batch of documents in input order, with counts of what was skipped."""

    texts: list[str]
    text_bytes: int
    skipped: dict[str, int] = field(default_factory=dict)


def _kind_of(path: Path) -> str:
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_info.json").exists():
            return "hf-disk"
        if (path / "dataset_dict.json").exists():
            raise PretokError("is a DatasetDict: pass one split's directory (e.g. DIR/train)", path)
        raise PretokError("is a directory but not an HF dataset saved with save_to_disk", path)
    return _kind_of_name(path.name, path)


def _kind_of_name(name: str, path: str | Path) -> str:
    name = name.lower()
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    for comp in (".gz", ".zst"):
        if name.endswith(comp) and name[: -len(comp)].endswith(JSONL_SUFFIXES):
            return "jsonl" + comp
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(TEXT_SUFFIXES):
        return "txt"
    raise PretokError("unknown input type (expected .parquet, .jsonl[.gz|.zst], .txt, or an HF dataset dir)", path)


def expand_inputs(inputs: Sequence[str]) -> list[InputFile]:
    """Expand globs and check every input exists; order is as given, globs sorted."""
    files: list[InputFile] = []
    urls = [s for s in inputs if is_url(s)]
    listed = dict(zip(urls, expand_urls(urls))) if urls else {}  # in flight together
    for spec in inputs:
        if is_url(spec):
            files += [InputFile(url, _kind_of_name(url.rsplit("/", 1)[-1], url), size, 0, version)
                      for url, size, version in listed[spec]]
            continue
        matches = sorted(glob.glob(spec)) if glob.has_magic(spec) else [spec]
        if not matches:
            raise PretokError("no input matches this pattern", spec)
        for m in matches:
            p = Path(m)
            try:
                st = p.stat()
            except OSError as e:
                why = "no such file or directory" if not p.is_symlink() else "a symlink to a missing file"
                raise PretokError(why if isinstance(e, FileNotFoundError) else e.strerror or str(e), p) from None
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise PretokError("not a regular file (a FIFO, socket or device); give a file or a directory", p)
            kind = _kind_of(p)
            size = st.st_size if kind != "hf-disk" else sum(f.stat().st_size for f in p.glob("*.arrow"))
            if kind != "hf-disk" and not os.access(p, os.R_OK):
                raise PretokError("permission denied", p)
            files.append(InputFile(str(p), kind, size, st.st_mtime_ns))
    if not files:
        raise PretokError("no inputs given")
    return files


# ---------------------------------------------------------------- planning


def _parquet_file(path: str, source=None):
    import pyarrow.parquet as pq

    if source is None:  # a URL: read by range requests, the footer first, then only the column chunks asked for
        source = RemoteFile(path) if is_url(path) else path
    try:
        return pq.ParquetFile(source, page_checksum_verification=True)  # checked where pages carry a CRC
    except PretokError:
        raise
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise PretokError(f"not a readable parquet file ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None


def estimate_text_bytes(files: Sequence[InputFile], text_column: str) -> int:
    """About how many bytes of text the inputs hold: a parquet file's text column uncompressed (from its footer),
    else the file size. Sizes parts by text, not by compressed bytes on disk. Remote footers are fetched 16 at a
    time (one round trip each would add up over thousands of files)."""
    remote_pq = [f for f in files if f.kind == "parquet" and is_url(f.path)]
    if len(remote_pq) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda f: _row_groups(f, text_column), remote_pq))
    return sum(sum(size for _, size in _row_groups(f, text_column)) if f.kind == "parquet" else f.size
               for f in files)


@functools.lru_cache(maxsize=4096)
def _row_groups(f: InputFile, text_column: str) -> tuple[tuple[int, int], ...]:
    """(rows, text column bytes uncompressed) of every row group, from the footer; read once per file version
    (InputFile carries size and mtime) for both sizing and planning."""
    pf = _parquet_file(f.path)
    col = _text_column_index(pf, f.path, text_column)
    meta = pf.metadata
    return tuple((meta.row_group(rg).num_rows, meta.row_group(rg).column(col).total_uncompressed_size)
                 for rg in range(meta.num_row_groups))


def _text_column_index(pf, path: str, column: str) -> int:
    import pyarrow as pa

    names = pf.schema_arrow.names
    if column not in names:
        raise PretokError(f"no column '{column}' (columns: {', '.join(names)}); use --text-column", path)
    typ = pf.schema_arrow.field(column).type
    if not is_text_type(typ):
        raise PretokError(f"column '{column}' has type {typ}, expected string", path)
    # The Parquet leaf index, counted from the Arrow schema: pyarrow's ParquetSchema (pf.schema, path_in_schema)
    # forms a reference cycle with the file's FileMetaData, which kept every opened footer (MBs for files of many
    # row groups) alive until a rare full garbage collection: worker RSS grew ~40 MB per GB of input.
    return sum(parquet_leaves(pf.schema_arrow.field(i).type) for i in range(names.index(column)))


def _plan_parquet(f: InputFile, opts: SourceOptions) -> list[tuple]:
    """Row ranges [start, stop) of ~part_bytes text: row groups are joined; only very big ones are split."""
    units: list[tuple] = []
    start = row = acc = 0
    for rows, size in _row_groups(f, opts.text_column):
        if size > max(opts.part_bytes, SPLIT_ROW_GROUP_BYTES):  # close the open range, split this group evenly
            if row > start:
                units.append(("parquet", (f.path,), start, row, acc))
            k = min(rows, -(-size // opts.part_bytes)) or 1
            cuts = [row + rows * i // k for i in range(k + 1)]
            units += [("parquet", (f.path,), a, b, size * (b - a) // max(rows, 1)) for a, b in zip(cuts, cuts[1:])]
            row += rows
            start, acc = row, 0
            continue
        row += rows
        acc += size
        if acc >= opts.part_bytes:
            units.append(("parquet", (f.path,), start, row, acc))
            start, acc = row, 0
    if row > start:
        units.append(("parquet", (f.path,), start, row, acc))
    return units


def _plan_jsonl(f: InputFile, opts: SourceOptions) -> list[tuple]:
    if f.size <= opts.part_bytes:  # one unit (none if empty): nothing to align (a remote file: no request)
        return [("jsonl", (f.path,), 0, f.size, f.size)] if f.size else []
    units, start = [], 0
    with open_input(f.path, 1 << 16) as fh:
        while start < f.size:
            stop = start + opts.part_bytes
            if stop >= f.size:
                stop = f.size
            else:
                fh.seek(stop)
                fh.readline()  # align to the next line start
                stop = min(fh.tell(), f.size)
            units.append(("jsonl", (f.path,), start, stop, stop - start))
            start = stop
    return units


def _plan_hf(f: InputFile, opts: SourceOptions) -> list[tuple]:
    ds = _load_hf(f.path)
    if opts.text_column not in ds.column_names:
        raise PretokError(f"no column '{opts.text_column}' (columns: {', '.join(ds.column_names)})", f.path)
    n = len(ds)
    rows = max(1, int(n * opts.part_bytes / max(f.size, 1)))
    return [("hf-disk", (f.path,), s, min(n, s + rows), f.size * (min(n, s + rows) - s) // max(n, 1))
            for s in range(0, n, rows)]


def plan_units(files: Sequence[InputFile], opts: SourceOptions) -> list[Unit]:
    """Cut the inputs into units of about `opts.part_bytes` of text, in input order."""
    raw: list[tuple] = []
    txt_group: list[InputFile] = []
    if opts.separator is not None:
        compile_separator(opts.separator)
    check_shape(files, opts.text_column)

    def flush_txt() -> None:
        if txt_group:
            raw.append(("txt", tuple(t.path for t in txt_group), 0, 0, sum(t.size for t in txt_group)))
            txt_group.clear()

    for f in files:
        if f.kind == "txt" and opts.separator is None:
            txt_group.append(f)
            if sum(t.size for t in txt_group) >= opts.part_bytes:
                flush_txt()
            continue
        flush_txt()
        if f.kind == "parquet":
            raw += _plan_parquet(f, opts)
        elif f.kind == "jsonl":
            raw += _plan_jsonl(f, opts)
        elif f.kind == "hf-disk":
            raw += _plan_hf(f, opts)
        else:  # compressed JSONL and separator-split text: one unit per file (not seekable / regex needs context)
            raw.append((f.kind, (f.path,), 0, 0, f.size))
    flush_txt()
    return [Unit(i, *r) for i, r in enumerate(raw)]


def shard_units(units: Sequence[Unit], num_shards: int, shard_index: int) -> list[Unit]:
    """A contiguous, deterministic slice of the units: shards concatenated in order equal the whole."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise PretokError(f"invalid shard {shard_index} of {num_shards}")
    n = len(units)
    return list(units[n * shard_index // num_shards : n * (shard_index + 1) // num_shards])


# ---------------------------------------------------------------- reading


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


def _read_parquet(unit: Unit, c: _Collector) -> Iterator[DocBatch]:
    path = unit.paths[0]
    remote = RemoteFile(path) if is_url(path) else None
    pf = _parquet_file(path, remote)
    col = _text_column_index(pf, path, c.opts.text_column)
    meta, first = pf.metadata, 0
    if remote is not None:  # the unit's text column chunks, consecutive ones fetched together
        remote.expect(_chunk_ranges(meta, col, unit.start, unit.stop))
    try:
        for rg in range(meta.num_row_groups):
            rgm = meta.row_group(rg)
            lo, hi = max(unit.start, first), min(unit.stop, first + rgm.num_rows)
            if lo < hi:
                yield from _read_row_group(pf, rg, rgm, col, lo - first, hi - first, c, f"{path} (row group {rg})")
            first += rgm.num_rows
            if first >= unit.stop:
                break
    except PretokError:
        raise
    except Exception as e:
        raise PretokError(f"corrupt parquet data ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None


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


def _read_row_group(pf, rg: int, rgm, col: int, lo: int, hi: int, c: _Collector, where: str) -> Iterator[DocBatch]:
    """Rows [lo, hi) of one row group: read whole if small (fast), streamed in batches if big (bounded memory)."""
    name = c.opts.text_column
    if rgm.column(col).total_uncompressed_size <= 4 * c.opts.batch_bytes:
        arr = pf.read_row_group(rg, columns=[name], use_threads=False).column(0).combine_chunks()
        yield from c.add_arrow(arr.slice(lo, hi - lo), where)
        return
    avg = max(1, rgm.total_byte_size // max(rgm.num_rows, 1))
    pos = 0
    for batch in pf.iter_batches(batch_size=max(1, c.opts.batch_bytes // avg), row_groups=[rg], columns=[name],
                                   use_threads=False):
        a, b = max(lo - pos, 0), min(hi - pos, batch.num_rows)
        pos += batch.num_rows
        if a < b:
            yield from c.add_arrow(batch.column(0).slice(a, b - a), where)
        if pos >= hi:
            break


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
        text = rec.get(key, MISSING) if isinstance(rec, dict) else MISSING
        c.add(text, where, len(line), check_surrogates=_SURROGATE_ESCAPE.search(line) is not None)
        if c.full():
            yield c.take()


def compile_separator(pattern: str) -> "re.Pattern":
    """The `--separator` regex, refused in one line when invalid or when it matches the empty string (which would
    split between every character)."""
    try:
        sep = re.compile(pattern)
    except re.error as e:
        raise PretokError(f"invalid --separator regex {pattern!r}: {e}") from None
    if sep.fullmatch(""):
        raise PretokError(f"--separator {pattern!r} matches the empty string; use e.g. '\\n\\n+'")
    return sep


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
            if c.full():
                yield c.take()
        return
    # Stream the file in blocks; text from the start of the last separator match on is carried into the next
    # block, so a separator that straddles a block edge splits exactly as `re.split` on the whole file would.
    path, sep = unit.paths[0], compile_separator(c.opts.separator)
    utf8 = codecs.getincrementaldecoder("utf-8-sig")(errors="surrogateescape")
    carry = ""
    with open_input(path) as fh:
        while True:
            block = fh.read(c.opts.batch_bytes)
            buf = carry + utf8.decode(block, final=not block)
            if block:
                last = max((m.start() for m in sep.finditer(buf) if m.start() > 0), default=0)
                buf, carry = buf[:last], buf[last:]
            damaged = _has_surrogate(buf)
            for doc in sep.split(buf):
                if doc:  # separators at the edges produce empty strings: not documents
                    c.add(doc, path, check_surrogates=damaged)
                if c.full():
                    yield c.take()
            if not block:
                break


def _load_hf(path: str):
    try:
        import datasets

        return datasets.load_from_disk(path)
    except Exception as e:
        raise PretokError(f"cannot load HF dataset ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None


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


_READERS = {"parquet": _read_parquet, "jsonl": _read_jsonl, "jsonl.gz": _read_jsonl, "jsonl.zst": _read_jsonl,
            "txt": _read_txt, "hf-disk": _read_hf}


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
