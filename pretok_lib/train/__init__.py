"""Training: config → model → loop (DDP, AMP, checkpoints) → runs/<id>/ (docs/RUNS.md).

    pretok train --config configs/tiny.yaml train.steps=100
    torchrun --nproc_per_node 2 -m pretok_lib.train --config configs/tiny.yaml
    pretok export runs/<id> [--out DIR]      # transformers model dir (a completed run writes runs/<id>/hf itself)
"""

from .config import Config, load_config
from .run import train

__all__ = ["Config", "load_config", "train"]
