"""The engine's scaling curve over worker counts (issue 39, part 3): `pretok bench tokenize --workers N` runs for
several N (one JSON each), tabulated against the ceiling on N cores, with Amdahl's and the universal scalability
law's fits and their predictions at 72 and 288 cores.

USL (Gunther): C(N) = N / (1 + σ(N − 1) + κN(N − 1)), the speedup over one worker; σ is contention (Amdahl's serial
fraction when κ = 0), κ coherency (a cost growing with pairs of workers). Fitted by least squares on
N / C(N) − 1 = σ(N − 1) + κN(N − 1), which is linear in σ and κ.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

PREDICT_AT = (72, 288)


def _rate(res: Mapping, name: str) -> float | None:
    """A method's MB/s in one bench JSON: the median over its rounds where there are several, else its fastest."""
    est = (res.get("repeats") or {}).get("mb_per_s", {}).get(name)
    if est and est.get("median"):
        return float(est["median"])
    m = res.get("methods", {}).get(name)
    return float(m["mb_per_s"]) if m and m.get("mb_per_s") else None


def binding(res: Mapping, n: int, ceiling_mb_s: float | None = None) -> dict:
    """What limits the engine at N workers, from one bench JSON: the start-up's share of the run (a constant: it
    binds end to end as N grows), and in the tokenizing phase the main process's busy share of its core and the
    workers' of theirs (CPU-s per GB from the bench's accounting × the phase's GB/s). `binds`: the largest."""
    sc, m = res.get("scaling") or {}, (res.get("methods") or {}).get(f"(d) engine memmap w{n}") or {}
    tl, gb = m.get("timeline") or {}, ((res.get("corpus") or {}).get("text_bytes") or 0) / 1e9
    main, workers = sc.get("main_streaming_s_per_gb"), sc.get("workers_s_per_gb")
    if main is None or workers is None or not (tl.get("tokenize_seconds") and m.get("seconds") and gb):
        return {}
    phase_gb_s = gb / tl["tokenize_seconds"]
    shares = {"start-up": tl.get("startup_seconds", 0.0) / m["seconds"], "main process": main * phase_gb_s,
              "workers": workers * phase_gb_s / n}
    return {"main_cpu_s_per_gb": main, "workers_cpu_s_per_gb": workers, "startup_share": shares["start-up"],
            "main_busy": shares["main process"], "workers_busy": shares["workers"],
            "phase_x_ceiling": phase_gb_s * 1e3 / ceiling_mb_s if ceiling_mb_s else None,
            "binds": max(shares, key=shares.get), "phase_mb_s": phase_gb_s * 1e3}


def curve_points(results: Sequence[Mapping]) -> list[dict]:
    """One row per bench JSON (its `workers` N): engine memmap w1 and wN, the 1- and N-core ceilings (MB/s), the
    speedup over w1, the per-core efficiency against the N-core ceiling and the side that binds; sorted by N.
    A JSON without w1 (`--skip engine-1`) takes the median w1 of the others (`w1_from: "other runs"`)."""
    w1s = [v for res in results if (v := _rate(res, "(d) engine memmap w1"))]
    rows = []
    for res in results:
        n = int(res["workers"])
        w1, wn = _rate(res, "(d) engine memmap w1"), _rate(res, f"(d) engine memmap w{n}")
        own = w1 is not None
        w1 = w1 if own else (statistics.median(w1s) if w1s else None)
        c1 = _rate(res, "(c) ceiling 1 core")
        cn = c1 if n == 1 else _rate(res, f"(c) ceiling {n} cores")
        if not (w1 and wn and cn):
            continue
        rows.append({"workers": n, "engine_w1_mb_s": w1, "w1_from": "this run" if own else "other runs",
                     "engine_mb_s": wn, "ceiling_1_mb_s": c1, "ceiling_mb_s": cn, "speedup": wn / w1,
                     "x_ceiling": wn / cn, **binding(res, n, cn)})
    return sorted(rows, key=lambda r: r["workers"])


