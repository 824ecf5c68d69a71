"""`train.precision: auto` and the MFU peak: resolved per hardware (cached CPU matmul rates), recorded in
run.json/config.yaml, MFU <= 1 in every precision, the report showing the precision and the peak's source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from pretok_lib.errors import PretokError
from pretok_lib.train import hardware, load_config, train

from ..conftest import ROOT
from .conftest import records, tiny_overrides

CPU = torch.device("cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private measurement cache (the real one lives in $PRETOK_CACHE_DIR or the temp dir)."""
    monkeypatch.setenv("PRETOK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / hardware.CACHE_FILE


def test_auto_on_this_cpu_follows_the_measured_matmuls_with_a_reason(cache):
    choice = hardware.resolve_precision("auto", CPU)
    rates = hardware.cpu_matmul_rates()
    assert choice.requested == "auto" and choice.used in ("fp32", "bf16")
    if not hardware.cpu_flags() & set(hardware.BF16_FLAGS):       # this AVX2 EPYC: bf16 is emulated
        assert choice.used == "fp32" and rates["bf16"] < rates["fp32"] / 4
        assert "emulates bf16" in choice.reason and "no avx512_bf16/amx_bf16 flag" in choice.reason
    else:
        assert choice.used == ("bf16" if rates["bf16"] >= rates["fp32"] else "fp32")
    assert "bf16 matmul" in choice.reason and "fp32" in choice.reason and "GFLOP/s" in choice.reason


@pytest.mark.parametrize("rates, used, why", [
    ({"fp32": 50e9, "bf16": 200e9, "fp16": 1e9}, "bf16", "computes bf16 natively"),
    ({"fp32": 50e9, "bf16": 1e9, "fp16": 1e9}, "fp32", "emulates bf16 (bf16 matmul 1 vs fp32 50 GFLOP/s, 50x"),
])
def test_auto_on_cpu_decides_by_the_measured_ratio(monkeypatch, rates, used, why):
    monkeypatch.setattr(hardware, "cpu_matmul_rates", lambda: rates)
    choice = hardware.resolve_precision("auto", CPU)
    assert choice.used == used and why in choice.reason


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_explicit_precision_is_honoured_without_measuring(monkeypatch, precision):
    monkeypatch.setattr(hardware, "cpu_matmul_rates", lambda: pytest.fail("measured for an explicit precision"))
    assert hardware.resolve_precision(precision, CPU) == hardware.Precision(precision, precision, "requested")


@pytest.mark.parametrize("bf16, used", [(True, "bf16"), (False, "fp16")])
def test_auto_on_gpus(monkeypatch, bf16, used):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    monkeypatch.setattr(hardware, "_cuda_bf16", lambda d: bf16)
    choice = hardware.resolve_precision("auto", torch.device("cuda", 0))
    assert choice.used == used and "Tesla T4" in choice.reason


def test_cpu_rates_are_measured_once_and_cached(cache, monkeypatch):
    first = hardware.cpu_matmul_rates()
    assert set(first) == {"fp32", "bf16", "fp16"} and all(v > 0 for v in first.values())
    entry = json.loads(cache.read_text())[hardware._cache_key()]
    assert entry["rates"] == first and entry["cpu"] == hardware.cpu_model() and entry["torch"] == torch.__version__
    monkeypatch.setattr(hardware, "best_matmul_flops", lambda *a: pytest.fail("measured again"))
    assert hardware.cpu_matmul_rates() == first
    cache.write_text("{not json")                     # a damaged cache is measured again and rewritten
    monkeypatch.setattr(hardware, "best_matmul_flops", lambda *a: 7e9)
    assert hardware.cpu_matmul_rates() == {"fp32": 7e9, "bf16": 7e9, "fp16": 7e9}
    assert json.loads(cache.read_text())[hardware._cache_key()]["rates"]["fp32"] == 7e9


@pytest.mark.parametrize("var", hardware.KERNEL_ENV)
def test_rates_measured_under_other_cpu_kernels_are_not_reused(cache, monkeypatch, var):
    """ATEN_CPU_CAPABILITY=avx2 (and the oneDNN / MKL ISA limits) make bf16 emulated on a CPU with native bf16:
    a rate cached without it must not decide the precision with it, nor the other way round."""
    for k in hardware.KERNEL_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hardware, "best_matmul_flops", lambda *a: 5e9)
    assert hardware.cpu_matmul_rates()["bf16"] == 5e9
    monkeypatch.setenv(var, "avx2")
    monkeypatch.setattr(hardware, "best_matmul_flops", lambda *a: 1e8)
    assert hardware.cpu_matmul_rates()["bf16"] == 1e8    # measured again under the limited kernels
    monkeypatch.delenv(var)
    assert hardware.cpu_matmul_rates()["bf16"] == 5e9    # the unlimited entry is still there


