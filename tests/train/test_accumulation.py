"""Any split of the global batch (micro-batch x ranks x gradient accumulation) trains on the same samples and
measures the same validation set, also across epoch ends: the loader drops an epoch's remainder under one loader
batch (micro-batch x ranks), and the step drops the epoch's last micro-batches short of one accumulation, so a step
never spans two epochs. Before, a step took them with the next epoch's first ones (runs with accumulation diverged
from the equal runs without it at the first epoch end), and evaluation took eval.batches micro-batches per rank
(fewer validation samples with accumulation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretok_lib.cli import main as cli_main

from .conftest import run_cli, sized_corpus

SEQ, GLOBAL, STEPS = 16, 4, 10
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


@pytest.fixture(scope="module")
def odd_data(tmp_path_factory) -> tuple[Path, int]:
    """(memmap dir, samples) of data whose epoch is 3 global batches of GLOBAL plus an odd remainder (13 or 15
    samples), so splits with accumulation 2 or 4 reach an epoch end in the middle of a step."""
    _, _, out, samples = sized_corpus(tmp_path_factory.mktemp("odd-epochs"), "a step of several micro batches never "
                                      "takes samples from two epochs at once", SEQ, 1, lambda n: n in (13, 15))
    return out["memmap"], samples


def overrides(data: Path, runs: Path, run_id: str, micro: int, accum: int, **extra) -> list[str]:
    o = {"run.dir": runs, "run.id": run_id, "model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 2,
         "model.num_kv_heads": 1, "data.path": data, "data.seq_len": SEQ, "data.micro_batch": micro,
         "train.grad_accum": accum, "train.steps": STEPS, "train.warmup_steps": 2, "train.precision": "fp32",
         "log.tensorboard": False, "checkpoint.every": 0, "checkpoint.export": False, "eval.path": data,
         "eval.every": 5, "eval.batches": 2, **extra}
    return [f"{k}={v}" for k, v in o.items()]


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


# (micro-batch, ranks, accumulation) of a global batch of GLOBAL
SPLITS = [(4, 1, 1), (2, 1, 2), (1, 1, 4), (1, 2, 2)]


def test_every_split_of_the_global_batch_trains_alike_across_epoch_ends(odd_data, tmp_path, capsys):
    data, samples = odd_data
    got = {}
    for micro, world, accum in SPLITS:
        name = f"m{micro}w{world}a{accum}"
        args = overrides(data, tmp_path, name, micro, accum)
        if world == 1:
            capsys.readouterr()
            assert cli_main(["train", *args]) == 0, capsys.readouterr().err
        else:
            run_cli(args, nproc=world)
        got[name] = records(tmp_path / name, "train"), records(tmp_path / name, "val")
    (ref_train, ref_val), *_ = got.values()
    assert STEPS * GLOBAL > 2 * samples        # the runs cross two epoch ends
    for name, (train, val) in got.items():
        assert [r["step"] for r in train] == list(range(1, STEPS + 1)), name
        assert [r["effective_tokens"] for r in train] == [r["effective_tokens"] for r in ref_train], name
        assert [r["loss"] for r in train] == pytest.approx([r["loss"] for r in ref_train], rel=1e-5), name
        assert [r["val_tokens"] for r in val] == [r["val_tokens"] for r in ref_val], name
        assert [r["val_loss"] for r in val] == pytest.approx([r["val_loss"] for r in ref_val], rel=1e-5), name


def test_an_epoch_short_of_one_global_batch_is_one_line(odd_data, tmp_path, capsys):
    """Micro-batches of 2, accumulated 8 times: one step needs 16 samples, the data has fewer; before, every step
    took micro-batches of two epochs."""
    data, _ = odd_data
    capsys.readouterr()
    assert cli_main(["train", *overrides(data, tmp_path, "small", 2, 8)]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "fewer samples than one global batch (16" in lines[0] and str(data) in lines[0], err
    assert "Traceback" not in err
