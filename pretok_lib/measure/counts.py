"""Token counts of one batch of any trainer: tokens (input slots), effective tokens (labels that count), padding,
masked labels and samples, read from the batch's arrays (torch tensors, numpy arrays or nested lists).

Conventions (docs/BYO.md):
- a mapping with `input_ids` (Hugging Face style): padding = `attention_mask == 0`; `labels` are unshifted (the
  model shifts them), so effective tokens = `labels[..., 1:] >= 0`, masked = the other attended positions of
  `labels[..., 1:]`; without `labels` every attended position but each row's last counts;
- a pair `(x, y)` (nanoGPT's `get_batch`): y is already shifted, effective tokens = `y >= 0` (ignore indices are
  negative: -100, nanoGPT's -1), masked = the rest, no padding;
- a single array: token ids, every slot counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PretokError


@dataclass
class Counts:
    """What one batch (or the micro-batches of one step) holds."""

    tokens: int = 0
    effective_tokens: int = 0
    padding: int = 0
    masked: int = 0
    samples: int = 0

    def __iadd__(self, other: "Counts") -> "Counts":
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        return self


def _array(a: Any) -> Any:
    """A torch tensor or numpy array as is; anything else (nested lists) as a numpy array."""
    if hasattr(a, "shape") and hasattr(a, "sum"):
        return a
    import numpy as np

    return np.asarray(a)


def _n(x: Any) -> int:
    return int(x.sum()) if hasattr(x, "sum") else int(x)


def _size(a: Any) -> int:
    return int(a.numel()) if hasattr(a, "numel") else int(a.size)


def _rows(a: Any) -> int:
    return int(a.shape[0]) if len(a.shape) > 1 else 1


def _mapping_counts(batch: Mapping[str, Any]) -> Counts:
    ids = batch.get("input_ids")
    if ids is None:
        ids = batch.get("inputs_embeds")
        if ids is None:
            raise PretokError("a batch mapping needs input_ids (or inputs_embeds): pass tokens= to step()")
        ids = _array(ids)[..., 0]
    ids = _array(ids)
    mask = batch.get("attention_mask")
    attended = (_array(mask) != 0) if mask is not None else (ids == ids)
    tokens = _size(ids)
    padding = tokens - _n(attended)
    labels = batch.get("labels")
    if labels is not None:
        lab = _array(labels)[..., 1:]
        att = attended[..., 1:]
        effective = _n((lab >= 0) & att)
        masked = _n((lab < 0) & att)
    else:
        effective = _n(attended[..., 1:])
        masked = 0
    return Counts(tokens, effective, padding, masked, _rows(ids))


def batch_counts(batch: Any) -> Counts:
    """The `Counts` of one batch (see the module docstring for the layouts understood)."""
    if isinstance(batch, Mapping):
        return _mapping_counts(batch)
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(hasattr(b, "shape") for b in batch):
        x, y = (_array(b) for b in batch)
        tokens, effective = _size(x), _n(y >= 0)
        return Counts(tokens, effective, 0, _size(y) - effective, _rows(x))
    arr = _array(batch)
    if not hasattr(arr, "shape") or not len(arr.shape):
        raise PretokError(f"cannot count the tokens of a {type(batch).__name__} batch: pass tokens= to step()")
    return Counts(_size(arr), _size(arr), 0, 0, _rows(arr))
