"""A spawned DataLoader worker ends with `os._exit` once torch's worker loop returns (`data/worker_exit.py`), as
forked ones do: a daemon thread still inside libtorch with the GIL released (the worker queue's feeder pickling a
batch) cannot abort it during interpreter finalization. The fault is injected: a daemon thread running matmuls in
a loop is inside libtorch when the process ends."""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import threading

import pytest
import torch

from pretok_lib.data import ShardedBatches
from pretok_lib.data.worker_exit import end_spawned_worker_at_once

from .helpers import content, dataset, run


def _busy_in_libtorch() -> None:
    """Start a daemon thread that is nearly always inside a GIL-releasing libtorch call; return once it runs."""
    torch.set_num_threads(1)
    started = threading.Event()

    def loop() -> None:
        a = torch.randn(384, 384)
        started.set()
        while True:
            torch.mm(a, a)

    threading.Thread(target=loop, daemon=True).start()
    started.wait()


def _target(install: bool, ending: str) -> None:
    if install:
        end_spawned_worker_at_once()
    _busy_in_libtorch()
    if ending == "exit 3":
        sys.exit(3)
    if ending == "raise":
        raise ValueError("the target failed")


def _spawned(install: bool, ending: str = "return") -> int:
    p = mp.get_context("spawn").Process(target=_target, args=(install, ending))
    p.start()
    p.join(120)
    assert not p.is_alive()
    return p.exitcode


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="CPython 3.14 parks such threads at finalization "
                    "(gh-87135) instead of pthread_exit: no abort to show")
def test_without_it_a_thread_in_libtorch_aborts_the_ending_spawned_process() -> None:
    """The injected fault is the real one: finalizing with the thread inside libtorch ends in SIGABRT."""
    assert any(_spawned(False) == -signal.SIGABRT for _ in range(3))


@pytest.mark.parametrize("ending, code", [("return", 0), ("exit 3", 3), ("raise", 1)])
def test_a_spawned_process_ends_at_once_with_its_exit_code(capfd, ending: str, code: int) -> None:
    assert _spawned(True, ending) == code
    err = capfd.readouterr().err
    assert "terminate called" not in err
    assert ("ValueError: the target failed" in err) == (ending == "raise")  # the traceback was flushed first


class BusyWorkers(ShardedBatches):
    """A dataset whose DataLoader workers each hold a daemon thread inside libtorch, as a feeder thread
    pickling a batch is when a loader is dropped."""

    def __iter__(self):
        _busy_in_libtorch()
        yield from super().__iter__()


@pytest.mark.parametrize("start_method", ["spawn"], indirect=True)
def test_a_dropped_spawned_loader_ends_its_workers_with_exit_code_0(wiki, start_method, capfd) -> None:
    """Workers started by spawn and dropped mid-epoch exit 0 whatever their threads are doing; no message."""
    ds = dataset(wiki, "pretok-memmap", 64, micro_batch=4)
    whole = [content(b) for b in run(ds, num_workers=0, limit=3)[1]]
    busy = BusyWorkers(ds.source, 4, 0, 1)
    loader = torch.utils.data.DataLoader(busy, batch_size=None, num_workers=2)
    it = iter(loader)
    got = [content(next(it)) for _ in range(3)]
    workers = list(it._workers)
    del it
    assert got == whole
    assert [w.exitcode for w in workers] == [0, 0]
    assert "Aborted" not in capfd.readouterr().err
