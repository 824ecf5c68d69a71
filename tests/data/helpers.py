"""Helpers for the data-path tests: building datasets of each path, running loaders, and an independent
reference of the global sample order (documents tokenized here with HF `tokenizers`, permuted with numpy's
`default_rng([seed, epoch])`, padded or packed by hand) that the five paths must reproduce."""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import tokenizers

from pretok_lib.data import ShardedBatches, make_dataset, make_loader, make_source

from ..conftest import GPT2_JSON

GPT2 = str(GPT2_JSON)
BOS = PAD = 50256  # GPT-2: <|endoftext|> is BOS (stored at every document start) and the padding id
PAD_SEQ_LEN = 128  # the padded outputs hold rows of 129 tokens
KINDS = ("padded", "padding-free", "pretok-padded", "pretok-token-list", "pretok-memmap")
PRETOK_KINDS = ("pretok-padded", "pretok-token-list", "pretok-memmap")
PADDED_KINDS = ("padded", "pretok-padded")
PACKED_KINDS = ("padding-free", "pretok-token-list", "pretok-memmap")


@dataclass(frozen=True)
class Corpus:
    name: str
    text: Path  # the text input the baselines read
    dirs: dict = field(hash=False)  # kind -> pretokenized output dir

    def path(self, kind: str):
        return self.text if kind in ("padded", "padding-free") else self.dirs[kind]


def dataset(corpus: Corpus, kind: str, seq_len: int, **kw):
    if kind in ("padded", "padding-free"):
        kw.setdefault("tokenizer", GPT2)
    return make_dataset(kind, corpus.path(kind), seq_len, **kw)


@functools.cache
def source(corpus: Corpus, kind: str, seq_len: int, seed: int = 0, shuffle: bool = True):
    """One (cached) sample source, shared by the ranks of a test: building a baseline's source reads the text
    and loads the tokenizer (~0.2 s), which would dominate runs over many ranks."""
    kw = {"tokenizer": GPT2} if kind in ("padded", "padding-free") else {}
    return make_source(kind, corpus.path(kind), seq_len, seed=seed, shuffle=shuffle, **kw)


def sharded(corpus: Corpus, kind: str, seq_len: int, micro_batch: int, rank: int, world: int,
            doc_aware: bool = False, **source_kw) -> ShardedBatches:
    return ShardedBatches(source(corpus, kind, seq_len, **source_kw), micro_batch, rank, world, doc_aware)


def run(ds, num_workers: int = 0, limit: int | None = None, loader=None):
    """Iterate a loader over `ds` (or the given loader); return (loader, batches) stopping after `limit`."""
    loader = loader if loader is not None else make_loader(ds, num_workers=num_workers)
    out = []
    if limit == 0:
        return loader, out
    for b in loader:
        out.append(b)
        if limit is not None and len(out) == limit:
            break
    return loader, out


def rows(batch) -> list[tuple]:
    """Each sample of a batch as a hashable tuple of its input ids."""
    return [tuple(r) for r in batch["input_ids"].tolist()]


def content(batch) -> dict:
    """Everything a batch carries except its bookkeeping (step/epoch), as plain Python values."""
    out = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in batch.items() if k not in ("step", "epoch")}
    return out


def flatten_steps(per_rank: list[list[dict]]) -> list[tuple]:
    """The global sample sequence: step by step, rank 0's micro-batch, then rank 1's, ..."""
    steps = {len(b) for b in per_rank}
    assert len(steps) == 1, f"ranks yielded different numbers of batches: {[len(b) for b in per_rank]}"
    out = []
    for s in range(steps.pop()):
        for batches in per_rank:
            out += rows(batches[s])
    return out


# ------------------------------------------------------------------ the independent reference


@functools.cache
def _ref_tokenizer() -> tokenizers.Tokenizer:
    t = tokenizers.Tokenizer.from_file(GPT2)
    t.encode_special_tokens = True  # literal "<|endoftext|>" in text is text, as in the engine
    return t


@functools.cache
def texts(path: Path) -> tuple[str, ...]:
    if path.suffix == ".parquet":
        return tuple(pq.read_table(path).column("text").to_pylist())
    return tuple(json.loads(line)["text"] for line in path.open())


@functools.cache
def ref_docs(path: Path) -> tuple[np.ndarray, ...]:
    """Every document as [BOS, *ids], tokenized here with HF tokenizers (not through pretok_lib)."""
    enc = _ref_tokenizer().encode_batch(list(texts(path)), add_special_tokens=False)
    return tuple(np.array([BOS, *e.ids], dtype=np.int64) for e in enc)


def ref_order(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)


def ref_samples(corpus: Corpus, kind: str, seq_len: int, seed: int = 0, epoch: int = 0,
                shuffle: bool = True) -> list[np.ndarray]:
    """The epoch's samples (seq_len + 1 tokens each) in global order, computed by hand."""
    docs = ref_docs(corpus.text)
    order = ref_order(len(docs), seed, epoch, shuffle)
    W = seq_len + 1
    if kind in PADDED_KINDS:
        out = []
        for i in order:
            row = np.full(W, PAD, dtype=np.int64)
            d = docs[i][:W]
            row[: len(d)] = d
            out.append(row)
        return out
    stream = np.concatenate([docs[i] for i in order])
    n = len(stream) // W
    return list(stream[: n * W].reshape(n, W))


def ref_rows(corpus: Corpus, kind: str, seq_len: int, **kw) -> list[tuple]:
    return [tuple(s[:-1].tolist()) for s in ref_samples(corpus, kind, seq_len, **kw)]


def multiset(xs) -> Counter:
    return Counter(xs)
