"""The worker pool, main-process side: the spawned zygote (`zygote.py`) and the workers it forks.

Start-up (interpreter, imports, building e.g. a fastokens tokenizer from JSON: ~0.5 s of CPU) is paid once, not
once per worker, and begins at the start of a run, while the main process still plans the input and loads the
tokenizer itself. Each worker begins with the encoder the zygote built.

Messages: main → workers, `tasks` queue: ("unit", Unit, backend, the run's Job pickled without any unit's fields,
the unit's objects, its stamps), ("hash", [(block, (file, offset, size)), ...]) or None (stop); `urgent` queue,
taken first: ("place", Placement) of a part in its files; each worker's own pipe, taken before both: ("write",
Placement) of a part that worker keeps in memory. Workers → main `results` queue: ("progress", bytes, docs, tokens,
the worker's time.time()) at most every 0.25 s per worker and 16 a second from all of them (`zygote._Progress`),
("done", record, progress not sent yet or None, the worker's slot if it keeps the part in memory else None, placed),
("hashed", [(block, leaf), ...], placed), ("placed", placed), ("error", exception); `placed`: the unit indices of
the placements the worker did since its last message (sent with its next record, or on their own before it waits for
a task: one message per unit, not two). A worker that dies makes the zygote exit with a code saying how; the main
process watches the zygote. Zygote → main, once, on its own pipe: `Ready` (the backend it built for the workers, why
faster ones could not be built), sent before it forks.

A worker may hold one task ahead (taken as it starts a unit, if at least as many tasks as workers are queued;
placements still go first) to decode that unit's first row group while it encodes (`sources/read_ahead.py`).

The main process does no per-byte work: workers hash the input blocks (the inputs' checksums) and place finished
memmap parts into the final files; the main process only hands out tasks and offsets.
"""

from __future__ import annotations

import pickle
import queue as queue_mod
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import PretokError, os_error
from ..formats.checksum import Leaf, range_leaf
from ..sources import Unit
from ..tokenizer import (
    BackendUnavailable,
    Encoder,
    TokenizerInfo,
    backends_for,
    build_first,
    make_encoder,
    unbuildable,
)
from .memmap_place import Placement, place_part, write_held
from .parts import Job, PartRecord, process_unit
from .spawn import spawn, take_early
from .zygote import DIED_BY_SIGNAL, DIED_EXIT, Ready

if TYPE_CHECKING:
    from .progress import Progress

Encoded = tuple[np.ndarray, np.ndarray]  # (flat ids, offsets), as `Encoder.encode_batch` returns them
Block = tuple[str, int, int]  # (file, offset, size) of an input block to hash
HASH_TASK_BYTES = 64 << 20  # input blocks hashed per task, at most (many small files: one task, not one each)


@dataclass
class Work:
    """What `Workers.run` does and whom it tells: units to tokenize (`on_record` gets each record and returns the
    placements it made known), input blocks to hash (`on_hashed(block index, leaf)`), and placements done
    (`on_placed`)."""

    units: list[Unit]
    blocks: list[Block]
    backend: str
    job: Job
    info: TokenizerInfo
    on_record: Callable[[PartRecord], list[Placement]]
    on_hashed: Callable[[int, Leaf], None]
    on_placed: Callable[[int], None]  # the unit index of a placement done
    placements: list[Placement] = field(default_factory=list)  # known at the start (a resume): done first

    def tasks(self) -> list[tuple]:
        """Units and hash tasks interleaved by their share of the bytes (a block is hashed near when its bytes are
        read), hash tasks grouped up to HASH_TASK_BYTES."""
        groups, group, size = [], [], 0
        for k, b in enumerate(self.blocks):
            if group and size + b[2] > HASH_TASK_BYTES:
                groups.append((size, group))
                group, size = [], 0
            group.append((k, b))
            size += b[2]
        if group:
            groups.append((size, group))
        unit_total = sum(max(u.est_bytes, 1) for u in self.units) or 1
        hash_total = sum(g[0] for g in groups) or 1
        out, done, hashed, g = [], 0, 0, 0
        for u in self.units:
            done += max(u.est_bytes, 1)
            out.append(("unit", u))
            while g < len(groups) and (hashed + groups[g][0]) / hash_total <= done / unit_total:
                hashed += groups[g][0]
                out.append(("hash", groups[g][1]))
                g += 1
        return out + [("hash", grp) for _, grp in groups[g:]]


def hash_blocks(blocks: list[tuple[int, Block]]) -> list[tuple[int, Leaf]]:
    """The leaves of input blocks (a worker's "hash" task); a read that fails is one line naming the input."""
    out = []
    for k, (path, offset, size) in blocks:
        try:
            out.append((k, range_leaf(path, offset, size)))
        except OSError as e:
            raise os_error(e, path, "cannot read") from None
    return out


