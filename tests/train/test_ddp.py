"""DDP on CPU with 2 gloo ranks (torchrun): equal to one rank with the same global batch; identical gradients."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import ROOT
from .conftest import records, run_cli, run_here, tiny_overrides


@pytest.mark.parametrize("kind", ["pretok-memmap", "pretok-padded"])
def test_two_ranks_equal_one_rank_with_the_same_global_batch(kind, train_data, tmp_path):
    base = tiny_overrides(train_data, tmp_path, kind, **{"train.steps": 3, "eval.path": train_data.val,
                                                          "eval.every": 3, "eval.batches": 2})
    run_here(base + ["run.id=one", "data.micro_batch=8"])
    run_cli(base + ["run.id=two", "data.micro_batch=4"], nproc=2)
    one, two = records(tmp_path / "one"), records(tmp_path / "two")
    info = json.loads((tmp_path / "two" / "run.json").read_text())
    assert info["world_size"] == 2 and info["backend"] == "gloo" and info["status"] == "completed"
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]
    assert [r["effective_tokens"] for r in two] == [r["effective_tokens"] for r in one]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5)
    assert [r["grad_norm"] for r in two] == pytest.approx([r["grad_norm"] for r in one], rel=1e-4)
    assert two[0]["tokens_per_s_per_device"] == pytest.approx(two[0]["tokens_per_s"] / 2)
    (v1,), (v2,) = records(tmp_path / "one", "val"), records(tmp_path / "two", "val")
    assert v2["val_tokens"] == v1["val_tokens"] and v2["val_loss"] == pytest.approx(v1["val_loss"], rel=1e-5)
    # only rank 0 wrote: one record per step, one checkpoint
    assert [r["step"] for r in two] == [1, 2, 3]


def test_validate_ddp_gradients_identical_across_ranks(train_data):
    """The study's validate_ddp.py: after a step on different data, every rank holds the same gradients."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "pretok_lib.train.validate_ddp", "--data", str(train_data.dirs["pretok-memmap"]), "--seq-len", "64"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "ranks saw different data: yes" in out and "gradients identical across 2 ranks: yes" in out
    assert "parameters identical after the step: yes" in out
