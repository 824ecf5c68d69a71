"""Stopping what we started: stop signals turned into exceptions, a child's whole process tree stopped (torchrun
starts each rank in its own session, so a process group is not enough), children that die with their parent.

Used by `pretok sweep` (one process tree per grid point) and `pretok study` (the notebook kernel that runs the
sweeps): SIGTERM / SIGINT / SIGHUP to them reach every process they started, which checkpoint and exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import PretokError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_STOPPED = 3


class SweepStopped(KeyboardInterrupt):
    """A stop signal arrived while a sweep was running a point (which is then stopped, see `stop_tree`)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class Stopped(PretokError):
    """A sweep or study stopped by a signal after stopping what it started: one line, exit code 3 (like an
    interrupted training run: rerun the same command to resume)."""

    exit_code = EXIT_STOPPED


_signal_seen: int | None = None  # the stop signal the default handler of `stop_signals` raised for, if any


@contextlib.contextmanager
def stop_signals(handler: Callable[[int, object], None] | None = None):
    """While inside, SIGTERM/SIGINT/SIGHUP call `handler` (default: raise SweepStopped). A no-op outside the
    main thread, where Python cannot take signals.

    With the default handler, an Exception that leaves the block after a signal is that stop (`as_stopped`): the
    SweepStopped raised inside an import or a library can come out as their own error (numpy's import: ImportError).
    """
    global _signal_seen
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_stopped(signum, frame):
        global _signal_seen
        _signal_seen = signum
        raise SweepStopped(signum)

    saved = _signal_seen
    if handler is None:
        _signal_seen = None
    previous = {s: signal.signal(s, handler or raise_stopped) for s in STOP_SIGNALS}
    try:
        yield
    except Exception as e:
        stopped = as_stopped(e) if handler is None else e
        if stopped is e:
            raise
        raise stopped from e
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _signal_seen = saved


def as_stopped(e: BaseException) -> BaseException:
    """`e`, or a SweepStopped when `e` is an Exception and a stop signal was taken by `stop_signals` (then `e` is
    what the interrupted code made of the SweepStopped)."""
    if _signal_seen is None or not isinstance(e, Exception) or isinstance(e, Stopped):
        return e  # a Stopped is the stop, already told where it came (a sweep stopped during a point)
    return SweepStopped(_signal_seen)


def ignore(signum: int, frame) -> None:
    """A signal handler that does nothing (while stopping children already)."""


def tree(pid: int) -> list:
    """psutil processes of `pid` and all its descendants."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(proc: subprocess.Popen, grace_s: float = 60.0, sig: int = signal.SIGTERM) -> None:
    """`sig` to the child's process group and to every descendant (a training run's ranks checkpoint on it and
    exit 3), SIGKILL to whatever is left after `grace_s`; returns when none is left (the child reaped)."""
    import psutil

    procs = tree(proc.pid)
    for s, wait in ((sig, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, s)
        procs = [p for p in {*procs, *tree(proc.pid)} if p.is_running()]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(s)
        _, procs = psutil.wait_procs(procs, timeout=wait)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1.0)
        if not procs:
            return


def run_child(cmd: list[str], *, timeout: float | None = None, grace_s: float = 60.0,
              **popen: Any) -> subprocess.CompletedProcess:
    """`subprocess.run` for a child that must not outlive this command: it gets SIGTERM when this process dies, even
    by SIGKILL (`die_with_parent_hook`), and a stop signal, an error or `timeout` here stops its whole process tree
    (`stop_tree`: SIGTERM, SIGKILL after `grace_s`) before the exception (TimeoutExpired for `timeout`) goes on."""
    if popen.pop("capture_output", False):
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(cmd, preexec_fn=die_with_parent_hook(), **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            with stop_signals(ignore):    # stopping already: a second signal must not cut it short
                stop_tree(proc, grace_s)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def forward(signum: int, to_pids: list[int]) -> None:
    """Send `signum` to each pid still there."""
    for pid in to_pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def children() -> list[int]:
    """Pids of this process's direct children."""
    import psutil

    return [c.pid for c in psutil.Process().children()]


def die_with_parent_hook() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when this process (thread) dies, even by SIGKILL
    (PR_SET_PDEATHSIG survives exec); None where unavailable. Resolved here so the hook itself does nothing
    but the system call between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(1, int(signal.SIGTERM))

    return hook
