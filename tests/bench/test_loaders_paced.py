"""The paced loader timing (bench/loaders_paced.py): its rate is the calls' tokens over their time (a mean), so a
path whose calls are mostly cheap with an expensive one now and then gets its cost per batch, not its median call;
the interval is a seeded bootstrap of that mean and holds it."""

from __future__ import annotations

import random
import time

import pytest

from pretok_lib.analysis.uncertainty import bootstrap_sum_ratio
from pretok_lib.bench.loaders_paced import paced


def bursty(cheap_s: float, dear_s: float, every: int, tokens: int = 100):
    """Batches that cost `cheap_s`, and `dear_s` every `every`-th (a document tokenized now and then)."""
    def make():
        i = 0
        while True:
            i += 1
            end = time.perf_counter() + (dear_s if i % every == 0 else cheap_s)
            while time.perf_counter() < end:
                pass
            yield {"tokens": tokens}
    return make


@pytest.mark.parametrize("seed", range(4))
def test_the_rate_of_drawn_bursty_calls_is_their_mean(seed):
    rng = random.Random(seed)
    cheap, every, n = rng.uniform(1e-4, 1e-3), rng.choice([3, 4, 5]), rng.choice([9, 12, 15])
    dear = cheap * rng.uniform(10, 30)
    r = paced(bursty(cheap, dear, every), n=n, warmup=0, pace_s=0.001)
    assert r["paced_batches"] == n
    mean_s = r["paced_mean_batch_s"]
    assert r["paced_tokens_per_s"] == pytest.approx(100 / mean_s, rel=1e-9)
    # the median call is a cheap one; the mean carries the dear ones (n // every of them)
    assert r["paced_batch_s"] < 0.5 * mean_s
    assert mean_s >= ((n - n // every) * cheap + (n // every) * dear) / n * 0.99
    lo, hi = r["paced_rate_interval"]
    assert lo <= r["paced_tokens_per_s"] <= hi


def test_a_sum_ratio_is_deterministic_holds_its_point_and_none_without_a_denominator():
    tokens, times = [100, 100, 100, 100], [0.001, 0.001, 0.001, 0.01]
    assert bootstrap_sum_ratio(tokens, times) == bootstrap_sum_ratio(tokens, times)
    rate, lo, hi = bootstrap_sum_ratio(tokens, times)
    assert rate == pytest.approx(400 / 0.013) and lo < rate < hi
    assert bootstrap_sum_ratio([], []) is None and bootstrap_sum_ratio([5], [0.0]) is None
    assert bootstrap_sum_ratio([1, 1], [2, 2]) == (0.5, 0.5, 0.5)   # no spread: the point itself
