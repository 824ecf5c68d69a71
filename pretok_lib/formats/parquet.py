"""The two parquet token formats: padded rows (`input_ids` + `attention_mask`) and token lists (one row per doc).

Both are written part by part (temp name, renamed at close), carry their format contract in the parquet
key-value metadata under `pretok`, and are validated on open. See docs/FORMATS.md.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..datapaths import window
from ..errors import PretokError
from . import checksum

PADDED, TOKEN_LIST = "padded", "token-list"
PARQUET_VERSION = 1
ROW_GROUP_TOKENS = 1 << 20  # about 1M token slots per row group: cheap random access, good compression
CODECS = ("none", "snappy", "zstd", "gzip", "lz4", "brotli")
DOC_LENGTHS_KEY = "pretok.doc_lengths"  # token-list footer: every row's length (see doc_lengths_of)
ROW_LENGTHS_KEY = "pretok.row_lengths"  # padded footer: every row's real (unmasked) token count
ARROW_IDS = {"uint16": pa.uint16(), "int32": pa.int32()}


def parse_compression(spec: str) -> tuple[str, int | None]:
    """'zstd:3' → ('zstd', 3); 'snappy' → ('snappy', None); 'none' → ('none', None)."""
    codec, _, level = spec.lower().partition(":")
    if codec not in CODECS:
        raise PretokError(f"unknown compression '{spec}' (choose from {', '.join(CODECS)}, e.g. zstd:3)")
    if level and (codec in ("none", "snappy") or not level.lstrip("-").isdigit()):
        raise PretokError(f"bad compression level in '{spec}'")
    if level:
        low, high = pa.Codec.minimum_compression_level(codec), pa.Codec.maximum_compression_level(codec)
        if not low <= int(level) <= high:
            raise PretokError(f"compression level {level} of '{spec}' is out of {codec}'s range [{low}, {high}]")
    return codec, int(level) if level else None


def schema_for(fmt: str, dtype: str, seq_len: int, pad_id: int | None) -> pa.Schema:
    """The arrow schema of a format, with its contract in the `pretok` metadata key."""
    ids = ARROW_IDS[dtype]
    row = window(seq_len)
    if fmt == PADDED:
        fields = [pa.field("input_ids", pa.list_(ids, row), nullable=False),
                  pa.field("attention_mask", pa.list_(pa.int8(), row), nullable=False)]
    else:
        fields = [pa.field("input_ids", pa.list_(ids), nullable=False)]
    meta = {"format": fmt, "format_version": PARQUET_VERSION, "dtype": dtype}
    if fmt == PADDED:
        meta.update(seq_len=seq_len, row_length=row, pad_id=pad_id)
    return pa.schema(fields, metadata={"pretok": json.dumps(meta, sort_keys=True)})


@dataclass
class PaddedStats:
    padding: int
    truncated: int


def padded_arrays(ids: np.ndarray, offsets: np.ndarray, row_length: int, pad_id: int,
                  dtype: str) -> tuple[np.ndarray, np.ndarray, PaddedStats]:
    """Documents (flat ids + offsets) → (n, row_length) ids padded with `pad_id`, and the 0/1 mask."""
    starts, lens = offsets[:-1], np.diff(offsets)
    kept = np.minimum(lens, row_length)
    cols = np.arange(row_length)
    mask = cols[None, :] < kept[:, None]
    out = np.full((len(lens), row_length), pad_id, dtype=dtype)
    out[mask] = ids[(starts[:, None] + cols[None, :])[mask]]
    stats = PaddedStats(padding=int((row_length - kept).sum()), truncated=int((lens - kept).sum()))
    return out, mask.astype(np.int8), stats


def arrow_of(a: np.ndarray) -> pa.Array:
    """A 1-D numpy array as an Arrow array over the same memory (no copy). Unlike `pa.array`, which imports pandas
    to ask whether its argument is a pandas object (0.3-0.6 s in every worker process that writes parquet)."""
    a = np.ascontiguousarray(a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("=")))
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])


def padded_table(ids: np.ndarray, offsets: np.ndarray, schema: pa.Schema) -> tuple[pa.Table, PaddedStats]:
    meta = json.loads(schema.metadata[b"pretok"])
    rows, mask, stats = padded_arrays(ids, offsets, meta["row_length"], meta["pad_id"], meta["dtype"])
    L = meta["row_length"]
    cols = [pa.FixedSizeListArray.from_arrays(arrow_of(rows.reshape(-1)), L),
            pa.FixedSizeListArray.from_arrays(arrow_of(mask.reshape(-1)), L)]
    return pa.Table.from_arrays(cols, schema=schema), stats


def tokenlist_table(ids: np.ndarray, offsets: np.ndarray, schema: pa.Schema) -> pa.Table:
    dtype = json.loads(schema.metadata[b"pretok"])["dtype"]
    arr = pa.ListArray.from_arrays(arrow_of(offsets.astype(np.int32)), arrow_of(ids.astype(dtype, copy=False)))
    return pa.Table.from_arrays([arr], schema=schema)


class ParquetPartWriter:
    """Writes one part file through a temp name; rows are grouped into row groups of ~ROW_GROUP_TOKENS slots.
    Parts record every row's length in the footer (token list: `DOC_LENGTHS_KEY`; padded: real tokens per row,
    `ROW_LENGTHS_KEY`) unless `record_doc_lengths` is False (how files written before the keys existed look)."""

    record_doc_lengths = True

    def __init__(self, path: str | os.PathLike, schema: pa.Schema, compression: str):
        codec, level = parse_compression(compression)
        self.path, self.tmp = Path(path), Path(str(path) + ".tmp")
        self.writer = pq.ParquetWriter(self.tmp, schema, compression=codec, compression_level=level,
                                       use_dictionary=False, write_statistics=False)
        self.pending: list[pa.Table] = []
        self.pending_tokens = 0
        self.contract = json.loads(schema.metadata[b"pretok"])
        self.lengths: list[np.ndarray] | None = [] if self.record_doc_lengths else None

    def write(self, table: pa.Table, tokens: int, lengths: np.ndarray) -> None:
        """Append `table` (`tokens` slots); `lengths`: its rows' lengths (token list: tokens per document; padded:
        real tokens per row), for the footer, given by the caller from the numpy arrays the table was made of."""
        if len(lengths) != table.num_rows:
            raise ValueError(f"{len(lengths)} row lengths for {table.num_rows} rows")
        self.pending.append(table)
        if self.lengths is not None:
            self.lengths.append(np.asarray(lengths, dtype=np.int64))
        self.pending_tokens += tokens
        if self.pending_tokens >= ROW_GROUP_TOKENS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            table = pa.concat_tables(self.pending).combine_chunks()
            self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.pending, self.pending_tokens = [], 0

    def close(self) -> dict:
        self._flush()
        if self.lengths is not None:
            key = DOC_LENGTHS_KEY if self.contract["format"] == TOKEN_LIST else ROW_LENGTHS_KEY
            self.writer.add_key_value_metadata({key: encode_lengths(self.lengths)})
        self.writer.close()
        size, digest = self.tmp.stat().st_size, checksum.of_file(self.tmp)
        os.replace(self.tmp, self.path)
        return {"path": self.path.name, "size": size, "checksum": digest}

    def abort(self) -> None:
        """Drop the unfinished part: close the writer (errors ignored: the disk may be full) and remove the temp."""
        try:
            self.writer.close()
        except Exception:
            pass
        self.tmp.unlink(missing_ok=True)


def encode_lengths(parts: list[np.ndarray]) -> str:
    """Row lengths as the footer value: base64 of zlib-compressed little-endian int64."""
    arr = np.concatenate(parts).astype("<i8") if parts else np.zeros(0, "<i8")
    return base64.b64encode(zlib.compress(arr.tobytes(), 1)).decode("ascii")


# ---------------------------------------------------------------- reading


def doc_lengths_of(meta: pq.FileMetaData, path: str | os.PathLike, key: str = DOC_LENGTHS_KEY) -> np.ndarray | None:
    """The row lengths a footer records under `key` (files written before the key existed: None), checked
    against the file's row count."""
    raw = (meta.metadata or {}).get(key.encode())
    if raw is None:
        return None
    try:
        lengths = np.frombuffer(zlib.decompress(base64.b64decode(raw, validate=True)), "<i8").astype(np.int64)
    except (ValueError, zlib.error):
        lengths = None
    if lengths is None or len(lengths) != meta.num_rows or (lengths < 0).any():
        raise PretokError(f"corrupt '{key}' footer metadata (not {meta.num_rows} row lengths)", path)
    return lengths


