"""Planning: the inputs cut into units of about `part_bytes` of text, from parquet footers and byte offsets.

The plan depends only on the inputs and the part size, never on the worker count.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Sequence

from ..errors import PretokError
from .arrow_text import is_text_type, parquet_leaves
from .input_checks import check_shape
from .inputs import InputFile, SourceOptions, Unit, compile_separator
from .remote import is_url
from .remote_file import RemoteFile, open_input

# Row groups are split across units only above this size: every unit reading a slice of a row group must
# decode the group up to its slice, so splitting small groups costs more decoding than it gains in parallelism.
SPLIT_ROW_GROUP_BYTES = 64_000_000


def _parquet_file(path: str, source=None, metadata=None):
    """The file opened for reading (`metadata`: its footer, parsed before, not read again)."""
    import pyarrow.parquet as pq

    if source is None:  # a URL: read by range requests, the footer first, then only the column chunks asked for
        source = RemoteFile(path) if is_url(path) else path
    try:
        # pages are checked where they carry a CRC
        return pq.ParquetFile(source, metadata=metadata, page_checksum_verification=True)
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
    if _saved_without_rows(f.path):  # `datasets` cannot load what it saved from 0 rows: like an empty file
        return []
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


def _saved_without_rows(path: str) -> bool:
    """Whether an HF dataset directory was saved from 0 rows (its state lists no data file)."""
    try:
        return json.loads((Path(path) / "state.json").read_text()).get("_data_files") == []
    except (OSError, ValueError, AttributeError):
        return False


def _load_hf(path: str):
    try:
        import datasets

        return datasets.load_from_disk(path)
    except Exception as e:
        raise PretokError(f"cannot load HF dataset ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None
