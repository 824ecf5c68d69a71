"""The five data paths of the study, declared once (torch-free: analysis and benchmarks import it too).

A *data path* (`data.kind` in a training config) is how training gets its tokens: tokenized on the fly from text
(the original study's two baselines) or read from a `pretok tokenize` output of some format. Packed paths cut
documents into `seq_len + 1` windows; padded paths give one document per row, padded.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

# The kinds, by name: the only place their strings are written (tests/test_datapaths.py checks the package).
PADDED, PADDING_FREE = "padded", "padding-free"
PRETOK_PADDED, PRETOK_TOKEN_LIST, PRETOK_MEMMAP = "pretok-padded", "pretok-token-list", "pretok-memmap"
BASELINE = PADDED         # the original study's baseline: speedups are ratios to it
DEFAULT = PRETOK_MEMMAP   # training's default data path, its held-out split's, and the study's pretokenized one


@dataclass(frozen=True)
class DataPath:
    """One data path and what each layer needs of it. Readers are named `module:Class` and imported on use, so
    this module stays import-light (no torch, no pyarrow)."""

    name: str
    format: str | None      # the `pretok tokenize --format` it reads; None: tokenizes text on the fly
    packed: bool            # windows of packed documents (else one padded document per row)
    baseline: str           # the on-the-fly path with the same layout (itself for the baselines)
    reader: str             # its sample source (`data.make_source` builds it)
    colour: str             # its colour in every figure
    row_groups: bool = False  # parquet row-group reader: `data.order` block/exact, cache (`data.cache_mb`)
    inram_reader: str | None = None  # the in-RAM reader it replaced (`pretok bench loaders --memory`)

    @property
    def on_the_fly(self) -> bool:
        return self.format is None

    @property
    def layout(self) -> str:
        """"packed" or "padded": batches of one layout cannot be mixed with the other's."""
        return "packed" if self.packed else "padded"

    def reader_class(self) -> Any:
        return load(self.reader)


def load(dotted: str) -> Any:
    """The object a `module:name` string names (imported now)."""
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


_D = "pretok_lib.data."
REGISTRY: tuple[DataPath, ...] = (
    DataPath(PADDED, None, False, PADDED, _D + "baselines:PaddedText", "#d62728"),
    DataPath(PADDING_FREE, None, True, PADDING_FREE, _D + "baselines:PaddingFreeStream", "#ff7f0e"),
    DataPath(PRETOK_PADDED, "padded", False, PADDED, _D + "pretokenized:PaddedRows", "#9467bd", row_groups=True,
             inram_reader=_D + "inram:InRamPaddedRows"),
    DataPath(PRETOK_TOKEN_LIST, "token-list", True, PADDING_FREE, _D + "pretokenized:TokenListPacked", "#2ca02c",
             row_groups=True, inram_reader=_D + "inram:InRamTokenList"),
    DataPath(PRETOK_MEMMAP, "memmap", True, PADDING_FREE, _D + "pretokenized:MemmapPacked", "#1f77b4"),
)
BY_NAME = {p.name: p for p in REGISTRY}
KINDS = tuple(p.name for p in REGISTRY)                          # canonical order (tables, figures)
ON_THE_FLY = tuple(p.name for p in REGISTRY if p.on_the_fly)
PRETOKENIZED = tuple(p.name for p in REGISTRY if not p.on_the_fly)
PACKED = tuple(p.name for p in REGISTRY if p.packed)
PARQUET_KINDS = tuple(p.name for p in REGISTRY if p.row_groups)  # row-group readers
FORMAT_OF = {p.name: p.format for p in REGISTRY if p.format}     # pretokenized path -> format
KIND_OF_FORMAT = {f: k for k, f in FORMAT_OF.items()}            # format -> pretokenized path
# Each pretokenized path and the on-the-fly path with the same layout: their ratio isolates tokenization.
PRETOK_PAIRS = {p.name: p.baseline for p in REGISTRY if not p.on_the_fly}
COLOURS = {p.name: p.colour for p in REGISTRY}
# What the study reports: the pretokenized path of each layout (packed, padded), and packed over padded pairs
# (the gain of packing, on the fly and pretokenized).
STUDY_PRETOKENIZED = (PRETOK_MEMMAP, PRETOK_PADDED)
PACKING_PAIRS = ((PADDING_FREE, PADDED), (PRETOK_MEMMAP, PRETOK_PADDED))


def global_batch(micro_batch: int, world: int, grad_accum: int = 1) -> int:
    """Sequences per optimizer step: micro-batch x ranks x gradient-accumulation steps (one DataLoader step of
    the global order is `micro_batch x world` of them)."""
    return micro_batch * world * grad_accum


def window(seq_len: int) -> int:
    """Tokens per sample: `seq_len` inputs and their labels, shifted by one."""
    return seq_len + 1


def rank(kind: str | None) -> tuple[int, str]:
    """Sort key putting the data paths in their canonical order, unknown ones after."""
    k = kind or "?"
    return (KINDS.index(k) if k in KINDS else len(KINDS), k)
