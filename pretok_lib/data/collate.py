"""Causal-LM batches: `input_ids`, shifted `labels` (-100 on padding and at document crossings), counts."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .packing import Sample

IGNORE = -100


def collate(samples: Sequence[Sample], doc_aware: bool = False) -> dict:
    """Stack samples of W tokens into inputs/labels of W-1 positions.

    Padded rows: labels are ignored where the target is padding. Packed rows: the label whose target is the
    first token of a new document is ignored (the model is not asked to predict across a document boundary).
    With `doc_aware`, `position_ids` restart at 0 at every document start and `doc_lens` lists the pieces.
    Counts: `tokens` (input slots), `padding_tokens`, `masked_tokens` (crossings), `effective_tokens` (labels
    that count). Samples of a mixture add `origin`: each row's dataset index (a tensor)."""
    tokens = np.stack([s.tokens for s in samples]).astype(np.int64, copy=False)
    if samples[0].mask is not None:
        out = collate_padded(tokens, np.stack([s.mask for s in samples]))
    else:
        out = _collate_packed(tokens, samples, doc_aware)
    if samples[0].origin is not None:
        out["origin"] = torch.tensor([s.origin for s in samples], dtype=torch.int64)
    return out


def collate_padded(tokens: np.ndarray, mask: np.ndarray) -> dict:
    """Padded rows given as arrays, ids (B, W) int64 and mask (B, W) bool: the batch `collate` makes of them
    (readers that gather a whole batch at once call this directly)."""
    att, targets = mask[:, :-1], mask[:, 1:]
    labels = np.where(targets, tokens[:, 1:], IGNORE)
    return {"attention_mask": torch.from_numpy(att.astype(np.int64)),
            "input_ids": torch.from_numpy(np.ascontiguousarray(tokens[:, :-1])), "labels": torch.from_numpy(labels),
            "tokens": int(att.size), "padding_tokens": int(att.size - np.count_nonzero(att)), "masked_tokens": 0,
            "effective_tokens": int(np.count_nonzero(targets))}  # ids are >= 0: no kept label is IGNORE


def _collate_packed(tokens: np.ndarray, samples: Sequence[Sample], doc_aware: bool) -> dict:
    inputs, labels = tokens[:, :-1], tokens[:, 1:].copy()
    L = inputs.shape[1]
    out: dict = {}
    masked = 0
    for i, s in enumerate(samples):
        cross = s.starts[s.starts <= L] - 1
        labels[i, cross] = IGNORE
        masked += len(cross)
    if doc_aware and samples[0].starts is not None:
        pos = np.empty_like(inputs)
        for i, s in enumerate(samples):
            idx = np.arange(L)
            base = np.zeros(L, dtype=np.int64)
            for st in s.starts[s.starts < L]:
                base[st:] = st
            pos[i] = idx - base
        out["position_ids"] = torch.from_numpy(pos)
        out["doc_lens"] = [s.doc_lens.tolist() for s in samples]
    out.update(input_ids=torch.from_numpy(np.ascontiguousarray(inputs)), labels=torch.from_numpy(labels),
               tokens=int(inputs.size), padding_tokens=0, masked_tokens=masked,
               effective_tokens=int((labels != IGNORE).sum()))
    return out
