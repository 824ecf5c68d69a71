"""The zygote: the one spawned process that loads the tokenizer, builds its encoder once and forks the workers.

Imported in a fresh interpreter, this module pulls in nothing heavy at import time, so the zygote starts a
fastokens build straight from a tokenizer.json's bytes in a thread at once (the build releases the GIL most of the
time) while the modules the workers need are imported and the tokenizer is identified beside it; the build is
adopted only if it is of the identified file, and the thread is joined before the zygote forks (a fork copies no
other thread).
It builds the first candidate backend that can be built (fastest first, or only the forced one), remembers why
each one before it could not, and tells the main process (`Ready`) before it forks: the workers all run that one
backend, and a backend that failed here is never built again in this run (asking for it raises the same error),
so the output never depends on which process failed.
After forking, the zygote supervises: it exits as soon as a worker dies (the exit code says how; the main
process watches the zygote) and answers the main process's `encode` requests for the backend check.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait as wait_any
from typing import Callable

# The environment the zygote starts in, inherited by its workers. It must hold no thread when it forks: all but the
# last keep numpy's OpenBLAS, Arrow's jemalloc and the tokenizer libraries from starting any (each worker is one
# process on one core anyway). The last makes Arrow allocate from the C library's malloc, not jemalloc, whose arenas
# keep what a worker freed: peak RSS per worker -60 MB (memmap) to -125 MB (padded) with cl100k, same speed.
WORKER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
              "JE_ARROW_MALLOC_CONF": "background_thread:false", "ARROW_DEFAULT_MEMORY_POOL": "system"}
DIED_EXIT, DIED_BY_SIGNAL = 63, 64  # zygote exit codes: a worker exited with an error / was killed by a signal
_ENCODERS: dict = {}  # backend -> Encoder, in the zygote and (inherited) in every worker
_INFO: list = []  # the TokenizerInfo (kind and fingerprint) the encoders were built from
_FAILED: dict = {}  # backend -> the BackendUnavailable its build raised here


@dataclass
class Ready:
    """The zygote's first message to the main process, sent before it forks: the tokenizer it identified, the
    backend it built for the workers (None: none could be), why the ones tried before could not, or why the
    tokenizer itself could not be identified (`error`)."""

    fingerprint: str | None
    backend: str | None
    failures: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def _set_parent_death_signal() -> None:
    """Die with the parent (a kill -9 of the main process must not leave workers writing parts)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _encoder(backend: str):
    """The encoder of `backend`, built once; a backend whose build failed raises that same error again."""
    from ..tokenizer import BackendUnavailable, make_encoder

    if backend in _FAILED:
        raise _FAILED[backend]
    if backend not in _ENCODERS:
        try:
            _ENCODERS[backend] = make_encoder(_INFO[0], backend)
        except BackendUnavailable as e:
            _FAILED[backend] = e
            raise
    return _ENCODERS[backend]


def _early_fastokens(spec: str, backend: str | None) -> tuple[str, object] | None:
    """(sha256 fingerprint, fastokens.Tokenizer or the exception its build raised) built straight from a HF
    tokenizer.json's bytes, before numpy and the tokenizer module are imported and the file is identified (~0.2 s
    sooner); None if another backend is asked for or the spec is not such a file. `_prepare` adopts it (or its
    failure) only if `identify` then finds that very file."""
    import hashlib
    from pathlib import Path

    if backend not in (None, "fastokens"):
        return None
    path = Path(spec).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        if file.suffix != ".json" or file.name.startswith("tekken") or not file.is_file():
            return None
        data = file.read_bytes()
        if b'"config"' in data[:4096]:  # a Mistral tekken file under another name
            return None
        fingerprint = "sha256:" + hashlib.sha256(data).hexdigest()
    except Exception:
        return None
    try:
        import fastokens

        tok = fastokens.Tokenizer.from_json_str(data.decode("utf-8"))
        # its lazy initialisation (~25-60 ms at the first encode) done once here, inherited by every forked worker
        tok.encode_batch_flat(["warm up"], add_special_tokens=False, split_special_tokens=True)
        return fingerprint, tok
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a Rust panic is a BaseException
        return fingerprint, e


def _start_early_build(spec: str, backend: str | None) -> tuple[threading.Thread, list]:
    """`_early_fastokens` started in a thread; its result is appended to the returned list."""
    early: list = []
    build = threading.Thread(target=lambda: early.append(_early_fastokens(spec, backend)))
    build.start()
    return build, early


