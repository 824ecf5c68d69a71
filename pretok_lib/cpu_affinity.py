"""CPU pinning: a worker process pinned to one core, and its helper threads let back onto every allowed core."""

from __future__ import annotations

import os

_ALLOWED: set[int] = set()  # the CPUs this process could run on before `pin_to_one_cpu`


def pin_to_one_cpu(cpu_index: int) -> None:
    """Pin the calling thread (call it before starting others: they inherit it) to one allowed CPU, by index."""
    allowed = sorted(os.sched_getaffinity(0))
    _ALLOWED.update(allowed)
    os.sched_setaffinity(0, {allowed[cpu_index % len(allowed)]})


def unpin_this_thread() -> None:
    """Let the calling thread run on every CPU the process was allowed before it was pinned (Linux applies
    affinity per thread), so a helper thread's work that releases the GIL runs beside the pinned one's."""
    if _ALLOWED:
        try:
            os.sched_setaffinity(0, _ALLOWED)
        except OSError:  # the allowed set shrank meanwhile (cgroup change): stay where the thread is
            pass
