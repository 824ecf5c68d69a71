"""Training: config → model → loop (DDP, AMP, checkpoints) → runs/<id>/ (docs/RUNS.md).

    pretok train --config configs/tiny.yaml train.steps=100
    torchrun --nproc_per_node 2 -m pretok_lib.train --config configs/tiny.yaml
    pretok export runs/<id> [--out DIR]      # transformers model dir (a completed run writes runs/<id>/hf itself)
"""

from .config import Config, load_config

__all__ = ["Config", "load_config", "train"]


def __getattr__(name: str):
    # `train` imports torch: on first use, so `python -m pretok_lib.train` can import it under its own terms (__main__)
    if name == "train":
        from .run import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
