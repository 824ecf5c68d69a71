"""The global sample order: a permutation per (seed, epoch), cut into global batches, sliced by rank and worker.

Contract (docs/ARCHITECTURE.md, "Sharding and resume of the loaders"):
- An epoch's order comes from `numpy.random.default_rng([seed, epoch])` (identity when not shuffling): a
  permutation of the rows for the padded paths, of the documents for the packed paths (which then cut the
  permuted stream into consecutive windows). It does not depend on world size, micro-batch or workers.
- The order is consumed in global batches of `micro_batch * world_size` samples; rank r takes the r-th
  contiguous slice of each global batch. A remainder smaller than one global batch is dropped at the end of
  the epoch (a different tail each epoch when shuffling), so every rank yields the same number of batches.
- DataLoader worker w of W produces the rank's steps w, w+W, ...; PyTorch's round-robin over workers then
  yields them in step order.
- The resumable position is (epoch, samples consumed in the epoch): O(1) to restore, and valid for any new
  world size or micro-batch size (elastic): the remaining samples are taken in the same order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np


@dataclass
class Position:
    """Where the global order stands: `consumed` samples of `epoch` are done (by all ranks together)."""

    epoch: int = 0
    consumed: int = 0
    cursor: tuple[int, int] | None = None  # streaming sources only: (document position, token offset)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Position":
        cur = d.get("cursor")
        return cls(int(d["epoch"]), int(d["consumed"]), tuple(cur) if cur is not None else None)


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of `n` items in `epoch`: a seeded permutation, or 0..n-1."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


@dataclass(frozen=True)
class Shard:
    """Who is reading: rank/world (DDP) and worker/workers (DataLoader), with the micro-batch size."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1
    micro_batch: int = 1

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.world


def steps_left(num_samples: int, pos: Position, global_batch: int) -> int:
    """Full global batches remaining in the epoch (the remainder is dropped)."""
    return max(0, (num_samples - pos.consumed) // global_batch)


def my_steps(num_samples: int, pos: Position, shard: Shard) -> Iterator[tuple[int, int, int]]:
    """Yield (step, first, last) for this rank and worker: global order positions [first, last) of its slices."""
    gb = shard.global_batch
    for step in range(shard.worker, steps_left(num_samples, pos, gb), shard.workers):
        first = pos.consumed + step * gb + shard.rank * shard.micro_batch
        yield step, first, first + shard.micro_batch