class Stopped(BaseException):
    """A wait on the pool given up because the run is ending (not an error of the work itself)."""


class Workers:
    """The zygote and its forked workers, or inline processing for `workers <= 0`."""

    def __init__(self, spec: str, backend: str | None, workers: int, preload: tuple[str, ...] = ()):
        """Start at once (the caller plans meanwhile); `backend`: the one to build before forking (None: the
        fastest candidate for the tokenizer); `preload`: URL schemes of the inputs, whose fsspec filesystems the
        zygote imports before forking (s3fs: ~1 s each worker would pay)."""
        self.n, self.zygote, self.drained = max(workers, 0), None, False
        self.ready: Ready | None = None  # the zygote's build report (inline: this process's), once known
        self.inline: Encoder | None = None
        self.writes: list = []  # the main process's end of each worker's pipe of placements of parts it keeps
        if self.n:  # the zygote `pretok tokenize` started before importing the engine, or a new one
            sp = take_early(spec, backend, self.n, preload) or spawn(spec, backend, self.n, preload)
            self.spawned, self.zygote, self.writes, self.lock = sp, sp.zygote, sp.writes, sp.lock
            self.tasks, self.urgent, self.results, self.conn = sp.tasks, sp.urgent, sp.results, sp.conn
            self.ready_conn, self.counts = sp.ready_conn, sp.counts

    def expect(self, tasks: int) -> None:
        """Tell the zygote how many tasks the plan holds: it forks no more workers than that (a 3 MB input on a
        288-core node: 3 workers, not 287), and none before it is told."""
        if self.zygote is not None:
            self.counts[0] = max(1, tasks)

    @property
    def started(self) -> int | None:
        """How many workers the zygote forked (0 inline), None before it has."""
        if self.zygote is None:
            return 0
        return self.counts[1] if self.counts[1] >= 0 else None

    def backend(self, info: TokenizerInfo, force: str | None) -> str:
        """The backend every worker runs: the first candidate (or `force`) that could be built, by the zygote before
        it forked (inline: here, kept for `run`). Raises a one-line PretokError naming the tokenizer if none could
        (or the zygote's tokenizer is not `info`'s). Blocks until the zygote has built it."""
        if force is not None and force not in backends_for(info):
            raise PretokError(f"backend '{force}' is not available for {info.kind} tokenizers "
                              f"(choose from {', '.join(backends_for(info))})", info.spec)
        if self.ready is None and self.zygote is None:
            backend, self.inline, failures = build_first(info, force)
            self.ready = Ready(info.fingerprint, backend, failures)
        elif self.ready is None:
            self.ready = self._ready()
        ready = self.ready
        if ready.error is not None or ready.fingerprint != info.fingerprint:
            raise PretokError("the tokenizer file could not be read or changed while the run was starting"
                              + (f" ({ready.error})" if ready.error else ""), info.spec)
        if ready.backend is None:
            raise unbuildable(info, force, ready.failures)
        return ready.backend

    def _ready(self) -> Ready:
        """The zygote's `Ready`; a one-line PretokError if it dies first."""
        try:
            while not self.ready_conn.poll(0.05):
                if not self.zygote.is_alive():
                    break
            else:
                return self.ready_conn.recv()
        except (EOFError, OSError):
            pass
        self.zygote.join(5)
        self.check_alive()
        raise PretokError("the tokenizer worker process stopped before building its tokenizer; rerun the same command")

    def encoder(self, backend: str, stop: threading.Event) -> Callable[[list[str]], Encoded] | None:
        """`encode_batch` of `backend` run by the zygote (built there once: a backend whose build failed there raises
        that BackendUnavailable), or None when inline (then one whose build failed here raises it too). Raises
        `Stopped` once `stop` is set or when the zygote is gone."""
        if self.zygote is None:
            failed = (self.ready.failures if self.ready else {}).get(backend)
            if failed is None:
                return None

            def unavailable(texts: list[str]) -> Encoded:
                raise BackendUnavailable(backend, failed)
            return unavailable

        def encode(texts: list[str]) -> Encoded:
            with self.lock:
                try:
                    self.conn.send((texts, backend))
                    while not self.conn.poll(0.05):
                        if stop.is_set() or not self.zygote.is_alive():
                            raise Stopped()
                    got = self.conn.recv()
                except (EOFError, OSError):  # the zygote died: the run fails for that, not the backend
                    raise Stopped() from None
            if isinstance(got, BaseException):
                raise got
            return got
        return encode

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """After a completed `run`, let the idle workers exit; else (an error, a restart, nothing to do) kill the
        zygote at once, even mid start-up, and its workers die with it."""
        if self.zygote is None:
            return
        self.spawned.close(self.drained)
        self.zygote = None

    def run(self, work: Work, bar: Progress, keep_going: Callable[[], None] = lambda: None) -> None:
        """Do `work`. At most 4 tokenize or hash tasks per worker are queued, which bounds what the main process
        holds for placing in order; a placement goes out as soon as it is known, to the worker keeping the part in
        memory (its own pipe) or, for a part in its files, on the `urgent` queue. `keep_going` is called between
        messages and may raise to stop the run."""
        tasks = work.tasks()
        if self.zygote is None:  # inline, for debugging and tiny inputs
            enc = self.inline if self.inline is not None and self.inline.backend == work.backend else None
            enc = enc or (make_encoder(work.info, work.backend) if work.units else None)
            kept: dict = {}  # unit index → its part kept in memory until its placement is known
            for p in work.placements:
                place_part(p)
                work.on_placed(p.index)
            for kind, task in tasks:
                keep_going()
                if kind == "hash":
                    for k, leaf in hash_blocks(task):
                        work.on_hashed(k, leaf)
                    continue
                record, part = process_unit(task, enc, work.job, bar.update)
                if part is not None:
                    kept[task.index] = part
                for p in work.on_record(record):
                    if p.index in kept:
                        write_held(p, kept.pop(p.index))
                    else:
                        place_part(p)
                    work.on_placed(p.index)
            return
        todo, running, placing, window = deque(tasks), 0, len(work.placements), 4 * self.n
        keeper: dict[int, int] = {}  # unit index → the worker keeping its part in memory (until it is placed)
        self.drained, checked = False, 0.0
        # the run's job pickled once (without any unit's fields); a worker unpickles it when it changes
        blob = pickle.dumps(replace(work.job, objects=(), stamps=()), pickle.HIGHEST_PROTOCOL)
        for p in work.placements:
            self.urgent.put(("place", p))
        while todo or running or placing:
            while todo and running < window:
                kind, task = todo.popleft()
                self.tasks.put(("unit", task, work.backend, blob, *work.job.unit_fields(task)) if kind == "unit"
                               else ("hash", task))
                running += 1
            keep_going()
            if time.monotonic() - checked > 0.2:  # a dead worker stops the messages: checked on a wait as well
                self.check_alive()
                checked = time.monotonic()
            try:
                kind, *msg = self.results.get(timeout=0.05)
            except queue_mod.Empty:
                self.check_alive()
                continue
            if kind == "progress":
                bar.update(*msg)
                continue
            if kind == "error":
                raise msg[0]  # a worker's PretokError, with its one-line message
            for index in msg[-1]:  # the placements the worker did since its last message (the unit indices)
                placing -= 1
                work.on_placed(index)
            if kind == "done":
                running -= 1
                if msg[1] is not None:
                    bar.update(*msg[1])
                if msg[2] is not None:  # the worker keeps the part in memory: it writes it itself
                    keeper[msg[0]["unit"]["index"]] = msg[2]
                for p in work.on_record(msg[0]):
                    self._place(p, keeper.pop(p.index, None))
                    placing += 1
            elif kind == "hashed":
                running -= 1
                for k, leaf in msg[0]:
                    work.on_hashed(k, leaf)
        self.drained = True

    def _place(self, p: Placement, slot: int | None) -> None:
        """Send a placement to the worker keeping the part (`slot`), or to any worker (the part is in its files)."""
        if slot is None:
            self.urgent.put(("place", p))
            return
        try:
            self.writes[slot].send(("write", p))
        except OSError:  # that worker is gone: the zygote says how
            self.check_alive(wait=5)
            raise PretokError("a tokenizer worker process died; rerun the same command to resume") from None

    def check_alive(self, wait: float = 0.0) -> None:
        """Raise if the zygote ended during the run (waiting up to `wait` s for an end under way): a worker died
        (it then exits at once) or it never started."""
        if self.zygote is None:  # inline: no worker processes
            return
        if wait:
            self.zygote.join(wait)
        code = self.zygote.exitcode
        if code is None:
            return
        if code >= DIED_BY_SIGNAL:
            why = f"killed by signal {code - DIED_BY_SIGNAL}: out of memory, kill -9, or a crash in native code"
        elif code == DIED_EXIT:
            why = "it exited with an error"
        else:
            why = f"the worker processes could not start or were killed, exit code {code}"
        raise PretokError(f"a tokenizer worker process died ({why}); rerun the same command to resume")
