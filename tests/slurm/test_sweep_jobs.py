"""`run_sweep(launcher="slurm")` on a real SLURM (CPU, gloo): one slurm/train.sbatch job per grid point, output
appended to runs/<id>/launcher.log, completed points skipped on the next call (no new job)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretok_lib.launch.sweep import expand_grid, run_sweep

from ..conftest import ROOT
from ..launch.test_sweep import tiny_config  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def test_sweep_on_slurm(slurm_cluster, tiny_config: Path, tmp_path: Path) -> None:  # noqa: F811
    runs, lines = tmp_path / "runs", []
    grid = expand_grid({"train.steps": 2}, {"world": [1, 2]}, prefix="slurm")
    res = run_sweep(tiny_config, grid, runs, "slurm", echo=lines.append)
    logs = "\n".join((runs / p.run_id / "launcher.log").read_text() for p, _ in res)
    assert [(p.run_id, s) for p, s in res] == [("slurm-w1", "completed"), ("slurm-w2", "completed")], logs
    for p, _ in res:
        rec = json.loads((runs / p.run_id / "launcher.json").read_text())["attempts"][-1]
        assert rec["launcher"] == "slurm" and rec["job_state"] == "COMPLETED" and rec["job_id"].isdigit()
        assert json.loads((runs / p.run_id / "run.json").read_text())["world_size"] == p.world
        log = (runs / p.run_id / "launcher.log").read_text()
        assert log.startswith("\n=== ") and "completed" in log  # the sweep's header, then the job's own output
    assert sum("submitted" in line for line in lines) == 2
    lines.clear()
    assert [s for _, s in run_sweep(tiny_config, grid, runs, "slurm", echo=lines.append)] == ["skipped", "skipped"]
    assert not any("submitted" in line for line in lines)


def test_a_stopped_slurm_sweep_leaves_its_job_recorded_and_the_rerun_waits_for_it(
        slurm_cluster, tiny_config: Path, tmp_path: Path) -> None:  # noqa: F811
    """A sweep stopped while its jobs ran recorded nothing; its rerun submitted each point again, so two jobs
    trained into one run directory. Now the job id is in launcher.json at submission; the stopped sweep says its
    jobs keep running (exit 3), and the rerun waits for the same job: one job, one attempt, completed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "pretok_lib.cli", "sweep", "--config", str(tiny_config), "--runs-dir", str(runs),
           "--launcher", "slurm", "--axis", "world=1", "--set", "train.steps=3", "--prefix", "stop"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    record = runs / "stop-w1" / "launcher.json"
    deadline = time.monotonic() + 60
    while not record.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 3 and "keep running" in err, (first.returncode, out, err)
    job = json.loads(record.read_text())["attempts"][-1]
    assert job["status"] == "submitted" and job["job_id"].isdigit()
    # The job is held where it is (suspended) while the rerun looks at it, so that the rerun finds it alive however
    # long the rerun's start-up takes on a loaded machine (it once found the job completed and skipped the point);
    # resumed once the rerun says it waits for it.
    suspended = subprocess.run(["scontrol", "suspend", job["job_id"]], env=env, capture_output=True).returncode == 0
    second = subprocess.Popen(cmd, cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in second.stdout if suspended else ():
            seen.append(line)
            if "of an earlier sweep" in line:
                break
    finally:
        if suspended:
            subprocess.run(["scontrol", "resume", job["job_id"]], env=env, capture_output=True)
    out, err = second.communicate(timeout=240)
    out = "".join(seen) + out
    assert second.returncode == 0, err
    assert "submitted" not in out, out
    if suspended:   # else the job had ended before it could be held: the rerun found it completed, ran nothing
        assert f"SLURM job {job['job_id']} of an earlier sweep" in out, out
    attempts = json.loads(record.read_text())["attempts"]
    assert [(a["job_id"], a["status"]) for a in attempts] == [(job["job_id"], "completed")]