def fit_usl(points: Sequence[tuple[int, float]], amdahl: bool = False) -> dict | None:
    """σ and κ from (N, speedup over one worker) points (κ = 0 for Amdahl), both >= 0 (least squares under those
    bounds: a negative κ or σ means a speedup that grows faster than N somewhere, which no set of cores gives;
    measured on 16 cores, an unbounded κ of -4.7e-4 predicted 40.8 GB/s at 288 cores from 0.6 GB/s at 15);
    `bounded` names a coefficient held at 0. None without a point at N >= 2."""
    import numpy as np

    pts = [(n, c) for n, c in points if n >= 2 and c > 0]
    if not pts:
        return None
    y = np.array([n / c - 1 for n, c in pts])
    cols = {"sigma": np.array([n - 1 for n, _ in pts], dtype=float),
            "kappa": np.array([n * (n - 1) for n, _ in pts], dtype=float)}

    def solve(names: list[str]) -> dict[str, float]:
        if not names:
            return {}
        coef, *_ = np.linalg.lstsq(np.stack([cols[k] for k in names], axis=1), y, rcond=None)
        return dict(zip(names, map(float, coef)))

    free = ["sigma"] if amdahl else ["sigma", "kappa"]
    fit = solve(free)
    while any(v < 0 for v in fit.values()):   # hold the most negative at 0, refit the rest
        free.remove(min(fit, key=fit.get))
        fit = solve(free)
    bounded = [k for k in ("sigma", "kappa") if k not in free and not (amdahl and k == "kappa")]
    return {"sigma": fit.get("sigma", 0.0), "kappa": fit.get("kappa", 0.0), "points": len(pts), "bounded": bounded}


def usl_speedup(n: int, fit: Mapping) -> float:
    return n / (1 + fit["sigma"] * (n - 1) + fit["kappa"] * n * (n - 1))


def scaling_curve(results: Sequence[Mapping]) -> dict:
    """The table, both fits and their predicted throughput (GB/s: w1's rate × the fitted speedup) at PREDICT_AT."""
    rows = curve_points(results)
    pts = [(r["workers"], r["speedup"]) for r in rows]
    w1 = statistics.median(r["engine_w1_mb_s"] for r in rows) if rows else None
    out = {"rows": rows, "engine_w1_mb_s": w1, "fits": {}}
    for name, amdahl in (("amdahl", True), ("usl", False)):
        fit = fit_usl(pts, amdahl)
        if fit is not None and w1:
            fit["predicted_gb_per_s"] = {str(c): w1 * usl_speedup(c, fit) / 1e3 for c in PREDICT_AT}
        out["fits"][name] = fit
    return out


def curve_lines(sc: Mapping) -> list[str]:
    lines = [f"  {'N':>3}  {'engine wN MB/s':>14}  {'ceiling N MB/s':>14}  {'x ceiling':>9}  {'speedup vs w1':>13}"
             f"  {'start-up':>8}  {'phase x ceil':>12}  {'main busy':>9}  {'workers busy':>12}  binds"]
    for r in sc["rows"]:
        busy = (f"  {r['startup_share']:>8.0%}  {r['phase_x_ceiling']:>12.2f}  {r['main_busy']:>9.2f}  "
                f"{r['workers_busy']:>12.2f}  {r['binds']}" if "binds" in r else f"  {'-':>8}  {'-':>12}  {'-':>9}  "
                f"{'-':>12}  -")
        lines.append(f"  {r['workers']:>3}  {r['engine_mb_s']:>14.1f}  {r['ceiling_mb_s']:>14.1f}  "
                     f"{r['x_ceiling']:>9.2f}  {r['speedup']:>13.2f}" + busy)
    for name, fit in sc["fits"].items():
        if fit is None:
            lines.append(f"{name}: no point at N >= 2")
            continue
        pred = ", ".join(f"{v:.2f} GB/s on {c} cores" for c, v in fit.get("predicted_gb_per_s", {}).items())
        held = f", {' and '.join(fit['bounded'])} held at 0" if fit.get("bounded") else ""
        lines.append(f"{name}: sigma {fit['sigma']:.4f}, kappa {fit['kappa']:.2e} ({fit['points']} points{held}); "
                     f"{pred}")
    return lines


def main(paths: Sequence[str]) -> dict:
    """Read the bench JSONs at `paths`, print the curve, return it."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    sc = scaling_curve(results)
    print("\n".join(curve_lines(sc)))
    return sc
