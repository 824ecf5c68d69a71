"""The read-ahead thread of the parquet reader (`sources.prefetch.prefetched`) and the CPU pinning it relies on:
order, errors at their place, bounded look-ahead, and no thread left behind however the consumer stops."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pretok_lib.sources.prefetch import prefetched


class Boom(Exception):
    pass


class Source:
    """A generator of `n` items that may raise at `fail_at`, counting what it produced and whether it closed."""

    def __init__(self, n: int, fail_at: int | None, slow: bool):
        self.n, self.fail_at, self.slow = n, fail_at, slow
        self.produced, self.closed, self.max_ahead, self.consumed = 0, False, 0, 0

    def __iter__(self):
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise Boom(i)
                if self.slow:
                    time.sleep(0.001)
                self.produced += 1
                self.max_ahead = max(self.max_ahead, self.produced - self.consumed)
                yield i
        finally:
            self.closed = True


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pretok-prefetch"]


@pytest.mark.parametrize("seed", range(40))
def test_random_sequences_errors_and_early_stops(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 30)
    fail_at = rng.choice([None, rng.randint(0, max(n - 1, 0))]) if n else None
    stop_at = rng.choice([None, rng.randint(0, n)])
    depth = rng.randint(1, 3)
    src = Source(n, fail_at, slow=rng.random() < 0.3)
    it = iter(src)
    got, raised = [], None
    gen = prefetched(it, depth)
    try:
        for x in gen:
            if stop_at is not None and len(got) == stop_at:
                break
            got.append(x)
            src.consumed = len(got)
            if rng.random() < 0.2:
                time.sleep(0.002)  # let the producer run ahead as far as it may
    except Boom as e:
        raised = e.args[0]
    gen.close()
    end = min(x for x in (n, fail_at, stop_at) if x is not None)
    assert got == list(range(end))  # in order, nothing skipped or repeated
    if fail_at is not None and (stop_at is None or fail_at <= stop_at):
        assert raised == fail_at  # the producer's error, at its place
    else:
        assert raised is None
    # the consumer holds one item, the queue `depth`, the producer one more it is trying to hand over
    assert src.max_ahead <= depth + 2
    assert src.closed and not _prefetch_threads()


def test_an_error_in_the_consumer_stops_and_joins_the_producer():
    src = Source(1000, None, slow=True)
    with pytest.raises(ZeroDivisionError):
        for x in prefetched(iter(src)):
            if x == 3:
                1 / 0
    assert src.closed and src.produced < 10 and not _prefetch_threads()


def test_the_prefetch_thread_runs_on_every_core_a_pinned_process_was_allowed():
    """Linux pins per thread: the worker's pinned main thread must not take its read-ahead thread with it."""
    allowed = sorted(os.sched_getaffinity(0))
    code = (
        "import json, os\n"
        "from pretok_lib.machine.cpu_affinity import pin_to_one_cpu\n"
        "from pretok_lib.sources.prefetch import prefetched\n"
        "pin_to_one_cpu(1)\n"
        "def producer():\n"
        "    yield sorted(os.sched_getaffinity(0))\n"
        "print(json.dumps([sorted(os.sched_getaffinity(0)), next(iter(prefetched(producer())))]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    pinned, producer = json.loads(out)
    assert pinned == [allowed[1 % len(allowed)]]
    assert producer == allowed
