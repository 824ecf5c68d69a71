"""memory.peak_rss_mb: this process's VmHWM, the one reader the engine, training and benchmarks share."""

from __future__ import annotations

import builtins
import resource
import subprocess
import sys

from pretok_lib.memory import peak_rss_mb

from .conftest import ROOT


def test_peak_rss_is_vmhwm_and_grows_with_an_allocation():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    assert abs(peak_rss_mb() - int(status["VmHWM"].split()[0]) / 1024) < 64  # the same counter (moments apart)
    code = ("from pretok_lib.memory import peak_rss_mb; a = peak_rss_mb(); b = bytearray(200 << 20); "
            "b[::4096] = b'x' * len(b[::4096]); print(a, peak_rss_mb())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    before, after = map(float, out.stdout.split())
    assert after - before > 150  # 200 MB touched: the peak rose by about that much


def test_without_proc_it_falls_back_to_ru_maxrss(monkeypatch):
    real_open = builtins.open

    def no_proc(path, *a, **kw):
        if str(path).startswith("/proc/"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert peak_rss_mb() == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
