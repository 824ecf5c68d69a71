"""Submit slurm/*.sbatch jobs and wait for them from Python (used by sweeps and the tests).

- `cluster_settings()`: the PRETOK_* settings of slurm/cluster.env after environment overrides.
- `submit(script, args, dependency=..., array=..., dry_run=..., **sbatch_options)`: through `slurm/submit.sh`
  (cluster options from cluster.env) → job id (dry run: the sbatch line, nothing submitted).
- `gpu_options(n, request)`: `--gpus-per-node=n` or `--gres=gpu:n` (PRETOK_GPU_REQUEST) as sbatch options.
- `job_records(job_id)`: `scontrol show job` as dicts.
- `wait(job_ids, timeout)`: polls `scontrol show job` (no accounting database needed) until every job ended →
  `{job_id: state}`; `job_state(job_id)` is one poll.

Failures are one-line `PretokError`s (sbatch missing, submission refused, timeout).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import PretokError

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = ROOT / "slurm"
CLUSTER_ENV = SLURM_DIR / "cluster.env"

#: States after which a job will not run again by itself (a requeued job passes through PENDING instead).
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
#: Reported for a pending job whose dependency can never be met (e.g. it was `afterok` on a failed job).
NEVER = "DEPENDENCY_NEVER_SATISFIED"
#: Reported for a job `scontrol` no longer knows (ended longer than MinJobAge ago, state unknown).
GONE = "UNKNOWN"


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(env or {})}


def _need(binary: str, env: Mapping[str, str]) -> str:
    path = shutil.which(binary, path=env.get("PATH"))
    if path is None:
        raise PretokError(f"{binary} not found on PATH: SLURM client tools are needed (run on a login node)")
    return path


def cluster_settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of slurm/cluster.env (its PRETOK_* names, in file order) as a job would see them: the file's
    defaults overridden by `env` and os.environ."""
    e = _env(env)
    script = f'set -a && source "{CLUSTER_ENV}" && env -0'
    r = subprocess.run(["bash", "-c", script], check=False, capture_output=True, env=e, timeout=30)
    if r.returncode != 0:
        raise PretokError(f"cannot read settings: {r.stderr.decode(errors='replace').strip()}", CLUSTER_ENV)
    values = dict(item.split("=", 1) for item in r.stdout.decode().split("\0") if "=" in item)
    names = re.findall(r"\$\{(PRETOK_\w+):=", CLUSTER_ENV.read_text())
    return {k: values.get(k, "") for k in names}


def sbatch_options(options: Mapping[str, object]) -> list[str]:
    """`{"job_name": "x", "ntasks_per_node": 2, "requeue": True, "gpus_per_node": None}` →
    `["--job-name=x", "--ntasks-per-node=2", "--requeue"]` (None and False are left out)."""
    out = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out.append(flag if value is True else f"{flag}={os.fspath(value) if isinstance(value, os.PathLike) else value}")
    return out


def gpu_options(gpus_per_node: int, request: str = "gpus-per-node") -> dict[str, object]:
    """The sbatch option asking for `gpus_per_node` GPUs per node, in the form PRETOK_GPU_REQUEST names:
    `{"gpus_per_node": 4}` or `{"gres": "gpu:4"}`; {} for none."""
    if gpus_per_node <= 0:
        return {}
    if request == "gres":
        return {"gres": f"gpu:{gpus_per_node}"}
    if request != "gpus-per-node":
        raise PretokError(f"PRETOK_GPU_REQUEST={request}: choose gpus-per-node or gres", CLUSTER_ENV)
    return {"gpus_per_node": gpus_per_node}


