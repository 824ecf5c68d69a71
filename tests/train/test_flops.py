"""flops.py is the one home of the model's shape rules, the FLOPs formula and the accelerator peaks: every row is
complete and sourced, matched by device name without shadowing, and no other module of the package restates a
peak (two tables once disagreed: L40S 362.0 vs 362.05)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from pretok_lib.train import flops

from ..conftest import ROOT


def test_every_accelerator_row_is_complete_and_sourced() -> None:
    names = [a.name for a in flops.ACCELERATOR_TABLE]
    keys = [a.key for a in flops.ACCELERATOR_TABLE]
    assert len(set(names)) == len(names) and len(set(keys)) == len(keys)
    for a in flops.ACCELERATOR_TABLE:
        peaks = (a.bf16_tflops, a.fp16_tflops, a.tf32_tflops)
        assert all(isinstance(p, float) and p > 0 for p in peaks), a
        assert a.tf32_tflops <= a.bf16_tflops and len(a.source) > 20 and "FLOPS" in a.source, a
    assert {"H200 NVL", "H200", "L40S", "H100 SXM"} <= set(flops.ACCELERATORS)
    assert flops.ACCELERATORS["L40S"].bf16_tflops == 362.05
    assert flops.ACCELERATORS["H200 NVL"].bf16_tflops == 835.5


@pytest.mark.parametrize("row", flops.ACCELERATOR_TABLE, ids=lambda a: a.name)
def test_each_row_matches_its_own_device_names(row: flops.Accelerator) -> None:
    """Matched by substring in table order: no row may be shadowed by an earlier, shorter one."""
    for name in (f"NVIDIA {row.key}", f"NVIDIA {row.key} 80GB HBM3", f"AMD Instinct {row.key}"):
        assert flops.match_accelerator(name) is row
    assert flops.match_accelerator("Some other GPU") is None


def _peak_constants(path) -> list[tuple[int, float]]:
    """Numeric literals of a module equal to a datasheet peak (>= 100 or fractional: 60 or 70 mean other things)."""
    peaks = {p for a in flops.ACCELERATOR_TABLE for p in (a.bf16_tflops, a.fp16_tflops, a.tf32_tflops)}
    peaks = {p for p in peaks if p >= 100 or p != int(p)}
    return [(n.lineno, n.value) for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and type(n.value) in (int, float) and n.value in peaks]


def test_the_peaks_live_in_one_module() -> None:
    where = {p.relative_to(ROOT).as_posix(): hits for p in sorted((ROOT / "pretok_lib").rglob("*.py"))
             if (hits := _peak_constants(p))}
    assert list(where) == ["pretok_lib/train/flops.py"], where


def test_shape_rules_and_formula() -> None:
    assert flops.intermediate_size(2048) == 5504 and flops.intermediate_size(64) == 192
    assert flops.intermediate_size(64, 100) == 100
    assert flops.rounded_vocab(50257, 64) == 50304 and flops.rounded_vocab(64, 64) == 64
    assert flops.rounded_vocab(7, 0) == 7
    assert flops.flops_per_token(10, 2, 3, 4) == 6 * 10 + 12 * 2 * 3 * 4
    # defaults of the config's model section come from ModelConfig: hidden 128, 2 layers, 4 heads, 2 kv heads
    assert flops.config_flops_per_token({}, 1000, 8) == flops.flops_per_token(
        flops.matmul_params(128, 2, 4, 2, 1024), 2, 128, 8)
    assert flops.config_flops_per_token({"vocab_size": 1000}, 5, 8) == flops.config_flops_per_token({}, 1000, 8,
                                                                                                     vocab_multiple=1)


def test_flops_and_the_stall_model_are_torch_free() -> None:
    code = "import sys, pretok_lib.train.flops, pretok_lib.analysis.stall; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
