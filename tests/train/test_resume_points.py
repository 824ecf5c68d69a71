"""A run resumes from any of its checkpoints, those taken on the last step of an epoch included, and equals the
uninterrupted run bit for bit; what a run records lets the next attempt check it is the same run (run.json's global
batch and working directory). In this process, on data whose epochs are three steps long."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pretok_lib.cli import main as cli_main
from pretok_lib.train import checkpoint

from .conftest import sized_corpus

SEQ, MICRO, EPOCH_STEPS, STEPS = 16, 2, 3, 8


@pytest.fixture(scope="module")
def short_epochs(tmp_path_factory) -> dict[str, list[str]]:
    """Overrides of each data kind (memmap, token-list, padding-free on the fly) on documents that make epochs of
    EPOCH_STEPS global batches of SEQ-token windows (plus a remainder under one batch)."""
    src, tok, out, _ = sized_corpus(tmp_path_factory.mktemp("short-epochs"), "data loaders resume from the position "
                                    "they saved at the end of every epoch", SEQ, MICRO,
                                    lambda n: n // MICRO == EPOCH_STEPS, ("memmap", "token-list"), lengths=range(2, 60))
    return {"pretok-memmap": [f"data.path={out['memmap']}"],
            "pretok-token-list": ["data.kind=pretok-token-list", f"data.path={out['token-list']}"],
            "padding-free": ["data.kind=padding-free", f"data.path={src}", f"data.tokenizer={tok}"]}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


def overrides(data: list[str], runs: Path, **extra) -> list[str]:
    o = {"run.dir": runs, "run.id": "run", "model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 2,
         "model.num_kv_heads": 1, "data.seq_len": SEQ, "data.micro_batch": MICRO,
         "train.steps": STEPS, "train.warmup_steps": 2, "train.precision": "fp32", "log.tensorboard": False,
         "checkpoint.every": 1, "checkpoint.keep": STEPS, "checkpoint.export": False, **extra}
    return [*data, *(f"{k}={v}" for k, v in o.items())]


def epoch_of(ckpt: Path) -> int:
    return torch.load(ckpt / "state.pt", weights_only=False)["loader"]["position"]["epoch"]


def train(args: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli_main(["train", *map(str, args)])
    return rc, capsys.readouterr().err


def curve(run: Path) -> list[tuple]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"], r["grad_norm"], r["cum_tokens"]) for r in map(json.loads, lines)
            if r["kind"] == "train"]


def interrupted_after(reference: Path, dst: Path, step: int) -> None:
    """The state a kill right after checkpoint `step` leaves: later checkpoints never written, no summary,
    run.json `running` (its metrics may hold a step beyond, as after a kill mid-step)."""
    shutil.copytree(reference, dst)
    for p in checkpoint.list_checkpoints(dst / "checkpoints"):
        if int(p.name.split("_")[1]) > step:
            shutil.rmtree(p)
    (dst / "summary.json").unlink()
    record = json.loads((dst / "run.json").read_text())
    (dst / "run.json").write_text(json.dumps({**record, "status": "running"}))


@pytest.mark.parametrize("kind", ["pretok-memmap", "pretok-token-list", "padding-free"])
def test_resume_from_every_checkpoint_epoch_ends_included_is_bit_exact(short_epochs, tmp_path, capsys, kind):
    """A checkpoint on an epoch's last step holds the position (epoch e, all of it consumed): its resume began with
    an empty pass, taken for "fewer samples than one global batch" (exit 2, the run never resumable). Every step
    for memmap; for the other kinds the first and each epoch's last."""
    data = short_epochs[kind]
    ref_runs = tmp_path / "ref"
    rc, err = train(overrides(data, ref_runs), capsys)
    assert rc == 0, err
    reference = curve(ref_runs / "run")
    assert [s for s, *_ in reference] == list(range(1, STEPS + 1))
    ckpts = checkpoint.list_checkpoints(ref_runs / "run" / "checkpoints")
    epoch_ends = [k for k in range(1, STEPS) if epoch_of(ckpts[k]) > epoch_of(ckpts[k - 1])]
    assert len(epoch_ends) >= 2, epoch_ends
    for k in range(1, STEPS) if kind == "pretok-memmap" else [1, *epoch_ends]:
        runs = tmp_path / f"resume-{k}"
        interrupted_after(ref_runs / "run", runs / "run", k)
        rc, err = train(overrides(data, runs), capsys)
        assert rc == 0, (k, err)
        assert f"step_{k:08d}" in err and curve(runs / "run") == reference, k