def submit(script: str | os.PathLike, args: Sequence[str] = (), *, dependency: str | Iterable[str] | None = None,
           array: str | None = None, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
           dry_run: bool = False, **options: object) -> str:
    """Submit `script args...` through slurm/submit.sh (account, partition, time, ... from cluster.env / env).

    `dependency`: a job id or ids (→ `afterok:a:b`) or a full sbatch spec containing ':' (e.g. `afterany:12`);
    `array`: e.g. `0-7` or `3`; `options`: more sbatch options by name, winning over cluster.env (`nodes=2,
    ntasks_per_node=4, gpus_per_node=4, job_name="x", output=path, time="02:00:00"`; for slurm/train.sbatch
    `ntasks_per_node` is the number of training processes per node); `env`: variables added to this
    process's environment for sbatch (jobs inherit them); `cwd`: the job's working directory (default: the
    current one). Returns the job id; `dry_run`: nothing is submitted (no sbatch needed), returns the sbatch
    command line and slurm/submit.sh's comments on the job's environment and launch prefix.
    """
    e = _env(env)
    if not dry_run:
        _need("sbatch", e)
    script = Path(script)
    if not script.is_file():
        raise PretokError("no such sbatch script", script)
    opts = sbatch_options(options)
    if dependency:
        if isinstance(dependency, str):
            spec = dependency if ":" in dependency else f"afterok:{dependency}"
        else:
            spec = "afterok:" + ":".join(map(str, dependency))
        opts.append(f"--dependency={spec}")
    if array is not None:
        opts.append(f"--array={array}")
    cmd = ["bash", str(SLURM_DIR / "submit.sh"), *(["--dry-run"] if dry_run else []), *opts, str(script.resolve()),
           *map(str, args)]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=e, cwd=cwd, timeout=120)
    if dry_run and r.returncode == 0:
        return r.stdout.rstrip("\n")
    job = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if r.returncode != 0 or not re.fullmatch(r"\d+", job):
        msg = " ".join(r.stderr.split()) or f"exit code {r.returncode}, output {r.stdout.strip()!r}"
        raise PretokError(f"sbatch failed: {msg}", script)
    return job


def job_records(job_id: str, env: Mapping[str, str] | None = None) -> list[dict[str, str]] | None:
    """`scontrol show job -o JOB` as one dict per job (an array: one per task); None if SLURM forgot the job."""
    env = _env(env)
    r = subprocess.run([_need("scontrol", env), "show", "job", "-o", str(job_id)], check=False, capture_output=True,
                       text=True, env=env, timeout=60)
    if r.returncode != 0:
        if "Invalid job id" in r.stderr:
            return None
        raise PretokError(f"scontrol show job {job_id} failed: {' '.join(r.stderr.split())}")
    return [dict(re.findall(r"(\w[\w/:]*)=(\S*)", line)) for line in r.stdout.splitlines() if line.strip()]


def _state(rec: dict[str, str]) -> str:
    state = rec.get("JobState", GONE)
    if state == "PENDING" and rec.get("Reason") == "DependencyNeverSatisfied":
        return NEVER
    return state


def job_state(job_id: str, env: Mapping[str, str] | None = None) -> str:
    """One poll. For an array: COMPLETED when all tasks completed, else the first not-completed task's state
    (a task still pending or running wins over an ended one, so the array counts as ended only when all are)."""
    recs = job_records(job_id, _env(env))
    if recs is None:
        return GONE
    states = [_state(r) for r in recs]
    live = [s for s in states if s not in FINAL and s not in (NEVER, GONE)]
    if live:
        return live[0]
    bad = [s for s in states if s != "COMPLETED"]
    return bad[0] if bad else "COMPLETED"


def wait(job_ids: str | Iterable[str], timeout: float | None = None, poll: float = 0.25, max_poll: float = 5.0,
         env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Wait until every job (or job array) has ended; returns `{job_id: final state}` (`COMPLETED` = success).

    A pending job whose dependency can never be satisfied counts as ended (state `DEPENDENCY_NEVER_SATISFIED`),
    as does a job scontrol has forgotten (`UNKNOWN`). Polls every `poll` s, backing off to `max_poll` (spares
    slurmctld during long waits). Raises PretokError after `timeout` seconds (None: no limit).
    """
    ids = [job_ids] if isinstance(job_ids, str) else [str(j) for j in job_ids]
    e = _env(env)
    deadline = None if timeout is None else time.monotonic() + timeout
    done: dict[str, str] = {}
    while True:
        for j in ids:
            if j not in done:
                s = job_state(j, e)
                if s in FINAL or s in (NEVER, GONE):
                    done[j] = s
        if len(done) == len(ids):
            return {j: done[j] for j in ids}
        if deadline is not None and time.monotonic() > deadline:
            left = ", ".join(f"{j}={job_state(j, e)}" for j in ids if j not in done)
            raise PretokError(f"timed out after {timeout:g} s waiting for SLURM jobs: {left}")
        time.sleep(poll)
        poll = min(max_poll, poll * 1.25)
