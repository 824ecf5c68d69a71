"""Per-record series of one run: rates as totals over the records kept after the warm-up, their per-step spread,
and where the loss crosses a target. Used by `metrics.run_metrics`."""

from __future__ import annotations

import numpy as np

from ..train.crossing import crossing
from .runs import Run


def mean_after(values: np.ndarray, skip: int) -> float | None:
    """Mean of the finite values after the first `skip` records (all of them if there are no more than `skip`);
    None if no finite value."""
    v = np.asarray(values, dtype=float)
    v = v[skip:] if len(v) > skip else v
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else None


TIME_WEIGHTED = ("tokens_per_s", "effective_tokens_per_s", "tokens_per_s_per_device", "mfu", "data_stall")
TOKEN_WEIGHTED = ("padding_frac", "masked_frac")


def weighted_after(values: np.ndarray, weights: np.ndarray, skip: int) -> float | None:
    """Σ value·weight / Σ weight over the records after the first `skip` (all if no more) whose value and weight
    are finite (weight > 0). A per-step rate weighted by its step time is the total rate; `mean_after` when no
    record has a weight."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    v, w = (v[skip:], w[skip:]) if len(v) > skip else (v, w)
    ok = np.isfinite(v) & np.isfinite(w) & (w > 0)
    if not ok.any():
        return mean_after(values, skip)
    return float((v[ok] * w[ok]).sum() / w[ok].sum())


def spread_after(values: np.ndarray, skip: int, q: tuple[float, float] = (10, 90)) -> tuple[float | None, ...]:
    """Percentiles `q` of the finite values after `skip` (None each when there is none)."""
    v = np.asarray(values, dtype=float)
    v = v[skip:] if len(v) > skip else v
    v = v[np.isfinite(v)]
    return tuple(float(np.percentile(v, x)) for x in q) if v.size else (None,) * len(q)


def last_finite(values: np.ndarray) -> tuple[float | None, int | None]:
    """The last finite value and its index."""
    idx = np.flatnonzero(np.isfinite(values))
    return (float(values[idx[-1]]), int(idx[-1])) if idx.size else (None, None)


VAL_SOURCES = {"val": "val_loss", "val_own": "val_loss_own"}   # val record key of each validation source


def time_to_target(run: Run, target: float, source: str = "auto") -> tuple[float | None, int | None]:
    """(wall_s, step) where the loss crosses `target`, interpolated between the records around the crossing
    (`crossing.crossing`, as summary.json's). (None, None) if never reached. source: "val" (val_loss), "val_own"
    (val_loss_own: the held-out split in the run's own layout, eval.own_path), "train" (loss) or "auto" (val if
    the run logged any, else train)."""
    use_val = source in VAL_SOURCES or (source == "auto" and run.val.has("val_loss"))
    recs, key = (run.val, VAL_SOURCES.get(source, "val_loss")) if use_val else (run.train, "loss")
    if not len(recs):
        return None, None
    return crossing(*([float(x) for x in recs[k]] for k in (key, "wall_s", "step")), target)
