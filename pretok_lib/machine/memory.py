"""This process's peak resident memory and CPU time: one reader for the engine's workers, training and the
benchmarks."""

from __future__ import annotations

import resource
import sys


def peak_rss_mb() -> float:
    """This process's own peak RSS in MB: VmHWM of /proc/self/status (ru_maxrss, the fallback where /proc is not
    readable, counts what a spawned child inherited from its parent before exec)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def cpu_seconds() -> float:
    """CPU seconds (user + system) this process has used, all its threads together (children not counted)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
