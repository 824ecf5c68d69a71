"""Where the engine's CPU goes and what it predicts on many cores (issue 37): the serial fraction from CPU records
and from wall times, Amdahl's predictions, and the engine's own CPU accounts in the manifest."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pretok_lib.bench.scaling import (cpu_per_gb, fitted_serial_fraction, per_byte, predicted_gb_per_s, scaling,
                                      scaling_lines, serial_fraction)
from pretok_lib.machine.memory import cpu_seconds
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..tokenizer.test_specials import tiny_bpe


@given(s=st.floats(0, 1), t1=st.floats(0.1, 1e4), n=st.integers(2, 512))
def test_the_fitted_fraction_recovers_amdahls_from_its_times(s, t1, n):
    assert fitted_serial_fraction(t1, t1 * (s + (1 - s) / n), n) == pytest.approx(s, abs=1e-9)


@given(main=st.floats(0.001, 10), work=st.floats(0.001, 100), units=st.integers(1, 1000))
def test_predictions_are_amdahls_capped_by_the_units(main, work, units):
    got = [predicted_gb_per_s(main, work, c, units) for c in (1, 2, 16, 72, 288)]
    assert got == sorted(got) and got[0] == pytest.approx(1 / (main + work))
    assert predicted_gb_per_s(main, work, 288, units) == pytest.approx(1 / (main + work / min(288, units)))
    assert predicted_gb_per_s(main, work, 10**9) < 1 / main        # never past the serial part's own rate
    assert serial_fraction(main, work) == pytest.approx(main / (main + work))


def test_the_issue_37_numbers_give_its_predictions():
    """The issue measured ~1.0 main CPU-s per GB against 5.3 worker CPU-s: s ~ 0.16, about 1 GB/s on 288 cores."""
    runs = {f"(d) engine memmap w{w}": [{"units": 32, "cpu": {"main_cpu_seconds": 1.2, "main_cpu_streaming_seconds":
                                                              1.0, "workers_cpu_seconds": 5.3}}] for w in (1, 2)}
    rounds = [{"(d) engine memmap w1 tokenizing phase": 10.0, "(d) engine memmap w2 tokenizing phase": 5.8}]
    sc = scaling(runs, rounds, int(1e9), 2)
    assert sc["serial_fraction"] == pytest.approx(1.0 / 6.3) and sc["fitted_serial_fraction"] == pytest.approx(0.16)
    assert sc["predicted_gb_per_s"]["288"]["enough_units"] == pytest.approx(1 / (1.0 + 5.3 / 288))
    assert sc["predicted_gb_per_s"]["288"]["this_input"] == pytest.approx(1 / (1.0 + 5.3 / 32))
    text = "\n".join(scaling_lines(sc))
    assert "1.00 CPU-s from the first batch on" in text and "this input (32 units)" in text
    assert cpu_per_gb([{"cpu": {"main_cpu_seconds": None}}], 10) is None and scaling({}, [], 10, 2) is None


@pytest.mark.parametrize("workers", [0, 2])
def test_the_manifest_accounts_for_the_runs_cpu(tmp_path, workers):
    """Every part records its CPU; the manifest sums the workers' and gives the main process's own: with no workers
    the parts' CPU is the main process's and is not counted twice (main + workers = the process's CPU)."""
    tok = tiny_bpe(tmp_path / "t" / "tokenizer.json")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"doc {i} " * 200}) + "\n" for i in range(400)))
    before = cpu_seconds()
    m = run_tokenize(TokenizeConfig(inputs=[str(tmp_path / "d.jsonl")], out=str(tmp_path / "o"), tokenizer=str(tok),
                                    format="memmap", workers=workers, progress=False, part_mb=0.05))
    spent, run = cpu_seconds() - before, m["run"]
    parts = [json.loads(p.read_text()) for p in (tmp_path / "o" / ".pretok" / "parts").glob("*.json")]
    assert run["workers_cpu_seconds"] > 0 and 0 <= run["main_cpu_streaming_seconds"] <= run["main_cpu_seconds"]
    if workers == 0:
        assert run["main_cpu_seconds"] + run["workers_cpu_seconds"] == pytest.approx(spent, abs=0.1)
        assert run["main_cpu_seconds"] < spent
    assert len(parts) == len(m["parts"]) > 1 and all(isinstance(p["cpu_seconds"], float) for p in parts)
    assert sum(p["cpu_seconds"] for p in parts) == pytest.approx(run["workers_cpu_seconds"], abs=0.01)


@given(main=st.one_of(st.just(0.0), st.floats(0.01, 2)), main0=st.floats(0, 5), work=st.floats(1, 20), work0=st.floats(0, 5),
       sizes=st.lists(st.integers(10, 5000), min_size=2, max_size=5, unique=True))
