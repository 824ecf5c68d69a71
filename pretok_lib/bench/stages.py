"""A worker's path taken apart: the stages a worker runs, in one process on one pinned core, with no queues,
threads or other processes, each timed in CPU seconds per GB of text. Encoding's share of the sum bounds what any
engine that reads the same input and writes the same output on the same cores can reach against the in-memory
ceiling (which times encoding alone): wN / ceiling <= encoding alone / total.

Stages, per row group of the text column: read (Parquet decompress + decode to an Arrow string array), str (Arrow to
Python `str`, what the encoder takes), encode (the backend's `encode_batch`, ~batch_bytes batches), special (BOS
inserted and cast to the output's dtype, `engine.parts.add_special`), then per format:
- memmap: hash (the batch kept as a part, `engine.parts.HeldPart`, and the XXH3-128 of its ids and lengths) and
  write (`memmap_place.write_held` into a data file and a lengths file at their running offsets, as a worker writes
  a part it kept in memory);
- token-list, padded: table (the Arrow table of the rows: `formats.parquet.tokenlist_table` / `padded_table`) and
  write (`ParquetPartWriter`: row groups compressed with the default codec, the part's checksum at close; a part
  per 1/32 of the input, as the engine cuts these formats).

The bound: the same batches encoded alone (texts in memory, as the ceiling times them) over the stages' total.
`scripts/engine_stages.py` runs it from the command line; `pretok bench tokenize` runs it beside the engine
(`bounds`, in a spawned child) and reports each format's wN / ceiling against its bound.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ..analysis.uncertainty import estimate
from ..engine.config import PARTS_PARQUET
from ..engine.memmap_place import Placement, write_held
from ..engine.parts import HeldPart, add_special
from ..formats import TRAIN_COMPRESSION
from ..formats import parquet as pqf
from ..sources.arrow_text import byte_lengths

STAGES = {"memmap": ("read", "str", "encode", "special", "hash", "write"),
          "token-list": ("read", "str", "encode", "special", "table", "write"),
          "padded": ("read", "str", "encode", "special", "table", "write")}
SEQ_LEN = 2048  # padded rows: the engine's default


class _Output:
    """What a worker does with a batch's ids once they carry BOS and the dtype, per format, timed into `spent`."""

    def __init__(self, fmt: str, d: str, dtype: np.dtype, pad_id: int, part_bytes: int, spent: dict):
        self.fmt, self.d, self.spent, self.part_bytes = fmt, d, spent, part_bytes
        if fmt == "memmap":
            self.dtype, self.targets = dtype, [os.path.join(d, "data.bin"), os.path.join(d, "data.lens")]
            for path in self.targets:
                open(path, "wb").close()
            self.at = [0, 0]
        else:
            self.schema = pqf.schema_for(fmt, dtype.name, SEQ_LEN, pad_id)
            self.writer, self.parts, self.in_part = None, 0, 0

    def add(self, ids: np.ndarray, offsets: np.ndarray, text_bytes: int) -> None:
        cpu = time.process_time
        if self.fmt == "memmap":  # a part per batch, kept and written as a worker does
            t = cpu()
            part = HeldPart(Path(self.d) / "part", self.dtype.name, limit=1 << 62)
            part.add(ids, np.diff(offsets))
            part.hashes()
            self.spent["hash"] += cpu() - t
            t = cpu()
            sizes = [sum(b.nbytes for b in part.buffers(ext)) for ext in (".bin", ".lens")]
            write_held(Placement(0, "", tuple((ext, target, at, size) for ext, target, at, size in zip(
                (".bin", ".lens"), self.targets, self.at, sizes))), part)
            self.at = [at + size for at, size in zip(self.at, sizes)]
            self.spent["write"] += cpu() - t
            return
        t = cpu()
        if self.fmt == "token-list":
            table, n = pqf.tokenlist_table(ids, offsets, self.schema), np.diff(offsets)
        else:
            table, _ = pqf.padded_table(ids, offsets, self.schema)
            n = np.minimum(np.diff(offsets), SEQ_LEN + 1)
        self.spent["table"] += cpu() - t
        t = cpu()
        if self.writer is None:
            self.writer = pqf.ParquetPartWriter(os.path.join(self.d, f"part-{self.parts}.parquet"), self.schema,
                                                TRAIN_COMPRESSION)
        self.writer.write(table, int(n.sum()), n)
        self.in_part += text_bytes
        if self.in_part >= self.part_bytes:
            self.close()
        self.spent["write"] += cpu() - t

    def close(self) -> None:
        if self.fmt != "memmap" and self.writer is not None:
            self.writer.close()
            self.writer, self.parts, self.in_part = None, self.parts + 1, 0


