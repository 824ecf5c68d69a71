"""A GPU machine's `pretok gpu-study` JSON beside this study's prediction (notebook 05): the accelerator is matched
by the GPU's name, every path run gets its measured stall, the GPU machine's own predictions and this study's
prediction for that accelerator; a missing or unreadable file says so."""

from __future__ import annotations

import pytest

from pretok_lib.analysis.gpu_measured import NONE, gpu_markdown, gpu_rows


def check(lo: float, hi: float, measured: float) -> dict:
    return {"interval": [lo, hi], "inside": lo <= measured <= hi, "measured_stall": measured}


def gpu_json(gpu_name: str = "NVIDIA H200") -> dict:
    runs = {"pretok-memmap w0": {"kind": "pretok-memmap", "workers": 0, "tokens_per_s": 42660.0,
                                 "effective_tokens_per_s": 42517.0, "data_stall": 0.0040},
            "padded w2": {"kind": "padded", "workers": 2, "tokens_per_s": 39907.0,
                          "effective_tokens_per_s": 2018.0, "data_stall": 0.0015}}
    checks = {"pretok-memmap w0": {"back_to_back": check(0.0016, 0.0019, 0.0040),
                                   "paced": check(0.0035, 0.0045, 0.0040), "either": check(0.0016, 0.0045, 0.0040)},
              "padded w2": {"back_to_back": check(0.0037, 0.0051, 0.0015)}}
    return {"started": "2026-11-28T06:25:00+00:00",
            "environment": {"gpu_name": gpu_name, "torch": "2.11.0+cu130", "cpus": 16, "cpu_model": "Xeon",
                            "nvidia_smi": "580.159.04, NVIDIA H200, 143771 MiB"},
            "parts": {"mfu": {"mfu": {"median": 0.415, "interval": [0.414, 0.416], "n": 29}, "goal": 0.4, "met": True,
                              "facts": {"params": 1.51e9, "precision": "bf16",
                                        "peak_source": "datasheet H200 dense bf16"}},
                      "paths": {"runs": runs}, "loaders": {"checks": checks}}}


PREDICTION = [{"accelerator": a, "path": p, "workers": w, "stall_low": lo, "stall_high": hi}
              for a in ("H200", "H100 SXM") for p, w, lo, hi in (("pretok-memmap", 0, 0.001, 0.002),
                                                                ("padded", 2, 0.0, 0.0))]


def test_each_run_beside_the_prediction_for_its_gpu():
    rows = {r["run"]: r for r in gpu_rows(gpu_json(), PREDICTION)}
    assert rows["pretok-memmap w0"]["study_prediction"] == (0.001, 0.002)
    assert rows["padded w2"]["paced"] is None and rows["padded w2"]["measured_stall"] == 0.0015
    md = gpu_markdown(gpu_json(), PREDICTION)
    assert "MFU 41.5%" in md and "met" in md and "1.51B" in md
    assert "this study's prediction for H200" in md
    line = next(x for x in md.splitlines() if x.startswith("| pretok-memmap | 0 |"))
    assert "0.40%" in line and "0.16%-0.19% (outside)" in line and "0.35%-0.45% |" in line and "0.10%-0.20%" in line
    assert "| 0.16%-0.45% |" in line and rows["pretok-memmap w0"]["either"]["inside"]


@pytest.mark.parametrize("name, acc", [("NVIDIA GH200 480GB", "GH200"), ("NVIDIA H100 80GB HBM3", "H100 SXM")])
def test_the_accelerator_is_matched_by_name(name, acc):
    pred = [dict(r, accelerator=acc if r["accelerator"] == "H200" else "A10") for r in PREDICTION]
    assert gpu_rows(gpu_json(name), pred)[0]["study_prediction"] == (0.001, 0.002)
    assert gpu_rows(gpu_json("Some Other GPU"), pred)[0]["study_prediction"] is None


def test_no_file_or_an_unreadable_one():
    assert gpu_markdown(None) == NONE
    assert gpu_markdown(None, source="gpu.json").startswith("`gpu.json`: not a readable")
    empty = gpu_json()
    empty["parts"]["paths"] = {}
    assert gpu_markdown(empty).endswith("No data-path runs in this measurement.")
