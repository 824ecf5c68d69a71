"""The SLURM launcher of `pretok sweep`: one `slurm/train.sbatch` job per grid point (docs/SLURM.md).

- `slurm_layout(world, gpus_per_node)`: nodes, processes per node and GPUs of one point's job.
- `point_job(point, config, runs, settings, ...)`: the job of one point, as train.sbatch arguments and sbatch
  options (GPUs asked for as PRETOK_GPU_REQUEST says: `--gpus-per-node=N` or `--gres=gpu:N`).
- `dry_run(points, config, runs, ...)`: each point's full sbatch line; nothing submitted (no SLURM needed).
- `run_slurm(...)`: submit the points' jobs, record them in launcher.json, wait for them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PretokError
from . import slurm
from .sweep import SBATCH_SCRIPT, Point, _attempts, _now, _outcome, _record, command


def slurm_layout(world: int, gpus_per_node: int) -> dict[str, int]:
    """sbatch options of one point: all processes on one node, or whole GPU nodes when `world` exceeds them."""
    if gpus_per_node <= 0 or world <= gpus_per_node:
        return {"nodes": 1, "ntasks_per_node": world, **({"gpus_per_node": world} if gpus_per_node > 0 else {})}
    if world % gpus_per_node:
        raise PretokError(f"sweep: world size {world} is not a multiple of {gpus_per_node} GPUs per node")
    return {"nodes": world // gpus_per_node, "ntasks_per_node": gpus_per_node, "gpus_per_node": gpus_per_node}


def point_job(point: Point, config: str | os.PathLike, runs: Path, settings: Mapping[str, str],
              options: Mapping[str, Any] | None = None) -> tuple[list[str], dict[str, Any]]:
    """(train.sbatch arguments, sbatch options) of one point's job; `settings`: slurm.cluster_settings();
    `options`: the caller's sbatch options, last (they win)."""
    layout: dict[str, Any] = dict(slurm_layout(point.world, int(settings.get("PRETOK_GPUS_PER_NODE") or 0)))
    gpus = layout.pop("gpus_per_node", 0)
    opts = {**layout, **slurm.gpu_options(gpus, settings.get("PRETOK_GPU_REQUEST") or "gpus-per-node"),
            "job_name": point.run_id, "output": runs / point.run_id / "launcher.log", "open_mode": "append",
            **(options or {})}
    return command(point, config, "slurm", runs), opts


def dry_run(points: Sequence[Point], config: str | os.PathLike, runs: str | os.PathLike,
            script: str | os.PathLike = SBATCH_SCRIPT, options: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> list[str]:
    """Each point's full sbatch command line (with slurm/submit.sh's comments on the job's environment and launch
    prefix), as `run_slurm` would submit it; nothing is submitted and no SLURM tool is needed."""
    settings = slurm.cluster_settings(env)
    runs = Path(runs).resolve()
    out = []
    for p in points:
        args, opts = point_job(p, config, runs, settings, options)
        out.append(slurm.submit(script, args, env=env, dry_run=True, **opts))
    return out


def run_slurm(config: Path, todo: list[Point], runs: Path, script: str | os.PathLike, options: dict, env: dict,
              status: dict[str, str], say: Callable[[str], None]) -> None:
    """One `slurm/train.sbatch` job per point (through slurm.submit; output appended to launcher.log), then wait
    for all of them; a point completed when its run.json says so.

    Args:
        config, todo, runs: as run_sweep; script, options: the sbatch script and flags; env: the jobs' environment.
        status: filled with run id -> outcome; say: progress lines.
    """
    settings = slurm.cluster_settings(env)
    jobs: dict[str, tuple[Point, str, list[str]]] = {}
    for p in todo:
        rdir = runs / p.run_id
        rdir.mkdir(parents=True, exist_ok=True)
        last = (_attempts(rdir) or [{}])[-1]
        if last.get("status") == "submitted" and last.get("job_id"):   # an earlier sweep's job, maybe still alive
            state = slurm.job_state(last["job_id"], env)
            if state not in slurm.FINAL and state not in (slurm.NEVER, slurm.GONE):
                jobs[last["job_id"]] = (p, last.get("started") or _now(), last.get("command") or [])
                say(f"  {p.run_id}: SLURM job {last['job_id']} of an earlier sweep is {state}: waiting for it")
                continue
        args, opts = point_job(p, config, runs, settings, options)
        with open(rdir / "launcher.log", "ab") as fh:
            fh.write(f"\n=== {_now()} pretok sweep: sbatch {script} {' '.join(args)}\n".encode())
        job = slurm.submit(script, args, env=env, **opts)
        jobs[job] = (p, _now(), ["sbatch", str(script), *args])
        _record(rdir, p, {"launcher": "slurm", "job_id": job, "command": jobs[job][2], "started": jobs[job][1],
                          "status": "submitted"})   # before waiting: a stopped sweep's rerun finds its job
        say(f"  submitted {p.run_id}: SLURM job {job}")
    t0 = time.monotonic()
    states = slurm.wait(list(jobs), env=env)
    for job, (p, started, cmd) in jobs.items():
        rdir = runs / p.run_id
        ok = states[job] == "COMPLETED"
        st, why = _outcome(rdir, 0 if ok else None, None if ok else f"SLURM job {job} {states[job]}")
        _record(rdir, p, {"launcher": "slurm", "job_id": job, "job_state": states[job], "command": cmd,
                          "started": started, "finished": _now(), "seconds": round(time.monotonic() - t0, 2),
                          "returncode": None, "status": st, "reason": why})
        status[p.run_id] = st
        say(f"  {p.run_id} (job {job} {states[job]}): {st}" + (f" ({why})" if why else ""))
