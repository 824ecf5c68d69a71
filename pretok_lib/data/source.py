"""The contract of a sample source: what `ShardedBatches`, `StatefulLoader` and `MixtureSource` read from one.

A source serves `window`-token samples (`datapaths.window(seq_len)`) in an order fixed by `seed`, `shuffle` and
the epoch. An *indexed* source (`streaming = False`) knows `num_samples` and serves any position of the epoch's
order (`sample(epoch, k)`); a *streaming* one (`streaming = True`, the on-the-fly padding-free baseline) yields
windows from a cursor (`windows(epoch, cursor)`). `order_identity()` says what, beyond window, seed, shuffle and
size, makes its order this order: a loader state is refused on any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from .packing import Sample

EXACT = {"order": "exact"}  # the order identity of a source with one order (its epoch permutation)


@runtime_checkable
class Source(Protocol):
    """What every sample source has."""

    window: int
    seed: int
    shuffle: bool
    streaming: bool

    def order_identity(self) -> dict:
        """The order this source serves, for loader states: at least {"order": ...}."""
        ...


@runtime_checkable
class IndexedSource(Source, Protocol):
    """A source addressed by position: sample k of an epoch's order, any k in [0, num_samples)."""

    num_samples: int

    def sample(self, epoch: int, k: int) -> Sample:
        ...


@runtime_checkable
class BatchedSource(IndexedSource, Protocol):
    """An indexed source that also collates a whole micro-batch at once (padded parquet rows: one gather)."""

    def batch(self, epoch: int, first: int, last: int) -> dict:
        """Order positions [first, last) collated: the same batch as `collate` of `sample(epoch, k)` for each k."""
        ...


@runtime_checkable
class StreamingSource(Source, Protocol):
    """A source read as a stream: (window, cursor after it) from a cursor (document position, token offset)."""

    def windows(self, epoch: int, cursor: tuple[int, int] | None) -> Iterator[tuple[Sample, tuple[int, int]]]:
        ...


@runtime_checkable
class PretokenizedSource(IndexedSource, Protocol):
    """A `pretok tokenize` output served as samples: its directory and its manifest (what a mixture blends)."""

    path: Path
    m: dict
