"""The stall model checked against a run that measured its stall: the loader benchmark's row for the run's data
path and worker count, the run's own compute step by step, and the stall predicted beside the one measured, each
with its interval. Used by `pretok gpu-study` (a GPU's runs) and notebook 05 (this study's CPU runs). Torch-free.

Up to three versions of the model, as the benchmark allows:
- `back_to_back`: the benchmark's throughput (batches made one after another); with workers the main process's
  cost from the randint-via-DataLoader reference;
- `paced` (the benchmark ran `--pace-ms`): next() timed once per step after an idle wait of the step's length
  (analysis/supply.py);
- `either`: from the lower end of the two to the higher. A loader called inside a training step is slower than
  back to back (its caches gone cold) and, on the CPUs measured so far, faster than after an idle wait.

Each gives the predicted interval (over the loader rate's interval, the main cost's and the two ways of taking the
run's compute: `stall.check_run`), the measured stall with its own interval (a bootstrap over the run's steps),
`inside` (the measured point in the predicted interval), `agrees` (the two intervals overlap) and `off_by`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .stall import measured_rates, predict_for
from .supply import PACED_KEYS, VIA, target_supply


def stall_check(loaders: Mapping[str, Any], kind: str, workers: int, records: Sequence[Mapping[str, Any]],
                skip: int, ranks: int = 1) -> dict | None:
    """The versions of the model for one run (its train `records`, `skip` warm-up steps left out, on `ranks`
    ranks) beside its measured stall; None when the benchmark has no row for its path and worker count, or the run
    no train records."""
    row = (loaders.get("loaders") or {}).get(f"{kind} w{workers}")
    if not row or not row.get("tokens_per_s"):
        return None
    m = measured_rates(records, skip)   # once: each version of the model tries several supplies against it
    if m is None:
        return None
    plain = {k: v for k, v in row.items() if k not in PACED_KEYS}
    out = {"back_to_back": _predict(loaders, plain, workers, m, False, ranks)}
    if row.get("paced_tokens_per_s"):
        a = out["back_to_back"]
        b = out["paced"] = _predict(loaders, row, workers, m, True, ranks)
        out["either"] = against(a["measured_stall"], a["measured_interval"], min(a["interval"][0], b["interval"][0]),
                                max(a["interval"][1], b["interval"][1]))
    return out


def against(measured: float, measured_interval: Sequence[float] | None, lo: float, hi: float) -> dict:
    """A predicted interval [lo, hi] beside the measured stall and its interval."""
    mlo, mhi = measured_interval or (measured, measured)
    return {"measured_stall": measured, "measured_interval": [mlo, mhi], "interval": [lo, hi],
            "inside": lo <= measured <= hi, "agrees": mlo <= hi and lo <= mhi,
            "off_by": 0.0 if lo <= measured <= hi else (measured - hi if measured > hi else measured - lo)}


def _predict(loaders: Mapping[str, Any], row: dict, w: int, m: Mapping[str, Any], paced: bool, ranks: int) -> dict:
    """One version of the model: its bounds over the row's rate interval (and the reference's, with workers)."""
    variants = [row]
    if paced:   # the paced rate's interval: supply (no workers) or main cost (workers) at its ends
        variants += [{**row, "paced_tokens_per_s": r} for r in (row.get("paced_rate_interval") or []) if r and r > 0]
    else:
        variants += [{**row, "tokens_per_s": r} for r in ((row.get("estimate") or {}).get("interval") or [])]
    refs: list[float | None] = [None]
    ref = (loaders.get("loaders") or {}).get(VIA.format(w)) or {}
    if w and not paced:   # the reference's interval bounds the main process's cost
        refs += [1.0 / r for r in ((ref.get("estimate") or {}).get("interval") or []) if r > 0]
    checks = []
    for v in variants:
        t = target_supply(loaders, v, ranks=ranks)
        for main in refs:
            checks.append(predict_for(m, t["supply"], w, t["main_per_slot"] if main is None else main))
    preds = [c[k] for c in checks for k in ("predicted_stall", "predicted_stall_per_step")]
    c0 = checks[0]
    return {**against(c0["data_stall"], c0.get("data_stall_interval"), min(preds), max(preds)),
            "predicted_stall": c0["predicted_stall"],
            **{k: c0[k] for k in ("consumption", "supply", "headroom", "main_per_slot", "loop_per_slot", "steps")}}
