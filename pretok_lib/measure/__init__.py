"""Bring your own trainer: measure tokens/s, effective tokens/s, padding and data stall of any training loop and
write a run directory in the trainer's contract (docs/RUNS.md, docs/BYO.md), so `pretok_lib.analysis` and
`pretok report` show it beside the project's runs.

    from pretok_lib.measure import Run
    with Run("runs/mine", config={"train": {"lr": 3e-4}}) as m:
        for batch in m.batches(loader):
            loss = step(batch)
            m.step(loss=loss.item())

    from pretok_lib.measure import PretokCallback     # transformers.Trainer(..., callbacks=[PretokCallback(dir)])
"""

from .counts import Counts, batch_counts
from .run import Run

__all__ = ["Counts", "PretokCallback", "Run", "batch_counts"]


def __getattr__(name: str):
    # PretokCallback imports transformers: on first use only
    if name == "PretokCallback":
        from .hf import PretokCallback

        return PretokCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
