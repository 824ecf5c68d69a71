"""Validation (docs/RUNS.md "val" records): the held-out splits of a run and their losses.

`eval.path` (`eval.kind`, default the memmap layout: packed windows, the same for every data path, so losses
compare) gives `val_loss`; `eval.own_path` (`eval.own_kind`) a second split in another layout, typically the
padded paths' own (one document per row), whose loss is `val_loss_own` in the same record. Each loss is the mean
per effective label (not padding, not masked) over the first `eval.batches` global batches of its split.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..data import make_dataset, make_loader
from ..data.order import Position
from ..datapaths import ON_THE_FLY
from ..errors import PretokError
from .config import Config
from .distributed import Dist, all_reduce
from .hardware import autocast_dtype
from .metrics import perplexity

def _autocast(device: torch.device, precision: str):
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def forward_loss_sum(model, batch: dict, device: torch.device, precision: str) -> torch.Tensor:
    """Summed cross-entropy over the micro-batch's effective labels (fp32 logits)."""
    kw = {"input_ids": batch["input_ids"].to(device, non_blocking=True)}
    for k in ("attention_mask", "position_ids"):
        if k in batch:
            kw[k] = batch[k].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    with _autocast(device, precision):
        logits = model(**kw).logits
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")


def source_tokenizer(source) -> tuple[int, str]:
    """(tokenizer vocab size, fingerprint) of a data path's source: the baselines' loaded tokenizer, or the
    pretokenized dataset's manifest (no second load of the tokenizer)."""
    info = getattr(source, "info", None)
    if info is not None:
        return info.vocab_size, info.fingerprint
    return source.m["tokenizer"]["vocab_size"], source.m["tokenizer"]["fingerprint"]


@dataclass
class HeldOut:
    """One held-out split: its record keys end in `suffix` ("" for val_loss, "_own" for val_loss_own)."""
    suffix: str
    key: str          # the config key of its path, for error lines
    path: str
    dataset: Any


def held_out_splits(cfg: Config, d: Dist, fingerprint: str) -> list[HeldOut]:
    """The run's held-out splits (none without eval.path), sharded like the training data; a split another
    tokenizer made (`fingerprint`: the training data's) is refused."""
    e = cfg.eval
    wanted = [("", "eval.path", e.kind, e.path), ("_own", "eval.own_path", e.own_kind, e.own_path)]
    out = []
    for suffix, key, kind, path in wanted:
        if not e.path or not path:
            continue
        tok = cfg.data.tokenizer if kind in ON_THE_FLY else None
        ds = make_dataset(kind, path, cfg.data.seq_len, micro_batch=cfg.data.micro_batch, rank=d.rank,
                          world=d.world, seed=cfg.run.seed, shuffle=False, tokenizer=tok,
                          verify_on_open=cfg.data.verify_on_open, cache_mb=cfg.data.cache_mb,
                          text_column=cfg.data.text_column, bos=cfg.data.bos, eos=cfg.data.eos,
                          separator=cfg.data.separator)
        if source_tokenizer(ds.source)[1] != fingerprint:
            raise PretokError(f"{key}: the data was tokenized with another tokenizer than the training data", path)
        out.append(HeldOut(suffix, key, path, ds))
    return out


@torch.no_grad()
def evaluate(net, splits: list[HeldOut], cfg: Config, device: torch.device) -> dict:
    """`val_loss<suffix>`, `val_ppl<suffix>`, `val_tokens<suffix>` of every split: the mean loss over its first
    eval.batches global batches (eval.batches x grad_accum micro-batches of every rank), so the same samples
    whatever the split of the global batch. One all-reduce for all splits."""
    net.eval()
    sums = torch.zeros(2 * len(splits), dtype=torch.float64)
    for k, split in enumerate(splits):
        split.dataset.position = Position()
        for i, batch in enumerate(make_loader(split.dataset)):
            if i >= cfg.eval.batches * cfg.train.grad_accum:
                break
            sums[2 * k] += forward_loss_sum(net, batch, device, cfg.train.precision).item()
            sums[2 * k + 1] += batch["effective_tokens"]
    net.train()
    all_reduce(sums)
    out: dict = {}
    for k, split in enumerate(splits):
        if sums[2 * k + 1] == 0:
            raise PretokError(f"{split.key}: the eval data yields no batch (fewer samples than micro_batch × world "
                              "size)", split.path)
        loss = float(sums[2 * k] / sums[2 * k + 1])
        out.update({f"val_loss{split.suffix}": loss, f"val_ppl{split.suffix}": perplexity(loss),
                    f"val_tokens{split.suffix}": int(sums[2 * k + 1])})
    return out
