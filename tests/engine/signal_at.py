"""Signals at moments the run's own progress defines (what it has committed), not at fractions of a calibration
run's wall time: under any load a signal lands where the test means it to (a timed one lands late or early as the
machine's load changes, and a test then counts too few interruptions)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

HANG = 300.0  # seconds: only a hang takes this long


def committed_parts(out: Path) -> int:
    """Part records a tokenize run has committed into `out` so far."""
    parts = out / ".pretok" / "parts"
    return len(list(parts.glob("*.json"))) if parts.is_dir() else 0


def after_parts(out: Path, k: int) -> Callable[[], bool]:
    """Ready once the run state exists (k = 0) or k parts are committed."""
    return lambda: (out / ".pretok" / "config.json").exists() and committed_parts(out) >= k


def signal_when(p: subprocess.Popen, ready: Callable[[], bool], sig: int) -> bool:
    """Wait (polling) until `ready()` or the process ends, then stop the process where it is (SIGSTOP), send
    `sig` and let it go on: `sig` lands right after the moment, however slow or fast the machine. True if the
    process was still running at the moment."""
    end = time.monotonic() + HANG
    while p.poll() is None and not ready():
        assert time.monotonic() < end, "the run neither reached the moment nor ended"
        time.sleep(0.001)
    if p.poll() is not None:
        return False
    try:
        os.kill(p.pid, signal.SIGSTOP)
        os.kill(p.pid, sig)
        os.kill(p.pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True