def test_the_per_byte_shares_are_the_slopes_over_sizes_and_drive_the_prediction(main, main0, work, work0, sizes):
    """CPU = constant + slope x GB at every size of the scan: the slopes and constants come back, and the serial
    fraction and predictions use the slopes, not one size's CPU per GB (which holds the constants)."""
    scan = [{"input_bytes": mb * 10**6, "cpu": {"main_cpu_streaming_seconds": main0 + main * mb / 1e3,
                                                "main_cpu_seconds": main0 + 1 + main * mb / 1e3,
                                                "workers_cpu_seconds": work0 + work * mb / 1e3}} for mb in sizes]
    got = per_byte(scan)
    assert got["main_streaming_s_per_gb"] == pytest.approx(main, abs=1e-6)
    assert got["main_streaming_constant_s"] == pytest.approx(main0, abs=1e-6)
    assert got["main_constant_s"] == pytest.approx(main0 + 1, abs=1e-6)
    assert got["workers_s_per_gb"] == pytest.approx(work, rel=1e-6)
    runs = {"(d) engine memmap w2": [{"units": 64, "cpu": scan[0]["cpu"]}]}
    sc = scaling(runs, [], sizes[0] * 10**6, 2, scan=scan)
    assert sc["from_slopes"] == (main > 0)
    if main:
        assert sc["serial_fraction"] == pytest.approx(main / (main + work), abs=1e-6)
        assert sc["predicted_gb_per_s"]["288"]["enough_units"] == pytest.approx(1 / (main + work / 288), rel=1e-5)
    assert "per extra GB (slopes over" in "\n".join(scaling_lines(sc))
    assert per_byte(scan[:1]) is None and per_byte([{**scan[0], "cpu": None}, scan[1]]) is None
    flat = [{**r, "cpu": {**r["cpu"], "main_cpu_streaming_seconds": main0}} for r in scan]  # no per-byte share seen
    assert not scaling(runs, [], sizes[0] * 10**6, 2, scan=flat)["from_slopes"]  # tiny sizes: one size's numbers


def test_the_bench_reads_the_engines_cpu_from_its_manifest_with_no_sampler_beside_it():
    """The engine runs in the bench's process: a thread sampling the workers' RSS there (every 20 ms) took ~7% of a
    core from the workers on 2 cores and counted in the main process's CPU. The workers' peak RSS is their own
    record; the CPU accounts are the manifest's as they are."""
    import inspect

    from pretok_lib.bench import tokenize_methods
    from pretok_lib.bench.tokenize_methods import _engine_cpu

    run = {"main_cpu_seconds": 2.0, "main_cpu_streaming_seconds": 1.5, "workers_cpu_seconds": 9.0,
           "wall_seconds": 10.0}
    assert _engine_cpu(run) == {k: run[k] for k in ("main_cpu_seconds", "main_cpu_streaming_seconds",
                                                    "workers_cpu_seconds")}
    assert "ChildRss" not in inspect.getsource(tokenize_methods.run_engine)


@given(a=st.floats(0.1, 2), u=st.floats(0, 3e-3), b=st.floats(0, 1), sizes=st.lists(st.integers(1, 4000), min_size=2,
       max_size=5, unique=True), coarse_units=st.integers(1, 40))
def test_the_main_process_per_unit_and_per_byte_are_told_apart_with_a_coarse_run(a, u, b, sizes, coarse_units):
    """Scan runs whose units grow with their size (~485 per GB, as the plan cuts 2 MB units) cannot separate a cost
    per unit from one per byte; the largest input again in fewer units can. The fit recovers both, and an input large
    enough for 64 MB units is predicted from them."""
    from pretok_lib.bench.scaling import large_input_gb_per_s, per_unit

    def run(mb: int, units: int) -> dict:
        return {"input_bytes": mb * 10**6, "units": units,
                "cpu": {"main_cpu_streaming_seconds": a + u * units + b * mb / 1e3}}

    scan = [run(mb, max(1, round(mb * 0.485))) for mb in sorted(sizes)]
    coarse = run(sorted(sizes)[-1], coarse_units)
    assert per_unit(scan, None) is None                       # collinear without the coarse run: not fitted
    if coarse["units"] == scan[-1]["units"] or len(scan) < 3:  # no second unit count at one size, or too few runs
        assert per_unit(scan, coarse) is None
        return
    pu = per_unit(scan, coarse)
    assert pu["per_run_s"] == pytest.approx(a, abs=1e-6) and pu["per_unit_ms"] == pytest.approx(u * 1e3, abs=1e-5)
    assert pu["per_gb_s"] == pytest.approx(b, abs=1e-5)
    assert large_input_gb_per_s(pu, 6.5, 288, 64e6) == pytest.approx(
        1 / (max(pu["per_gb_s"], 0) + max(pu["per_unit_ms"], 0) / 1e3 * 1e9 / 64e6 + 6.5 / 288))


def test_scaling_reports_the_large_input_prediction_only_with_a_coarse_run():
    runs = {f"(d) engine memmap w{w}": [{"units": 485, "cpu": {"main_cpu_seconds": 1.0, "main_cpu_streaming_seconds":
                                                               0.8, "workers_cpu_seconds": 6.5}}] for w in (1, 2)}
    scan = [{"input_bytes": int(gb * 1e9), "units": k, "cpu": {
        "main_cpu_seconds": 0.6 + 0.5e-3 * k, "main_cpu_streaming_seconds": 0.4 + 0.5e-3 * k,
        "workers_cpu_seconds": 6.5 * gb}} for gb, k in ((0.1, 50), (0.5, 243), (2.0, 970))]
    coarse = {"input_bytes": int(2e9), "units": 31, "cpu": {"main_cpu_seconds": 0.6 + 0.5e-3 * 31,
                                                             "main_cpu_streaming_seconds": 0.4 + 0.5e-3 * 31,
                                                             "workers_cpu_seconds": 13.0}}
    without = scaling(runs, [], int(1e9), 2, scan=scan)
    assert without["per_unit"] is None and without["large_input"] is None
    sc = scaling(runs, [], int(1e9), 2, scan=scan, coarse=coarse)
    assert sc["per_unit"]["per_unit_ms"] == pytest.approx(0.5, abs=1e-6) and sc["large_input"]["unit_mb"] == 64
    assert sc["large_input"]["main_s_per_gb"] == pytest.approx(0.5e-3 * 1e9 / 64e6)
    assert sc["large_input"]["predicted_gb_per_s"]["288"] > 10 > sc["predicted_gb_per_s"]["288"]["enough_units"]
    assert any("CPU-ms per unit" in line for line in scaling_lines(sc))