def check_no_nulls(col: pa.Array, path: str | os.PathLike, group: int | None, name: str = "input_ids") -> None:
    """A list column of a part holds no null row and no null value (a null read as a number is no token)."""
    if col.null_count or col.values.null_count:  # values: the whole child array, also under null rows
        where = f"row group {group}: " if group is not None else ""
        raise PretokError(f"{where}column '{name}' holds nulls (a pretok part has none: every row is a list of "
                          "token ids)", path)


def check_ids(ids: np.ndarray, vocab: int, path: str | os.PathLike, group: int | None = None) -> None:
    """Every id lies in [0, vocab): an id the tokenizer cannot produce is refused, never served."""
    if not ids.size:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        where = f"row group {group}: " if group is not None else ""
        raise PretokError(f"{where}token id {lo if lo < 0 else hi} outside the tokenizer's vocab [0, {vocab}) "
                          "(not written with this tokenizer, or corrupted)", path)


def read_contract(path: str | os.PathLike, expect_format: str | None = None) -> dict:
    """Open one part file, check it is a pretok parquet part of a known version; return its contract."""
    try:
        schema = pq.read_schema(path)
    except FileNotFoundError:
        raise PretokError("missing parquet part", path) from None
    except Exception as e:
        raise PretokError(f"not a readable parquet file ({type(e).__name__}: {str(e).splitlines()[0]})", path) from None
    raw = (schema.metadata or {}).get(b"pretok")
    if raw is None:
        raise PretokError("parquet file has no 'pretok' metadata (not written by pretok)", path)
    try:
        meta = json.loads(raw)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise PretokError("parquet file's 'pretok' metadata is not a JSON object (corrupt or not written by pretok)",
                          path)
    if meta.get("format_version") != PARQUET_VERSION:
        raise PretokError(f"unsupported format_version {meta.get('format_version')} (this pretok reads {PARQUET_VERSION})", path)
    if expect_format and meta.get("format") != expect_format:
        raise PretokError(f"holds format '{meta.get('format')}', expected '{expect_format}'", path)
    _check_columns(schema, meta, path)
    return meta


