"""DataLoader workers leave stop signals to the process they load for (`data/worker_signals.py`): a SIGTERM, SIGINT
or SIGUSR1 sent to every process of a run (a process group, a SLURM step, a sweep's process tree, torchrun's
shutdown) reached the workers too, and torch's worker died of a SIGTERM it did not get from its parent: the trainer
then failed at once ("DataLoader worker (pid N) is killed by signal: Terminated", exit 1, no checkpoint) instead
of checkpointing (tests/train/test_faults_train.py has the run)."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

from pretok_lib.data import make_loader

from .helpers import content, dataset

CASES = [("fork", s) for s in ("TERM", "INT", "USR1")] + [("spawn", "TERM")]


def _workers(before: set[int]) -> list[psutil.Process]:
    """The children started since `before` but multiprocessing's resource tracker (spawn starts one)."""
    return [p for p in psutil.Process().children() if p.pid not in before
            and not any("resource_tracker" in a for a in p.cmdline())]


def _blocks_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as fh:
        blocked = next(int(line.split()[1], 16) for line in fh if line.startswith("SigBlk:"))
    return bool(blocked & 1 << (signal.SIGTERM - 1))


@pytest.mark.parametrize("start_method,sig", CASES, indirect=["start_method"])
def test_workers_outlive_a_stop_signal_from_outside(wiki, start_method, sig):
    """The signal, sent by another process to both workers mid-epoch, leaves the epoch's batches as they are; the
    workers end with the epoch, and the main process keeps SIGTERM unblocked."""
    ds = dataset(wiki, "pretok-memmap", 64, micro_batch=4)
    whole = [content(b) for b in make_loader(ds, num_workers=0)]
    before = {p.pid for p in psutil.Process().children()}
    it = iter(make_loader(dataset(wiki, "pretok-memmap", 64, micro_batch=4), num_workers=2))
    got = [content(next(it))]
    workers = _workers(before)
    assert len(workers) == 2
    deadline = time.monotonic() + 300       # a spawned worker takes SIGTERM from its worker_init on (it imports first)
    while not all(_blocks_sigterm(p.pid) for p in workers):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for p in workers:
        subprocess.run(["kill", f"-{sig}", str(p.pid)], check=True)
    time.sleep(0.5)
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
    got += [content(b) for b in it]
    assert got == whole
    psutil.wait_procs(workers, timeout=120)
    assert not any(p.is_running() for p in workers)
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_sigterm_from_the_parent_still_ends_a_worker(wiki):
    """torch's shutdown `terminate()`s a worker that does not leave in time: that SIGTERM (from the parent) ends it."""
    before = {p.pid for p in psutil.Process().children()}
    it = iter(make_loader(dataset(wiki, "pretok-memmap", 64, micro_batch=4), num_workers=2))
    next(it)
    workers = _workers(before)
    workers[0].send_signal(signal.SIGTERM)     # from this process: the parent
    assert workers[0].wait(timeout=120) == 0
    it.close()
    psutil.wait_procs(workers, timeout=120)


AFTER_WORKERS = r"""
import multiprocessing as mp, sys, time


def main():
    mp.set_start_method(sys.argv[2])
    from pretok_lib.data import make_dataset, make_loader
    for _ in make_loader(make_dataset("pretok-memmap", sys.argv[1], 64, micro_batch=4, rank=0, world=1), num_workers=1):
        pass
    p = mp.get_context("forkserver").Process(target=time.sleep, args=(120,))
    p.start()
    time.sleep(0.5)
    p.terminate()
    p.join(30)
    print(p.exitcode)
    if p.exitcode is None:
        p.kill()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_processes_started_after_the_workers_still_take_sigterm(wiki, tmp_path, method):
    """SIGTERM was blocked while any DataLoader started its workers: a forkserver started for them (the start
    method forkserver; Python 3.14's default on Linux) kept it blocked, and so did every process it forked later:
    a multiprocessing Pool's `terminate()` then hung for good. In a fresh interpreter, whose forkserver is not
    running yet."""
    import sys

    from ..conftest import ROOT

    script = tmp_path / "after_workers.py"
    script.write_text(AFTER_WORKERS)
    r = subprocess.run([sys.executable, str(script), str(wiki.dirs["pretok-memmap"]), method], cwd=ROOT,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == str(-signal.SIGTERM), r.stdout
