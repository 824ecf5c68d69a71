"""How `pretok study` takes stop signals (SIGTERM, SIGINT, SIGHUP) while its notebooks run."""

from __future__ import annotations

import signal
import threading
import time

from ..launch import procs

CUT_AFTER_S = 30.0  # a stopped notebook whose kernel has no process of its own left is cut after this long


class Stop:
    """The study's handler of SIGTERM/SIGINT/SIGHUP: remember the signal and interrupt the notebook kernel (our
    child, in its own session) every 2 s until the running notebook ends: a sweep running in it then stops its
    runs, which checkpoint (pretok_lib.launch.sweep); an idle kernel ignores SIGINT, so it is repeated. A second
    signal while a notebook runs (`cuttable`) stops it at once: KeyboardInterrupt in papermill, which kills the
    kernel (its runs still get SIGTERM, PR_SET_PDEATHSIG), and run_study records the notebook `stopped`. Raised
    anywhere else (recording, writing the report), it printed a traceback and left study.json saying the notebooks
    not reached were `running`: there a further signal changes nothing, the study is stopping already.

    A kernel can hang after its cell ended: a SIGINT landing in ipykernel's message handler outside the user's
    code ("KeyboardInterrupt caught in kernel") loses the cell's reply, and papermill waits for it forever (seen once
    in CI). So once the kernel has had no child process (its runs stopped) for CUT_AFTER_S and the notebook has
    not ended, the study cuts it as a second signal would (`cut` says so)."""

    def __init__(self):
        self.signum: int | None = None
        self.cuttable = False
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.cut = ""            # why the study cut the notebook itself ("": it did not)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __call__(self, signum: int, frame) -> None:
        if self.signum is not None:
            if self.cuttable:
                self.cuttable = False
                raise KeyboardInterrupt
            return
        self.signum = signum
        self.thread = threading.Thread(target=self._interrupt_kernel, daemon=True)
        self.thread.start()

    def notebook_ended(self) -> None:
        """The running notebook's execution has ended (a cell failed, e.g. the interrupted one, or its last cell
        ran): no SIGINT after this returns, since one landing in the kernel while papermill shuts it down raises
        there and prints a traceback under the study's one line. run_study clears `done` before the next notebook."""
        with self._lock:
            self.done.set()

    def _interrupt_kernel(self) -> None:
        idle_since: float | None = None
        while True:
            with self._lock:
                if self.done.is_set():
                    return
                kernels = procs.children()
                procs.forward(signal.SIGINT, kernels)
            now = time.monotonic()
            busy = any(_running(p) for pid in kernels for p in procs.tree(pid)[1:])
            idle_since = None if busy else (now if idle_since is None else idle_since)
            if idle_since is not None and now - idle_since >= CUT_AFTER_S and self.cuttable:
                self.cut = (f"the kernel had no process left and had not ended the notebook {CUT_AFTER_S:.0f} s "
                            "after the stop: cut")
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # -> __call__: KeyboardInterrupt
                idle_since = None
            self.done.wait(2.0)


def _running(p) -> bool:
    """Whether psutil process `p` still runs (a zombie, ended but not reaped by its parent, does not)."""
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
