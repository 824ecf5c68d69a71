"""Helpers for the SLURM job tests: run the slurm/ scripts, wait for jobs, show their logs when they fail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pretok_lib.launch import slurm

from ..conftest import ROOT

SLURM = ROOT / "slurm"


def job_logs(cwd: Path) -> str:
    """Every job log (slurm-*.out) in `cwd`, for failure messages."""
    return "\n".join(f"----- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                     for p in sorted(cwd.glob("slurm-*.out")))


def wait_ok(job_ids: list[str], cwd: Path, timeout: float = 180) -> dict[str, str]:
    """Wait for the jobs; fail with their logs unless every one COMPLETED."""
    states = slurm.wait(job_ids, timeout=timeout)
    assert set(states.values()) == {"COMPLETED"}, f"{states}\n{job_logs(cwd)}"
    return states


def run_script(*args: str | os.PathLike, cwd: Path, env: dict | None = None) -> str:
    """Run a slurm/*.sh wrapper (it submits jobs); returns its stdout (job ids)."""
    r = subprocess.run(["bash", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, timeout=120,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout.strip()


def scontrol_job(job_id: str) -> list[dict[str, str]]:
    """`scontrol show job` records of a job (one per array task)."""
    return slurm.job_records(job_id) or []
