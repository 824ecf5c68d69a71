"""Starting the zygote (`zygote.py`): its queues and pipes, and the spawned process itself.

Light on purpose (the standard library and `zygote.py`, which imports nothing heavy either): `pretok tokenize`
starts the zygote as soon as its arguments are parsed (`start_early`), before its own process imports numpy,
pyarrow and the engine (~0.15 s), so that the zygote's interpreter, imports and encoder build run beside those
imports instead of after them. `Workers` then takes that zygote over (`take_early`) if it was started for the same
tokenizer, backend, worker count and URL schemes; one that is never taken over (the output was complete, another
run held its lock, an argument was refused) is killed by `discard_early`, which the command calls on every exit.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..machine.process_env import environ_set
from .zygote import WORKER_ENV, run_zygote


@dataclass
class Spawned:
    """A started zygote and the main process's ends of its queues and pipes (`workers.py` describes the messages)."""

    key: tuple  # (tokenizer spec, backend, workers, URL schemes): what it was started for
    zygote: mp.Process
    tasks: object
    urgent: object
    results: object
    conn: object  # the backend check's encode requests
    ready_conn: object  # the zygote's `Ready`
    writes: list  # per worker: the placements of the parts it keeps in memory
    counts: object  # [tasks the plan holds (0: not known yet), workers forked (-1: not yet)]
    lock: threading.Lock  # one encode request at a time on `conn`

    def close(self, drained: bool = False) -> None:
        """After a completed run (`drained`), let the idle workers exit; else kill the zygote at once, even mid
        start-up, and its workers die with it. Then close the main process's ends."""
        if drained and self.zygote.is_alive():
            for _ in self.writes:
                self.tasks.put(None)
            self.conn.close()  # the zygote then only waits for its workers
            self.zygote.join(10)
        if self.zygote.is_alive():
            self.zygote.kill()
        self.zygote.join()
        self.ready_conn.close()
        for w in self.writes:
            w.close()
        for q in (self.tasks, self.urgent, self.results):
            q.cancel_join_thread()
            q.close()


def spawn(spec: str, backend: str | None, workers: int, preload: tuple[str, ...] = ()) -> Spawned:
    """Start a zygote that builds `backend` (None: the fastest that builds) for the tokenizer `spec` and forks up to
    `workers` workers; `preload`: URL schemes whose filesystems it imports before forking."""
    ctx = mp.get_context("spawn")
    tasks, urgent, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    conn, child = ctx.Pipe()
    writes = [ctx.Pipe(duplex=False) for _ in range(workers)]  # (worker's end, main's end) per worker
    ready_conn, ready_child = ctx.Pipe(duplex=False)
    counts = ctx.RawArray("q", [0, -1])
    zygote = ctx.Process(target=run_zygote, args=(spec, backend, workers, (tasks, urgent, [r for r, _ in writes]),
                                                  results, child, ready_child, preload, counts), name="pretok-zygote")
    with environ_set(WORKER_ENV), _main_module_hidden():  # WORKER_ENV: read by the spawned interpreter as it starts
        zygote.start()
    child.close()
    ready_child.close()
    for r, _ in writes:
        r.close()
    return Spawned((spec, backend, workers, preload), zygote, tasks, urgent, results, conn, ready_conn,
                   [w for _, w in writes], counts, threading.Lock())


_EARLY: list[Spawned] = []  # a zygote started by the command line before the engine was imported


def start_early(spec: str, backend: str | None, workers: int, preload: tuple[str, ...] = ()) -> None:
    """Start the zygote a run with these arguments will take over (`take_early`)."""
    discard_early()
    _EARLY.append(spawn(spec, backend, workers, preload))


def take_early(spec: str, backend: str | None, workers: int, preload: tuple[str, ...] = ()) -> Spawned | None:
    """The zygote `start_early` started for exactly these arguments, taken over (once); one started for others is
    killed. None if there is none."""
    if not _EARLY:
        return None
    early = _EARLY.pop()
    if early.key == (spec, backend, workers, preload) and early.zygote.is_alive():
        return early
    early.close()
    return None


def discard_early() -> None:
    """Kill a zygote that was started early and never taken over (nothing if it was)."""
    while _EARLY:
        _EARLY.pop().close()


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While a spawned process starts, show multiprocessing a `__main__` with no file and no spec. Spawn otherwise
    runs the parent's main script again in the child (as `__mp_main__`), for objects defined there; the zygote
    needs none (its target and arguments live in pretok_lib). So a script that calls the engine at top level
    without an `if __name__ == "__main__":` guard, or one fed on stdin, works, and a guarded one's top-level
    imports (torch, a model...) are not paid again in the zygote, whose memory every forked worker inherits."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main
