"""slurm/train.sbatch on a real SLURM (CPU, gloo): a 2-process DDP job writes a completed run; a job sent USR1
(what `--signal=B:USR1@120` does before the time limit) checkpoints, requeues itself and resumes to the end
with every step logged exactly once."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.launch import slurm
from pretok_lib.demo.corpus import train_default_tokenizer
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.train.metrics import read_records

from ..conftest import PYDOCS_JSONL
from .helpers import SLURM, job_logs, scontrol_job, wait_ok

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
# The stopped runs: a stop signal is sent after step 5 and handled within ~10 steps (~0.3 s here); what is left
# (~190 steps, ~5 s) runs after the resume.
STEPS_STOPPED = 200


@pytest.fixture(scope="module")
def train_config(tmp_path_factory, shared_data) -> Path:
    """A tiny CPU run: 60 python-docs documents, a 512-token BPE trained on them, a 2-layer model."""
    d = tmp_path_factory.mktemp("train-jobs")
    docs = [json.loads(line)["text"] for _, line in zip(range(60), PYDOCS_JSONL.open())]
    pq.write_table(pa.table({"text": docs}), d / "docs.parquet")
    tok = train_default_tokenizer(d / "docs.parquet", d / "tok", vocab_size=512)
    run_tokenize(TokenizeConfig(inputs=[str(d / "docs.parquet")], out=str(d / "memmap"), tokenizer=str(tok),
                                format="memmap", workers=0, progress=False))
    cfg = d / "tiny-test.yaml"
    cfg.write_text(f"""\
run: {{dir: {d / 'runs'}, seed: 0}}
model: {{hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2}}
data: {{kind: pretok-memmap, path: {d / 'memmap'}, seq_len: 64, micro_batch: 2}}
train: {{steps: 20, lr: 1.0e-3, warmup_steps: 2, precision: fp32}}
log: {{tensorboard: false}}
checkpoint: {{every: 10, keep: 2}}
""")
    return cfg


def train_steps(run_dir: Path) -> list[int]:
    """Steps logged so far; polled while the job writes, so a half-written last line is left out."""
    return [r["step"] for r in read_records(run_dir / "metrics.jsonl", "train")]


def test_ddp_job_completes(slurm_cluster, train_config, tmp_path):
    job = slurm.submit(SLURM / "train.sbatch", ["--config", str(train_config), "run.id=ddp"], ntasks_per_node=2,
                       cwd=tmp_path)
    wait_ok([job], tmp_path)
    run = train_config.parent / "runs" / "ddp"
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "completed", job_logs(tmp_path)
    assert (status["world_size"], status["backend"]) == (2, "gloo")
    assert status["slurm"]["SLURM_JOB_ID"] == job
    assert train_steps(run) == list(range(1, 21))
    assert json.loads((run / "summary.json").read_text())["steps"] == 20


def test_usr1_checkpoints_requeues_and_resumes(slurm_cluster, train_config, tmp_path):
    steps = STEPS_STOPPED
    args = ["--config", str(train_config), "run.id=requeue", f"train.steps={steps}", "checkpoint.every=1000"]
    job = slurm.submit(SLURM / "train.sbatch", args, ntasks_per_node=2, cwd=tmp_path)
    run = train_config.parent / "runs" / "requeue"
    deadline = time.monotonic() + 120
    while not ((run / "metrics.jsonl").exists() and len(train_steps(run)) >= 5):
        assert time.monotonic() < deadline and slurm.job_state(job) in ("PENDING", "RUNNING"), job_logs(tmp_path)
        time.sleep(0.2)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    wait_ok([job], tmp_path, timeout=240)

    log = (tmp_path / f"slurm-pretok-train-{job}.out").read_text()
    assert "got SIGUSR1" in log and f"requeueing job {job}" in log and "resumed from" in log, log
    resumed_at = int(log.split("resumed from")[1].split("(step ")[1].split(")")[0])
    assert 5 <= resumed_at < steps, log
    assert train_steps(run) == list(range(1, steps + 1)), log  # nothing lost, nothing logged twice
    assert scontrol_job(job)[0]["Restarts"] == "1"
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "completed" and status["slurm"]["SLURM_RESTART_COUNT"] == "1"


def test_srun_backend_scancel_then_resubmit_resumes(slurm_cluster, train_config, tmp_path):
    """PRETOK_LAUNCH_BACKEND=srun (one srun task per rank); a plain scancel (SIGTERM) checkpoints and ends the
    job; submitting the same run.id again resumes from that checkpoint."""
    steps = STEPS_STOPPED
    args = ["--config", str(train_config), "run.id=scancel", f"train.steps={steps}", "checkpoint.every=1000"]
    env = {"PRETOK_LAUNCH_BACKEND": "srun"}
    first = slurm.submit(SLURM / "train.sbatch", args, ntasks_per_node=2, env=env, cwd=tmp_path)
    run = train_config.parent / "runs" / "scancel"
    deadline = time.monotonic() + 120
    while not ((run / "metrics.jsonl").exists() and len(train_steps(run)) >= 5):
        assert time.monotonic() < deadline and slurm.job_state(first) in ("PENDING", "RUNNING"), job_logs(tmp_path)
        time.sleep(0.2)
    subprocess.run(["scancel", first], check=True)
    assert slurm.wait([first], timeout=300)[first] == "CANCELLED"
    stopped = train_steps(run)
    assert stopped == list(range(1, len(stopped) + 1)) and len(stopped) < steps
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted", job_logs(tmp_path)

    second = slurm.submit(SLURM / "train.sbatch", args, ntasks_per_node=2, env=env, cwd=tmp_path)
    wait_ok([second], tmp_path)
    log = (tmp_path / f"slurm-pretok-train-{second}.out").read_text()
    assert f"resumed from {run / 'checkpoints' / f'step_{len(stopped):08d}'}" in log, log
    assert train_steps(run) == list(range(1, steps + 1))
    status = json.loads((run / "run.json").read_text())
    assert (status["status"], status["world_size"], status["backend"]) == ("completed", 2, "gloo")
