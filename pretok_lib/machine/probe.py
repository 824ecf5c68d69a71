"""Is the machine quiet? A probe around every measured run (docs/MEASURING.md).

Before and after the run: a fixed calibration workload (~0.15 s on a 2020s core: a float64 matmul and a regex
pre-tokenizer loop, the same work every time, each timed as its fastest of 9 rounds) whose change is the *drift*; during the run: the load average,
the steal time (/proc/stat) and the CPU used by processes outside this process's tree (psutil: every visible
process that is not this one or a descendant; processes that start and end within the run are missed), both over
the run and its calibrations. A run
is flagged (not quiet) when its calibration drifted by more than 10%, it ran beside more than 0.5 core of
outside CPU, or more than 5% of the CPU time was stolen by the hypervisor.

    with Probe("engine-w2#0") as p:
        ...measured work...
    p.result  # {"run", "quiet", "calibration_drift", "outside_cpu_cores", "loadavg", "steal", "reasons", ...}
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping

MAX_DRIFT = 0.10          # calibration slower or faster by more than this: the machine's speed changed
MAX_OUTSIDE_CORES = 0.5   # CPU used by processes outside the study, in cores
MAX_STEAL = 0.05          # share of CPU time stolen by the hypervisor

_TEXT = "The quick brown fox's 12345 jumps over the lazy dog, again and again! " * 200
_PAT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


_ROUNDS = 9              # calibration rounds; each workload's time is its fastest round's
_warm = False


def calibrate() -> dict[str, float]:
    """Seconds of two fixed workloads, each the fastest of `_ROUNDS` rounds (~0.15 s in all on a 2020s core): a
    96x96 float64 matmul x 200 (small enough for one BLAS thread) and a regex pre-tokenizer over 14 KB x 25. The
    fastest round, as timeit does: a short interruption slows one round, not the minimum, so on a quiet machine two
    calibrations agree to a few percent, while a machine whose speed changed (a sibling hyperthread or a core taken
    by another process, frequency, steal) slows every round. The first call in a process warms up first (imports,
    page faults, caches), untimed."""
    import numpy as np

    global _warm
    a = np.random.default_rng(0).standard_normal((96, 96))

    def one() -> tuple[float, float]:
        t0 = time.perf_counter()
        for _ in range(200):
            a @ a
        t1 = time.perf_counter()
        for _ in range(25):
            _PAT.findall(_TEXT)
        return t1 - t0, time.perf_counter() - t1

    if not _warm:
        one()
        _warm = True
    rounds = [one() for _ in range(_ROUNDS)]
    return {"matmul_s": min(r[0] for r in rounds), "tokenize_s": min(r[1] for r in rounds)}


def drift(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """The largest relative change of a calibration workload's time between before and after (0.1: 10%)."""
    return max((abs(after[k] / before[k] - 1) for k in before if before[k] > 0 and k in after), default=0.0)


