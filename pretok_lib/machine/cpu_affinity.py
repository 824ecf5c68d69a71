"""The CPUs this process may use, and pinning: a worker process pinned to one core, its helper threads let back
onto every allowed core. Linux has affinity masks; elsewhere (macOS) every CPU counts and pinning is skipped."""

from __future__ import annotations

import os

THREADS_ENV = "PRETOK_THREADS_PER_RANK"   # torch threads of each training rank (set by `pretok sweep`)
_ALLOWED: set[int] = set()  # the CPUs this process could run on before `pin_to_one_cpu`


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (a SLURM or cgroup allocation is
    smaller than the machine), else the CPU count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    count = getattr(os, "process_cpu_count", os.cpu_count)  # Python 3.13+ honours -X cpu_count
    return max(1, count() or 1)


def pin_to_one_cpu(cpu_index: int) -> None:
    """Pin the calling thread (call it before starting others: they inherit it) to one allowed CPU, by index;
    a no-op where the OS has no affinity masks."""
    if not hasattr(os, "sched_setaffinity"):
        return
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