def test_the_run_records_its_global_batch_and_another_one_is_refused(short_epochs, tmp_path, capsys):
    """run.json had no global batch, so the documented check (the product must stay) never ran: a resume with
    another micro-batch mixed two global batches in one run, and a completed run was reported as the new one."""
    runs = tmp_path / "runs"
    data = short_epochs["pretok-memmap"]
    rc, err = train(overrides(data, runs, **{"train.steps": 2}), capsys)
    assert rc == 0, err
    record = json.loads((runs / "run" / "run.json").read_text())
    assert record["global_batch"] == MICRO and record["cwd"]
    rc, err = train(overrides(data, runs, **{"train.steps": 2, "data.micro_batch": 1}), capsys)
    assert rc == 2 and "global batch" in err and "2 -> 1" in err, err
    rc, err = train(overrides(data, runs, **{"train.steps": 2}), capsys)
    assert rc == 0 and "already completed" in err, err


def test_a_second_trainer_into_a_busy_run_directory_is_refused(short_epochs, tmp_path, capsys):
    """Two trainers wrote one run directory (a sweep's SLURM job still queued when a rerun submitted another): the
    run directory's lock, held by rank 0 for the whole run, refuses the second with one line, exit 2."""
    from pretok_lib.train.run import _run_dir_lock

    runs = tmp_path / "runs"
    with _run_dir_lock(runs / "run"):
        rc, err = train(overrides(short_epochs["pretok-memmap"], runs, **{"train.steps": 2}), capsys)
    assert rc == 2 and "one trainer at a time" in err and err.count("\n") == 1, err
    assert not (runs / "run" / "run.json").exists()
    assert [p.name for p in runs.iterdir()] == ["run"]  # nothing beside run directories (readers list them)
    rc, err = train(overrides(short_epochs["pretok-memmap"], runs, **{"train.steps": 2}), capsys)
    assert rc == 0, err


def test_a_run_ended_by_its_time_budget_and_killed_before_its_end_was_recorded_resumes_to_that_end(
        short_epochs, tmp_path, capsys):
    """The step that passes train.time_budget_s is checkpointed, then the summary and the export are written: a kill
    in between (a time limit, preemption) left run.json `running`, and the rerun resumed from that checkpoint and
    trained one step more than the run had (its wall time was past the budget, so it stopped after the next step).
    The checkpoint says the run ended there: the rerun completes it with the same steps."""
    data = short_epochs["pretok-memmap"]
    budget = ["train.time_budget_s=1e-6", "log.skip_steps=2", "train.steps=50"]
    ref_runs = tmp_path / "ref"
    rc, err = train(overrides(data, ref_runs) + budget, capsys)
    assert rc == 0, err
    reference = curve(ref_runs / "run")
    assert [s for s, *_ in reference] == [1, 2, 3, 4]
    runs = tmp_path / "killed"
    interrupted_after(ref_runs / "run", runs / "run", 4)
    rc, err = train(overrides(data, runs) + budget, capsys)
    assert rc == 0 and "step_00000004" in err, err
    assert curve(runs / "run") == reference
    assert json.loads((runs / "run" / "summary.json").read_text())["steps"] == 4
    assert json.loads((runs / "run" / "run.json").read_text())["status"] == "completed"


def test_starting_over_with_resume_off_drops_the_older_checkpoints_at_once(short_epochs, tmp_path, capsys,
                                                                          monkeypatch):
    """checkpoint.resume=false starts the run over, but the older attempt's checkpoints stayed until the new run's
    first save: a crash before it, then the same command with resume on, resumed the old run's step 6 after the new
    run's steps 1-2 (metrics.jsonl steps 1, 2, 7, 8: two runs mixed, completed). Now they go at the start, and the
    rerun trains from step 1 like the uninterrupted run."""
    from pretok_lib.train import loop

    data = short_epochs["pretok-memmap"]
    ref_runs = tmp_path / "ref"
    assert train(overrides(data, ref_runs), capsys)[0] == 0
    reference = curve(ref_runs / "run")
    runs = tmp_path / "again"
    interrupted_after(ref_runs / "run", runs / "run", 6)
    real = loop.Trainer.step

    def crash_after_two(self, batches):
        if self.progress.step == 2:
            raise RuntimeError("injected crash")
        return real(self, batches)

    monkeypatch.setattr(loop.Trainer, "step", crash_after_two)
    with pytest.raises(RuntimeError, match="injected crash"):
        train(overrides(data, runs, **{"checkpoint.resume": "false", "checkpoint.every": 4}), capsys)
    assert not checkpoint.list_checkpoints(runs / "run" / "checkpoints")
    monkeypatch.setattr(loop.Trainer, "step", real)
    rc, err = train(overrides(data, runs), capsys)
    assert rc == 0 and "resumed from" not in err, err
    assert curve(runs / "run") == reference
