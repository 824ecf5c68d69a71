"""Where the engine's CPU goes, and what that predicts on many cores (issue 37): `pretok bench tokenize` reports the
main process's CPU per GB of input beside the workers', the serial fraction, and Amdahl's throughput at 16, 72 and
288 cores with its assumptions.

The engine records its CPU in the manifest (`run.main_cpu_seconds`, `main_cpu_streaming_seconds` from the first
batch on, `workers_cpu_seconds`: engine/run.py). Per GB of input text, S = the main process's streaming CPU (what it
does while the workers run: handing out tasks and offsets, progress, the backend check) and W = the workers' CPU.
One worker per core and the main process on its own: T(n) = S + W/n per GB, so the serial fraction is s = S / (S +
W) and the throughput on n cores 1 / (S + W / min(n, units)) GB/s, where `units` caps the busy workers (the plan
cuts an input into units; a worker takes one at a time). The fraction fitted from the tokenizing phase's wall time
at 1 and N workers, s = (N·T(N)/T(1) − 1)/(N − 1), is shown beside it as a check: on a 2-core machine the main
process shares a core with a worker, so that fit counts its CPU twice over and noise moves it by ±0.1. S at one size
also holds per-run constants (the backend check tokenizes a sample in a thread of the main process), which dominate
small inputs: an upper bound. The per-byte shares are the slopes of S and W over the RSS scan's input sizes
(`per_byte`: least squares, CPU-s per GB, with the per-run constant as intercept); the predictions are made from
them when the scan has two sizes or more. Over the scan, units grow with the input (memmap units are ~1/1024 of the
input, at least 8 MB), so a per-unit cost of the main process shows up in its slope as a per-byte one; a run of the
largest input in 64 MB units separates them (`per_unit`), and an input large enough for 64 MB units is predicted
from both.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

CORES = (16, 72, 288)
MIN_SLOPE = 1e-3  # CPU-s per GB below which a fitted slope is taken for noise around a constant
CPU_KEYS = ("main_cpu_seconds", "main_cpu_streaming_seconds", "workers_cpu_seconds")
ASSUMPTIONS = ("one core per worker and one for the main process; each worker as fast as this machine's; the "
               "per-byte CPU of the main process in series with the workers; no limit of memory bandwidth, disk or "
               "page cache")


def cpu_per_gb(runs: Sequence[Mapping], text_bytes: int) -> dict | None:
    """Medians over one engine method's `runs` (`run_engine` results with `cpu`) of the main process's streaming
    and total CPU and the workers' CPU, in seconds per GB of input text; None without CPU records."""
    rows = [r["cpu"] for r in runs if isinstance(r.get("cpu"), Mapping)
            and all(isinstance(r["cpu"].get(k), (int, float)) for k in CPU_KEYS)]
    if not rows or text_bytes <= 0:
        return None
    gb = text_bytes / 1e9
    return {"main_streaming_s_per_gb": statistics.median(x["main_cpu_streaming_seconds"] for x in rows) / gb,
            "main_s_per_gb": statistics.median(x["main_cpu_seconds"] for x in rows) / gb,
            "workers_s_per_gb": statistics.median(x["workers_cpu_seconds"] for x in rows) / gb, "n": len(rows)}


def serial_fraction(main_s: float, workers_s: float) -> float | None:
    """s = S / (S + W): the share of the per-byte CPU that runs in series (the main process's)."""
    total = main_s + workers_s
    return main_s / total if total > 0 else None


def fitted_serial_fraction(t1: float, tn: float, n: int) -> float | None:
    """Amdahl's s from wall times at 1 and n workers, T(n) = T(1)·(s + (1 − s)/n); unbounded (noise can put it
    below 0 or above 1); None for n < 2 or no time."""
    if n < 2 or t1 <= 0:
        return None
    return (tn / t1 - 1 / n) / (1 - 1 / n)


