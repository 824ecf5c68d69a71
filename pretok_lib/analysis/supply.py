"""A loader's supply on a target rank, from what `pretok bench loaders` measured on this machine: each loader
modelled as `data/loader.py` and `data/baselines.py` run it. Torch-free.

- Loaders that split the samples (`padded` and the pretokenized paths: ranks and DataLoader workers each make only
  their own batches): per-rank supply grows with the workers, k / min(W, cores measured) for k cores per rank (each
  target worker as fast as a measured one: an upper bound), and does not depend on the number of ranks.
- `padding-free` (whole stream): window k is known only after tokenizing everything before it, so every rank and
  every worker tokenizes the whole stream and keeps its share. Per-rank supply = T · min(W, k) / W / ranks, T the
  stream's tokenize rate of one process (measured: supply · W / min(W, cores measured)). More workers or cores per
  rank add nothing; more ranks divide it.
- `padded` at another seq_len: a batch costs B · (a + b·L): a per document (tokenize the whole text, whatever L),
  b per slot (pad, collate), so 1/S(L) = a/L + b. b is taken from the pretokenized padded path measured at the same
  worker count (the same rows collated without tokenizing; per-batch costs included, so b is high and the supply at
  a longer L low: conservative); a = L_bench · (1/S(L_bench) − b). The other paths are left at their measured rate
  (per-slot costs; per-batch costs amortize at a longer L: conservative too).
- Main-process cost per slot m (receive a worker's batch: unpickle, collate, copy): the benchmark's
  `ref: torch.randint via DataLoader wN` rate (batches made in N workers at no data cost) inverted, in s/slot.
- Paced rows (`pretok bench loaders --pace-ms P`: next() timed alone, called once per P ms as a training step calls
  it; bench/loaders_paced.py) replace two of these where measured: with no workers the supply is the paced rate
  (a batch made between steps costs more than back to back: +0.4-0.7 ms per batch on an H200 machine), with
  workers m is the paced time of receiving that path's prefetched batch per slot (0.3 ms there, where the
  throughput reference implied 0.77 ms).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..datapaths import PRETOK_PAIRS, REGISTRY

# every rank and worker tokenizes the whole stream (the on-the-fly packed path: data/baselines.py)
WHOLE_STREAM = tuple(p.name for p in REGISTRY if p.on_the_fly and p.packed)
# per-document tokenize + per-slot pad: supply depends on seq_len (the on-the-fly padded path)
PER_DOCUMENT = tuple(p.name for p in REGISTRY if p.on_the_fly and not p.packed)
# the same rows, collated without tokenizing: the pretokenized path of the padded baseline
SLOT_COST_FROM = next(k for k, base in PRETOK_PAIRS.items() if base in PER_DOCUMENT)
VIA = "ref: torch.randint via DataLoader w{}"
# what `--pace-ms` adds to a benchmark row (bench/loaders_paced.py)
PACED_KEYS = ("pace_s", "paced_batches", "paced_batch_s", "paced_mean_batch_s", "paced_estimate",
              "paced_tokens_per_s", "paced_rate_interval")


def sharing(kind: str) -> str:
    """How the ranks and workers of a path share the work: "whole stream" or "split"."""
    return "whole stream" if kind in WHOLE_STREAM else "split"


def worker_scale(kind: str, workers: int, cores_measured: int, cores_per_rank: int | None, ranks: int = 1) -> float:
    """Factor from the measured supply (one rank, W workers on `cores_measured` cores) to a target rank's (k =
    `cores_per_rank` workers on k cores, None: W as measured; `ranks` ranks). Split paths: k / min(W, cores) with
    workers, 1 without (one process); whole-stream paths: W / min(W, cores) / ranks (T / ranks), whatever the
    target's workers and cores."""
    if not workers or cores_per_rank is None:
        per_worker = 1.0
    else:  # W workers on fewer cores measured a share of T (whole stream) or of W workers' rate (split)
        per_worker = (workers if kind in WHOLE_STREAM else cores_per_rank) / max(1, min(workers, cores_measured))
    return per_worker / max(1, int(ranks)) if kind in WHOLE_STREAM else per_worker


def _rate(loaders: Mapping[str, Any], name: str) -> float | None:
    r = (loaders.get("loaders") or {}).get(name) or {}
    v = r.get("tokens_per_s")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def slot_cost(loaders: Mapping[str, Any], workers: int) -> float:
    """Seconds per slot of padding and collating rows, without tokenizing: 1 / the pretokenized padded path's
    supply at `workers` (else at 0 workers; 0 when not measured)."""
    v = _rate(loaders, f"{SLOT_COST_FROM} w{workers}") or _rate(loaders, f"{SLOT_COST_FROM} w0")
    return 1.0 / v if v else 0.0


def at_seq_len(kind: str, supply: float, seq_bench: int | None, seq_target: int | None, per_slot: float) -> float:
    """A path's supply (slots/s) measured at `seq_bench`, at `seq_target`: 1/S = a/L + b for per-document paths,
    unchanged for the others (and when either length is unknown)."""
    if kind not in PER_DOCUMENT or not seq_bench or not seq_target or seq_target == seq_bench or supply <= 0:
        return supply
    b = min(per_slot, 1.0 / supply)
    a = seq_bench * (1.0 / supply - b)
    return 1.0 / (a / seq_target + b) if a / seq_target + b > 0 else supply


def main_cost(loaders: Mapping[str, Any], workers: int) -> float:
    """Main-process seconds per slot with `workers` DataLoader workers: 1 / the randint-via-DataLoader reference's
    rate at that worker count (else the nearest measured one; 0 with no workers or no reference)."""
    if not workers:
        return 0.0
    rates = {}
    for name, r in (loaders.get("loaders") or {}).items():
        if name.startswith(VIA.format("")) and (v := _rate(loaders, name)):
            rates[int(r.get("workers") or 0)] = v
    if not rates:
        return 0.0
    w = min(rates, key=lambda n: (abs(n - workers), -n))
    return 1.0 / rates[w]


def target_supply(loaders: Mapping[str, Any], row: Mapping[str, Any], cores_per_rank: int | None = None,
                  cpu_speed: float = 1.0, seq_len: int | None = None, ranks: int = 1) -> dict:
    """One benchmark row (a data path at W workers) on a target rank: its supply (slots/s), target workers,
    main-process cost (s/slot) and how it was derived."""
    kind, w = row["kind"], int(row.get("workers") or 0)
    cores = int((loaders.get("environment") or {}).get("cpus") or 1)
    paced = row.get("paced_tokens_per_s")   # next() called once per step (bench/loaders_paced.py), if measured
    measured = float(paced if paced and not w else row["tokens_per_s"])
    at_len = at_seq_len(kind, measured, loaders.get("seq_len"), seq_len, slot_cost(loaders, w))
    target_w = w if not w or cores_per_rank is None else cores_per_rank
    main = 1.0 / paced if paced and w else main_cost(loaders, w)
    return {"supply": at_len * worker_scale(kind, w, cores, cores_per_rank, ranks) * cpu_speed,
            "supply_at_seq_len": at_len, "target_workers": target_w, "sharing": sharing(kind),
            "main_per_slot": main / cpu_speed if target_w else 0.0, "cores_measured": cores,
            "paced": bool(paced)}
