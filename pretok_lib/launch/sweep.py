"""Grid sweeps of training runs: one process (or SLURM job) per grid point, readable deterministic run ids, resumable.

    grid = expand_grid({"train.steps": 20, "data.tokenizer": tok},
                       {"data": ["padded", "pretok-memmap"], "world": [1, 2], "precision": ["fp32", "bf16"]},
                       linked={"data": {"padded": {"data.path": corpus}, "pretok-memmap": {"data.path": mm_dir}}})
    for point, status in run_sweep("configs/tiny.yaml", grid, "runs"):   # completed | skipped | failed
        ...

A point whose `runs/<id>/run.json` says "completed" is skipped; any other point is (re)launched, so a failed or
interrupted point is retried on the next call (the trainer resumes from its newest checkpoint). Each attempt is
recorded in `runs/<id>/launcher.json`; the process output goes to `runs/<id>/launcher.log`.

SIGTERM / SIGINT / SIGHUP to the sweep reach the run it started (every process of it, torchrun's ranks
included, which checkpoint and exit 3), then the sweep raises `SweepStopped` (exit 3 from the CLI). A run
also gets SIGTERM if the sweep dies without a word (PR_SET_PDEATHSIG), so no run outlives its sweep.
"""


from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import PretokError
from ..machine.cpu_affinity import THREADS_ENV, usable_cpus
from ..machine.probe import Probe
from ..train.run_record import run_error, run_status
from . import procs
from .procs import SweepStopped, stop_signals
from .sweep_grid import (ALIASES, WORLD, Grid, Linked, Point, check_points, expand_grid, point_problem, run_id,
                         sweep_table)
from .sweep_values import numbers, parse_axis, parse_setting, parse_value, yaml_problem, yaml_scalar

POINT_OUTCOMES = ("completed", "skipped", "failed")  # run_sweep: ran to completion now / completed before / did not
LAUNCHERS = ("local", "slurm")
TRAIN_MODULE = "pretok_lib.train"
SBATCH_SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "train.sbatch"


