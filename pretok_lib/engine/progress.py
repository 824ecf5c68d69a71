"""Progress for long work: MB/s and ETA from input bytes, plus docs/s and tokens/s.

On a terminal this is a tqdm bar. In a log file (SLURM job output, CI) it is a plain line every
`log_every` seconds and one at the end, so logs stay readable and error lines stay on their own line.
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

from ..machine.memory import cpu_seconds


def _si(x: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(x) < 1000:
            return f"{x:.1f}{unit}"
        x /= 1000
    return f"{x:.1f}T"


class Progress:
    """Counts input bytes (the bar), documents and tokens (the postfix rates)."""

    def __init__(self, total_bytes: int, desc: str, enabled: bool = True, log_every: float = 30.0):
        self.docs = self.tokens = self.bytes = 0
        self.first_update: float | None = None  # time.time() the first batch was done: when work started flowing
        self.first_update_cpu: float | None = None  # this process's CPU seconds when it got that first update
        self.total, self.desc, self.enabled, self.log_every = total_bytes, desc, enabled, log_every
        self.t0 = self._last = time.time()
        self.tty = enabled and sys.stderr.isatty()
        self.bar = tqdm(total=total_bytes or None, desc=desc, unit="B", unit_scale=True, unit_divisor=1000,
                        file=sys.stderr, dynamic_ncols=True, mininterval=0.5) if self.tty else None

    def rates(self) -> str:
        dt = max(time.time() - self.t0, 1e-9)
        return (f"{self.bytes / dt / 1e6:.1f} MB/s, {_si(self.docs / dt)} docs/s, "
                f"{_si(self.tokens / dt)} tok/s")

    def update(self, nbytes: int, docs: int, tokens: int, at: float | None = None) -> None:
        """`at`: when the work was done (a worker's time.time(); a busy main process receives it later)."""
        if self.first_update is None:
            self.first_update = at or time.time()
            self.first_update_cpu = cpu_seconds()   # the receiving (main) process's CPU then
        self.docs += docs
        self.tokens += tokens
        self.bytes += nbytes
        now = time.time()
        if self.bar is not None:
            self.bar.update(nbytes)
            if now - self._last > 0.5:
                self.bar.set_postfix_str(self.rates(), refresh=False)
                self._last = now
        elif self.enabled and now - self._last > self.log_every:
            self._log()
            self._last = now

    def _log(self) -> None:
        done = f"{self.bytes / 1e6:.1f}/{self.total / 1e6:.1f} MB" if self.total else f"{self.bytes / 1e6:.1f} MB"
        eta = ""
        if self.total and self.bytes:
            rate = self.bytes / max(time.time() - self.t0, 1e-9)
            eta = f", ETA {max(self.total - self.bytes, 0) / rate:.0f}s"
        print(f"{self.desc}: {done}, {self.rates()}{eta}", file=sys.stderr, flush=True)

    def close(self, ok: bool = True) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self.rates(), refresh=False)
            self.bar.leave = ok
            self.bar.close()
        elif self.enabled and ok:
            self._log()
