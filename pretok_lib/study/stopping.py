"""How `pretok study` takes stop signals (SIGTERM, SIGINT, SIGHUP) while its notebooks run."""

from __future__ import annotations

import signal
import threading

from .. import procs


class Stop:
    """The study's handler of SIGTERM/SIGINT/SIGHUP: remember the signal and interrupt the notebook kernel (our
    child, in its own session) every 2 s until the running notebook ends: a sweep running in it then stops its
    runs, which checkpoint (pretok_lib.sweep); an idle kernel ignores SIGINT, so it is repeated. A second
    signal while a notebook runs (`cuttable`) stops it at once: KeyboardInterrupt in papermill, which kills the
    kernel (its runs still get SIGTERM, PR_SET_PDEATHSIG), and run_study records the notebook `stopped`. Raised
    anywhere else (recording, writing the report), it printed a traceback and left study.json saying the notebooks
    not reached were `running`: there a further signal changes nothing, the study is stopping already."""

    def __init__(self):
        self.signum: int | None = None
        self.cuttable = False
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
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
        while True:
            with self._lock:
                if self.done.is_set():
                    return
                procs.forward(signal.SIGINT, procs.children())
            self.done.wait(2.0)
