"""Experiment trackers beside TensorBoard (`log.tracking`, docs/TRAINING.md): every metrics.jsonl record mirrored to
MLflow (a local file store by default: no server, no network) and/or Weights & Biases (offline by default: written
under the run, `wandb sync` uploads it later, e.g. from a login node of a cluster whose compute nodes have no
internet). metrics.jsonl stays the record the analysis reads; a tracker is a copy for the tools a team already uses.

    log:
      tracking: [mlflow, wandb]   # pip install 'pretok[tracking]'
      mlflow_uri: null            # default: file store <run.dir>/mlruns (`mlflow ui --backend-store-uri` it;
                                  #   MLflow 3 wants MLFLOW_ALLOW_FILE_STORE=true for it, set here for file: URIs);
                                  #   sqlite:///mlflow.db needs the full `mlflow` package
      wandb_mode: offline         # offline (<run>/wandb/offline-run-*: `wandb sync` them), online (needs
                                  #   WANDB_API_KEY and network), disabled
      experiment: null            # MLflow experiment / W&B project; default: the config's name

A resumed run continues its tracker runs (ids kept in `<run>/tracking.json`); the MLflow run ends FINISHED, KILLED
(interrupted) or FAILED with the pretok run; the W&B run gets summary `pretok/status` and exit code 0, 3 (interrupted:
marked preempting, as W&B names a run that will resume) or 1.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_json
from ..errors import PretokError
from .run_record import flatten

TRACKERS = {"mlflow": "mlflow", "wandb": "wandb"}          # log.tracking name -> the module it needs
WANDB_MODES = ("offline", "online", "disabled")
EXIT_CODES = {"completed": 0, "interrupted": 3}          # W&B exit codes by pretok status (others: 1)
EXTRA = "pip install 'pretok[tracking]'"
STATE_FILE = "tracking.json"
MLFLOW_STATUS = {"completed": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


def check_tracking(names: Sequence[str], wandb_mode: str = "offline") -> str | None:
    """Why `log.tracking` cannot be used (an unknown tracker, its package not installed, an unknown W&B mode),
    None if it can."""
    if "wandb" in names and wandb_mode not in WANDB_MODES:
        return f"log.wandb_mode '{wandb_mode}' is not one of {', '.join(WANDB_MODES)}"
    for name in names:
        if name not in TRACKERS:
            return f"log.tracking '{name}' is not one of {', '.join(TRACKERS)}"
        if importlib.util.find_spec(TRACKERS[name]) is None:
            return f"log.tracking '{name}': the {TRACKERS[name]} package is not installed ({EXTRA})"
    return None


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A metrics record's numbers as `<kind>/<key>` scalars (a list: one per index), as TensorBoard gets them."""
    out: dict[str, float] = {}
    prefix = record.get("kind", "train")
    for k, v in record.items():
        if k in ("kind", "step"):
            continue
        if _finite(v):
            out[f"{prefix}/{k}"] = float(v)
        elif isinstance(v, list):
            out.update({f"{prefix}/{k}/{i}": float(x) for i, x in enumerate(v) if _finite(x)})
    return out


class MLflowTracker:
    """One MLflow run per pretok run, through `MlflowClient` (no global active run)."""

    def __init__(self, run_dir: Path, run_id: str, config: Mapping[str, Any], uri: str | None,
                 experiment: str, resume: bool = False) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.run_dir = Path(run_dir)
        self.uri = uri or (self.run_dir.parent / "mlruns").resolve().as_uri()
        if self.uri.startswith("file:"):   # MLflow 3 keeps its file store only on request: this is one
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        state = _read_state(self.run_dir).get("mlflow") or {}
        if resume and state.get("uri") == self.uri and state.get("run_id"):
            self.id = state["run_id"]
            self.client.update_run(self.id, status="RUNNING")
            return
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        self.id = self.client.create_run(exp_id, run_name=run_id, tags={"pretok.run_dir": str(self.run_dir)}
                                         ).info.run_id
        params = [Param(k[:250], str(v)[:6000]) for k, v in flatten(dict(config)).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.id, params=params[i:i + 100])
        _write_state(self.run_dir, {"mlflow": {"uri": self.uri, "run_id": self.id}})

    def log(self, record: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        ms, step = int(time.time() * 1000), int(record.get("step", 0))
        metrics = [Metric(k, v, ms, step) for k, v in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.id, metrics=metrics)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.id, MLFLOW_STATUS.get(status, "FAILED"))


class WandbTracker:
    """One W&B run per pretok run, written under `<run>/wandb` (its id kept for a resume). The console is left
    alone (`console="off"`): pretok's own output and logs stay as they are."""

    def __init__(self, run_dir: Path, run_id: str, config: Mapping[str, Any], mode: str, project: str,
                 resume: bool = False) -> None:
        import wandb

        self.run_dir = Path(run_dir)
        state = _read_state(self.run_dir).get("wandb") or {}
        known = state.get("run_id") if resume else None     # None: W&B makes a new id
        self.run = wandb.init(project=project, name=run_id, id=known, dir=str(self.run_dir), mode=mode,
                              config=flatten(dict(config)), resume="allow" if resume else None, reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))
        self.id = self.run.id
        _write_state(self.run_dir, {"wandb": {"run_id": self.id, "mode": mode, "project": project}})

    def log(self, record: Mapping[str, Any]) -> None:
        values = scalars(record)
        if values:
            self.run.log(values, step=int(record.get("step", 0)))

    def close(self, status: str) -> None:
        self.run.summary["pretok/status"] = status
        if status == "interrupted":
            self.run.mark_preempting()
        self.run.finish(exit_code=EXIT_CODES.get(status, 1))


def _read_state(run_dir: Path) -> dict[str, Any]:
    try:
        d = json.loads((run_dir / STATE_FILE).read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_state(run_dir: Path, update: Mapping[str, Any]) -> None:
    atomic_write_json(run_dir / STATE_FILE, {**_read_state(run_dir), **update})


def open_trackers(names: Sequence[str], run_dir: Path, run_id: str, config: Mapping[str, Any],
                  mlflow_uri: str | None = None, experiment: str = "pretok", resume: bool = False,
                  wandb_mode: str = "offline") -> list[Any]:
    """The trackers `names` asks for, started (a PretokError if one cannot be used). `resume`: a run resumed
    from a checkpoint continues its tracker run; else a new one starts (a run started over gets a new one)."""
    if why := check_tracking(names, wandb_mode):
        raise PretokError(why, run_dir)
    return [MLflowTracker(run_dir, run_id, config, mlflow_uri, experiment, resume) if n == "mlflow"
            else WandbTracker(run_dir, run_id, config, wandb_mode, experiment, resume) for n in dict.fromkeys(names)]