def _prepare(spec: str, backend: str | None, build: threading.Thread, early: list) -> Ready:
    """Identify the tokenizer while `build` runs `_early_fastokens` (result in `early`), adopt that build (or its
    failure) if identify found that very file an hf-json tokenizer to be run by fastokens, then build the first
    candidate (or `backend`) that can be built."""
    from ..tokenizer import BackendUnavailable, _reason, backends_for, fastokens_encoder, identify

    try:
        _INFO.append(identify(spec))
    except Exception as e:  # the main process reports a bad tokenizer itself (it loads it too)
        build.join()
        return Ready(None, None, {}, str(e).splitlines()[0] if str(e) else type(e).__name__)
    try:
        order = [backend] if backend else backends_for(_INFO[0])
        build.join()
        got = early[0] if early else None
        if got is not None and (_INFO[0].kind, order[0], _INFO[0].fingerprint) == ("hf-json", "fastokens", got[0]):
            if isinstance(got[1], BaseException):
                _FAILED["fastokens"] = BackendUnavailable("fastokens", _reason(got[1]), spec)
            else:
                _ENCODERS["fastokens"] = fastokens_encoder(got[1])
        for choice in order:
            try:
                _encoder(choice)
                break
            except Exception as e:  # BackendUnavailable; or a forced backend not available for this kind
                _FAILED.setdefault(choice, e if isinstance(e, BackendUnavailable) else
                                   BackendUnavailable(choice, _reason(e), spec))
        built = next((b for b in order if b in _ENCODERS), None)
        return Ready(_INFO[0].fingerprint, built, {b: e.reason for b, e in _FAILED.items()})
    finally:
        build.join()


def run_zygote(spec: str, backend: str | None, n: int, tasks, results, conn, ready_conn,
               preload: tuple[str, ...] = (), counts=None) -> None:
    """Load the tokenizer, build the first candidate backend that builds, report it (`Ready` on `ready_conn`),
    fork `n` workers, then supervise them and answer `encode` requests on `conn`.

    Args:
        spec: the tokenizer (path or name).
        backend: the backend to build (None: the fastest candidate that builds).
        n: workers to fork.
        tasks, results: where the workers take tasks from, `(tasks, urgent, pipes)`: a worker takes from its own
            pipe (`pipes[slot]`: placements of the parts it keeps in memory) first, then `urgent`, then `tasks`;
            and the queue they send records and progress to.
        conn: the backend check's `encode` requests from the main process.
        ready_conn: where `Ready` (or the failure) is sent once the encoder is built.
        preload: URL schemes whose filesystems are imported before forking.
        counts: shared [the plan's tasks, set by the main process once planned (0: not yet), workers forked]: the
            zygote waits for the first (after it has sent `Ready`), forks at most that many workers and writes back
            how many.
    """
    _set_parent_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    build, early = _start_early_build(spec, backend)
    from .. import sources  # noqa: F401 — what the workers run, imported beside the build
    from . import parts  # noqa: F401 — likewise
    if preload:
        from ..sources.remote import preload_filesystems

        preload_filesystems(preload)
    report = _prepare(spec, backend, build, early)
    try:
        ready_conn.send(report)
    except OSError:  # the main process stopped (or was stopped) while this one started: nothing to run
        os._exit(0)
    ready_conn.close()
    if report.backend is None:  # nothing the workers could run: the main process reports why and ends the run
        n = 0
    elif counts is not None:  # no idle workers for a small input: wait for the plan, if the main process has not
        while counts[0] <= 0:  # planned yet (started early, its imports can outlast this build on a slow disk);
            time.sleep(0.002)  # no task could come before the plan anyway
        n = min(n, counts[0])
    if counts is not None:
        counts[1] = n
    _FORKED[0] = n  # inherited: a worker holds a task ahead only while every other one could still take one
    procs = _start_workers(list(range(n)), tasks, results, preload)
    alive, requests = {p.sentinel: p for p in procs}, [conn]
    while alive:
        for ready in wait_any(requests + list(alive)):
            if ready is conn:
                if not _answer(conn):
                    requests.clear()  # the main process closed its end: only the workers are left to watch
                continue
            _reap(alive.pop(ready))


FORK_FANOUT = 16  # children one process forks; more workers are forked by group processes, in parallel


