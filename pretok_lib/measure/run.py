"""`Run`: measure any training loop (tokens/s, effective tokens/s, padding, data stall) and write a run directory in
the trainer's contract (docs/RUNS.md), so `pretok_lib.analysis.load_runs` and `pretok report` read it beside the
project's own runs.

    with Run("runs/my-run", config={"model": "gpt2-small", "train": {"lr": 3e-4}}) as m:
        for batch in m.batches(loader):       # times each next(): the data wait
            loss = train_step(batch)          # any step; loss.item() syncs the device
            m.step(loss=loss.item())          # one optimizer step: a metrics.jsonl record
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..atomic import atomic_write_json, atomic_write_text
from ..errors import PretokError
from ..train.config import SKIP_STEPS
from ..train.run_record import read_run_record
from .counts import Counts, batch_counts

RUN_VERSION = 1
CONTRACT_FILES = ("run.json", "config.yaml", "metrics.jsonl", "summary.json")
DEFAULT_KIND = "byo"   # data.kind of a run measured with this API unless the config or `data_kind` says otherwise


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _plain(v: Any) -> Any:
    """A config value YAML can write: mappings, sequences and scalars kept, anything else as its str()."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _set_default(config: dict[str, Any], dotted: str, value: Any, leaves: tuple[str, ...] = ()) -> None:
    """Set `dotted` in the nested config unless it (or one of the leaf spellings `leaves`) is already set."""
    from ..analysis.runs import config_value

    if value is None or config_value(config, (dotted, *leaves)) is not None:
        return
    *sections, leaf = dotted.split(".")
    d = config
    for s in sections:
        d = d.setdefault(s, {}) if isinstance(d.get(s, {}), dict) else d
    d[leaf] = value


def _torch() -> Any:
    return sys.modules.get("torch")   # only when the caller's loop imported it: this module never does


def _device() -> tuple[str, str]:
    """(device type, its name): CUDA when the caller's torch has initialised it, else this CPU."""
    from ..machine.environment import cpu_model

    torch = _torch()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return "cuda", torch.cuda.get_device_name()
    return "cpu", cpu_model()


def _peak_mem_mb(device: str) -> float:
    from ..machine.memory import peak_rss_mb

    torch = _torch()
    if device == "cuda" and torch is not None:
        return torch.cuda.max_memory_allocated() / 2**20
    return peak_rss_mb()


