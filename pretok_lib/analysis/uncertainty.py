"""Repeated measurements as estimates with intervals (docs/MEASURING.md).

A number the study or `pretok bench` publishes is the median of >= 3 repeats with a distribution-free interval
(order statistics of the sample; no normality assumed), and a ratio is the median of the ratios of paired rounds
(round i's A over round i's B: slow drift of a shared machine cancels within a round). An interval that holds
"no effect" (ratio 1, difference 0) is *not resolved*, with the number of repeats the observed spread says would
resolve it. Values that cannot be true (an efficiency above 1, a stall outside [0, 1], ...) are *invalid
measurements* (`check_*`), never findings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

LEVEL = 0.95
MIN_REPEATS = 3


def _binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2 ** n


def median_ranks(n: int, level: float = LEVEL) -> tuple[int, int, float]:
    """(lo, hi, coverage): 0-based ranks of the sorted sample whose values bound the median with probability
    `coverage` >= `level` for any continuous distribution; the narrowest such pair. When even (min, max) falls
    short (n < 6 at 95%), it is (0, n - 1) with its smaller coverage 1 - 2 / 2**n, stated as such."""
    if n < 1:
        raise ValueError("no samples")
    best = (0, n - 1, 1 - 2 * _binom_cdf(0, n) if n > 1 else 0.0)
    for k in range(1, n // 2 + 1):   # [x_(k), x_(n-1-k)] (0-based) covers with 1 - 2 P(X <= k)
        cover = 1 - 2 * _binom_cdf(k, n)
        if cover < level:
            break
        best = (k, n - 1 - k, cover)
    return best


@dataclass(frozen=True)
class Estimate:
    """The median of `samples` and an interval [lo, hi] that holds the true median with probability `coverage`
    (the order-statistic interval's exact coverage: below `level` when there are too few samples)."""

    median: float
    lo: float
    hi: float
    n: int
    coverage: float
    samples: tuple[float, ...] = field(default=(), repr=False)
    level: float = LEVEL

    @property
    def halfwidth(self) -> float:
        """Half the interval's width relative to the median (0.05: ±5%); inf for a median of 0."""
        return (self.hi - self.lo) / 2 / abs(self.median) if self.median else math.inf

    def holds(self, value: float) -> bool:
        return self.lo <= value <= self.hi

    def resolved(self, null: float) -> bool:
        """Whether the interval excludes `null` (1 for a ratio, 0 for a difference) and rests on >= 2 samples."""
        return self.n >= 2 and not self.holds(null)

    def repeats_to_resolve(self, null: float) -> int | None:
        """Repeats that would make the interval exclude `null`, from the observed spread (its width shrinks as
        1/sqrt(n)); `n` when already resolved; None when the median sits on `null` (no effect seen to resolve)."""
        if self.resolved(null):
            return self.n
        gap = abs(self.median - null)
        if gap == 0 or self.n < 2:
            return None if gap == 0 else MIN_REPEATS
        side = (self.hi - self.median) if null > self.median else (self.median - self.lo)
        need = math.ceil(self.n * (max(side, 1e-300) / gap) ** 2 * 1.2)  # 20% margin for the estimate's own noise
        return max(self.n + 1, need, MIN_REPEATS)

    def to_dict(self) -> dict:
        return {"median": self.median, "interval": [self.lo, self.hi], "n": self.n, "coverage": self.coverage,
                "samples": list(self.samples)}


def estimate(samples: Iterable[float], level: float = LEVEL) -> Estimate | None:
    """The median and its order-statistic interval of the finite samples (None when there are none)."""
    xs = sorted(float(x) for x in samples if x is not None and math.isfinite(float(x)))
    if not xs:
        return None
    n = len(xs)
    lo, hi, cover = median_ranks(n, level)
    mid = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    return Estimate(mid, xs[lo], xs[hi], n, cover, tuple(xs), level)


def paired_ratio(a: Sequence[float | None], b: Sequence[float | None], level: float = LEVEL) -> Estimate | None:
    """The ratio a/b from paired rounds: the estimate of a[i] / b[i] over rounds where both were measured."""
    return estimate((x / y for x, y in zip(a, b) if x is not None and y), level)


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], level: float = LEVEL, resamples: int = 2000,
                    seed: int = 0) -> Estimate | None:
    """median(a) / median(b) for unpaired samples, with a seeded percentile-bootstrap interval (deterministic)."""
    import numpy as np

    xa, xb = np.asarray([x for x in a if x is not None], float), np.asarray([x for x in b if x is not None], float)
    if not len(xa) or not len(xb) or np.median(xb) == 0:
        return None
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(xa, (resamples, len(xa))), axis=1)
    mb = np.median(rng.choice(xb, (resamples, len(xb))), axis=1)
    ok = mb != 0
    boot = ma[ok] / mb[ok]
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    n = min(len(xa), len(xb))
    return Estimate(float(np.median(xa) / np.median(xb)), float(lo), float(hi), n, level, (), level)