def command(point: Point, config: str | os.PathLike, launcher: str = "local", runs_dir: str | os.PathLike = "runs",
            module: str = TRAIN_MODULE) -> list[str]:
    """The command of one grid point. local: `python -m <module>` for one process, torchrun (`python -m
    torch.distributed.run --standalone`) for more; slurm: the arguments given to `slurm/train.sbatch`."""
    args = ["--config", str(config), *point.cli_overrides(), f"run.id={point.run_id}", f"run.dir={runs_dir}"]
    if launcher == "slurm":
        return args
    if launcher != "local":
        raise PretokError(f"sweep: unknown launcher '{launcher}' (choose from {', '.join(LAUNCHERS)})")
    if point.world == 1:
        return [sys.executable, "-m", module, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={point.world}",
            "-m", module, *args]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _attempts(run_dir: Path) -> list[dict]:
    try:
        return json.loads((run_dir / "launcher.json").read_text())["attempts"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _record(run_dir: Path, point: Point, attempt: dict) -> None:
    """Append one attempt to `run_dir/launcher.json` (atomically rewritten); the outcome of a SLURM job replaces
    its `submitted` attempt."""
    path = run_dir / "launcher.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        rec = {"point": point.to_dict(), "attempts": []}
    rec["point"] = point.to_dict()
    last = rec["attempts"][-1] if rec["attempts"] else {}
    if last.get("status") == "submitted" and attempt.get("job_id") == last.get("job_id"):
        rec["attempts"][-1] = attempt
    else:
        rec["attempts"].append(attempt)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rec, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def tail(path: str | os.PathLike, lines: int = 8) -> str:
    """The last `lines` lines of a log (for failure messages)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16384))
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


def _launch_local(cmd: list[str], log: Path, env: dict, timeout_s: float | None) -> tuple[int | None, str | None]:
    """Run `cmd` in its own session with output appended to `log`; (exit code, problem)."""
    with open(log, "ab") as fh:
        fh.write(f"\n=== {_now()} pretok sweep: {' '.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=procs.die_with_parent_hook())
        try:
            return proc.wait(timeout_s), None
        except subprocess.TimeoutExpired:
            with procs.stop_signals(procs.ignore):    # stopping already: a second signal must not cut it short
                procs.stop_tree(proc)
            return proc.returncode, f"timed out after {timeout_s:g} s"
        except BaseException:  # SweepStopped, KeyboardInterrupt: stop the run (it checkpoints), then re-raise
            with procs.stop_signals(procs.ignore):
                procs.stop_tree(proc)
            raise


def _outcome(run_dir: Path, rc: int | None, problem: str | None) -> tuple[str, str | None]:
    """(completed | failed, reason) from the exit code and the run's own run.json."""
    st = run_status(run_dir)
    if rc == 0 and st == "completed":
        return "completed", None
    why = problem or (f"exit code {rc}" if rc is not None else "no exit code")
    if st == "failed" and run_error(run_dir):
        why += f"; run.json: {run_error(run_dir)}"
    elif st != "completed":
        why += f"; run.json status {st!r}"
    return "failed", why


RERUN = "rerun"
CHANGED_POLICIES = ("refuse", "rerun")  # a point whose run directory holds another config (train/identity.py)


class Unclearable(str):
    """A point's run directory that is another run's but holds the config's inputs: neither rerun nor cleared."""


def _changed(config: Path, p: Point, runs: Path) -> str | None:
    """Why the run directory of point `p` (an earlier attempt) is not this point's run (another config:
    train/identity.py), or None when it is or holds nothing; RERUN when it is not but the point says
    run.overwrite=true."""
    from ..train.config import load_config
    from ..train.identity import changed, inputs_inside, refusal

    if not (runs / p.run_id / "config.yaml").exists():  # no earlier attempt's config to compare with
        return None
    cfg = load_config(config, [*p.cli_overrides(), f"run.id={p.run_id}", f"run.dir={runs}"])
    why = changed(runs / p.run_id, cfg, p.world)
    if why and inputs_inside(cfg, runs / p.run_id):  # neither the trainer's overwrite nor --rerun-changed clears it
        return Unclearable(f"{runs / p.run_id}: {why}; and it {inputs_inside(cfg, runs / p.run_id)}")
    if why and cfg.run.overwrite:
        return RERUN
    return f"{refusal(runs / p.run_id, why)} (a sweep: --rerun-changed starts such points over)" if why else None


def clear_run_dir(run_dir: Path) -> None:
    """Remove a run directory: renamed aside first, then deleted, so a stop or kill while deleting leaves no half
    of it (say a run.json saying completed without the config.yaml that tells it is another config's run, which
    the next sweep then skipped as this point's), only a `.<id>.old-<pid>` directory that the next clear removes."""
    for old in run_dir.parent.glob(f".{run_dir.name}.old-*"):
        shutil.rmtree(old, ignore_errors=True)
    aside = run_dir.parent / f".{run_dir.name}.old-{os.getpid()}"
    os.replace(run_dir, aside)
    shutil.rmtree(aside)


def dry_run_lines(config: str | os.PathLike, grid: Grid, runs_dir: str | os.PathLike = "runs", launcher: str = "local",
                  module: str = TRAIN_MODULE, rerun_changed: bool = False) -> list[str]:
    """`pretok sweep --dry-run`: one line per point, its run id, its state (or why the sweep would refuse or start it
    over) and its command (slurm: the full sbatch line; nothing submitted, no SLURM needed). Points whose config
    the trainer would refuse are refused here as the sweep would refuse them."""
    if not Path(config).is_file():  # as the sweep itself would say
        raise PretokError("config file not found", config)
    check_points(config, grid.points(), Path(runs_dir).resolve())
    points = grid.points()
    if launcher == "slurm":
        from .sweep_slurm import dry_run

        cmds = dry_run(points, Path(config).resolve(), runs_dir)
    else:
        cmds = [" ".join(command(p, config, launcher, runs_dir, module)) for p in points]
    lines = []
    for p, cmd in zip(points, cmds):
        why = _changed(Path(config).resolve(), p, Path(runs_dir).resolve())
        state = run_status(Path(runs_dir) / p.run_id) or "not run"
        state = state if why in (None, RERUN) else ("would start over: " if rerun_changed and not isinstance(
            why, Unclearable) else "would be refused: ") + why
        lines.append(f"{p.run_id}  [{state}]  {cmd}")
    return lines


def run_sweep(config: str | os.PathLike, grid: Grid | Iterable[Point], runs_dir: str | os.PathLike = "runs",
              launcher: str = "local", *, module: str = TRAIN_MODULE, timeout_s: float | None = None,
              env: Mapping[str, str] | None = None, slurm_script: str | os.PathLike = SBATCH_SCRIPT,
              slurm_options: Mapping[str, Any] | None = None, echo: Callable[[str], None] | None = print,
              changed: str = "refuse", calibrate: bool = True) -> list[tuple[Point, str]]:
    """Launch every grid point not yet completed, one after the other (local) or all at once as SLURM jobs then
    wait for them; returns `(point, status)` with status `completed` (now), `skipped` (completed before) or
    `failed` (recorded in launcher.json, retried on the next call).

    Args:
        config: the base training config; grid: a Grid or its points; runs_dir: where run dirs are made.
        launcher: local or slurm; module: the training module run per point; timeout_s: per point (local).
        env: extra environment for the runs; slurm_script, slurm_options: the sbatch script and its flags.
        echo: where progress lines go (None: silent).
        changed: a point whose run directory holds a run of another config (say the base config changed since):
            `refuse` (failed, nothing launched, the old run kept) or `rerun` (its directory cleared, then run).
        calibrate: the machine probe around each local run (its attempt's `probe` in launcher.json) times its
            calibration before and after (False: outside CPU, load and steal only).
    """
    points = grid.points() if isinstance(grid, Grid) else list(grid)
    if launcher not in LAUNCHERS:
        raise PretokError(f"sweep: unknown launcher '{launcher}' (choose from {', '.join(LAUNCHERS)})")
    config, runs = Path(config).resolve(), Path(runs_dir).resolve()
    if not config.is_file():
        raise PretokError("config file not found", config)
    check_points(config, points, runs)
    say = echo or (lambda s: None)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if launcher == "local":
        child_env.setdefault(THREADS_ENV, str(sweep_threads(points)))
    status: dict[str, str] = {}
    todo = []
    if changed not in CHANGED_POLICIES:
        raise PretokError(f"sweep: changed must be one of {', '.join(CHANGED_POLICIES)} (got {changed!r})")
    for p in points:
        why = _changed(config, p, runs)
        if why is None:
            if run_status(runs / p.run_id) == "completed":
                status[p.run_id] = "skipped"
            else:
                todo.append(p)
        elif why == RERUN:  # the point itself says run.overwrite=true: the trainer starts over
            todo.append(p)
        elif changed == "rerun" and not isinstance(why, Unclearable):  # cleared here, so a requeued SLURM job
            # of it resumes rather than restarts
            say(f"  {p.run_id}: its run directory holds a run of another config or other data: starting it over")
            clear_run_dir(runs / p.run_id)
            todo.append(p)
        else:  # the old run's results must not pass for this point's, nor be resumed under its config
            status[p.run_id] = "failed"
            say(f"  {p.run_id}: failed: {why}")
            _record(runs / p.run_id, p, {"launcher": launcher, "command": None, "started": _now(),
                                         "finished": _now(), "seconds": 0.0, "returncode": None,
                                         "status": "failed", "reason": why})
    done = sum(st == "skipped" for st in status.values())
    say(f"sweep: {len(points)} grid points, {done} already completed, {len(todo)} to run"
        + (f", {len(status) - done} refused" if len(status) > done else "") + f" ({launcher}) -> {runs}")
    if launcher == "local":
        try:
            with stop_signals():
                _run_local(config, todo, runs, module, timeout_s, child_env, status, say, calibrate)
        except SweepStopped as e:     # between two points: nothing of ours was running
            raise procs.Stopped(f"sweep {e.args[0]} between two points; rerun the same command to resume",
                                runs) from None
    elif todo:
        from .sweep_slurm import run_slurm

        try:
            with stop_signals():
                run_slurm(config, todo, runs, slurm_script, dict(slurm_options or {}), child_env, status, say)
        except SweepStopped as e:  # the jobs are the cluster's: they go on, recorded for the rerun to wait for
            raise procs.Stopped(f"sweep {e.args[0]}; its SLURM jobs keep running (job ids in each launcher.json: "
                                "rerun the same command to wait for them, scancel to stop them)", runs) from None
    return [(p, status[p.run_id]) for p in points]


def sweep_threads(points: Sequence[Point], usable: int | None = None) -> int:
    """Torch threads per rank of every point of a local sweep: the usable cores over the largest world size, so
    the scaling efficiency compares ranks of equal threads (issue 34: 2 threads at 1 rank vs 1 at 2 ranks) and
    ranks x threads never exceed the cores (docs/MEASURING.md "Threads")."""
    return max(1, (usable or usable_cpus()) // max((p.world for p in points), default=1))


def _run_local(config: Path, todo: list[Point], runs: Path, module: str, timeout_s: float | None, child_env: dict,
               status: dict[str, str], say: Callable[[str], None], probe_calibration: bool = True) -> None:
    """The points one after the other, each its own process (see `_launch_local`), each inside a machine probe
    (`machine_probe.Probe`, recorded as the attempt's `probe`).

    Args:
        config, todo, runs, module: as run_sweep; timeout_s: per point; child_env: the runs' environment.
        status: filled with run id -> outcome; say: progress lines.
    """
    for i, p in enumerate(todo, 1):
        rdir = runs / p.run_id
        t0, started = time.monotonic(), _now()
        cmd = command(p, config, "local", runs, module)
        attempt = {"launcher": "local", "command": cmd, "started": started}
        try:
            rdir.mkdir(parents=True, exist_ok=True)
            with Probe(p.run_id, calibration=probe_calibration) as probe:   # is the machine quiet? (issue 34)
                rc, problem = _launch_local(cmd, rdir / "launcher.log", child_env, timeout_s)
        except BaseException as caught:
            e = procs.as_stopped(caught)  # a stop signal's SweepStopped turned into another error on its way
            if not isinstance(e, KeyboardInterrupt):
                raise
            st = run_status(rdir)
            why = f"{e.args[0] if e.args else 'interrupted'} (sweep stopped); run.json status {st!r}"
            _record(rdir, p, {**attempt, "finished": _now(), "seconds": round(time.monotonic() - t0, 2),
                              "returncode": None, "status": "failed", "reason": why})
            if isinstance(e, SweepStopped):
                raise procs.Stopped(f"sweep {e.args[0]} during {p.run_id} (run.json: {st}); its processes "
                                    f"are stopped; rerun the same command to resume", runs) from None
            raise e
        st, why = _outcome(rdir, rc, problem)
        secs = time.monotonic() - t0
        _record(rdir, p, {**attempt, "finished": _now(), "seconds": round(secs, 2), "returncode": rc,
                          "status": st, "reason": why, "probe": probe.result})
        status[p.run_id] = st
        say(f"  [{i}/{len(todo)}] {p.run_id}: {st} in {secs:.1f} s" + (f" ({why})" if why else ""))
        if st == "failed":
            say("    " + tail(rdir / "launcher.log", 5).replace("\n", "\n    "))


from .sweep_slurm import slurm_layout  # noqa: E402  (the SLURM launcher, split off; names kept importable here)

# the grid and the value parsing live in sweep_grid.py and sweep_values.py; their names stay importable here
__all__ = ["ALIASES", "CHANGED_POLICIES", "LAUNCHERS", "POINT_OUTCOMES", "RERUN", "SBATCH_SCRIPT", "TRAIN_MODULE",
           "WORLD", "Grid", "Linked", "Point", "Unclearable", "check_points", "clear_run_dir", "command", "dry_run_lines",
           "expand_grid", "numbers", "parse_axis", "parse_setting", "parse_value", "point_problem", "run_id",
           "run_sweep", "slurm_layout", "sweep_table", "sweep_threads", "tail", "yaml_problem", "yaml_scalar"]
