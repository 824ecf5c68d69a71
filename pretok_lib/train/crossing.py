"""Where a loss series first reaches a target, interpolated between its records: the one definition of time to
target, for the trainer's summary.json (train/metrics.py) and the analysis (analysis/series.py). Plain Python
(no torch, no numpy): both import it without the other's dependencies."""

from __future__ import annotations

import math
from collections.abc import Sequence


def crossing(loss: Sequence[float], wall: Sequence[float], step: Sequence[float], target: float
             ) -> tuple[float | None, int | None]:
    """(wall_s, step) where `loss` crosses `target`: linear between the last record above it and the first at or
    below it (evaluations are `eval.every` steps apart: the first record alone overstates the time by up to that
    interval), the first record's own when none with finite numbers precedes it; the step rounded up. NaN marks a
    record without a number (never a crossing). (None, None) if never reached."""
    i = next((k for k, v in enumerate(loss) if v <= target), None)
    if i is None:
        return None, None
    w, s = float(wall[i]), float(step[i])
    before = [j for j in range(i) if math.isfinite(loss[j]) and math.isfinite(wall[j]) and math.isfinite(step[j])]
    if before and math.isfinite(w) and math.isfinite(s):
        j = before[-1]
        f = (loss[j] - target) / (loss[j] - loss[i])   # loss[j] > target >= loss[i], so 0 < f <= 1
        # never past the record at or below the target (f = 1 gave wall[i] + 1 ulp: 1.9 + (6.7281 - 1.9))
        w, s = min(w, float(wall[j] + f * (w - wall[j]))), min(s, float(step[j] + f * (s - step[j])))
    return (w if math.isfinite(w) else None), (math.ceil(s - 1e-9) if math.isfinite(s) else None)


def number(v: object) -> float:
    """A record's value as a float: NaN for anything but an int or float (a missing key, None, a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    try:
        return float(v)
    except OverflowError:   # an int beyond float range (JSON allows it)
        return math.inf if v > 0 else -math.inf


def records_crossing(records: Sequence[dict], key: str, target: float) -> tuple[float | None, int | None]:
    """`crossing` of the `key` values of metrics.jsonl records (their `wall_s` and `step`)."""
    loss, wall, step = ([number(r.get(k)) for r in records] for k in (key, "wall_s", "step"))
    return crossing(loss, wall, step, target)
