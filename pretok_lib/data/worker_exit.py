"""A spawned DataLoader worker ends as a forked one does: `os._exit` right after torch's worker loop returns.

Under spawn, a worker returns from the loop into multiprocessing's `spawn_main`, which calls `sys.exit`, so the
interpreter finalizes while the worker queue's feeder thread (a daemon) may still be pickling a prefetched batch
inside libtorch with the GIL released (`_share_fd_cpu_`). When that thread takes the GIL back during finalization,
CPython before 3.14 ends it with `pthread_exit` (3.14 parks it: gh-87135); the forced unwind through a C++
destructor calls `std::terminate`. The user sees "terminate called without an active exception" and, from the
dropped loader in the main process, an ignored `RuntimeError: DataLoader worker (pid N) is killed by signal:
Aborted` with its traceback: about one loader in 20 dropped right after its first batch, measured. Fork and
forkserver children already end with `os._exit` after the same loop (multiprocessing's popen_fork, forkserver), so
nothing of the worker's state is lost that they keep.
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import sys


class _SysExitingAtOnce:
    """`sys` as `multiprocessing.spawn` sees it, except that `exit` flushes the standard streams and ends the
    process at once with the status `sys.exit` would give (None: 0, an int: itself, anything else: 1)."""

    def __getattr__(self, name: str):
        return getattr(sys, name)

    def __setattr__(self, name: str, value) -> None:  # spawn's `prepare` sets sys.path / sys.argv
        setattr(sys, name, value)

    @staticmethod
    def exit(status: object = None) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:
                pass
        os._exit(status if isinstance(status, int) else 0 if status is None else 1)


def end_spawned_worker_at_once() -> None:
    """Make this process's return from `spawn_main` (a process started by spawn: its target has returned, its
    exit code is known) end it with `os._exit` instead of interpreter finalization. Idempotent; no effect in a
    process started otherwise, whose start never returns into `spawn_main`."""
    if not isinstance(multiprocessing.spawn.sys, _SysExitingAtOnce):
        multiprocessing.spawn.sys = _SysExitingAtOnce()