class Run:
    """One measured run: `config.yaml` and `run.json` at start, a `metrics.jsonl` record per step, `summary.json`
    and run.json's final status at the end (completed; failed with the error; interrupted by Ctrl-C).

    Args:
        run_dir: the run's directory (its name is the run id); one holding a run is refused unless `overwrite`.
        config: the run's settings (nested dict, written as config.yaml); `data.kind` (default "byo"),
            `data.seq_len`, `train.precision`, `log.skip_steps` are added from the arguments when missing.
        world_size, rank: default from WORLD_SIZE / RANK; only rank 0 writes (its batch counts x world_size are
            the global batch's: equal batches per rank assumed). skip_steps: warm-up records the means skip.
        target_loss: summary.json's time to target. flops_per_token, peak_flops: give MFU when both are known.
        log_every: a record every N steps (each record holds its own step's numbers).
        tracking: trackers mirroring every record, as the trainer's `log.tracking` ("mlflow", "wandb"; mlflow_uri:
            default a file store beside the run directory; wandb_mode: offline, online or disabled; experiment: the
            MLflow experiment / W&B project).
    """

    def __init__(self, run_dir: str | os.PathLike, config: Mapping[str, Any] | None = None, *,
                 data_kind: str | None = None, seq_len: int | None = None, precision: str | None = None,
                 world_size: int | None = None, rank: int | None = None, skip_steps: int = SKIP_STEPS,
                 target_loss: float | None = None, flops_per_token: float | None = None,
                 peak_flops: float | None = None, log_every: int = 1, overwrite: bool = False,
                 tracking: Sequence[str] = (), mlflow_uri: str | None = None, experiment: str = "pretok",
                 wandb_mode: str = "offline") -> None:
        self.dir = Path(run_dir)
        self.run_id = self.dir.name
        self.world_size = int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", 1))
        self.rank = int(rank if rank is not None else os.environ.get("RANK", 0))
        if self.world_size < 1 or log_every < 1 or skip_steps < 0:
            raise PretokError("world_size and log_every must be >= 1, skip_steps >= 0", self.dir)
        self.config = _plain(dict(config or {}))
        _set_default(self.config, "data.kind", data_kind or DEFAULT_KIND, ("data_kind",))
        _set_default(self.config, "data.seq_len", seq_len)
        _set_default(self.config, "train.precision", precision, ("precision", "dtype"))
        _set_default(self.config, "train.target_loss", target_loss, ("target_loss",))
        _set_default(self.config, "log.skip_steps", skip_steps)
        self.skip_steps, self.target_loss, self.log_every = skip_steps, target_loss, log_every
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.overwrite = overwrite
        self.tracking = (list(tracking), mlflow_uri, experiment, wandb_mode)
        if tracking:
            from ..train.tracking import check_tracking

            if why := check_tracking(list(tracking), wandb_mode):
                raise PretokError(why, self.dir)
        self._trackers: list[Any] = []
        self.status: str | None = None
        self.steps = 0
        self._fh: Any = None
        self._pending = Counts()
        self._counted = True         # False once a batch could not be counted: step() then needs tokens=
        self._wait = self._paused = 0.0
        self._t0 = self._mark = 0.0
        self._cum = Counts()
        self._started = ""

    @property
    def writes(self) -> bool:
        """Whether this process writes the run directory (rank 0)."""
        return self.rank == 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> "Run":
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None:
            self.finish()
        elif isinstance(exc, KeyboardInterrupt):
            self.finish("interrupted", "interrupted (KeyboardInterrupt)")
        else:
            self.finish("failed", f"{type(exc).__name__}: {exc}")
        return False

    def start(self) -> "Run":
        """Write config.yaml and run.json (running) and open metrics.jsonl; the clock starts here."""
        self._started = _now()
        if self.writes:
            self._prepare_dir()
            atomic_write_text(self.dir / "config.yaml", yaml.safe_dump(self.config, sort_keys=False))
            if self.tracking[0]:
                from ..train.tracking import open_trackers

                self._trackers = open_trackers(self.tracking[0], self.dir, self.run_id, self.config,
                                               self.tracking[1], self.tracking[2], wandb_mode=self.tracking[3])
            atomic_write_json(self.dir / "run.json", self._info("running"))
            self._fh = open(self.dir / "metrics.jsonl", "w")
        self.status = "running"
        self._t0 = self._mark = time.perf_counter()
        return self

    def _prepare_dir(self) -> None:
        old = read_run_record(self.dir)
        if old is not None or (self.dir / "metrics.jsonl").exists():
            if not self.overwrite:
                status = (old or {}).get("status", "unknown")
                raise PretokError(f"holds a run already (status {status}): overwrite=True starts it over, or "
                                  "choose another run directory", self.dir)
            for name in CONTRACT_FILES:
                (self.dir / name).unlink(missing_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)

    def finish(self, status: str = "completed", error: str | None = None) -> None:
        """End the run: on completion summary.json, then run.json's final status (written last)."""
        if self.status != "running":
            return
        self.status = status
        if not self.writes:
            return
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for t in self._trackers:
            t.close(status)
        self._trackers = []
        if status == "completed":
            atomic_write_json(self.dir / "summary.json", {"status": "completed", **self.summary()})
        atomic_write_json(self.dir / "run.json", self._info(status, error))

    def summary(self) -> dict[str, Any]:
        """summary.json's numbers, computed from metrics.jsonl as the trainer's (`train.metrics.summarize`)."""
        from ..analysis.runs import config_value
        from ..train.metrics import read_records, summarize

        records = read_records(self.dir / "metrics.jsonl")
        settings = {"data_kind": config_value(self.config, ("data.kind",)), "world_size": self.world_size,
                    "seq_len": config_value(self.config, ("data.seq_len",)),
                    "global_batch": self._global_batch, "precision": config_value(self.config, ("train.precision",)),
                    "lr": next((r["lr"] for r in reversed(records) if r.get("lr") is not None), None)}
        return summarize(records, self.skip_steps, self.target_loss, settings)

    def _info(self, status: str, error: str | None = None) -> dict[str, Any]:
        from ..machine.environment import environment

        env = environment()
        device, name = _device()
        return {"version": RUN_VERSION, "run_id": self.run_id, "status": status, "error": error,
                "started": self._started, "finished": _now() if status != "running" else None,
                "world_size": self.world_size, "device": device, "device_name": name, "cpu_model": env["cpu_model"],
                "platform": env["platform"], "backend": None, "git_commit": env["git_commit"],
                "git_dirty": env["git_dirty"], "versions": {"python": env["python"], **env["packages"]},
                "host": socket.gethostname(), "cpus": env["cpus"], "slurm": env["slurm"], "pid": os.getpid(),
                "command": sys.argv, "cwd": os.getcwd(), "trainer": "byo (pretok_lib.measure)",
                "peak_flops": self.peak_flops, "flops_per_token": self.flops_per_token,
                "peak_source": "given (pretok_lib.measure.Run peak_flops)" if self.peak_flops else None}

    # -- measuring ---------------------------------------------------------------------------------------------

    def batches(self, iterable: Iterable[Any], count: bool = True) -> Iterator[Any]:
        """Yield `iterable`'s batches, timing each `next()` as data wait and counting its tokens (`count=False`:
        step() is given them)."""
        it = iter(iterable)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self._wait += time.perf_counter() - t
            if count:
                self.add_batch(batch)
            yield batch

    def add_batch(self, batch: Any) -> None:
        """Count a batch toward the next step (`batches()` does it for each batch it yields)."""
        try:
            self._pending += batch_counts(batch)
        except PretokError:
            self._counted = False

    def add_wait(self, seconds: float) -> None:
        """Add data wait measured by the caller (a loop that does not fetch through `batches()`)."""
        self._wait += seconds

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside (evaluation, checkpointing) counts in no step."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - t

    def step(self, loss: float | None = None, *, lr: float | None = None, grad_norm: float | None = None,
             tokens: int | None = None, effective_tokens: int | None = None, padding: int | None = None,
             masked: int | None = None, samples: int | None = None) -> dict[str, Any] | None:
        """One optimizer step ended: its time is since the previous step (less paused time), its data wait what
        `batches()` waited since then, its counts those of the batches fetched since then (or the ones given,
        per rank). Returns the record written (None between `log_every` steps or on ranks > 0)."""
        now = time.perf_counter()
        step_time = max(now - self._mark - self._paused, 1e-9)
        wait = min(self._wait, step_time)
        c = self._pending
        if tokens is not None:
            c = Counts(tokens, tokens if effective_tokens is None else effective_tokens, padding or 0, masked or 0,
                       samples or 0)
        elif not self._counted:
            raise PretokError("a batch of this step could not be counted: pass tokens= (and effective_tokens=)",
                              self.dir)
        else:
            for k, v in (("effective_tokens", effective_tokens), ("padding", padding), ("masked", masked),
                         ("samples", samples)):
                if v is not None:
                    setattr(c, k, v)
        self._mark, self._wait, self._paused = now, 0.0, 0.0
        self._pending, self._counted = Counts(), True
        self.steps += 1
        w = self.world_size
        g = Counts(c.tokens * w, c.effective_tokens * w, c.padding * w, c.masked * w, c.samples * w)
        self._cum += g
        self._global_batch = g.samples or None
        if not self.writes or self.steps % self.log_every:
            return None
        rec = self._record(loss, lr, grad_norm, step_time, wait, g, now)
        self._write(rec)
        return rec

    _global_batch: int | None = None

    def _record(self, loss: float | None, lr: float | None, grad_norm: float | None, step_time: float, wait: float,
                g: Counts, now: float) -> dict[str, Any]:
        tps = g.tokens / step_time
        mfu = (self.flops_per_token * tps / self.world_size / self.peak_flops
               if self.flops_per_token and self.peak_flops else None)
        device = _device()[0]
        return {"kind": "train", "step": self.steps, "wall_s": now - self._t0, "loss": _finite(loss), "lr": lr,
                "grad_norm": _finite(grad_norm), "step_time_s": step_time, "data_wait_s": wait,
                "data_stall": wait / step_time, "tokens": g.tokens, "effective_tokens": g.effective_tokens,
                "padding_frac": g.padding / g.tokens if g.tokens else None,
                "masked_frac": g.masked / g.tokens if g.tokens else None, "tokens_per_s": tps,
                "tokens_per_s_per_device": tps / self.world_size,
                "effective_tokens_per_s": g.effective_tokens / step_time,
                "mfu": mfu, "peak_mem_mb": _peak_mem_mb(device), "cum_tokens": self._cum.tokens,
                "cum_effective_tokens": self._cum.effective_tokens, "samples": self._cum.samples}

    def eval(self, val_loss: float, val_tokens: int | None = None, **more: float) -> dict[str, Any] | None:
        """A validation record at the current step (`val_loss`, its perplexity, `val_tokens`, and e.g.
        `val_loss_own=`). Wrap the evaluation itself in `paused()` to keep its time out of the next step."""
        if not self.writes:
            return None
        loss = _finite(val_loss)
        rec = {"kind": "val", "step": self.steps, "wall_s": time.perf_counter() - self._t0, "val_loss": loss,
               "val_ppl": None if loss is None else (math.exp(loss) if loss < 700 else math.inf),
               "val_tokens": val_tokens, **{k: _finite(v) for k, v in more.items()}}
        self._write(rec)
        return rec

    def _write(self, rec: dict[str, Any]) -> None:
        if self._fh is None:
            raise PretokError("the run is not started (use `with Run(...)` or call start())", self.dir)
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()
        for t in self._trackers:
            t.log(rec)


def _finite(x: Any) -> float | None:
    """A loss or norm as a float (a tensor's item()), None when not given; NaN and inf kept as JSON allows."""
    if x is None:
        return None
    return float(x.item() if hasattr(x, "item") else x)