def predicted_gb_per_s(main_s: float, workers_s: float, cores: int, units: int | None = None) -> float:
    """1 / (S + W / busy) GB/s with busy = min(cores, units) workers (`units` None: as many as the cores)."""
    busy = max(1, cores if units is None else min(cores, units))
    return 1.0 / (main_s + workers_s / busy)


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def per_byte(scan: Sequence[Mapping]) -> dict | None:
    """The main process's streaming CPU and the workers' CPU as lines over input size (runs of the RSS scan with
    `input_bytes` and `cpu`): slopes in CPU-s per GB, intercepts in CPU-s per run. None with fewer than two sizes."""
    rows = [r for r in scan if isinstance(r.get("cpu"), Mapping) and r.get("input_bytes")
            and all(isinstance(r["cpu"].get(k), (int, float)) for k in CPU_KEYS)]
    if len({r["input_bytes"] for r in rows}) < 2:
        return None
    gb = [r["input_bytes"] / 1e9 for r in rows]
    main = _line(gb, [r["cpu"]["main_cpu_streaming_seconds"] for r in rows])
    total = _line(gb, [r["cpu"]["main_cpu_seconds"] for r in rows])
    work = _line(gb, [r["cpu"]["workers_cpu_seconds"] for r in rows])
    return {"main_streaming_s_per_gb": main[0], "main_streaming_constant_s": main[1], "main_s_per_gb": total[0],
            "main_constant_s": total[1], "workers_s_per_gb": work[0], "workers_constant_s": work[1],
            "sizes_gb": sorted(set(gb)), "n": len(rows)}


