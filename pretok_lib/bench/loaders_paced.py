"""A loader called once per training step (`pretok bench loaders --pace-ms P`): the time of `next()` alone when
the caller was busy for P ms before each call, as a training loop is while the GPU computes.

Measured on an H200 (issue 39), a batch cost more inside the training step than back to back in the benchmark:
with no DataLoader workers +0.4-0.7 ms per batch on the pretokenized paths (0.75 ms vs 0.31 ms for memmap), and with
2 workers the main process took 0.3 ms to receive a prefetched batch where the throughput reference implied
0.77 ms. The stall model (analysis/supply.py) takes these paced times where the benchmark has them: with no
workers the supply is the batch's slots / its paced time; with workers the main process's cost is the paced time
of receiving that path's batch.

The rate is a mean (the calls' tokens over their time), as a run's data stall is a share of its time: a path whose
calls are mostly cheap with an expensive one now and then (padding-free tokenizes a document every few batches)
has a median call far below its cost per batch. Its interval is a seeded bootstrap of that mean (deterministic).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

from ..analysis.uncertainty import bootstrap_sum_ratio, estimate
from .repeats import est_dict


def paced(make_iter: Callable[[], Iterator[dict]], n: int, warmup: int, pace_s: float) -> dict:
    """After `warmup` untimed batches, `n` calls of next() each after `pace_s` seconds away (sleeping, as the main
    process waits on the device): their median time with its interval, their mean, and the rate they make (tokens
    over time) with its bootstrap interval."""
    it = make_iter()
    times, tokens = [], []
    try:
        for i in range(warmup + n):
            if i >= warmup:   # the warm-up calls are not timed: no wait before them
                time.sleep(pace_s)
            t = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:   # an epoch end: a fresh iterator, this call not counted
                it = make_iter()
                continue
            dt = time.perf_counter() - t
            if i >= warmup:
                times.append(dt)
                tokens.append(int(b.get("tokens", 0)))
    finally:
        getattr(it, "close", lambda: None)()
    if not times:
        return {}
    rate = bootstrap_sum_ratio(tokens, times)   # tokens over time: a mean, as a run's stall is a share of time
    return {"pace_s": pace_s, "paced_batches": len(times), "paced_batch_s": statistics.median(times),
            "paced_mean_batch_s": sum(times) / len(times), "paced_estimate": est_dict(estimate(times)),
            "paced_tokens_per_s": rate[0] if rate else None, "paced_rate_interval": list(rate[1:]) if rate else None}


def pace_path(kind: str, src: str, tok: str | None, seq_len: int, micro_batch: int, seed: int, workers: int,
              n: int, warmup: int, pace_s: float) -> dict:
    """`paced` on a fresh dataset and loader of one data path, built as `bench_path` builds them."""
    from ..data import make_dataset, make_loader

    ds = make_dataset(kind, src, seq_len, micro_batch=micro_batch, tokenizer=tok, seed=seed, shuffle=True)
    loader = make_loader(ds, num_workers=workers)
    return paced(lambda: iter(loader), n, warmup, pace_s)
