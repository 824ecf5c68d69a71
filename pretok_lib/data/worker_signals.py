"""DataLoader workers leave stop signals to the process they load for.

A stop signal often reaches every process of a run, not only the trainer: Ctrl-C the terminal's foreground process
group, `kill -TERM -PGID`, torchrun's shutdown, a sweep's stop (`procs.stop_tree`), SLURM's `scancel` (every process
of the job step), `docker stop`. The trainer answers SIGTERM / SIGINT / SIGUSR1 by finishing its step and
checkpointing (train/loop.py `StopFlag`), which needs its workers: but torch makes a worker die of any SIGTERM not
sent by its parent, and the main process then fails at once ("DataLoader worker (pid N) is killed by signal:
Terminated"), without a checkpoint, losing the steps since the last one.

So a worker ignores SIGINT and SIGUSR1 and takes SIGTERM only from its parent (torch's own rule, which its
`terminate()` at shutdown relies on) or once its parent is gone. SIGTERM is blocked in the main process while it
starts workers (`starting_workers`), so a forked worker inherits it blocked; the worker's `worker_init` then waits
for it on a thread with `sigwaitinfo`, which tells who sent it. A spawned (or forkserver) worker starts with no
signal blocked and has threads of its imports by then, which cannot be made to block it: one delivered to such a
thread goes to a Python handler that cannot tell the sender and ends the worker only when its parent is gone (a
parent's `terminate()` of a hung worker then leaves it to torch's watchdog), and until `worker_init` has run (the
worker's imports: seconds) a SIGTERM still ends it. Linux and other POSIX systems with `sigwaitinfo`; elsewhere a
no-op.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator

_SUPPORTED = hasattr(signal, "sigwaitinfo") and hasattr(signal, "pthread_sigmask")
_started = False  # this process's SIGTERM watcher runs (one per worker process)


@contextlib.contextmanager
def starting_workers() -> Iterator[None]:
    """SIGTERM blocked in this thread while DataLoader workers are forked from it (they inherit the mask); one
    that arrives meanwhile is delivered when the block ends. Only in the main thread, where Python runs its signal
    handlers, and only for the fork start method: a forkserver started inside the block kept SIGTERM blocked for
    good, and so did every process it started later (a Pool's `terminate()` then hung)."""
    if (not _SUPPORTED or threading.current_thread() is not threading.main_thread()
            or multiprocessing.get_start_method() != "fork"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_init(_worker_id: int | None = None) -> None:
    """In a DataLoader worker (its `worker_init_fn`): SIGINT and SIGUSR1 ignored, SIGTERM blocked and taken by a
    thread that ends the worker only when its parent sent it or has gone."""
    global _started
    if not _SUPPORTED or _started or threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)
    parent = os.getppid()
    signal.signal(signal.SIGTERM, functools.partial(_sigterm_handler, parent))  # threads older than this one
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})   # threads started from here on inherit it
    threading.Thread(target=_take_sigterm, args=(parent,), name="pretok-worker-sigterm", daemon=True).start()
    _started = True


def _sigterm_handler(parent: int, _signum: int, _frame) -> None:
    """A SIGTERM that a thread not blocking it took (a spawned worker's import threads): sender unknown."""
    if os.getppid() != parent:
        os._exit(0)


def _take_sigterm(parent: int) -> None:
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == parent or os.getppid() != parent:
            os._exit(0)  # as torch's worker handler does for its parent's SIGTERM