def _check_columns(schema: pa.Schema, meta: dict, path: str | os.PathLike) -> None:
    """The documented columns: lists of integers (any list type and integer width another writer may choose for a
    token list; fixed-size lists of `row_length` for padded rows: a variable list would cut rows anywhere)."""
    padded = meta.get("format") == PADDED
    for name in ("input_ids", "attention_mask") if padded else ("input_ids",):
        i = schema.get_field_index(name)
        typ = schema.field(i).type if i >= 0 else None
        lists = (pa.types.is_fixed_size_list,) if padded else \
            (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
        if typ is None or not any(t(typ) for t in lists):
            want = f"fixed_size_list[{meta.get('row_length')}]" if padded else "a list"
            raise PretokError(f"column '{name}' is {typ or 'missing'}, not {want} of integers (docs/FORMATS.md)", path)
        ok = pa.types.is_integer(typ.value_type) or (name == "attention_mask" and pa.types.is_boolean(typ.value_type))
        if not ok or (padded and typ.list_size != meta.get("row_length")):
            raise PretokError(f"column '{name}' is {typ}, not "
                              + (f"fixed_size_list<integer>[{meta.get('row_length')}]" if padded else "a list of integers")
                              + " (docs/FORMATS.md)", path)


def iter_documents(path: str | os.PathLike) -> Iterator[np.ndarray]:
    """Yield each stored row's tokens: the real (unpadded) tokens for padded rows, the list for token lists."""
    meta = read_contract(path)
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=4096):
        ids = batch.column("input_ids")
        if meta["format"] == PADDED:
            L = meta["row_length"]
            rows = ids.values.to_numpy(zero_copy_only=False).reshape(-1, L)
            masks = batch.column("attention_mask").values.to_numpy(zero_copy_only=False).reshape(-1, L)
            for row, m in zip(rows, masks):
                yield row[: int(m.sum())]
        else:
            values = ids.values.to_numpy(zero_copy_only=False)
            offs = ids.offsets.to_numpy()
            for a, b in zip(offs[:-1], offs[1:]):
                yield values[a:b]
