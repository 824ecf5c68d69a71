"""The engine's scaling curve over worker counts (issue 39, part 3): generated bench results from a known USL curve
give back its σ and κ and predictions, and the table pairs each wN with the ceiling on N cores."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pretok_lib.bench.scaling_curve import curve_points, fit_usl, scaling_curve, usl_speedup

from ..conftest import ROOT


def bench_json(n: int, w1: float, speedup: float, ceiling_per_core: float) -> dict:
    """What `pretok bench tokenize --workers n --json` records of the methods the curve reads."""
    rates = {"(d) engine memmap w1": w1, f"(d) engine memmap w{n}": w1 * speedup,
             "(c) ceiling 1 core": ceiling_per_core, f"(c) ceiling {n} cores": ceiling_per_core * n}
    return {"workers": n, "methods": {k: {"mb_per_s": v} for k, v in rates.items()},
            "repeats": {"mb_per_s": {k: {"median": v, "interval": [v, v], "n": 2} for k, v in rates.items()}}}


@given(sigma=st.floats(0, 0.2), kappa=st.floats(0, 1e-3), w1=st.floats(20, 300))
def test_a_usl_curve_is_fitted_back(sigma, kappa, w1):
    fit = {"sigma": sigma, "kappa": kappa}
    results = [bench_json(n, w1, usl_speedup(n, fit), 250.0) for n in (2, 4, 8, 15)]
    sc = scaling_curve(results)
    assert [r["workers"] for r in sc["rows"]] == [2, 4, 8, 15]
    usl = sc["fits"]["usl"]
    assert usl["sigma"] == pytest.approx(sigma, abs=1e-9) and usl["kappa"] == pytest.approx(kappa, abs=1e-9)
    assert usl["predicted_gb_per_s"]["288"] == pytest.approx(w1 * usl_speedup(288, fit) / 1e3)
    if kappa == 0:
        assert sc["fits"]["amdahl"]["sigma"] == pytest.approx(sigma, abs=1e-9)
    for r in sc["rows"]:
        assert r["x_ceiling"] == pytest.approx(r["engine_mb_s"] / (250.0 * r["workers"]))


def test_runs_without_the_methods_or_a_parallel_point_are_left_out():
    partial = {"workers": 4, "methods": {"(d) engine memmap w1": {"mb_per_s": 90.0}}}
    assert curve_points([partial]) == []
    assert fit_usl([(1, 1.0)]) is None
    assert scaling_curve([bench_json(1, 90.0, 1.0, 200.0)])["fits"]["usl"] is None


def test_the_script_reads_bench_jsons_and_writes_the_curve(tmp_path):
    paths = []
    for n, s in ((2, 1.8), (4, 3.2)):
        p = tmp_path / f"tokenize-w{n}.json"
        p.write_text(json.dumps(bench_json(n, 100.0, s, 200.0)))
        paths.append(str(p))
    out = tmp_path / "curve.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "engine_scaling.py"), *paths, "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "x ceiling" in proc.stdout and "usl: sigma" in proc.stdout
    assert [r["workers"] for r in json.loads(out.read_text())["rows"]] == [2, 4]
