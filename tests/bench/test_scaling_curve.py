"""The engine's scaling curve over worker counts (issue 39, part 3): generated bench results from a known USL curve
give back its σ and κ and predictions, and the table pairs each wN with the ceiling on N cores."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pretok_lib.bench.scaling_curve import binding, curve_points, fit_usl, scaling_curve, usl_speedup

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


@given(speedups=st.lists(st.floats(0.3, 1.5), min_size=1, max_size=4), w1=st.floats(20, 300))
def test_the_fits_never_predict_more_than_linear_scaling(speedups, w1):
    """Measured speedups of any shape (noisy, flat, near-linear): σ and κ stay >= 0, so no prediction exceeds N x w1
    (on the H200 machine's 16 cores an unbounded κ < 0 predicted 40.8 GB/s at 288 cores from 0.6 GB/s at 15)."""
    ns = (2, 4, 8, 15)[:len(speedups)]
    results = [bench_json(n, w1, max(0.05, f * n), 250.0) for n, f in zip(ns, speedups)]
    for name, fit in scaling_curve(results)["fits"].items():
        assert fit["sigma"] >= 0 and fit["kappa"] >= 0
        for cores, gb_s in fit["predicted_gb_per_s"].items():
            assert gb_s <= int(cores) * w1 / 1e3 * (1 + 1e-9)


def test_a_superlinear_tail_holds_kappa_at_zero():
    pts = [(2, 1.65), (4, 2.76), (8, 4.28), (15, 5.34)]   # the H200 machine's 16 cores, 1 GB, GPT-2 (issue 39)
    fit = fit_usl(pts)
    assert fit["kappa"] == 0 and fit["bounded"] == ["kappa"]
    assert fit["sigma"] == pytest.approx(fit_usl(pts, amdahl=True)["sigma"])


def test_w1_comes_from_the_other_runs_when_a_run_skipped_it():
    one = bench_json(1, 100.0, 1.0, 200.0)
    four = bench_json(4, 100.0, 3.0, 200.0)
    for part in ("methods", "repeats"):   # `--skip engine-1`: no w1 in the N = 4 run
        (four[part] if part == "methods" else four[part]["mb_per_s"]).pop("(d) engine memmap w1")
    rows = curve_points([one, four])
    assert [(r["workers"], r["w1_from"]) for r in rows] == [(1, "this run"), (4, "other runs")]
    assert rows[1]["speedup"] == pytest.approx(3.0)


def test_what_binds_is_the_largest_share():
    res = {"workers": 8, "corpus": {"text_bytes": 1e9},
           "scaling": {"main_streaming_s_per_gb": 0.5, "workers_s_per_gb": 9.0},
           "methods": {"(d) engine memmap w8": {"seconds": 2.0,
                                                "timeline": {"startup_seconds": 0.6, "tokenize_seconds": 1.3}}}}
    b = binding(res, 8)
    assert b["startup_share"] == pytest.approx(0.3)
    assert b["main_busy"] == pytest.approx(0.5 / 1.3) and b["workers_busy"] == pytest.approx(9.0 / 1.3 / 8)
    assert b["binds"] == "workers" and b["phase_mb_s"] == pytest.approx(1e3 / 1.3)
    res["methods"]["(d) engine memmap w8"]["timeline"]["startup_seconds"] = 1.9
    assert binding(res, 8)["binds"] == "start-up"
    assert binding({"workers": 8}, 8) == {}