def per_unit(scan: Sequence[Mapping], coarse: Mapping | None) -> dict | None:
    """The main process's streaming CPU as a + u·units + b·GB, least squares over the RSS scan and `coarse`, a run of
    the scan's largest input cut into fewer units (without it, units and bytes grow together in the scan and cannot
    be told apart): `u` in CPU-ms per unit, `b` in CPU-s per GB, `a` per run. None without enough runs."""
    import numpy as np

    def usable(r: Mapping) -> bool:
        return (isinstance(r.get("cpu"), Mapping) and bool(r.get("input_bytes")) and bool(r.get("units"))
                and isinstance(r["cpu"].get("main_cpu_streaming_seconds"), (int, float)))

    scan = [r for r in scan if usable(r)]
    if not coarse or not usable(coarse) or len(scan) < 3 or len({r["input_bytes"] for r in scan}) < 2:
        return None
    same_size = {r["units"] for r in scan if r["input_bytes"] == coarse["input_bytes"]}
    if not same_size or coarse["units"] in same_size:
        return None  # no second unit count at one size (a small input is one unit however cut): not separable
    rows = [*scan, coarse]
    x = np.array([[1.0, r["units"], r["input_bytes"] / 1e9] for r in rows])
    y = np.array([r["cpu"]["main_cpu_streaming_seconds"] for r in rows])
    (a, u, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return {"per_run_s": float(a), "per_unit_ms": float(u) * 1e3, "per_gb_s": float(b), "n": len(rows),
            "coarse_units": coarse["units"], "coarse_gb": coarse["input_bytes"] / 1e9}


def large_input_main_s_per_gb(pu: Mapping, unit_bytes: float) -> float:
    """The main process's CPU-s per GB of an input the engine cuts into units of `unit_bytes`: its per-byte cost plus
    its per-unit cost × units per GB (negative fitted terms, noise around 0, taken as 0)."""
    return max(pu["per_gb_s"], 0.0) + max(pu["per_unit_ms"], 0.0) / 1e3 * 1e9 / unit_bytes


def large_input_gb_per_s(pu: Mapping, workers_s: float, cores: int, unit_bytes: float) -> float:
    """Amdahl's throughput (as `predicted_gb_per_s`) for an input cut into units of `unit_bytes`."""
    return predicted_gb_per_s(large_input_main_s_per_gb(pu, unit_bytes), workers_s, cores)


def scaling(runs: Mapping[str, Sequence[Mapping]], rounds: Sequence[Mapping[str, float]], text_bytes: int, n: int,
            phase: str = " tokenizing phase", scan: Sequence[Mapping] = (),
            coarse: Mapping | None = None) -> dict | None:
    """The scaling record of the memmap engine at N = `n` workers: CPU per GB, both serial fractions, the
    predictions at CORES (this input's units, and an input with enough units) and the assumptions. With a `scan`
    of two sizes or more, the serial fraction and predictions come from the per-byte slopes (`per_byte`); with a
    `coarse` run too, the main process's CPU per unit and per byte (`per_unit`) and the prediction for an input large
    enough for the plan's largest units."""
    name, one = f"(d) engine memmap w{n}", "(d) engine memmap w1"
    cpu = cpu_per_gb(runs.get(name, ()), text_bytes)
    if cpu is None:
        return None
    slopes = per_byte(scan)
    # the slopes drive the prediction when both are positive: over sizes too small to show the per-byte CPU (a
    # smoke run), the main process's slope is noise around its constant and can come out at or below 0
    use = slopes is not None and min(slopes["main_streaming_s_per_gb"], slopes["workers_s_per_gb"]) > MIN_SLOPE
    s_main, w = ((slopes["main_streaming_s_per_gb"], slopes["workers_s_per_gb"]) if use
                 else (cpu["main_streaming_s_per_gb"], cpu["workers_s_per_gb"]))
    fits = [f for r in rounds if (t1 := r.get(one + phase)) and (tn := r.get(name + phase))
            and (f := fitted_serial_fraction(t1, tn, n)) is not None]
    units = runs[name][0].get("units")
    pu = per_unit(scan, coarse)
    large = None
    if pu is not None:
        from ..engine.config import MAX_PART_BYTES

        large = {"unit_mb": MAX_PART_BYTES / 1e6, "main_s_per_gb": large_input_main_s_per_gb(pu, MAX_PART_BYTES),
                 "predicted_gb_per_s": {str(c): large_input_gb_per_s(pu, w, c, MAX_PART_BYTES) for c in CORES}}
    return {"method": name, **cpu, "per_byte": slopes, "from_slopes": use, "per_unit": pu, "large_input": large,
            "serial_fraction": serial_fraction(s_main, w),
            "fitted_serial_fraction": statistics.median(fits) if fits else None, "fitted_rounds": len(fits),
            "units": units, "assumptions": ASSUMPTIONS,
            "predicted_gb_per_s": {str(c): {"this_input": predicted_gb_per_s(s_main, w, c, units),
                                            "enough_units": predicted_gb_per_s(s_main, w, c)} for c in CORES}}


def scaling_lines(sc: Mapping | None) -> list[str]:
    """What the bench prints about `scaling`'s record."""
    if not sc:
        return ["(no CPU records in the engine's manifests: no scaling prediction)"]
    fit = sc["fitted_serial_fraction"]
    pb = sc.get("per_byte")
    lines = [f"Where the CPU goes ({sc['method']}, median of {sc['n']} runs), per GB of input text: main process "
             f"{sc['main_streaming_s_per_gb']:.2f} CPU-s from the first batch on ({sc['main_s_per_gb']:.2f} with "
             f"planning and start-up), workers {sc['workers_s_per_gb']:.2f} CPU-s (per-run constants included)"]
    if pb:
        lines.append(f"per extra GB (slopes over {len(pb['sizes_gb'])} sizes, {pb['sizes_gb'][0]:.2g}-"
                     f"{pb['sizes_gb'][-1]:.2g} GB, {pb['n']} runs): main process {pb['main_streaming_s_per_gb']:.3f} "
                     f"CPU-s from the first batch on ({pb['main_s_per_gb']:.3f} in all; per run "
                     f"{pb['main_constant_s']:.2f} CPU-s), workers {pb['workers_s_per_gb']:.2f} CPU-s")
    lines += [f"serial fraction {sc['serial_fraction']:.3f} ("
              + ("per-byte: the main process's slope / it + the workers' slope" if sc.get("from_slopes") else
                 "main CPU from the first batch on / it + workers' CPU; it holds per-run constants too, such as the "
                 "backend check's sample, which dominate small inputs: an upper bound of the per-byte share")
              + "); fitted from the tokenizing phase at 1 and N workers: "
              + (f"{fit:.3f} (median of {sc['fitted_rounds']} rounds)" if fit is not None else "not measured"),
             f"predicted throughput, GB/s of input text ({sc['assumptions']}):",
             f"  {'cores':>6}  {'this input (%s units)' % sc['units']:>24}  {'enough units':>13}"]
    for c, p in sc["predicted_gb_per_s"].items():
        lines.append(f"  {c:>6}  {p['this_input']:>24.2f}  {p['enough_units']:>13.2f}")
    pu, large = sc.get("per_unit"), sc.get("large_input")
    if pu and large:
        lines.append(f"the main process per unit and per byte (least squares over {pu['n']} runs, one of "
                     f"{pu['coarse_gb']:.2g} GB in {pu['coarse_units']} units): {pu['per_unit_ms']:.3f} CPU-ms per "
                     f"unit, {pu['per_gb_s']:.3f} CPU-s per GB, {pu['per_run_s']:.2f} per run; an input large enough "
                     f"for {large['unit_mb']:g} MB units: {large['main_s_per_gb']:.3f} CPU-s per GB, predicted "
                     + ", ".join(f"{v:.1f} GB/s on {c} cores" for c, v in large["predicted_gb_per_s"].items()))
    return lines
