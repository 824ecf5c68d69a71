"""Python's garbage collector in a training process: never a full collection at a random step.

A full (generation-2) collection walks every object alive, and the imports of torch and transformers alone leave
millions: an automatic one lands at an arbitrary step of an arbitrary rank, and every other DDP rank waits for it
at the next all-reduce. As torchtitan (`gc_freq`) and Megatron-LM (`--manual-gc`) do, the automatic collector is
off while the loop runs; every `train.gc_every` steps each rank collects the young generations (cheap: only what
recent steps allocated), and a full collection runs where all ranks pause together anyway (checkpoint, evaluation).
`train.gc_every=0` leaves Python's automatic collector on.

`python -m pretok_lib.train` and `pretok train` also keep it off while they import torch and transformers
(`import_training_modules`): those passes find no garbage, and a tiny run's process took 30% longer with them
(docs/TRAINING.md). Frozen, those objects are also left alone by the collections of the DataLoader workers forked
later, so their memory pages stay shared instead of being copied (what `gc.freeze` is documented for).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator


def import_training_modules() -> None:
    """Import torch, transformers and the training modules with the collector off, then move everything they left
    out of all later collections (`gc.freeze`). For the entry points of a fresh process only: it freezes every
    object the process holds."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        from . import loop, run  # noqa: F401
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def scheduled(every: int) -> Iterator[Callable[[int, bool], None]]:
    """Within the block, automatic collection off (`every` > 0); yields `after_step(step, pause)`: a young collection
    every `every` steps, a full one when `pause` (all ranks stop there together). The collector's state is
    restored on leaving, also on an error."""
    if every <= 0:
        yield lambda step, pause: None
        return
    was_enabled = gc.isenabled()
    gc.disable()

    def after_step(step: int, pause: bool) -> None:
        if pause:
            gc.collect()
        elif step % every == 0:
            gc.collect(1)

    try:
        yield after_step
    finally:
        if was_enabled:
            gc.enable()
