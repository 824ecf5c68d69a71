"""Checkpoint and resume: a killed run resumed equals an uninterrupted one bit for bit (CPU); signals checkpoint
and exit; resuming on another world size continues the global data order."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pretok_lib.train.metrics import read_records

from ..conftest import ROOT
from .conftest import records, run_cli, run_here, tiny_overrides

STEPS = 30  # the kill test, fp32: the resume's bit-exactness does not depend on the precision
BF16_STEPS = 8  # the signal test also checks bf16 autocast; bf16 is emulated on CPUs without AVX-512 BF16 (~2.5 s/step)


def _popen(overrides: list[str]) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-m", "pretok_lib.train", *overrides], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_step(run_dir, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    path, end = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while time.monotonic() < end:
        done = read_records(path)   # the run is writing: its last line may be half-written
        if done and done[-1]["step"] >= step:
            return
        assert proc.poll() is None, f"run ended early: {proc.stderr.read()[-2000:]}"
        time.sleep(0.005)
    raise AssertionError(f"step {step} not reached")


def _start_copy(reference, tmp_path, run_id: str, step: int) -> tuple[subprocess.Popen, list[str], object]:
    """The reference run's command under another run id, started and let run to `step`."""
    base, _ = reference
    o = [x for x in base if not x.startswith("run.dir")] + [f"run.dir={tmp_path}", f"run.id={run_id}"]
    proc = _popen(o)
    _wait_for_step(tmp_path / run_id, step, proc)
    return proc, o, tmp_path / run_id


def _losses(run_dir) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in records(run_dir)]


def _reference(train_data, tmp_path_factory, steps: int, every: int, precision: str):
    runs = tmp_path_factory.mktemp("ref")
    o = tiny_overrides(train_data, runs, "pretok-memmap", **{"train.steps": steps, "checkpoint.every": every,
                                                               "train.precision": precision, "run.id": "ref"})
    run_here(o)   # in this process: a run's losses do not depend on it (test_faults_train compares both ways)
    return o, runs / "ref"


@pytest.fixture(scope="module")
def uninterrupted(train_data, tmp_path_factory):
    return _reference(train_data, tmp_path_factory, STEPS, 5, "fp32")


@pytest.fixture(scope="module")
def uninterrupted_bf16(train_data, tmp_path_factory):
    return _reference(train_data, tmp_path_factory, BF16_STEPS, 2, "bf16")


def test_killed_run_resumes_bit_exact(uninterrupted, tmp_path):
    ref = uninterrupted[1]
    proc, o, run = _start_copy(uninterrupted, tmp_path, "killed", 13)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads((run / "run.json").read_text())["status"] == "running"      # died without a word
    done = [r["step"] for r in records(run)]
    assert done[-1] >= 13 and done[-1] < STEPS
    p = run_cli(o)
    assert "resumed from" in p.stderr and "step_000000" in p.stderr
    assert json.loads((run / "run.json").read_text())["resumed_from_step"] in (10, 15, 20, 25)
    # every step once, and every loss and gradient norm identical to the uninterrupted run
    assert _losses(run) == _losses(ref)
    assert records(run)[-1]["cum_tokens"] == records(ref)[-1]["cum_tokens"]
    assert len(list((run / "checkpoints").iterdir())) == 2                         # keep: 2


def test_sigusr1_checkpoints_and_exits_then_resumes_bit_exact(uninterrupted_bf16, tmp_path):
    """Also the bf16 autocast path: resumed bit-exactly like fp32."""
    ref = uninterrupted_bf16[1]
    proc, o, run = _start_copy(uninterrupted_bf16, tmp_path, "sig", 3)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=120) == 3
    info = json.loads((run / "run.json").read_text())
    last = records(run)[-1]["step"]
    assert info["status"] == "interrupted" and (run / "checkpoints" / f"step_{last:08d}").is_dir()
    assert not (run / "summary.json").exists()
    run_cli(o)
    assert _losses(run) == _losses(ref)
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


def test_resume_on_another_world_size_continues_the_global_order(train_data, tmp_path):
    """2 ranks train 4 steps, then 1 rank resumes to 8 with the same global batch: steps 5-8 see the batches an
    uninterrupted 2-rank run sees (same tokens; losses equal within float tolerance)."""
    base = tiny_overrides(train_data, tmp_path, "pretok-memmap", **{"train.steps": 8, "checkpoint.every": 4})
    run_cli(base + ["run.id=ref", "data.micro_batch=4"], nproc=2)
    # the 2-rank run as if preempted after step 4: its step-4 checkpoint and its log
    elastic = tmp_path / "elastic"
    (elastic / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step_00000004", elastic / "checkpoints" / "step_00000004")
    shutil.copy(tmp_path / "ref" / "metrics.jsonl", elastic / "metrics.jsonl")
    p = run_cli(base + ["run.id=elastic", "data.micro_batch=8"])
    assert "resumed from" in p.stderr
    assert json.loads((elastic / "run.json").read_text())["world_size"] == 1
    ref, el = records(tmp_path / "ref"), records(tmp_path / "elastic")
    assert [r["step"] for r in el] == list(range(1, 9))
    assert [r["effective_tokens"] for r in el] == [r["effective_tokens"] for r in ref]
    assert [r["samples"] for r in el] == [r["samples"] for r in ref]
    assert [r["loss"] for r in el[4:]] == pytest.approx([r["loss"] for r in ref[4:]], rel=1e-4)
