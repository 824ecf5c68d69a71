"""A training run on disk (docs/RUNS.md): run directory, config.yaml, run.json status, metrics, summary.

    pretok train --config configs/tiny.yaml train.steps=100
    torchrun --nproc_per_node 2 -m pretok_lib.train --config configs/tiny.yaml
Exit code 0: completed (or already completed); 2: bad config or data; 3: interrupted by SIGTERM/SIGINT/SIGUSR1
after a checkpoint (resume by running the same command); 1: failed on an I/O error of the run directory (disk
full, read-only) or a crash; 130: stopped by a second SIGINT. run.json says why; errors are one stderr line.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import shutil
import socket
import sys
from pathlib import Path

import torch

from ..atomic import atomic_write_json
from ..errors import NonFiniteLoss, PretokError, os_error
from ..machine.cpu_affinity import THREADS_ENV, usable_cpus
from ..machine.environment import environment
from . import distributed
from .checkpoint import names_path
from .config import Config, load_config, save_config
from .identity import changed, inputs_inside, refusal
from .metrics import MetricsLog, read_records, summarize
from .run_record import RECORD_STATUSES, read_run_record

RUN_VERSION = 1
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_ABORTED = 1, 2, 3, 130


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _log(msg: str) -> None:
    print(f"[pretok train] {msg}", file=sys.stderr, flush=True)


def _run_info(run_id: str, d: distributed.Dist, status: str, started: str, error: str | None = None,
              trainer=None) -> dict:
    assert status in RECORD_STATUSES, status
    env = environment()
    dev = d.device
    return {"version": RUN_VERSION, "run_id": run_id, "status": status, "error": error, "started": started,
            "finished": _now() if status != "running" else None, "world_size": d.world, "device": dev.type,
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else env["cpu_model"],
            "cpu_model": env["cpu_model"], "platform": env["platform"],
            "backend": d.backend, "git_commit": env["git_commit"], "git_dirty": env["git_dirty"],
            "versions": {"python": env["python"], **env["packages"]}, "host": socket.gethostname(),
            "cpus": env["cpus"], "torch_threads": torch.get_num_threads(),
            "slurm": {k: v for k, v in os.environ.items() if k.startswith("SLURM_") and k in (
                "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_RESTART_COUNT")},
            "pid": os.getpid(), "command": sys.argv, "cwd": os.getcwd(), **(trainer.facts() if trainer is not None else {})}


def _trackers(cfg: Config, run_dir: Path, resumed: bool) -> list:
    """The trackers of `log.tracking` (train/tracking.py), started (a resumed run continues its tracker run)."""
    if not cfg.log.tracking:
        return []
    from .tracking import open_trackers

    return open_trackers(cfg.log.tracking, run_dir, run_dir.name, cfg.to_dict(), cfg.log.mlflow_uri,
                         cfg.log.experiment or cfg.name, resume=resumed, wandb_mode=cfg.log.wandb_mode)


def write_status(run_dir: Path, info: dict) -> str | None:
    """Rewrite run.json atomically; when that fails (disk full), overwrite the old file in place with the
    compact JSON if it fits in the bytes the file already holds (no new block needed). None when written, else
    why not (the file then still says what it said: a reader checks `host`/`pid`, see docs/RUNS.md)."""
    path = run_dir / "run.json"
    try:
        atomic_write_json(path, info)
        return None
    except OSError as e:
        problem = str(os_error(e, path))
    with contextlib.suppress(OSError):
        path.with_name(path.name + ".tmp").unlink()      # frees what the failed write took
    try:
        with open(path, "r+b") as fh:
            room = os.fstat(fh.fileno()).st_size
            # the whole record if it fits, else only what a reader needs to know the run failed and why
            for record in (info, {k: info[k] for k in _ESSENTIAL if k in info}):
                data = _compact(record, room)
                if len(data) <= room:
                    break
            else:
                return problem
            fh.write(data + b" " * (room - len(data)))
            fh.flush()
            os.fsync(fh.fileno())
        return None
    except OSError:
        return problem


def _inside(path, directory: Path) -> bool:
    """Whether `path` (None: no) lies in `directory`."""
    try:
        return path is not None and Path(os.path.abspath(path)).is_relative_to(os.path.abspath(directory))
    except (TypeError, ValueError):
        return False


_ESSENTIAL = ("run_id", "status", "error", "started", "finished", "host", "pid", "world_size", "device")


def _compact(record: dict, room: int) -> bytes:
    """`record` as compact JSON, its error message cut short (not below 20 characters) to fit in `room` bytes."""
    data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    if len(data) > room and record.get("error"):
        cut = max(20, len(record["error"]) - (len(data) - room) - 3)
        data = json.dumps({**record, "error": record["error"][:cut] + "..."}, sort_keys=True,
                          separators=(",", ":")).encode()
    return data


def _prepare_dir(cfg: Config, run_dir: Path, world: int) -> bool | tuple[int, str]:
    """Rank 0: False when the run already completed (nothing to do); clears it when run.overwrite; (exit code, error
    line) when it holds a run of another config (identity.py) or cannot be made (read-only, disk full)."""
    status = read_run_record(run_dir)
    if not cfg.run.overwrite:
        why = changed(run_dir, cfg, world)
        if why:
            return EXIT_BAD_INPUT, refusal(run_dir, why)
    elif run_dir.exists() and inputs_inside(cfg, run_dir):
        return EXIT_BAD_INPUT, f"{run_dir}: {inputs_inside(cfg, run_dir)}"
    try:
        if cfg.run.overwrite and run_dir.exists():
            _clear(run_dir)
        elif status and status.get("status") == "completed":
            return False
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return EXIT_FAILED, str(os_error(e, run_dir))
    return True


LAUNCHER_FILES = ("launcher.log", "launcher.json")  # a sweep's records of its attempts: not the run's to delete
RUN_LOCK = ".lock"  # held by rank 0 while a trainer runs in the directory


def _clear(run_dir: Path) -> None:
    """Empty a run directory for `run.overwrite`, keeping the launcher's log and records (a sweep writes into its
    log while this very attempt runs)."""
    for p in run_dir.iterdir():
        if p.name in (*LAUNCHER_FILES, RUN_LOCK):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def rank_threads(usable: int, local_ranks: int, requested: str | int | None = None, current: int | None = None
                 ) -> int:
    """Torch threads of one rank (docs/MEASURING.md "Threads"): `requested` ($PRETOK_THREADS_PER_RANK, else
    $OMP_NUM_THREADS), else `current` (torch's count: a caller in this process may have lowered it), else the
    usable cores split among the node's ranks; never more than that share, so ranks x threads <= usable cores
    (oversubscribed OpenMP cost 7x, issue 34), and at least 1."""
    share = max(1, usable // max(1, local_ranks))
    try:
        want = int(requested) if requested is not None else current or share
    except ValueError:
        want = share
    return max(1, min(want, share))


def train(cfg: Config) -> int:
    """Run (or resume) `cfg` on this rank; returns the process exit code."""
    d = distributed.setup(cfg.hardware.device)
    torch.set_num_threads(rank_threads(usable_cpus(), int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                                       os.environ.get(THREADS_ENV) or os.environ.get("OMP_NUM_THREADS"),
                                       torch.get_num_threads()))
    default_id = f"{cfg.name}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
    run_id = distributed.broadcast_object(cfg.run.id or default_id)
    cfg.run.id = run_id
    run_dir = Path(cfg.run.dir) / run_id
    # Rank 0 holds the run directory's lock for the whole run: a second trainer into it (a sweep's job still queued
    # when its rerun submitted another, a command started twice) stops with one line instead of writing the same
    # checkpoints and metrics.
    held, busy = contextlib.ExitStack(), None
    if d.is_main:
        try:
            held.enter_context(_run_dir_lock(run_dir))
        except PretokError as e:
            busy = (EXIT_BAD_INPUT, str(e))
    with held:
        return _train(cfg, d, run_id, run_dir, busy)


@contextlib.contextmanager
def _run_dir_lock(run_dir: Path):
    """Hold `run_dir/.lock` (flock, else lockf; made with the directory). Where nothing can be created (a read-only
    file system) the run goes on unlocked: its first write fails with the cause."""
    from ..engine.outdir import lock_or_say_why_not

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / RUN_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise os_error(e, run_dir) from None
        yield
        return
    try:
        lock_or_say_why_not(fd, run_dir / RUN_LOCK, run_dir, f"another trainer is running in this run directory "
                            f"(it holds {RUN_LOCK}): a run directory takes one trainer at a time")
        yield
    finally:
        os.close(fd)


def _train(cfg: Config, d: distributed.Dist, run_id: str, run_dir: Path, busy: tuple[int, str] | None) -> int:
    from .loop import StopFlag, Trainer

    todo = distributed.broadcast_object((busy or _prepare_dir(cfg, run_dir, d.world)) if d.is_main else None)
    if isinstance(todo, (tuple, list)):
        if d.is_main:
            print(f"pretok train: error: {todo[1]}", file=sys.stderr)
        distributed.teardown()
        return todo[0]
    if not todo:
        if d.is_main:
            _log(f"{run_dir} already completed; nothing to do (run.overwrite=true to start over)")
        distributed.teardown()
        return 0
    distributed.barrier()
    started = _now()
    trainer = metrics = None
    code = 1
    stop = StopFlag()
    try:
        trainer = Trainer(cfg, d, run_dir, _log)
        if d.is_main:
            with names_path(run_dir / "config.yaml"):
                save_config(cfg, run_dir / "config.yaml")
            with names_path(run_dir / "run.json"):
                atomic_write_json(run_dir / "run.json", _run_info(run_id, d, "running", started, trainer=trainer))
            trackers = _trackers(cfg, run_dir, trainer.progress.step > 0)
            with names_path(run_dir / "metrics.jsonl"):
                metrics = MetricsLog(run_dir, trainer.progress.step, cfg.log.tensorboard, trackers)
            what = f"a mixture of {len(cfg.data.mixture)} datasets" if cfg.data.mixture else cfg.data.kind
            _log(f"run {run_dir}: {what} on {d.world} x {d.device.type}, "
                 f"{sum(p.numel() for p in trainer.model.parameters()) / 1e6:.1f}M params, "
                 f"global batch {cfg.global_batch(d.world)} x {cfg.data.seq_len}")
        status = trainer.run(metrics, stop)
        if d.is_main:
            with names_path(run_dir / "metrics.jsonl"):
                metrics.close(status)
            metrics = None
            if status == "completed":
                settings = {"data_kind": cfg.data.kind, "world_size": d.world, "seq_len": cfg.data.seq_len,
                            "global_batch": cfg.global_batch(d.world),
                            "precision": cfg.train.precision, "lr": cfg.train.lr}
                summary = summarize(read_records(run_dir / "metrics.jsonl"), cfg.log.skip_steps,
                                    cfg.train.target_loss, settings)
                with names_path(run_dir / "summary.json"):
                    atomic_write_json(run_dir / "summary.json", {"status": "completed", **summary})
            info = _run_info(run_id, d, status, started, trainer=trainer)
            if status == "completed" and cfg.checkpoint.export:
                from .export import export_run

                info["export"] = export_run(run_dir, step=trainer.progress.step, overwrite=True,
                                            warn=lambda msg: _log(msg), record=False)
                _log(f"exported {run_dir / info['export']['path']} (transformers: AutoModelForCausalLM, "
                     f"AutoTokenizer)")
            with names_path(run_dir / "run.json"):
                atomic_write_json(run_dir / "run.json", info)
            _log(f"{status}: {run_dir}")
        code = 0 if status == "completed" else EXIT_INTERRUPTED
    except BaseException as e:
        # the second SIGINT's KeyboardInterrupt, also when the import or library it interrupted made another error of it
        if isinstance(e, KeyboardInterrupt) or (stop.aborted and isinstance(e, Exception)):
            msg, code = "stopped by a second SIGINT before its checkpoint (a rerun resumes from the last one)", \
                EXIT_ABORTED
        elif isinstance(e, OSError) and (not isinstance(e, PretokError) or _inside(e.filename, run_dir)):
            msg, code = str(os_error(e, run_dir)), EXIT_FAILED     # the run directory's I/O (disk full, ...)
        elif isinstance(e, PretokError):
            msg, code = str(e), EXIT_BAD_INPUT
        elif isinstance(e, NonFiniteLoss):
            msg, code = str(e), EXIT_FAILED
        elif not d.is_main and d.backend is not None:   # another rank died; rank 0 reports the cause
            msg, code = f"rank {d.rank}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}", EXIT_FAILED
        else:
            msg, code = f"{type(e).__name__}: {e}", None
        if d.is_main:
            if metrics is not None:
                with contextlib.suppress(Exception):   # a tracker's own failure must not hide the run's
                    metrics.close("failed")
            unwritten = write_status(run_dir, _run_info(run_id, d, "failed", started, msg, trainer))
            if unwritten and code is not None:
                msg += f" (and run.json could not be updated: {unwritten})"
        if code is None:
            raise
        print(f"pretok train: error: {msg}", file=sys.stderr)
    finally:
        del trainer
        distributed.teardown()
        stop.restore()
    return code


def add_args(ap) -> None:
    ap.add_argument("--config", help="YAML config (see configs/); sections run/model/data/train/eval/...")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=100 data.kind=padded")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="pretok train", description="Train a causal LM on one data path.")
    add_args(ap)
    args = ap.parse_args(argv)
    return run_from_args(args)


def run_from_args(args) -> int:
    try:
        cfg = load_config(args.config, args.overrides)
    except PretokError as e:
        print(f"pretok train: error: {e}", file=sys.stderr)
        return 2
    return train(cfg)
