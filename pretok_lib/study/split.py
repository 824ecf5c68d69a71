"""The study's documents: the researcher's inputs read as `pretok tokenize` reads them (globs, text column,
separator), split once into a training corpus and a held-out validation corpus (docs/STUDY.md "Your data").

Both are written as parquet (`text` column) in `data/corpus/`, so every later step reads the same documents
whatever the input format: the pretokenized datasets, the tokenize benchmark, and the on-the-fly baselines of the
training runs (which read text with no separator). A document is held out by a hash of its text, so the split is
deterministic, independent of the input order and of the machine, and a document that occurs twice is never on
both sides; no training run reads the held-out corpus.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PretokError

HELDOUT_MIN_DOCS = 64   # documents held out at least (when the corpus has 2x as many): eval batches need rows
ROW_GROUP_BYTES = 8 << 20
SPLIT_VERSION = 1


@dataclass(frozen=True)
class Split:
    """Where the two corpora are, and how many documents each holds."""

    train: str
    heldout: str
    train_docs: int
    heldout_docs: int


def doc_hash(text: str) -> int:
    """The 64-bit hash that places a document (blake2b of its UTF-8 text)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def heldout_count(documents: int, fraction: float, min_docs: int = HELDOUT_MIN_DOCS) -> int:
    """Documents to hold out: `fraction` of them, at least `min_docs` where the corpus has twice as many, at least
    one, never more than half. PretokError for fewer than 2 documents (nothing left to train or to validate on)."""
    if documents < 2:
        raise PretokError(f"the corpus has {documents} document(s): the study needs at least 2 (one is held out for "
                          "validation); a text file is one document unless --set separator=... splits it")
    return max(1, min(max(math.ceil(fraction * documents), min_docs), documents // 2))


def heldout_threshold(hashes: np.ndarray, k: int, where: str = "") -> int:
    """The largest hash held out: the smallest one with at least `k` documents at or below it, but never the
    largest (a duplicated text counts once per copy and all its copies go one way: some text stays for training).
    PretokError when every document is the same text."""
    values, counts = np.unique(hashes, return_counts=True)
    if len(values) < 2:
        raise PretokError("every document of the corpus is the same text: nothing left to train on besides the "
                          "held-out documents", where)
    i = int(np.searchsorted(np.cumsum(counts), k))
    return int(values[min(i, len(values) - 2)])


def iter_documents(inputs: Sequence[str], text_column: str = "text", separator: str | None = None
                   ) -> Iterator[str]:
    """The documents of `inputs` (files, globs) as `pretok tokenize` reads them, in its order (bad ones skipped)."""
    from ..sources import SourceOptions, expand_inputs, plan_units, read_unit

    opts = SourceOptions(text_column=text_column, separator=separator)
    for unit in plan_units(expand_inputs(list(inputs)), opts):
        for batch in read_unit(unit, opts):
            yield from batch.texts


def source_stamp(inputs: Sequence[str], text_column: str, separator: str | None, fraction: float) -> dict:
    """What the split depends on: each input file's path, size and mtime, how it is read, the fraction."""
    from ..sources import expand_inputs

    files = [[f.path, f.size, f.mtime_ns, list(f.version)] for f in expand_inputs(list(inputs))]
    return {"version": SPLIT_VERSION, "files": files, "text_column": text_column, "separator": separator,
            "fraction": fraction, "min_docs": HELDOUT_MIN_DOCS}


def split_corpus(inputs: Sequence[str], out_dir: str | os.PathLike, fraction: float = 0.02,
                 text_column: str = "text", separator: str | None = None) -> Split:
    """Write `out_dir/train.parquet` and `out_dir/heldout.parquet` from `inputs` (reused when `split.json` says
    they were made from the same inputs the same way). The held-out documents are those of the `heldout_count`
    smallest hashes (`doc_hash`; equal texts, equal hashes: a duplicate goes with its twin), in input order.
    Written under temp names and renamed, `split.json` last."""
    out = Path(out_dir)
    stamp = source_stamp(inputs, text_column, separator, fraction)
    record = out / "split.json"
    try:
        done = json.loads(record.read_text())
        if done.get("source") == stamp and all((out / f).is_file() for f in ("train.parquet", "heldout.parquet")):
            return Split(**{k: done[k] for k in ("train", "heldout", "train_docs", "heldout_docs")})
    except (OSError, ValueError, KeyError, TypeError):
        pass
    hashes = np.fromiter((doc_hash(t) for t in iter_documents(inputs, text_column, separator)), np.uint64)
    threshold = heldout_threshold(hashes, heldout_count(len(hashes), fraction), str(inputs[0]))
    out.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)   # from here the two files no longer match an older record
    counts = _write_split(iter_documents(inputs, text_column, separator), threshold, out)
    result = Split(str(out / "train.parquet"), str(out / "heldout.parquet"), counts[0], counts[1])
    from ..atomic import atomic_write_json

    atomic_write_json(record, {"source": stamp, "train": result.train, "heldout": result.heldout,
                               "train_docs": result.train_docs, "heldout_docs": result.heldout_docs})
    return result


def _write_split(docs: Iterator[str], threshold: int, out: Path) -> tuple[int, int]:
    """Stream `docs` into the two parquet files (temp names, renamed at the end); (train, held-out) counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("text", pa.string())])
    names = ("train.parquet", "heldout.parquet")
    tmps = [out / f".{n}.tmp" for n in names]
    writers: list = []
    pending: list[list[str]] = [[], []]
    size, counts = [0, 0], [0, 0]
    try:   # the writers are made inside: a stop landing in a constructor (its file made) removes the files too
        for t in tmps:
            writers.append(pq.ParquetWriter(str(t), schema, compression="zstd"))
        for text in docs:
            side = int(doc_hash(text) <= threshold)
            pending[side].append(text)
            size[side] += len(text)
            counts[side] += 1
            if size[side] >= ROW_GROUP_BYTES:
                writers[side].write_table(pa.table({"text": pending[side]}, schema=schema))
                pending[side], size[side] = [], 0
        for side in (0, 1):
            if pending[side]:
                writers[side].write_table(pa.table({"text": pending[side]}, schema=schema))
        for w in writers:
            w.close()
        for t, n in zip(tmps, names):
            os.replace(t, out / n)
    except BaseException:
        for i, t in enumerate(tmps):
            try:
                if i < len(writers):
                    writers[i].close()
            finally:
                t.unlink(missing_ok=True)
        raise
    return counts[0], counts[1]