def one_round(corpus: str, fmt: str, enc, bos: int | None, dtype: np.dtype, batch_bytes: int, workdir: str,
              max_bytes: int | None = None, keep: list | None = None) -> dict[str, float]:
    """CPU seconds per GB of text of each stage over the corpus (with `max_bytes`: over every k-th row group, k such
    that ~`max_bytes` of text spread over the whole file are read), once. `keep`: the encoded batches of texts are
    appended to it."""
    cpu, spent, text = time.process_time, dict.fromkeys(STAGES[fmt], 0.0), 0
    pf = pq.ParquetFile(corpus)
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        out = None
        for rg in sampled_row_groups(pf.metadata, max_bytes):
            t = cpu()
            arr = pf.read_row_group(rg, columns=["text"], use_threads=False).column(0).combine_chunks()
            spent["read"] += cpu() - t
            ends = np.cumsum(byte_lengths(arr))
            if out is None:  # parquet parts: 1/32 of the input's text (estimated from the first row group)
                part_bytes = int(ends[-1]) * pf.metadata.num_row_groups // PARTS_PARQUET if len(arr) else 1
                out = _Output(fmt, d, dtype, bos if bos is not None else 0, part_bytes, spent)
            start = 0
            while start < len(arr):
                base = int(ends[start - 1]) if start else 0
                stop = max(start + 1, int(np.searchsorted(ends, base + batch_bytes, side="right")))
                text += int(ends[stop - 1]) - base
                t = cpu()
                texts = arr.slice(start, stop - start).to_pylist()
                spent["str"] += cpu() - t
                start = stop
                t = cpu()
                ids, offsets = enc.encode_batch(texts)
                spent["encode"] += cpu() - t
                if keep is not None:
                    keep.append(texts)
                t = cpu()
                ids, offsets = add_special(ids, offsets, bos, None, dtype)
                spent["special"] += cpu() - t
                out.add(ids, offsets, int(ends[stop - 1]) - base)
        if out is not None:
            t = cpu()
            out.close()
            spent["write"] += cpu() - t
    return {k: v / (max(text, 1) / 1e9) for k, v in spent.items()}


def sampled_row_groups(meta, max_bytes: int | None) -> range:
    """Every row group, or every k-th one where the file's uncompressed size (~its text) is over `max_bytes`."""
    groups = meta.num_row_groups
    size = sum(meta.row_group(i).total_byte_size for i in range(groups))
    step = 1 if max_bytes is None or size <= max_bytes else -(-size // max(1, max_bytes))
    return range(0, groups, step)


def encode_alone(enc, batches: list[list[str]]) -> float:
    """CPU seconds of encoding `batches` already in memory, back to back (what the ceiling times)."""
    t = time.process_time()
    for texts in batches:
        enc.encode_batch(texts)
    return time.process_time() - t


def bounds(corpus: str, tok_spec: str, backend: str, formats: list[str], rounds: int, batch_bytes: int,
           workdir: str, max_bytes: int | None = None, cpu: int | None = 0) -> dict[str, dict]:
    """Per format: every round's stages (CPU-s per GB of text), their medians, the total and the bound on wN /
    ceiling (median and interval over the rounds): encoding the same batches alone, in memory, as the ceiling does
    (`alone`, timed in the same round), over the stages' total. Encoding inside the stages costs more than alone
    (the read and the writes between batches evict its caches), which no engine on a loaded machine avoids; the
    stages' own encode / total is kept as `encode_share`. The formats alternate within each round; every pass has a
    fresh encoder (as each engine run and the ceiling have: caches warm from an earlier pass would make encoding
    cheaper). Pins this process to `cpu` (None: as it is)."""
    from ..tokenizer import id_dtype_for, limit_threads_to_one_cpu, load_tokenizer, make_encoder

    limit_threads_to_one_cpu(cpu)
    info = load_tokenizer(tok_spec)
    dtype = np.dtype(id_dtype_for(info.vocab_size)).newbyteorder("<")

    def fresh():
        enc = make_encoder(info, backend)
        enc.encode_batch(["warm up"])
        return enc

    per: dict[str, list[dict[str, float]]] = {fmt: [] for fmt in formats}
    for _ in range(max(1, rounds)):
        batches: list[list[str]] = []
        for k, fmt in enumerate(formats):
            per[fmt].append(one_round(corpus, fmt, fresh(), info.bos_id, dtype, batch_bytes, workdir, max_bytes,
                                      batches if k == 0 else None))
        text = sum(len(t.encode("utf-8")) for b in batches for t in b)
        alone = encode_alone(fresh(), batches) / (max(text, 1) / 1e9)
        for fmt in formats:
            per[fmt][-1] = {**per[fmt][-1], "alone": alone}
    out = {}
    for fmt, rs in per.items():
        stages = [{k: r[k] for k in STAGES[fmt]} for r in rs]
        share = estimate(r["alone"] / sum(s.values()) for r, s in zip(rs, stages))
        inside = estimate(s["encode"] / sum(s.values()) for s in stages)
        out[fmt] = {"rounds": stages, "stages": {k: statistics.median(s[k] for s in stages) for k in STAGES[fmt]},
                    "total": statistics.median(sum(s.values()) for s in stages),
                    "alone": statistics.median(r["alone"] for r in rs),
                    "bound": {"median": share.median, "interval": [share.lo, share.hi], "n": share.n},
                    "encode_share": {"median": inside.median, "interval": [inside.lo, inside.hi], "n": inside.n},
                    "backend": backend, "max_bytes": max_bytes}
    return out

