"""One step under the profiler (`log.profile_step`) and a measurement run without the last checkpoint
(`checkpoint.at_end: false`): the files they write, and the profile's accounting on GPU-shaped event lists."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pretok_lib.train.profile import KINDS, kind_of, summarize

from .conftest import records, run_here, tiny_overrides


def test_the_profiled_step_and_no_last_checkpoint(train_data, tmp_path, one_thread):
    run_here(tiny_overrides(train_data, tmp_path, **{"train.steps": 3, "log.profile_step": 2,
                                                     "checkpoint.at_end": "false"}))
    run = tmp_path / "run"
    prof = json.loads((run / "profile-step2.json").read_text())
    assert prof["timed_on"] == "cpu" and 0 < prof["busy_s"] and prof["wall_s"] > 0
    assert set(prof["by_kind_s"]) <= {k for k, _ in KINDS} and "matmul" in prof["by_kind_s"]
    assert sum(prof["by_kind_frac"].values()) == pytest.approx(1.0)
    assert "aten::" in (run / "profile-step2.txt").read_text()
    assert not (run / "profile-step1.json").exists() and not (run / "profile-step3.json").exists()
    assert [r["step"] for r in records(run)] == [1, 2, 3]
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())


def test_the_default_writes_the_last_checkpoint_and_no_profile(train_data, tmp_path, one_thread):
    run_here(tiny_overrides(train_data, tmp_path, **{"train.steps": 2}))
    run = tmp_path / "run"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000002"]
    assert not list(run.glob("profile-*"))


def event(name: str, us: float, device: str, annotation: bool = False):
    return SimpleNamespace(key=name, count=1, self_device_time_total=us, self_cpu_time_total=0.0,
                           device_type=SimpleNamespace(name=device), is_user_annotation=annotation)


@given(kernels=st.lists(st.tuples(st.sampled_from(["nvjet_sm90_tst_256x128", "cudnn_flash_bprop", "triton_poi_x",
                                                   "multi_tensor_apply_kernel", "cunn_SoftMaxForward", "Memcpy HtoD"]),
                                  st.floats(1, 5e4)), min_size=1, max_size=30),
       spans=st.floats(0, 1e5))
def test_only_the_kernels_count_on_a_gpu(kernels, spans):
    """The operators that launched the kernels and a user annotation spanning them (`Optimizer.step#AdamW.step`)
    report the same device time again: counting them made an H200 step 102% busy."""
    events = [event(n, us, "CUDA") for n, us in kernels]
    events += [event("aten::mm", spans, "CPU"), event("Optimizer.step#AdamW.step", spans, "CUDA", annotation=True)]
    wall = sum(us for _, us in kernels) / 1e6
    s = summarize(events, wall, device=True)
    assert s["timed_on"] == "device kernels"
    assert s["busy_s"] == pytest.approx(wall) and s["busy_frac"] == pytest.approx(1.0)
    assert sum(s["by_kind_s"].values()) == pytest.approx(wall)


def test_kernel_names_sort_into_kinds():
    assert kind_of("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma") == "attention"
    assert kind_of("void at::native::multi_tensor_apply_kernel<FusedAdamW>") == "optimizer"
    assert kind_of("triton_poi_fused__unsafe_view_mul_silu") == "compiled_triton"
    assert kind_of("void at::native::cunn_SoftMaxForward<4, float>") == "cross_entropy"
    assert kind_of("Memcpy HtoD (Pageable -> Device)") == "copies"
    assert kind_of("something_else") == "other"
    for name in ("aten::cat", "void at::native::CatArrayBatchedCopy<float>", "aten::concat"):
        assert kind_of(name) == "copies", name
    for name in ("aten::scatter_add_", "void at::native::_scatter_gather_elementwise_kernel", "indicator"):
        assert kind_of(name) == "other", name