def loadavg() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat (None off Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice: guests are already in user/nice
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def _our_tree() -> set[int]:
    import psutil

    me = psutil.Process()
    try:
        return {me.pid, *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def process_cpu(exclude: Iterable[int]) -> dict[tuple[int, float], float]:
    """CPU seconds so far of every visible process not in `exclude`, keyed by (pid, create time) so a reused pid
    is a new process."""
    import psutil

    skip, out = set(exclude), {}
    for p in psutil.process_iter(["pid", "create_time", "cpu_times"]):
        info = p.info
        if info["pid"] in skip or info["cpu_times"] is None:
            continue
        t = info["cpu_times"]
        out[(info["pid"], info["create_time"] or 0.0)] = t.user + t.system
    return out


def outside_cpu(before: Mapping[tuple[int, float], float], after: Mapping[tuple[int, float], float],
                seconds: float) -> float:
    """Cores used by other processes between two `process_cpu` snapshots `seconds` apart (a process new in
    `after` counts all its CPU: it started during the run)."""
    used = sum(max(0.0, t - before.get(k, 0.0)) for k, t in after.items())
    return used / seconds if seconds > 0 else 0.0


class Probe:
    """Calibration before, snapshots of outside CPU and steal around the measured work, calibration after;
    `result` once the block ends. `calibration=False` skips the calibration (tests of the counters)."""

    def __init__(self, run: str = "", calibration: bool = True):
        self.run, self.calibration = run, calibration
        self.result: dict = {}

    def __enter__(self) -> Probe:
        # Outside CPU and steal are counted from before the first calibration to after the second: processes' CPU
        # times advance in clock ticks (10 ms), so over a 10 ms run alone one tick of another process read as a
        # whole core (the demo's "2.46 cores" outside on a 2-core machine).
        self._w0 = time.monotonic()
        self._cpu0 = process_cpu(_our_tree())
        self._ticks0 = cpu_ticks()
        self._cal0 = calibrate() if self.calibration else {}
        self._load0 = loadavg()
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        seconds = time.monotonic() - self._t0
        cal1 = calibrate() if self.calibration else {}
        ours = _our_tree()
        window = time.monotonic() - self._w0
        outside = min(outside_cpu(self._cpu0, process_cpu(ours), window), float(os.cpu_count() or 1))
        ticks = cpu_ticks()
        steal = None
        if ticks and self._ticks0 and ticks[1] > self._ticks0[1]:
            steal = (ticks[0] - self._ticks0[0]) / (ticks[1] - self._ticks0[1])
        loads = [x for x in (self._load0, loadavg()) if x is not None]
        self.result = verdict({"run": self.run, "seconds": seconds, "calibration_before": self._cal0,
                               "calibration_after": cal1, "calibration_drift": drift(self._cal0, cal1),
                               "outside_cpu_cores": outside, "window_s": window,
                               "loadavg": max(loads) if loads else None,
                               "steal": steal})


def verdict(r: dict) -> dict:
    """`r` with `quiet` and the `reasons` it is not (the thresholds of the module docstring)."""
    reasons = []
    if r.get("calibration_drift", 0) > MAX_DRIFT:
        reasons.append(f"calibration drifted {r['calibration_drift']:.0%} (> {MAX_DRIFT:.0%})")
    if r.get("outside_cpu_cores", 0) > MAX_OUTSIDE_CORES:
        reasons.append(f"{r['outside_cpu_cores']:.2f} cores used outside the study (> {MAX_OUTSIDE_CORES})")
    if (r.get("steal") or 0) > MAX_STEAL:
        reasons.append(f"{r['steal']:.0%} CPU steal (> {MAX_STEAL:.0%})")
    return {**r, "quiet": not reasons, "reasons": reasons}


def machine(probes: Iterable[Mapping]) -> dict:
    """The machine over many probed runs (study.json `machine`): quiet when every run was; the worst drift,
    outside CPU, load and steal, and the runs flagged."""
    ps = [p for p in probes if p]
    worst = lambda k: max((p[k] for p in ps if p.get(k) is not None), default=None)  # noqa: E731
    flagged = [p for p in ps if not p.get("quiet", True)]
    return {"quiet": all(p.get("quiet", True) for p in ps) if ps else None, "probed_runs": len(ps),
            "calibration_drift": worst("calibration_drift"), "outside_cpu_cores": worst("outside_cpu_cores"),
            "loadavg": worst("loadavg"), "steal": worst("steal"), "causes": causes(flagged),
            "flagged": [{"run": p.get("run"), "reasons": p.get("reasons")} for p in flagged]}


def causes(flagged: Iterable[Mapping]) -> list[str]:
    """What made the flagged runs noisy: "outside processes" (> 0.5 core of other processes' CPU), "steal" (the
    hypervisor), "host" (the calibration drifted while neither was seen: the machine's own speed changed, as when
    another tenant shares the physical core or the clock changes; on a 2-vCPU cloud VM measured idle, the
    calibration alternated between two speeds 60% apart in bursts of 0.5-3 s)."""
    out = []
    for p in flagged:
        outside = (p.get("outside_cpu_cores") or 0) > MAX_OUTSIDE_CORES
        steal = (p.get("steal") or 0) > MAX_STEAL
        host = (p.get("calibration_drift") or 0) > MAX_DRIFT and not outside and not steal
        out += [c for c, on in (("outside processes", outside), ("steal", steal), ("host", host)) if on]
    return sorted(set(out), key=("outside processes", "steal", "host").index)


CAUSE_TEXT = {"outside processes": "other processes used CPU beside the runs",
              "steal": "the hypervisor stole CPU time",
              "host": "the machine's own speed changed with no other process here using CPU (another tenant of the "
                      "host or the clock)"}


def machine_line(m: Mapping | None) -> str:
    """One line for a report: whether the machine was quiet, with the numbers."""
    if not m or m.get("quiet") is None:
        return "Machine steadiness: not probed (runs from before the probe)."

    def num(k: str, fmt: str) -> str:
        return "-" if m.get(k) is None else format(m[k], fmt)

    nums = (f"calibration drift up to {num('calibration_drift', '.0%')}, outside CPU up to "
            f"{num('outside_cpu_cores', '.2f')} cores, load average up to {num('loadavg', '.2f')}, steal "
            f"{num('steal', '.0%')}; {m.get('probed_runs', 0)} runs probed")
    if m["quiet"]:
        return f"The machine was quiet: {nums}."
    flagged = [f["run"] for f in m.get("flagged", [])]
    why = "; ".join(CAUSE_TEXT[c] for c in m.get("causes", []) if c in CAUSE_TEXT)
    return (f"The machine was NOT quiet ({len(flagged)} of {m.get('probed_runs', 0)} runs flagged: "
            f"{', '.join(map(str, flagged[:6]))}{' ...' if len(flagged) > 6 else ''}){f' — {why}' if why else ''}: "
            f"{nums}. Flagged runs are marked; their numbers are noisy.")
