"""examples/nanogpt_byo.py runs as documented (docs/BYO.md) and its run loads into the analysis."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np

from pretok_lib.analysis import load_runs, run_metrics

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nanogpt_byo.py"


def test_nanogpt_example_writes_a_complete_run(tmp_path, monkeypatch):
    tokens = np.random.default_rng(1).integers(0, 100, 5000).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), str(tmp_path / "runs" / "nano"), "--data",
                                      str(tmp_path / "train.bin"), "--vocab", "100", "--steps", "4", "--batch", "2",
                                      "--block", "16"])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    (run,) = load_runs(tmp_path / "runs")
    m = run_metrics(run)
    assert (run.status, m.steps, m.seq_len, m.global_batch, m.data_kind) == ("completed", 4, 16, 2, "nanogpt-get-batch")
    assert m.padding_frac == 0 and m.tokens_per_s > 0 and 0 <= m.data_stall < 1 and m.final_val_loss is not None
    assert (run.path / "summary.json").is_file()
