"""examples/nanogpt_byo.py and examples/hf_trainer_byo.py run as documented (docs/BYO.md) and their runs load
into the analysis."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np

from pretok_lib.analysis import load_runs, run_metrics

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nanogpt_byo.py"
HF_EXAMPLE = EXAMPLE.with_name("hf_trainer_byo.py")


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


def test_hf_trainer_example_measures_a_real_trainer_with_padding(tmp_path, monkeypatch):
    """A real `transformers.Trainer` on documents of different lengths, padded per batch by HF's collator: the run
    records the padding it really had (0 < padding < 1) and loads beside the project's runs."""
    from ..conftest import SHARED

    rng = np.random.default_rng(0)
    words = ["data", "path", "token", "loader", "stall", "batch", "pack", "shard"]
    (tmp_path / "c.txt").write_text("\n\n".join(" ".join(rng.choice(words, rng.integers(3, 40))) for _ in range(40)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(HF_EXAMPLE), str(tmp_path / "runs" / "hf"), "--text", str(tmp_path / "c.txt"),
                                      "--tokenizer", str(SHARED / "tokenizers" / "gpt2" / "tokenizer.json"),
                                      "--steps", "4", "--batch", "4", "--seq-len", "32"])
    runpy.run_path(str(HF_EXAMPLE), run_name="__main__")
    (run,) = load_runs(tmp_path / "runs")
    m = run_metrics(run)
    assert (run.status, m.steps, m.global_batch, m.data_kind) == ("completed", 4, 4, "hf-trainer-padded")
    assert 0 < m.padding_frac < 1 and m.tokens_per_s > 0 and 0 <= m.data_stall < 1
