"""Sharded, resumable batches for every data path, and the DataLoader wrapper that keeps the position.

`ShardedBatches` is an IterableDataset yielding collated micro-batches for one rank: it owns the slicing of
the global order by rank and DataLoader worker (see `order.py` for the contract). `StatefulLoader` wraps it in
a `torch.utils.data.DataLoader` (batch_size=None) and counts what was consumed, so `state_dict()` /
`load_state_dict()` resume exactly, in O(1), on any world size.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import PretokError
from .collate import collate
from .order import Position, Shard, my_steps, step_samples
from .source import BatchedSource, IndexedSource, StreamingSource
from .worker_exit import end_spawned_worker_at_once
from .worker_signals import starting_workers, worker_init


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when initialised, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ShardedBatches(IterableDataset):
    """This rank's micro-batches of `source`, from `position` to the end of the epoch."""

    def __init__(self, source: IndexedSource | StreamingSource, micro_batch: int, rank: int | None = None,
                 world: int | None = None, doc_aware: bool = False):
        if (rank is None) != (world is None):
            raise ValueError("give both rank and world, or neither (then torch.distributed decides)")
        if rank is None or world is None:
            rank, world = dist_rank_world()
        if not 0 <= rank < world or micro_batch < 1:
            raise ValueError(f"bad shard: rank {rank} of {world}, micro_batch {micro_batch}")
        self.source, self.micro_batch, self.rank, self.world = source, micro_batch, rank, world
        self.doc_aware, self.position = doc_aware, Position()

    @property
    def step_samples(self) -> int:
        """Samples of the global order one step takes (`order.step_samples`)."""
        return step_samples(self.micro_batch, self.world)

    def shard(self) -> Shard:
        info = get_worker_info()
        return Shard(self.rank, self.world, info.id if info else 0, info.num_workers if info else 1,
                     self.micro_batch)

    def __iter__(self) -> Iterator[dict]:
        if get_worker_info() is not None:  # a DataLoader worker: if spawned, it ends without finalizing
            end_spawned_worker_at_once()
        shard, pos = self.shard(), self.position
        if self.source.streaming:
            yield from self._stream(shard, pos)
            return
        batched = isinstance(self.source, BatchedSource)
        for step, first, last in my_steps(self.source.num_samples, pos, shard):
            if batched:
                batch = self.source.batch(pos.epoch, first, last)
            else:
                batch = collate([self.source.sample(pos.epoch, k) for k in range(first, last)], self.doc_aware)
            yield dict(batch, step=step, epoch=pos.epoch)

    def _stream(self, shard: Shard, pos: Position) -> Iterator[dict]:
        """Streaming sources: every reader walks the whole stream and keeps its slices of its steps."""
        gb, lo = self.step_samples, shard.rank * shard.micro_batch
        mine: list = []
        for j, (sample, cursor) in enumerate(self.source.windows(pos.epoch, pos.cursor)):
            step, slot = divmod(j, gb)
            if step % shard.workers != shard.worker:
                continue
            if lo <= slot < lo + shard.micro_batch:
                mine.append(sample)
            if slot == gb - 1:  # the step is complete (all ranks' slices): its end is where a resume would start
                yield dict(collate(mine, self.doc_aware), step=step, epoch=pos.epoch, cursor=cursor)
                mine = []


class StatefulLoader:
    """Iterates one epoch of `dataset` through a DataLoader; tracks the global position for exact resume."""

    def __init__(self, dataset: ShardedBatches, num_workers: int = 0, pin_memory: bool | None = None,
                 prefetch_factor: int | None = 2):
        self.dataset, self.num_workers = dataset, num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.prefetch_factor = prefetch_factor if num_workers > 0 else None

    @property
    def position(self) -> Position:
        return self.dataset.position

    def __len__(self) -> int:
        from .order import steps_left

        src = self.dataset.source
        if src.streaming:
            raise TypeError("a streaming source does not know its length before it is read")
        return steps_left(src.num_samples, self.position, self.dataset.step_samples)

    def __iter__(self) -> Iterator[dict]:
        start = self.position
        prepare = getattr(self.dataset.source, "prepare", None)
        if self.num_workers > 0 and prepare is not None:  # the epoch's index, built once and shared by the workers
            prepare(start.epoch)
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers,
                            pin_memory=self.pin_memory, prefetch_factor=self.prefetch_factor,
                            worker_init_fn=worker_init if self.num_workers > 0 else None)
        with starting_workers():  # stop signals are the trainer's to answer, not its workers' (worker_signals.py)
            batches = iter(loader)
        for batch in batches:
            consumed = start.consumed + (batch["step"] + 1) * self.dataset.step_samples
            cursor = batch.pop("cursor", None)
            self.dataset.position = Position(start.epoch, consumed, tuple(cursor) if cursor is not None else None)
            yield batch
        self.dataset.position = Position(start.epoch + 1, 0, None)

    def _identity(self) -> dict:
        src = self.dataset.source
        size = None if src.streaming else src.num_samples
        data = getattr(src, "data_identity", None)  # a mixture names its datasets in its order identity
        return {"source": type(src).__name__, "window": src.window, "seed": src.seed, "shuffle": src.shuffle,
                "num_samples": size, **src.order_identity(), **({"data": data()} if data else {})}

    def state_dict(self) -> dict:
        """The position, and what it is a position in: the source, its order and its data (checked on load; the
        step size may change; recorded under the key `global_batch`, as checkpoints always named it)."""
        return {"position": self.position.to_dict(), "global_batch": self.dataset.step_samples, **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        mine = self._identity()
        legacy = getattr(self.dataset.source, "legacy_order_identity", None)
        if legacy is not None and any("manifest" in e for e in state.get("mixture") or [] if isinstance(e, dict)):
            mine = {**mine, **legacy()}   # a mixture's state from before data identities: by manifest checksum
        state = {"order": "exact", **state}  # a state saved before orders existed was made in the exact order
        diff = [k for k in mine if k in state and state[k] != mine[k]]
        if "data" in diff:
            raise PretokError(f"loader state is for other data ({state['data'][:26]}…, this "
                              f"{type(self.dataset.source).__name__} serves {mine['data'][:26]}…): another "
                              "dataset, or this one tokenized with other settings")
        if diff:
            hint = f" (resume with data.order: {state['order']})" if "order" in diff else ""
            raise PretokError(f"loader state is for another data order (differs in: {', '.join(diff)}): "
                              f"{ {k: state[k] for k in diff} } vs { {k: mine[k] for k in diff} }{hint}")
        self.dataset.position = Position.from_dict(state["position"])
