"""The five data paths of the study, declared once (torch-free: analysis and benchmarks import it too).

A *data path* (`data.kind` in a training config) is how training gets its tokens: tokenized on the fly from text
(the original study's two baselines) or read from a `pretok tokenize` output of some format. Packed paths cut
documents into `seq_len + 1` windows; padded paths give one document per row, padded.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataPath:
    name: str
    format: str | None      # the `pretok tokenize --format` it reads; None: tokenizes text on the fly
    packed: bool            # windows of packed documents (else one padded document per row)
    baseline: str           # the on-the-fly path with the same layout (itself for the baselines)

    @property
    def on_the_fly(self) -> bool:
        return self.format is None


REGISTRY: tuple[DataPath, ...] = (
    DataPath("padded", None, packed=False, baseline="padded"),
    DataPath("padding-free", None, packed=True, baseline="padding-free"),
    DataPath("pretok-padded", "padded", packed=False, baseline="padded"),
    DataPath("pretok-token-list", "token-list", packed=True, baseline="padding-free"),
    DataPath("pretok-memmap", "memmap", packed=True, baseline="padding-free"),
)
BY_NAME = {p.name: p for p in REGISTRY}
KINDS = tuple(p.name for p in REGISTRY)                          # canonical order (tables, figures)
ON_THE_FLY = tuple(p.name for p in REGISTRY if p.on_the_fly)
PRETOKENIZED = tuple(p.name for p in REGISTRY if not p.on_the_fly)
PACKED = tuple(p.name for p in REGISTRY if p.packed)
PARQUET_KINDS = tuple(p.name for p in REGISTRY if p.format in ("padded", "token-list"))  # row-group readers
FORMAT_OF = {p.name: p.format for p in REGISTRY if p.format}     # pretokenized path -> format
KIND_OF_FORMAT = {f: k for k, f in FORMAT_OF.items()}            # format -> pretokenized path
# Each pretokenized path and the on-the-fly path with the same layout: their ratio isolates tokenization.
PRETOK_PAIRS = {p.name: p.baseline for p in REGISTRY if not p.on_the_fly}


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
