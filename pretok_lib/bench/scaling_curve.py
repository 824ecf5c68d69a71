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


def curve_points(results: Sequence[Mapping]) -> list[dict]:
    """One row per bench JSON (its `workers` N): engine memmap w1 and wN, the 1- and N-core ceilings (MB/s), the
    speedup over w1 and the per-core efficiency against the N-core ceiling; sorted by N."""
    rows = []
    for res in results:
        n = int(res["workers"])
        w1, wn = _rate(res, "(d) engine memmap w1"), _rate(res, f"(d) engine memmap w{n}")
        c1 = _rate(res, "(c) ceiling 1 core")
        cn = c1 if n == 1 else _rate(res, f"(c) ceiling {n} cores")
        if not (w1 and wn and cn):
            continue
        rows.append({"workers": n, "engine_w1_mb_s": w1, "engine_mb_s": wn, "ceiling_1_mb_s": c1,
                     "ceiling_mb_s": cn, "speedup": wn / w1, "x_ceiling": wn / cn})
    return sorted(rows, key=lambda r: r["workers"])


def fit_usl(points: Sequence[tuple[int, float]], amdahl: bool = False) -> dict | None:
    """σ and κ from (N, speedup over one worker) points (κ = 0 for Amdahl); None without a point at N >= 2."""
    import numpy as np

    pts = [(n, c) for n, c in points if n >= 2 and c > 0]
    if not pts:
        return None
    y = np.array([n / c - 1 for n, c in pts])
    x = np.array([[n - 1] if amdahl else [n - 1, n * (n - 1)] for n, _ in pts], dtype=float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    sigma, kappa = float(coef[0]), 0.0 if amdahl else float(coef[1])
    return {"sigma": sigma, "kappa": kappa, "points": len(pts)}


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
    lines = [f"  {'N':>3}  {'engine wN MB/s':>14}  {'ceiling N MB/s':>14}  {'x ceiling':>9}  {'speedup vs w1':>13}"]
    for r in sc["rows"]:
        lines.append(f"  {r['workers']:>3}  {r['engine_mb_s']:>14.1f}  {r['ceiling_mb_s']:>14.1f}  "
                     f"{r['x_ceiling']:>9.2f}  {r['speedup']:>13.2f}")
    for name, fit in sc["fits"].items():
        if fit is None:
            lines.append(f"{name}: no point at N >= 2")
            continue
        pred = ", ".join(f"{v:.2f} GB/s on {c} cores" for c, v in fit.get("predicted_gb_per_s", {}).items())
        lines.append(f"{name}: sigma {fit['sigma']:.4f}, kappa {fit['kappa']:.2e} ({fit['points']} points); {pred}")
    return lines


def main(paths: Sequence[str]) -> dict:
    """Read the bench JSONs at `paths`, print the curve, return it."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    sc = scaling_curve(results)
    print("\n".join(curve_lines(sc)))
    return sc