def bootstrap_sum_ratio(num: Sequence[float], den: Sequence[float], level: float = LEVEL, resamples: int = 2000,
                        seed: int = 0) -> tuple[float, float, float] | None:
    """sum(num) / sum(den) over paired items (a share of time, a rate over calls), with a seeded percentile-
    bootstrap interval over the items (deterministic): (point, lo, hi); None when there is no denominator."""
    import numpy as np

    a, b = np.asarray(num, float), np.asarray(den, float)
    if not len(b) or b.sum() <= 0:
        return None
    idx = np.random.default_rng(seed).integers(0, len(b), (resamples, len(b)))
    boot = a[idx].sum(1) / np.maximum(b[idx].sum(1), 1e-300)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    point = float(a.sum() / b.sum())
    return point, min(float(lo), point), max(float(hi), point)


# ---- validity: values that cannot be true are invalid measurements, not findings ------------------------------

EFFICIENCY_TOLERANCE = 0.05   # scaling efficiency may exceed 1 by this much (cache effects) before it is invalid


def _runs(runs: Sequence[str]) -> str:
    return f" (runs {', '.join(runs)})" if runs else ""


def check_efficiency(value: float | None, runs: Sequence[str] = (), tolerance: float = EFFICIENCY_TOLERANCE
                     ) -> str | None:
    """The reason a scaling efficiency is invalid (None: it is possible)."""
    if value is not None and value > 1 + tolerance:
        return f"scaling efficiency {value:.0%} above 100% (+{tolerance:.0%} tolerance){_runs(runs)}"
    if value is not None and value < 0:
        return f"negative scaling efficiency {value:.3g}{_runs(runs)}"
    return None


def check_fraction(value: float | None, what: str, runs: Sequence[str] = ()) -> str | None:
    """The reason a share (data stall, MFU, padding) outside [0, 1] is invalid."""
    if value is not None and not 0 <= value <= 1:
        return f"{what} {value:.3g} outside [0, 1]{_runs(runs)}"
    return None


def check_times(seconds: Iterable[float | None], runs: Sequence[str] = ()) -> str | None:
    """The reason a set of durations with a negative or non-finite one is invalid."""
    bad = [s for s in seconds if s is not None and not (math.isfinite(s) and s >= 0)]
    return f"negative or non-finite time {bad[0]!r}{_runs(runs)}" if bad else None


def check_ceilings(by_cores: dict[int, float], runs: Sequence[str] = ()) -> str | None:
    """The reason tokenizer ceilings (MB/s by core count) are inconsistent: more cores measured slower."""
    ks = sorted(by_cores)
    for lo, hi in zip(ks, ks[1:]):
        if by_cores[hi] < by_cores[lo]:
            return (f"ceiling on {hi} cores ({by_cores[hi]:.3g} MB/s) below the one on {lo} "
                    f"({by_cores[lo]:.3g} MB/s){_runs(runs)}")
    return None


def check_isolated_speedup(value: float | None, runs: Sequence[str] = ()) -> str | None:
    """The reason an isolated speedup of the pretokenized path below 1 is invalid (reading stored ids cannot be
    slower than tokenizing them: the machine or the measurement was disturbed)."""
    if value is not None and value < 1:
        return f"pretokenized path slower in isolation than tokenizing on the fly (x{value:.3g}){_runs(runs)}"
    return None


def finding(id: str, question: str, est: Estimate | None, unit: str, null: float | None = None,
            invalid: str | None = None, note: str = "") -> dict:
    """One machine-readable finding (study.json `findings`): {"id", "question", "value", "unit", "interval",
    "n", "resolved", "valid", "reason"}. `null` is "no effect" (1 for a ratio, 0 for a difference; None: a level,
    not an effect, resolved once measured); `invalid` the reason it cannot be true."""
    if est is None:
        return {"id": id, "question": question, "value": None, "unit": unit, "interval": None, "n": 0,
                "resolved": False, "valid": invalid is None, "reason": invalid or note or "not measured"}
    resolved = est.n >= 2 and (null is None or est.resolved(null))
    reason = invalid or note
    if invalid is None and est.n < 2:
        reason = (f"not resolved: one measurement, no interval — ~{MIN_REPEATS} repeats would give one"
                  + (f"; {note}" if note else ""))
    elif invalid is None and not resolved:
        need = est.repeats_to_resolve(null) if null is not None else MIN_REPEATS
        reason = (f"not resolved at this noise (±{est.halfwidth:.0%})"
                  + (f" — ~{need} repeats would resolve it" if need else " — no effect seen")
                  + (f"; {note}" if note else ""))
    return {"id": id, "question": question, "value": est.median, "unit": unit, "interval": [est.lo, est.hi],
            "n": est.n, "coverage": round(est.coverage, 4), "resolved": resolved and invalid is None,
            "valid": invalid is None, "reason": reason}