def _start_workers(slots: list[int], tasks, results, preload: tuple[str, ...]) -> list:
    """Fork the workers of `slots` (each ~5 ms here, one after another): up to FORK_FANOUT directly, else
    FORK_FANOUT group processes that fork their share at once (287 workers: ~0.2 s instead of ~1.6 s)."""
    fork = mp.get_context("fork")
    if len(slots) <= FORK_FANOUT:
        procs = [fork.Process(target=_worker, args=(i, tasks, results, os.getpid(), preload),
                              name=f"pretok-worker-{i}") for i in slots]
    else:
        per = -(-len(slots) // FORK_FANOUT)
        procs = [fork.Process(target=_group, args=(slots[k : k + per], tasks, results, os.getpid(), preload),
                              name=f"pretok-workers-{slots[k]}") for k in range(0, len(slots), per)]
    for p in procs:
        p.start()
    return procs


def _group(slots: list[int], tasks, results, parent_pid: int, preload: tuple[str, ...]) -> None:
    """A group process: fork the workers of `slots`, then exit as its parent would when one of them dies (the
    same exit code), or with 0 once all have ended."""
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent was killed before the death signal was set
        os._exit(0)
    procs = _start_workers(slots, tasks, results, preload)
    alive = {p.sentinel: p for p in procs}
    while alive:
        for ready in wait_any(list(alive)):
            _reap(alive.pop(ready))
    os._exit(0)


def _reap(p) -> None:
    """Join an ended worker (or group); if it did not end well, exit at once with the code that says how (its
    workers die with this process). Not a message on `results`: a worker killed while writing to it may hold the
    queue's lock."""
    p.join()
    code = p.exitcode
    if code == 0:
        return
    # killed (OOM killer, kill -9), a crash in native code, an error, or a group passing one of those on
    os._exit(DIED_BY_SIGNAL - code if code < 0 else code if code in (DIED_EXIT,) or code >= DIED_BY_SIGNAL
             else DIED_EXIT)


def _answer(conn) -> bool:
    """One `encode` request of the main process's backend check: (texts, backend) → (ids, offsets) | exception.
    False once the main process has closed the connection, before the request or while it was being answered
    (a completed run closes it with a check still in flight, a stopped one may exit first): that is the end of the
    checks, not an error of the zygote."""
    try:
        texts, backend = conn.recv()
    except (EOFError, OSError):
        return False
    from ..errors import PretokError
    from ..tokenizer import _reason

    try:
        answer = _encoder(backend).encode_batch(texts)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # sent as an error the main process can unpickle (not e.g. a Rust PanicException)
        answer = e if isinstance(e, PretokError) else RuntimeError(_reason(e))
    try:
        conn.send(answer)
    except OSError:  # EPIPE / ECONNRESET / a closed handle: nobody left to answer
        return False
    except Exception as e:  # the answer cannot be pickled (pickling comes first: nothing was written)
        try:
            conn.send(RuntimeError(f"the answer could not be sent ({_reason(e)})"))
        except OSError:
            return False
    return True


def _worker(slot: int, tasks, results, zygote_pid: int, preload: tuple[str, ...] = ()) -> None:
    """Take units until None; each becomes one committed part, its record sent back. The filesystems of
    `preload` (URL schemes of the inputs) are made first, while the main process plans."""
    from ..errors import PretokError
    from ..sources.read import start_reading_ahead
    from ..tokenizer import limit_threads_to_one_cpu
    from .memmap_place import place_part, write_held
    from .parts import keep_limit, process_unit
    from .workers import hash_blocks

    _set_parent_death_signal()
    if os.getppid() != zygote_pid:  # the zygote was killed before the death signal was set: nobody to serve
        os._exit(0)
    limit_threads_to_one_cpu(slot)
    if preload:
        from ..sources.remote import warm_filesystems

        warm_filesystems(preload)
    report = _Progress(results, _FORKED[0])
    queued, urgent, writes = tasks[0], tasks[1], tasks[2][slot]
    blob, base, held = b"", None, _NOTHING
    kept: dict = {}  # unit index → its part kept in memory (`parts.HeldPart`) until its placement comes on `writes`
    keep_parts, keep_bytes = keep_limit("KEEP_PARTS"), keep_limit("KEEP_MB")

    placed: list[int] = []  # placements done, not reported yet: they go with the next message, or before a wait

    def write_kept(p) -> None:
        write_held(p, kept.pop(p.index))
        placed.append(p.index)

    def report_placed() -> None:  # before the worker waits: the main process counts on them to finish
        if placed:
            results.put(("placed", _taken(placed)))
    while True:
        task, held = _next_task(queued, urgent, held, writes, report_placed)
        if task is None:
            break
        try:
            if task[0] == "place":
                place_part(task[1])
                placed.append(task[1].index)
            elif task[0] == "write":
                write_kept(task[1])
            elif task[0] == "hash":
                results.put(("hashed", hash_blocks(task[1]), _taken(placed)))
            else:
                _, unit, backend, run_job, objects, stamps = task
                if run_job != blob:  # the run's job, sent pickled with every unit: unpickled once
                    blob, base = run_job, pickle.loads(run_job)
                job = replace(base, objects=objects, stamps=stamps)
                if not _INFO or _INFO[0].fingerprint != job.tokenizer.fingerprint:
                    raise PretokError("the tokenizer file could not be read or changed while the run was starting",
                                      job.tokenizer.spec)
                if held is _NOTHING:  # hold the next task, if one is queued, and start reading its unit's first
                    held = _take_now(tasks[0])  # row group while this one is encoded (`sources/read_ahead.py`)
                    if isinstance(held, tuple) and held[0] == "unit" and held[3] == run_job:
                        start_reading_ahead(held[1], base.sources)
                record, part = process_unit(unit, _encoder(backend), job, report)
                if part is not None:
                    kept[unit.index] = part
                results.put(("done", record, report.take(), slot if part is not None else None, _taken(placed)))
                # Keeping too much: wait for the placements. That cannot deadlock: a kept part waits only for units
                # before it, and the earliest unit not done is queued or with a worker tokenizing it (a task held
                # ahead is later than the one in hand). The count also keeps the placements the main process sends a
                # busy worker (~300 bytes each) below a pipe's buffer.
                while len(kept) > keep_parts or sum(p.nbytes for p in kept.values()) > keep_bytes:
                    if not writes.poll():
                        report_placed()
                    write_kept(writes.recv()[1])
        except Exception as e:
            results.put(("error", e))


class _Progress:
    """A worker's progress, sent on its own at most every `every` seconds (its first batch at once: the run's
    start-up ends at the first), the rest with the part's record (`take`): messages per second of work, not per
    batch. `every` grows with the workers forked, so that all of them together send at most PER_S messages a second
    on their own (288 workers: every 18 s each; their records, several a second each, carry the rest)."""

    EVERY_S, PER_S = 0.25, 16

    def __init__(self, results, workers: int = 1):
        self.results, self.last, self.sent = results, 0.0, False
        self.every = max(self.EVERY_S, workers / self.PER_S)
        self.counts = [0, 0, 0]  # bytes, documents, tokens not sent yet

    def __call__(self, nbytes: int, docs: int, tokens: int) -> None:
        self.counts = [self.counts[0] + nbytes, self.counts[1] + docs, self.counts[2] + tokens]
        now = time.time()
        if not self.sent or now - self.last >= self.every:
            self.results.put(("progress", *self.counts, now))  # when it was done
            self.counts, self.last, self.sent = [0, 0, 0], now, True

    def take(self) -> tuple | None:
        """What was not sent yet (bytes, documents, tokens, time), or None."""
        if not any(self.counts):
            return None
        out, self.counts = (*self.counts, time.time()), [0, 0, 0]
        return out


_NOTHING = object()  # a worker holds no task taken ahead
_FORKED = [1]  # the workers forked (set by the zygote before it forks)


def _taken(items: list) -> list:
    """The items of `items` (a copy), which is emptied."""
    out = items[:]
    items.clear()
    return out


def _take_now(q):
    """The next queued task if one can be had at once (None: stop) and at least as many are queued as there are
    workers (so that none of the others goes without: a small plan, the run's tail), else _NOTHING."""
    import queue

    try:
        if q.qsize() < _FORKED[0]:
            return _NOTHING
        return q.get_nowait()
    except (queue.Empty, NotImplementedError):  # macOS has no qsize: no task held ahead
        return _NOTHING


def _next_task(tasks, urgent, held=_NOTHING, writes=None, before_wait: Callable[[], None] = lambda: None) -> tuple:
    """(the next task, what the worker holds after it): a placement of a part it keeps (on `writes`) first, then a
    waiting placement of a part's files, then the task held ahead, then the next one queued (None: stop).
    `before_wait` is called each time none can be had at once, before waiting for one."""
    import queue

    while True:
        if writes is not None and writes.poll():
            return writes.recv(), held
        try:
            return urgent.get_nowait(), held
        except queue.Empty:
            pass
        if held is not _NOTHING:
            return held, _NOTHING
        try:
            return tasks.get_nowait(), held
        except queue.Empty:
            before_wait()
        try:
            return tasks.get(timeout=0.02), held
        except queue.Empty:
            continue
