"""What training reads: the five data paths behind one factory, sharded by rank and worker, resumable.

    ds = make_dataset("pretok-memmap", "runs/demo/memmap", seq_len=1024, micro_batch=8, seed=0)
    loader = make_loader(ds, num_workers=2)
    for batch in loader: ...                      # input_ids, labels, counts; loader.state_dict() to resume

A weighted mixture of pretokenized datasets is one more source (`open_mixture`, docs/MIXTURES.md):
    ds = ShardedBatches(open_mixture([("runs/code/memmap", 0.3), ("runs/web/memmap", 0.7)], 1024), 8)
"""

from __future__ import annotations

import os
from typing import Sequence

from ..datapaths import BY_NAME, KINDS, PARQUET_KINDS
from ..errors import PretokError
from .loader import ShardedBatches, StatefulLoader, dist_rank_world
from .mixture import MixtureSource, open_mixture
from .pretokenized import BLOCK_GROUPS, CACHE_MB



def make_source(kind: str, path: str | os.PathLike | Sequence[str], seq_len: int, *, tokenizer: str | None = None,
                seed: int = 0, shuffle: bool = True, text_column: str = "text", backend: str | None = None,
                verify_on_open: bool = False, order: str | None = None, block_groups: int = BLOCK_GROUPS,
                cache_mb: float = CACHE_MB, bos: str = "auto", eos: str = "no", separator: str | None = None):
    """The sample source of one data path. Baselines read text (`path`: inputs) and need `tokenizer`;
    pretokenized paths read a `pretok tokenize` output dir and check it against `tokenizer` if given, and with
    `verify_on_open` check its data files against the manifest's checksums before serving anything.
    Parquet paths only: `order` "block" (their default: `block_groups` row groups shuffled at a time; the exact
    permutation on data of at most that many row groups) or "exact"; `cache_mb` of decoded row groups kept per
    process. Other paths: "exact" only (their default).

    Args:
        kind: a data path of datapaths.REGISTRY; path: its input files (baselines) or dataset dir (pretokenized).
        seq_len: tokens per training sample; tokenizer: the tokenizer spec (baselines: required).
        seed, shuffle: the global order; text_column: the baselines' text column; backend: a forced encoder.
        bos, eos, separator: the baselines' `pretok tokenize --bos/--eos/--separator` (pretokenized data carries
            its own, in its manifest).
        verify_on_open: check data files against the manifest first; order, block_groups, cache_mb: parquet paths.
    """
    if kind not in KINDS:
        raise PretokError(f"unknown data path '{kind}' (choose from {', '.join(KINDS)})")
    if seq_len < 1:
        raise PretokError(f"seq_len must be >= 1 (got {seq_len})")
    if order not in (None, "exact") and kind not in PARQUET_KINDS:
        raise PretokError(f"data order '{order}' applies to the parquet paths ({', '.join(PARQUET_KINDS)}), "
                          f"not '{kind}' (use order 'exact')")
    p = BY_NAME[kind]
    cls = p.reader_class()
    if p.on_the_fly:
        if tokenizer is None:
            raise PretokError(f"data path '{kind}' tokenizes on the fly: give a tokenizer")
        inputs = [str(path)] if isinstance(path, (str, os.PathLike)) else [str(p) for p in path]
        return cls(inputs, seq_len, tokenizer, seed=seed, shuffle=shuffle, text_column=text_column, backend=backend,
                   bos=bos, eos=eos, separator=separator)
    fingerprint = None
    if tokenizer is not None:
        from ..tokenizer import load_tokenizer

        fingerprint = load_tokenizer(tokenizer).fingerprint
    rows = {"order": order or "block", "block_groups": block_groups, "cache_mb": cache_mb} if p.row_groups else {}
    return cls(path, seq_len, seed=seed, shuffle=shuffle, tokenizer_fingerprint=fingerprint,
               verify_on_open=verify_on_open, **rows)

def make_dataset(kind: str, path, seq_len: int, *, micro_batch: int = 8, rank: int | None = None,
                 world: int | None = None, doc_aware: bool = False, **source_kw) -> ShardedBatches:
    """One data path as an IterableDataset of this rank's collated micro-batches (see `make_source`)."""
    return ShardedBatches(make_source(kind, path, seq_len, **source_kw), micro_batch, rank, world, doc_aware)


def make_loader(dataset: ShardedBatches, num_workers: int = 0, pin_memory: bool | None = None,
                prefetch_factor: int | None = 2) -> StatefulLoader:
    return StatefulLoader(dataset, num_workers, pin_memory, prefetch_factor)


__all__ = ["KINDS", "make_source", "make_dataset", "make_loader", "ShardedBatches", "StatefulLoader",
           "dist_rank_world", "MixtureSource", "open_mixture"]
