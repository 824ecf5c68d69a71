"""The worker pool: spawned processes pinned to one CPU each, fed units, reporting progress and records."""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import Callable

import numpy as np

from .errors import PretokError
from .parts import Job, process_unit
from .progress import Progress
from .sources import Unit
from .tokenizer import TokenizerInfo, backends_for, limit_threads_to_one_cpu, make_encoder

_WORKER: dict = {}


def _set_parent_death_signal() -> None:
    """Die with the parent (a kill -9 of the main process must not leave workers writing parts)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _init_worker(info: TokenizerInfo, job: Job, queue, slot) -> None:
    """Pin to one CPU and build the most likely backend while the main process is still checking backends."""
    _set_parent_death_signal()
    with slot.get_lock():
        cpu = slot.value
        slot.value += 1
    limit_threads_to_one_cpu(cpu)
    first = backends_for(info)[0]
    _WORKER.update(info=info, job=job, queue=queue, encoders={first: make_encoder(info, first)})


def _encoder(backend: str):
    encoders = _WORKER["encoders"]
    if backend not in encoders:
        encoders[backend] = make_encoder(_WORKER["info"], backend)
    return encoders[backend]


def _worker_unit(unit: Unit, backend: str) -> dict:
    q = _WORKER["queue"]
    return process_unit(unit, _encoder(backend), _WORKER["job"], lambda b, d, t: q.put((b, d, t)))


def _worker_encode(texts: list[str], backend: str) -> tuple[np.ndarray, np.ndarray]:
    ids, offsets = _encoder(backend).encode_batch(texts)
    return np.array(ids), offsets


class Stopped(BaseException):
    """A wait on the pool given up because the run is ending (not an error of the work itself)."""


class Workers:
    """The worker pool (spawned, one pinned CPU each), or inline processing for `workers <= 0`."""

    def __init__(self, info: TokenizerInfo, job: Job, workers: int, units: int):
        self.info, self.job, self.pool = info, job, None
        if workers > 0 and units > 0:
            # spawn, not fork: a worker's memory is its own (a forked one would carry, and be charged for, the
            # parent's pages) and no lock or thread state of the parent leaks in. Workers start while the main
            # process plans and checks; each builds its own encoder after pinning to a CPU.
            ctx = mp.get_context("spawn")
            self.queue, slot = ctx.Queue(), ctx.Value("i", 0)
            self.pool = ctx.Pool(min(workers, units), _init_worker, (info, job, self.queue, slot))
            self.pids = {w.pid for w in self.pool._pool}  # noqa: SLF001 — to notice a worker that died

    def encoder(self, backend: str, stop: threading.Event) -> Callable[[list[str]], tuple[np.ndarray, np.ndarray]] | None:
        """`encode_batch` of `backend` run by a worker (which has built it already), or None when inline. The
        call waits behind the parts already queued; it raises `Stopped` once `stop` is set."""
        if self.pool is None:
            return None

        def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
            result = self.pool.apply_async(_worker_encode, (texts, backend))
            while not result.ready():
                if stop.is_set():
                    raise Stopped()
                result.wait(0.05)
            return result.get()
        return encode

    def check_alive(self) -> None:
        """multiprocessing.Pool silently replaces a dead worker and loses its task (the run would hang): fail
        instead, with the reason (killed by the OOM killer, a crash in native code, an unimportable __main__)."""
        now = {w.pid for w in self.pool._pool}  # noqa: SLF001
        if now != self.pids:
            raise PretokError("a tokenizer worker process died (killed, out of memory, or a crash in native code; "
                              "scripts fed on stdin cannot start spawned workers: use a file or --workers 0); "
                              "rerun the same command to resume")

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def run(self, pending: list[Unit], backend: str, bar: Progress, on_record: Callable[[dict], None],
            keep_going: Callable[[], None] = lambda: None) -> None:
        """Process `pending` units; `on_record` gets each finished part's record in the main process. At most
        4 parts per worker are in flight, which bounds what the main process buffers for in-order appending.
        `keep_going` is called between parts and may raise to stop the run."""
        if self.pool is None:  # inline, for debugging and tiny inputs
            enc = make_encoder(self.info, backend) if pending else None
            for u in pending:
                keep_going()
                on_record(process_unit(u, enc, self.job, bar.update))
            return
        import queue as queue_mod

        done: queue_mod.SimpleQueue = queue_mod.SimpleQueue()  # filled by the pool's result thread, in order of completion
        todo, running = list(pending), 0
        window = 4 * self.pool._processes  # noqa: SLF001 — the pool's size
        while todo or running:
            while todo and running < window:
                self.pool.apply_async(_worker_unit, (todo.pop(0), backend), callback=lambda r: done.put((r, None)),
                                      error_callback=lambda e: done.put((None, e)))
                running += 1
            keep_going()
            try:
                rec, err = done.get(timeout=0.05)
            except queue_mod.Empty:
                _drain(self.queue, bar, timeout=0)
                self.check_alive()
                continue
            running -= 1
            if err is not None:
                raise err  # a worker's PretokError, with its one-line message
            on_record(rec)
            _drain(self.queue, bar, timeout=0)
        _drain(self.queue, bar, timeout=0)


def _drain(queue, bar: Progress, timeout: float) -> None:
    import queue as queue_mod

    try:
        item = queue.get(timeout=timeout) if timeout else queue.get_nowait()
        while True:
            bar.update(*item)
            item = queue.get_nowait()
    except queue_mod.Empty:
        pass
