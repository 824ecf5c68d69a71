"""The global sample order: a permutation per (seed, epoch), cut into loader steps, sliced by rank and worker.

Contract (docs/ARCHITECTURE.md, "Sharding and resume of the loaders"):
- An epoch's order comes from `numpy.random.default_rng([seed, epoch])` (identity when not shuffling): a
  permutation of the rows for the padded paths, of the documents for the packed paths (which then cut the
  permuted stream into consecutive windows). It does not depend on world size, micro-batch or workers.
- The parquet paths take the `block` order by default (`data.order: block`, see `block_permutation`): row
  groups shuffled, then rows shuffled within windows of `block_groups` row groups, so a reader decodes each row
  group about once per epoch. Deterministic from (seed, epoch) and the data's row-group layout alone; on data of
  at most `block_groups` row groups it is exactly the permutation above. `data.order: exact` forces the above.
- The order is consumed in steps of `micro_batch * world_size` samples (`step_samples`; the optimizer's global
  batch is grad_accum such steps); rank r takes the r-th contiguous slice of each step. A remainder smaller
  than one step is dropped at the end of the epoch (a different tail each epoch when shuffling), so every rank
  yields the same number of batches.
- DataLoader worker w of W produces the rank's steps w, w+W, ...; PyTorch's round-robin over workers then
  yields them in step order.
- The resumable position is (epoch, samples consumed in the epoch): O(1) to restore, and valid for any new
  world size or micro-batch size (elastic): the remaining samples are taken in the same order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

from ..datapaths import global_batch


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
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64, copy=False)


@dataclass(frozen=True)
class Shard:
    """Who is reading: rank/world (DDP) and worker/workers (DataLoader), with the micro-batch size."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1
    micro_batch: int = 1

    @property
    def step_samples(self) -> int:
        return step_samples(self.micro_batch, self.world)


def step_samples(micro_batch: int, world: int) -> int:
    """Samples one loader step takes from the global order: a micro-batch on every rank. The optimizer's global
    batch is this times the gradient-accumulation steps (`datapaths.global_batch`), which the order never sees."""
    return global_batch(micro_batch, world)


def steps_left(num_samples: int, pos: Position, step_samples: int) -> int:
    """Full loader steps (`step_samples` each) remaining in the epoch (the remainder is dropped)."""
    return max(0, (num_samples - pos.consumed) // step_samples)


def my_steps(num_samples: int, pos: Position, shard: Shard) -> Iterator[tuple[int, int, int]]:
    """Yield (step, first, last) for this rank and worker: global order positions [first, last) of its slices."""
    gb = shard.step_samples
    for step in range(shard.worker, steps_left(num_samples, pos, gb), shard.workers):
        first = pos.consumed + step * gb + shard.rank * shard.micro_batch
        yield step, first, first + shard.micro_batch


ORDERS = ("exact", "block")


def block_windows(group_rows: np.ndarray, seed: int, epoch: int, shuffle: bool, block: int):
    """(row groups in the epoch's block order, first order position of each window of `block` groups + the end).
    The group order is `default_rng([seed, epoch, 1]).permutation(G)` (file order when not shuffling)."""
    counts = np.asarray(group_rows, dtype=np.int64)
    if block < 1:
        raise ValueError(f"block must be >= 1 (got {block})")
    groups = np.random.default_rng([seed, epoch, 1]).permutation(len(counts)) if shuffle else np.arange(len(counts))
    per_window = np.add.reduceat(counts[groups], np.arange(0, len(groups), block)) if len(groups) else counts[:0]
    return groups, np.concatenate([[0], np.cumsum(per_window)]).astype(np.int64)


def block_permutation(group_rows: np.ndarray, seed: int, epoch: int, shuffle: bool, block: int) -> np.ndarray:
    """The `block` order of rows stored in row groups of `group_rows` rows (global row ids, groups in file order).

    The row groups are permuted by `default_rng([seed, epoch, 1]).permutation(G)` and the permuted sequence is
    cut into windows of `block` consecutive groups. Window by window, the window's rows, ascending, are permuted
    by the next `rng.permutation(rows in window)` of `rng = default_rng([seed, epoch])`. Hence data of at most
    `block` row groups (one window) gets exactly `epoch_permutation`. Not shuffling: 0..n-1. A reader touches at
    most `block` row groups at a time. Depends only on the row-group layout and (seed, epoch), not on world
    size, micro-batch or workers."""
    counts = np.asarray(group_rows, dtype=np.int64)
    n = int(counts.sum())
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    groups, starts = block_windows(counts, seed, epoch, shuffle, block)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rng = np.random.default_rng([seed, epoch])
    out = np.empty(n, dtype=np.int64)
    for w, pos in enumerate(starts[:-1]):
        gs = np.sort(groups[w * block : (w + 1) * block])  # rows ascending: groups in file order
        rows = np.concatenate([np.arange(firsts[g], firsts[g] + counts[g], dtype=np.int64) for g in gs])
        out[pos : pos + len(rows)] = rows[rng.permutation(len(rows))]
    return out
