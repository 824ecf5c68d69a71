"""A child started with `procs.run_child` (bench train's runs, gpu-check's torchrun and study) never outlives the
command that started it: not after a stop signal there, nor a SIGKILL, nor its timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pretok_lib.launch import procs

CHILD = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"


# Deadlines only catch hangs (a machine under load starts Python slowly: nothing here bounds a speed).
HANG_S = 300.0


def _gone(pid: int, within: float = HANG_S) -> bool:
    import psutil

    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _pid(path: Path, parent: subprocess.Popen) -> int:
    deadline = time.monotonic() + HANG_S
    while not (path.is_file() and path.read_text()) and time.monotonic() < deadline:
        assert parent.poll() is None, parent.returncode
        time.sleep(0.02)
    return int(path.read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_the_child_does_not_outlive_its_parent(tmp_path: Path, sig: int) -> None:
    """The parent, stopped by `sig` (SIGTERM raises in it as in the CLI; SIGKILL runs nothing), leaves no child."""
    parent_code = textwrap.dedent(f"""
        import signal, sys
        from pretok_lib.launch import procs

        def stop(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, signal.default_int_handler)   # as an interactive shell starts it
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        procs.run_child([sys.executable, "-c", {CHILD!r}, {str(tmp_path / 'pid')!r}], grace_s=5.0)
        """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stderr=subprocess.DEVNULL)
    child = _pid(tmp_path / "pid", parent)
    parent.send_signal(sig)
    parent.wait(timeout=HANG_S)
    try:
        assert _gone(child), f"child {child} outlived its parent stopped by {signal.Signals(sig).name}"
    finally:
        if not _gone(child, 0):
            os.kill(child, signal.SIGKILL)


def test_a_timeout_stops_the_child(tmp_path: Path) -> None:
    """The child sleeps 120 s: without the timeout it would end by itself, and no TimeoutExpired be raised."""
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run_child([sys.executable, "-c", CHILD, str(tmp_path / "pid")], timeout=3, grace_s=5.0)
    assert _gone(int((tmp_path / "pid").read_text()), 0)


def test_the_result_is_subprocess_runs() -> None:
    r = procs.run_child([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (3, "out\n")
