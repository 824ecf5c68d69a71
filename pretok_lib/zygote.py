"""The zygote: the one spawned process that loads the tokenizer, builds its encoder once and forks the workers.

Imported in a fresh interpreter, this module pulls in nothing heavy at import time, so the zygote can start
building the encoder (a fastokens build releases the GIL part of the time) in a thread while the modules the workers
need are imported beside it; the thread is joined before the zygote forks (a fork copies no other thread).
After forking, the zygote supervises: it exits as soon as a worker dies (the exit code says how; the main
process watches the zygote) and answers the main process's `encode` requests for the backend check.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from multiprocessing.connection import wait as wait_any

# The zygote must hold no thread when it forks: these keep numpy's OpenBLAS, Arrow's jemalloc and the tokenizer
# libraries from starting any (each worker is one process on one core anyway).
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                    "JE_ARROW_MALLOC_CONF": "background_thread:false"}
DIED_EXIT, DIED_BY_SIGNAL = 63, 64  # zygote exit codes: a worker exited with an error / was killed by a signal
_ENCODERS: dict = {}  # backend -> Encoder, in the zygote and (inherited) in every worker
_INFO: list = []  # the TokenizerInfo (kind and fingerprint) the encoders were built from


def _set_parent_death_signal() -> None:
    """Die with the parent (a kill -9 of the main process must not leave workers writing parts)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _encoder(backend: str):
    from .tokenizer import make_encoder

    if backend not in _ENCODERS:
        _ENCODERS[backend] = make_encoder(_INFO[0], backend)
    return _ENCODERS[backend]


def _build(spec: str, backend: str | None) -> None:
    from .tokenizer import backends_for, identify

    try:
        _INFO.append(identify(spec))
        _encoder(backend or backends_for(_INFO[0])[0])
    except Exception:  # the main process reports a bad tokenizer itself; a failed build is the check's to judge
        pass


def run_zygote(spec: str, backend: str | None, n: int, tasks, results, conn) -> None:
    """Load the tokenizer, build the most likely backend, fork `n` workers, then supervise them."""
    _set_parent_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    from . import tokenizer  # noqa: F401 — numpy first, before the build thread (single-threaded: SINGLE_THREADED)

    build = threading.Thread(target=_build, args=(spec, backend))
    build.start()
    from . import parts, sources  # noqa: F401 — what the workers run, imported beside the build
    build.join()
    fork = mp.get_context("fork")
    procs = [fork.Process(target=_worker, args=(i, tasks, results), name=f"pretok-worker-{i}") for i in range(n)]
    for p in procs:
        p.start()
    alive, requests = {p.sentinel: p for p in procs}, [conn]
    while alive:
        for ready in wait_any(requests + list(alive)):
            if ready is conn:
                if not _answer(conn):
                    requests.clear()  # the main process closed its end: only the workers are left to watch
                continue
            p = alive.pop(ready)
            p.join()
            if p.exitcode != 0:  # killed (OOM killer, kill -9) or a crash in native code: the run cannot finish.
                # Exit at once (the other workers die with the zygote); the exit code tells the main process why.
                # Not a message on `results`: a worker killed while writing to it may hold the queue's lock.
                os._exit(DIED_BY_SIGNAL - p.exitcode if p.exitcode < 0 else DIED_EXIT)


def _answer(conn) -> bool:
    """One `encode` request of the main process's backend check: (texts, backend) → (ids, offsets) | exception.
    False once the main process has closed the connection."""
    try:
        texts, backend = conn.recv()
    except (EOFError, OSError):
        return False
    try:
        conn.send(_encoder(backend).encode_batch(texts))
    except Exception as e:
        conn.send(e)
    return True


def _worker(slot: int, tasks, results) -> None:
    """Take units until None; each becomes one committed part, its record sent back."""
    from .errors import PretokError
    from .parts import process_unit
    from .tokenizer import limit_threads_to_one_cpu

    _set_parent_death_signal()
    limit_threads_to_one_cpu(slot)
    report = lambda b, d, t: results.put(("progress", b, d, t))  # noqa: E731
    while (task := tasks.get()) is not None:
        _, unit, backend, job = task
        try:
            if not _INFO or _INFO[0].fingerprint != job.tokenizer_fingerprint:
                raise PretokError("the tokenizer file could not be read or changed while the run was starting",
                                  job.tokenizer_spec)
            results.put(("done", process_unit(unit, _encoder(backend), job, report)))
        except Exception as e:
            results.put(("error", e))
