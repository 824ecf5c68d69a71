"""pretok_lib.launch.slurm and slurm/submit.sh without a cluster: fake sbatch/scontrol on PATH record what they get.

Option translation from slurm/cluster.env (defaults, env overrides, per-script options, caller options last),
job ids, and the one-line errors: sbatch missing, sbatch refusing, scontrol missing, timeouts."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from pretok_lib.launch import slurm
from pretok_lib.errors import PretokError

from .helpers import SLURM


def fake_bin(tmp_path: Path, name: str, body: str) -> dict[str, str]:
    """An env whose PATH starts with a dir holding executable `name` (a bash script)."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    (d / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
    (d / name).chmod(0o755)
    return {"PATH": f"{d}:{os.environ['PATH']}"}


def recording_sbatch(tmp_path: Path, reply: str = "4242") -> tuple[dict[str, str], Path]:
    rec = tmp_path / "sbatch-args"
    env = fake_bin(tmp_path, "sbatch", f'printf "%s\\n" "$@" > {shlex.quote(str(rec))}; echo "{reply}"')
    return env, rec


def clean_env(**extra: str) -> dict[str, str]:
    """Every cluster setting at its cluster.env default (empty counts as unset there), plus `extra`: a
    developer's own PRETOK_* exports must not leak into these tests."""
    return {**{k: "" for k in slurm.cluster_settings({})}, **extra}


def test_cluster_settings_defaults_and_overrides(monkeypatch):
    monkeypatch.delenv("PRETOK_TIME", raising=False)
    s = slurm.cluster_settings()
    assert s["PRETOK_TIME"] == "01:00:00" and s["PRETOK_LAUNCH_BACKEND"] == "torchrun"
    assert {"PRETOK_ACCOUNT", "PRETOK_PARTITION", "PRETOK_GPUS_PER_NODE", "PRETOK_CPUS_PER_TASK", "PRETOK_NODES",
            "PRETOK_SETUP", "PRETOK_PYTHON"} <= set(s)
    assert slurm.cluster_settings({"PRETOK_TIME": "00:05:00", "PRETOK_ACCOUNT": "abc"})["PRETOK_ACCOUNT"] == "abc"


def test_sbatch_options_by_name():
    assert slurm.sbatch_options({"job_name": "x", "ntasks_per_node": 2, "requeue": True, "gpus_per_node": None,
                                 "exclusive": False, "output": Path("/a/b.log")}) == \
        ["--job-name=x", "--ntasks-per-node=2", "--requeue", "--output=/a/b.log"]


def test_submit_passes_cluster_settings_then_caller_options(tmp_path):
    env, rec = recording_sbatch(tmp_path, reply="77;othercluster")
    env |= clean_env(PRETOK_ACCOUNT="acc1", PRETOK_PARTITION="normal", PRETOK_TIME="00:30:00",
                     PRETOK_SBATCH_EXTRA="--exclusive --reservation=r1")
    job = slurm.submit(SLURM / "notebook.sbatch", ["nb.ipynb", "out"], dependency=["5", "6"], array="0-3",
                       time="00:10:00", env=env, cwd=tmp_path)
    assert job == "77"
    args = rec.read_text().splitlines()
    script = args.index(str(SLURM / "notebook.sbatch"))
    opts, rest = args[:script], args[script + 1:]
    assert rest == ["nb.ipynb", "out"]
    assert opts[:6] == ["--parsable", "--account=acc1", "--partition=normal", "--time=00:30:00", "--exclusive",
                        "--reservation=r1"]
    assert opts[6:] == ["--time=00:10:00", "--dependency=afterok:5:6", "--array=0-3"]  # last wins in sbatch
    assert not any(o.startswith(("--nodes", "--ntasks-per-node", "--qos", "--mem")) for o in opts)


def test_submit_train_gets_nodes_and_processes(tmp_path):
    env, rec = recording_sbatch(tmp_path)
    slurm.submit(SLURM / "train.sbatch", ["--config", "c.yaml"], env=env | clean_env(), cwd=tmp_path)
    assert {"--nodes=1", "--ntasks-per-node=1"} <= set(rec.read_text().splitlines())
    gpu = clean_env(PRETOK_NODES="4", PRETOK_GPUS_PER_NODE="4", PRETOK_CPUS_PER_TASK="8")
    slurm.submit(SLURM / "train.sbatch", ["--config", "c.yaml"], dependency="afterany:9", env=env | gpu, cwd=tmp_path)
    got = rec.read_text().splitlines()
    assert {"--nodes=4", "--ntasks-per-node=4", "--gpus-per-node=4", "--cpus-per-task=8",
            "--dependency=afterany:9"} <= set(got)


def test_submit_errors_are_one_line(tmp_path):
    with pytest.raises(PretokError, match="sbatch not found on PATH"):
        slurm.submit(SLURM / "train.sbatch", env={"PATH": str(tmp_path)})
    env, _ = recording_sbatch(tmp_path)
    with pytest.raises(PretokError, match="no such sbatch script"):
        slurm.submit(tmp_path / "missing.sbatch", env=env)
    env = fake_bin(tmp_path, "sbatch", 'echo "sbatch: error: Batch job submission failed: Invalid account" >&2\n'
                                       'echo "second line" >&2; exit 1')
    with pytest.raises(PretokError) as e:
        slurm.submit(SLURM / "train.sbatch", ["--config", "x"], env=env | clean_env())
    assert "sbatch failed: sbatch: error: Batch job submission failed: Invalid account second line" in str(e.value)
    assert "\n" not in str(e.value)
    env = fake_bin(tmp_path, "sbatch", 'echo "not a job id"')
    with pytest.raises(PretokError, match="sbatch failed"):
        slurm.submit(SLURM / "train.sbatch", env=env | clean_env())


def test_wait_and_states_from_scontrol(tmp_path):
    env = fake_bin(tmp_path, "scontrol", """
case $4 in
  1) echo "JobId=1 JobName=a JobState=COMPLETED Reason=None ExitCode=0:0" ;;
  2) echo "JobId=2 ArrayJobId=2 ArrayTaskId=0 JobState=COMPLETED Reason=None"
     echo "JobId=3 ArrayJobId=2 ArrayTaskId=1 JobState=FAILED Reason=NonZeroExitCode" ;;
  4) echo "JobId=4 JobState=PENDING Reason=DependencyNeverSatisfied Dependency=afterok:2_*(failed)" ;;
  5) echo "JobId=5 JobState=RUNNING Reason=None" ;;
  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
esac""")
    assert slurm.wait(["1", "2", "4", "9"], timeout=120, env=env) == \
        {"1": "COMPLETED", "2": "FAILED", "4": slurm.NEVER, "9": slurm.GONE}
    assert slurm.job_records("2", env=env)[1]["ArrayTaskId"] == "1"
    with pytest.raises(PretokError, match=r"timed out after 0.5 s waiting for SLURM jobs: 5=RUNNING"):
        slurm.wait("5", timeout=0.5, poll=0.1, max_poll=0.1, env=env)
    with pytest.raises(PretokError, match="scontrol not found"):
        slurm.wait("1", timeout=1, env={"PATH": str(tmp_path / "nothing")})
