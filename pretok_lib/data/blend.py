"""Which source each sample of a weighted mixture comes from: Megatron-LM's greedy blending, made periodic.

The rule (Megatron-LM's `build_blending_indices`, docs/MIXTURES.md): sample n of the mixture stream goes to the
source j that lags most behind its share of the first n + 1 samples, argmax_j(w_j·(n+1) - c_j(n)) with c_j(n) the
samples source j got among the first n (ties to the lowest j; Megatron uses w_j·max(n, 1), one sample behind).
No source is ever a whole sample ahead of its share: c_j(n) - w_j·n < 1 for every j and every prefix n (its key
was > 0 when picked, as the keys sum to 1).

The weights are made rational first, p_j / Q with integer p_j summing to Q ≤ 2^16: exactly as written when
their decimal fractions allow it (0.3/0.7 → 3/10, 7/10), else rounded to multiples of 2^-16 (largest
remainder). Then the greedy sequence is periodic with period Q: after Q samples every deficit p_j - c_j(Q) is an
integer > -1 (no source a sample ahead) and they sum to 0, so all are 0 and the state is the initial one. One
period is computed once (a pure-Python loop of Q·k steps: ~0.15 s at Q = 65536), and any sample's (source, rank
within the source) is then O(1) arithmetic: the position a resume restarts from costs nothing to reach.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import reduce
from operator import add
from typing import Sequence

import numpy as np

PERIOD_MAX = 1 << 16


def rational_weights(weights: Sequence[float]) -> tuple[list[int], int]:
    """(p, Q): the normalised weights as p_j / Q, sum(p) == Q ≤ PERIOD_MAX, reduced by their gcd.

    Exact when the weights' decimal fractions have a common denominator ≤ PERIOD_MAX, else the largest-remainder
    rounding of w_j / sum(w) to multiples of 1 / PERIOD_MAX. ValueError when a weight is not a finite number > 0
    or is too small to survive the rounding (below ~1/65536 of the total)."""
    if not weights:
        raise ValueError("a mixture needs at least one dataset")
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"mixture weight {w!r} is not a finite number > 0")
    exact = [Fraction(repr(float(w))) for w in weights]
    total = sum(exact)
    shares = [f / total for f in exact]
    Q = reduce(math.lcm, (s.denominator for s in shares), 1)
    if Q <= PERIOD_MAX:
        p = [int(s * Q) for s in shares]
    else:
        Q = PERIOD_MAX
        ideal = [s * Q for s in shares]
        p = [math.floor(x) for x in ideal]
        by_remainder = sorted(range(len(p)), key=lambda j: (-(ideal[j] - p[j]), j))
        for j in by_remainder[: Q - sum(p)]:
            p[j] += 1
        small = [j for j, x in enumerate(p) if x == 0]
        if small:
            raise ValueError(f"mixture weight {weights[small[0]]!r} is below 1/{PERIOD_MAX} of the total "
                             f"{float(sum(weights)):g}: drop that dataset or raise its weight")
    g = reduce(math.gcd, p, Q)
    return [x // g for x in p], Q // g


def greedy_sources(p: Sequence[int], Q: int, n: int, megatron: bool = False) -> np.ndarray:
    """The source of each of the first `n` samples for integer weights p / Q (int16).

    Key of source j at sample i: p_j·t - Q·c_j with t = i + 1 (this module's rule), or t = max(i, 1) with
    `megatron` (what megatron.core.datasets.helpers.build_blending_indices computes, used to compare)."""
    k = len(p)
    if k > np.iinfo(np.int16).max:
        raise ValueError(f"a mixture of {k} datasets is too many")
    keys, out = [0] * k, []  # keys: p_j·t - Q·c_j for the t of the next sample
    for i in range(n):
        if not (megatron and i == 1):  # Megatron's t stays 1 for samples 0 and 1
            keys = list(map(add, keys, p))
        j = keys.index(max(keys))  # the first maximum: ties go to the lowest index, as in Megatron
        keys[j] -= Q
        out.append(j)
    return np.array(out, dtype=np.int16)


class Blend:
    """The periodic assignment of mixture-stream positions to sources, for weights `weights`."""

    def __init__(self, weights: Sequence[float]):
        self.p, self.Q = rational_weights(weights)
        self.order = greedy_sources(self.p, self.Q, self.Q)  # one period
        counts = np.bincount(self.order, minlength=len(self.p))
        if counts.tolist() != self.p:  # cannot happen (see the module docstring); a bug if it did
            raise AssertionError(f"blend period is not periodic: {counts.tolist()} != {self.p}")
        # rank[r]: how many samples of the same source precede position r of the period
        self.positions = [np.flatnonzero(self.order == j) for j in range(len(self.p))]
        self.rank = np.empty(self.Q, dtype=np.int64)
        for pos in self.positions:
            self.rank[pos] = np.arange(len(pos))

    @property
    def k(self) -> int:
        return len(self.p)

    @property
    def shares(self) -> list[float]:
        """The weights the blend realises (p_j / Q)."""
        return [x / self.Q for x in self.p]

    def locate(self, n: int) -> tuple[int, int]:
        """(source j, g): stream position `n` is the g-th sample (0-based) that source j contributes."""
        q, r = divmod(n, self.Q)
        j = int(self.order[r])
        return j, q * self.p[j] + int(self.rank[r])

    def locate_many(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """`locate` for positions [start, stop), vectorised: (sources, ranks)."""
        q, r = np.divmod(np.arange(start, stop, dtype=np.int64), self.Q)
        j = self.order[r]
        return j, q * np.asarray(self.p, dtype=np.int64)[j] + self.rank[r]

    def position_of(self, j: int, g: int) -> int:
        """The stream position of source j's g-th sample (the inverse of `locate`)."""
        q, s = divmod(g, self.p[j])
        return q * self.Q + int(self.positions[j][s])

    def counts(self, n: int) -> list[int]:
        """How many of the first `n` stream samples each source contributes."""
        q, r = divmod(n, self.Q)
        return [q * pj + int(np.searchsorted(pos, r)) for pj, pos in zip(self.p, self.positions)]