def test_unwritable_cache_only_costs_a_measurement(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PRETOK_CACHE_DIR", str(blocker / "sub"))      # cannot be a directory
    monkeypatch.setattr(hardware, "best_matmul_flops", lambda *a: 3e9)
    assert hardware.cpu_matmul_rates()["fp32"] == 3e9


def test_measurement_is_quick_and_leaves_threads_and_rng_alone(cache):
    import time

    threads, state = torch.get_num_threads(), torch.random.get_rng_state()
    t = time.perf_counter()
    hardware.cpu_matmul_rates()
    # ~0.5 s alone, stopped by its wall-clock budget (3 x 0.2 s, 2 products at least per dtype): the deadline only
    # catches one that ignores its budget, not a machine slowed by other work
    assert time.perf_counter() - t < 120
    assert torch.get_num_threads() == threads and torch.equal(torch.random.get_rng_state(), state)


def test_cpu_peak_is_the_best_dtype_times_threads(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_matmul_rates", lambda: {"fp32": 80e9, "bf16": 2e9, "fp16": 1e9})
    monkeypatch.setattr(hardware, "cpu_threads", lambda: 2)
    for precision in ("fp32", "bf16", "fp16"):        # the machine's utilisation, whatever the run's dtype
        peak, source = hardware.peak_flops(CPU, precision, None)
        assert peak == 160e9
        assert source == "measured CPU matmul: best of fp32 80, bf16 2, fp16 1 GFLOP/s per thread × 2 threads"
    assert hardware.peak_flops(CPU, "bf16", 1.5) == (1.5e12, "hardware.peak_tflops")


@pytest.mark.parametrize("key", list(hardware.PEAK_TFLOPS))
def test_every_datasheet_entry_matches_its_own_gpu_name(monkeypatch, key):
    """Names are matched by substring in table order: no entry may be shadowed by a shorter earlier one."""
    for name in (f"NVIDIA {key}", f"NVIDIA {key} 80GB HBM3", f"AMD Instinct {key}"):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None, n=name: n)
        for precision, figure in (("bf16", "bf16"), ("fp32", "fp32")):
            peak, source = hardware.peak_flops(torch.device("cuda", 0), precision, None)
            assert source.startswith(f"datasheet {key} ") and peak == hardware.PEAK_TFLOPS[key][figure] * 1e12


def test_fp32_on_cuda_uses_tf32_and_its_peak_or_neither(monkeypatch):
    """`train.tf32` (default on): fp32 matmuls on TF32 tensor cores, MFU against the datasheet's TF32 figure; off:
    IEEE fp32, MFU against a measured fp32 matmul (the datasheet has no row for it), never the TF32 figure."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    seen = []
    monkeypatch.setattr(hardware, "best_matmul_flops", lambda dev, dt, sizes, s: seen.append(dt) or 51e12)
    assert hardware.peak_flops(cuda, "fp32", None, tf32=True) == (494.5e12, "datasheet H100 dense TF32")
    peak, source = hardware.peak_flops(cuda, "fp32", None, tf32=False)
    assert peak == 51e12 and seen == [torch.float32] and "TF32 off" in source and "H100" in source
    assert hardware.peak_flops(cuda, "bf16", None, tf32=False)[0] == 989e12   # autocast matmuls: not fp32
    before = torch.get_float32_matmul_precision()
    try:
        assert hardware.set_tf32(cuda, True) == "high" and torch.get_float32_matmul_precision() == "high"
        assert hardware.set_tf32(cuda, False) == "highest" and torch.get_float32_matmul_precision() == "highest"
        torch.set_float32_matmul_precision(before)
        assert hardware.set_tf32(CPU, True) is None and torch.get_float32_matmul_precision() == before
    finally:
        torch.set_float32_matmul_precision(before)
    assert load_config(None, ["data.path=x"]).train.tf32 is True


def test_datasheet_has_the_current_gpus():
    assert {"GH200", "H200", "B200", "L40S", "A10", "A10G", "H100", "A100"} <= set(hardware.PEAK_TFLOPS)


def test_config_accepts_auto_and_a_positive_time_budget():
    assert load_config(None, ["data.path=x"]).train.precision == "auto"       # the default
    for name in ("tiny", "small", "study"):
        assert load_config(ROOT / "configs" / f"{name}.yaml", ["data.path=x"]).train.precision == "auto"
    assert load_config(None, ["data.path=x", "train.time_budget_s=30"]).train.time_budget_s == 30.0
    with pytest.raises(PretokError, match="train.time_budget_s must be a finite number > 0"):
        load_config(None, ["data.path=x", "train.time_budget_s=0"])


def test_shipped_profiles_and_bench_default_to_auto():
    import argparse

    from pretok_lib.bench.train import add_args
    from pretok_lib.study.profiles import PROFILES

    for name, p in PROFILES.items():
        assert p["sweep_base"].get("train.precision", "auto") == "auto", name
        assert p["train_overrides"].get("train.precision", "auto") == "auto", name
    assert {"precision": ["fp32", "bf16"]}.items() <= PROFILES["quick"]["sweep_grids"][-1].items()
    assert PROFILES["quick"]["sweep_base"]["train.time_budget_s"] > 0        # bf16 on an emulating CPU: bounded
    ap = argparse.ArgumentParser()
    add_args(ap)
    assert ap.parse_args([]).precision == "auto"


# ------------------------------------------------------------------------------ real runs: MFU, run.json, report


@pytest.fixture(scope="module")
def runs(train_data, tmp_path_factory) -> Path:
    """Tiny runs on this CPU: auto, explicit fp32, explicit bf16 (very short: bf16 is emulated here)."""
    root = tmp_path_factory.mktemp("precision-runs")
    for run_id, precision, steps in (("auto", "auto", 3), ("fp32", "fp32", 3), ("bf16", "bf16", 2)):
        o = tiny_overrides(train_data, root, **{"run.id": run_id, "train.precision": precision,
                                                "train.steps": steps, "log.skip_steps": 1})
        assert train(load_config(None, o)) == 0
    return root


def test_mfu_is_at_most_one_in_fp32_and_bf16(runs):
    for run_id in ("auto", "fp32", "bf16"):
        info = json.loads((runs / run_id / "run.json").read_text())
        assert info["peak_source"].startswith("measured CPU matmul: best of fp32")
        for r in records(runs / run_id):
            assert 0 < r["mfu"] <= 1, (run_id, r["step"], r["mfu"])
            assert r["mfu"] == pytest.approx(info["flops_per_token"] * r["tokens_per_s_per_device"]
                                             / info["peak_flops"])


def test_run_records_the_precision_used_and_why(runs):
    expected = {"auto": hardware.resolve_precision("auto", CPU).used, "fp32": "fp32", "bf16": "bf16"}
    for run_id, used in expected.items():
        info = json.loads((runs / run_id / "run.json").read_text())
        assert info["precision"] == used and info["precision_requested"] == run_id
        assert info["matmul_precision"] is None        # TF32 is a CUDA setting: CPUs keep IEEE fp32
        assert info["precision_reason"] == ("requested" if run_id != "auto" else
                                            hardware.resolve_precision("auto", CPU).reason)
        # config.yaml holds what the run computed in: running it again reproduces the run on any machine
        assert yaml.safe_load((runs / run_id / "config.yaml").read_text())["train"]["precision"] == used
        assert json.loads((runs / run_id / "summary.json").read_text())["precision"] == used


def test_report_shows_precision_and_peak_source(runs):
    from pretok_lib.analysis import load_runs, summary_table
    from pretok_lib.analysis.figures import mfu_figure

    loaded = load_runs(runs)
    rows = {r["run_id"]: r for r in summary_table(loaded)}
    auto = hardware.resolve_precision("auto", CPU)
    assert rows["auto"]["precision"] == auto.used and rows["auto"]["precision_reason"] == auto.reason
    assert rows["bf16"]["precision"] == "bf16" and rows["bf16"]["precision_reason"] == "requested"
    assert all(r["peak_source"].startswith("measured CPU matmul") for r in rows.values())
    assert all(0 < r["mfu"] <= 1 for r in rows.values())
    notes = " ".join(a.text for a in mfu_figure(loaded).layout.annotations)
    assert "peak: measured CPU matmul: best of fp32" in notes


def test_time_budget_stops_after_the_warmup_as_completed(train_data, tmp_path):
    o = tiny_overrides(train_data, tmp_path, **{"train.steps": 50, "train.time_budget_s": 1e-6,
                                                "log.skip_steps": 2, "eval.path": train_data.val, "eval.every": 100,
                                                "eval.batches": 1})
    assert train(load_config(None, o)) == 0
    run = tmp_path / "run"
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4]               # skip_steps + 2 steps, no fewer
    assert [v["step"] for v in records(run, "val")] == [4]                 # the last step is evaluated
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000004"]


def test_two_ranks_share_the_auto_precision_and_stop_at_the_same_budget_step(train_data, tmp_path):
    from .conftest import run_cli

    o = tiny_overrides(train_data, tmp_path, **{"train.steps": 50, "train.time_budget_s": 1e-6,
                                                "train.precision": "auto", "log.skip_steps": 1})
    run_cli(o, nproc=2, timeout=600)                  # a rank stopping alone would hang its peer's all-reduce
    run = tmp_path / "run"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["world_size"] == 2
    assert info["precision_requested"] == "auto" and info["precision"] == hardware.resolve_precision("auto", CPU).used
    assert [r["step"] for r in records(run)] == [1, 2, 3]
    assert all(0 < r["mfu"] <= 1 for r in records(run))


def test_precision_figure_says_when_precisions_ran_different_step_counts(tmp_path):
    from pretok_lib.analysis import load_runs
    from pretok_lib.analysis.figures import precision_figure

    from ..analysis.helpers import simple_run

    simple_run(tmp_path, "fp32", tokens_per_s=1000.0, n=6, precision="fp32")
    simple_run(tmp_path, "bf16", tokens_per_s=80.0, n=2, precision="bf16")     # stopped by its time budget
    title = precision_figure(load_runs(tmp_path)).layout.title.text
    assert "steps run: bf16 10, fp32 30: losses after different step counts" in title
    simple_run(tmp_path / "same", "fp32", tokens_per_s=1000.0, n=2, precision="fp32")
    simple_run(tmp_path / "same", "bf16", tokens_per_s=80.0, n=2, precision="bf16")
    assert precision_figure(load_runs(tmp_path / "same")).layout.title.text == "Mixed vs full precision"
