"""Read training run directories (docs/RUNS.md) into plain records: one `Run` per directory.

Only the files of the contract are read: `run.json` (status, world size), `config.yaml` (settings) and
`metrics.jsonl` (every number). `summary.json` is only checked for existence and status; no number comes from it.
A run that died keeps what it logged: a truncated or corrupt line is reported in `Run.problems`, never raised.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ..datapaths import global_batch
from ..train.crossing import number
from ..train.metrics import NOT_JSON, NOT_RECORD, parse_line
from ..train.run_record import flatten, read_run_config, read_run_record

TABLE_STATUSES = ("completed", "failed", "incomplete")
RUN_FILES = ("run.json", "metrics.jsonl", "launcher.json")  # launcher.json: `pretok_lib.launch.sweep` tried to start it
NOT_RUNS = {"checkpoints", "tb", ".pretok", "__pycache__", "mlruns"}   # mlruns: log.tracking's MLflow store

# Where each key setting may live in config.yaml: dotted keys tried in order, then a unique key with the same leaf.
SETTING_KEYS: dict[str, tuple[str, ...]] = {
    "data_kind": ("data.kind", "data_kind"),
    "seq_len": ("data.seq_len",),  # the one spelling the trainer has written since its first version
    "micro_batch": ("train.micro_batch", "data.micro_batch", "micro_batch", "train.micro_batch_size"),
    "global_batch": ("train.global_batch", "data.global_batch", "global_batch", "train.global_batch_size"),
    "grad_accum": ("train.grad_accum", "grad_accum", "train.gradient_accumulation_steps"),
    "precision": ("train.precision", "precision", "model.precision", "train.dtype"),
    "lr": ("optim.lr", "train.lr", "optimizer.lr", "lr"),
    "target_loss": ("eval.target_loss", "train.target_loss", "target_loss"),
    "steps": ("train.steps", "train.max_steps", "steps"),
    "num_workers": ("data.num_workers", "num_workers"),
    "skip_steps": ("log.skip_steps",),
}
# Config keys that never make two runs different experiments (dotted key, section or leaf name): run id/dir/seed,
# logging, checkpointing, and `name` (the config file's stem).
BOOKKEEPING = ("run", "log", "checkpoint", "seed", "name")
WORLD_SIZE_KEYS = ("world_size", "nproc_per_node", "nnodes", "grad_accum", "gradient_accumulation_steps")
PRECISION_KEYS = ("precision", "dtype", "amp", "autocast")
# The data path comparison ignores data.* except the batch shape below, and the own-layout validation split the
# study links to the padded paths (eval.own_*: part of how a path is run, not another experiment)
DATA_PATH_KEYS = ("data", "eval.own_path", "eval.own_kind")
BATCH_SHAPE_KEYS = ("seq_len", "micro_batch", "global_batch", "micro_batch_size", "global_batch_size", "batch_size")


class Records:
    """Metric records of one kind as columns: `recs["loss"]` is a float array, NaN where a record lacks a number."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self._cols: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._cols:
            self._cols[key] = np.array([_num(r.get(key)) for r in self.rows], dtype=float)
        return self._cols[key]

    def __repr__(self) -> str:
        return f"Records({len(self.rows)} rows, keys={self.keys()})"

    def keys(self) -> list[str]:
        """Every key present in at least one record, in first-seen order."""
        return list(dict.fromkeys(k for r in self.rows for k in r))

    def has(self, key: str) -> bool:
        """Whether at least one record holds a finite number under `key`."""
        return bool(len(self) and np.isfinite(self[key]).any())


_num = number  # a record value as a float, NaN if not a number


@dataclass
class Run:
    """One run directory. `status` is completed, failed or incomplete (running, killed, or no run.json)."""

    run_id: str
    path: Path
    status: str
    config: dict[str, Any]
    info: dict[str, Any]
    train: Records
    val: Records
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    has_summary: bool = False
    _settings: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def settings(self) -> dict[str, Any]:
        """Key settings (data_kind, world_size, global_batch, seq_len, precision, lr, ...; None when unknown)."""
        if self._settings is None:
            self._settings = settings_of(self.config, self.info, self.train)
        return self._settings

    @property
    def label(self) -> str:
        """The run id, with its status appended unless completed."""
        return self.run_id if self.status == "completed" else f"{self.run_id} [{self.status}]"


def _matches(key: str, patterns: Iterable[str]) -> bool:
    """A dotted key matches a pattern equal to it, to one of its sections, or to its leaf name."""
    leaf = key.rsplit(".", 1)[-1]
    return any(key == p or key.startswith(p + ".") or leaf == p for p in patterns)


def config_value(config: dict[str, Any], candidates: Iterable[str]) -> Any:
    """The first candidate dotted key present in `config`, else the value of the only key sharing a leaf name."""
    flat = flatten(config)
    cands = list(candidates)
    for c in cands:
        if c in flat and flat[c] is not None:
            return flat[c]
    leaves = {c.rsplit(".", 1)[-1] for c in cands}
    hits = [v for k, v in flat.items() if k.rsplit(".", 1)[-1] in leaves and v is not None]
    return hits[0] if len(hits) == 1 else None


def settings_of(config: dict[str, Any], info: dict[str, Any], train: Records | None = None) -> dict[str, Any]:
    """Key settings of a run from config.yaml and run.json. A missing global batch is derived from
    micro_batch x grad_accum x world_size, else from the logged tokens per step / seq_len."""
    s = {name: config_value(config, keys) for name, keys in SETTING_KEYS.items()}
    ws = info.get("world_size", config_value(config, ("world_size",)))
    s["world_size"] = int(ws) if isinstance(ws, (int, float)) and not isinstance(ws, bool) else None
    if isinstance(info.get("precision"), str):   # what the run computed in (`auto` resolved), per run.json
        s["precision"] = info["precision"]
    if s["global_batch"] is None and s["micro_batch"] is not None and s["world_size"]:
        s["global_batch"] = global_batch(int(s["micro_batch"]), s["world_size"], int(s["grad_accum"] or 1))
    if s["global_batch"] is None and s["seq_len"] and train is not None and train.has("tokens"):
        s["global_batch"] = round(float(np.nanmedian(train["tokens"])) / float(s["seq_len"]))
    return s


def config_signature(run: Run, ignore: Iterable[str] = (), keep: Iterable[str] = ()) -> tuple:
    """Hashable identity of a run's experiment: its flattened config (+ world size) without bookkeeping keys
    (run id/dir, logging, checkpoints, seeds) and without keys matching `ignore` unless they match `keep`.
    Runs with equal signatures are repeats of one setting."""
    ignore, keep = (*BOOKKEEPING, *ignore), tuple(keep)
    flat = dict(flatten(run.config), world_size=run.settings["world_size"])
    return tuple(sorted((k, repr(v)) for k, v in flat.items() if not _matches(k, ignore) or _matches(k, keep)))


def read_metrics(path: Path) -> tuple[list[dict], list[dict], list[str]]:
    """Train and val records of metrics.jsonl in step order, and problems found. Unparsable lines and records
    without a valid step (`train.metrics.parse_line`) are skipped and reported (the last line as truncated), as is
    a file with no train or val record; records replayed after a resume from an older checkpoint are superseded by
    the later ones."""
    problems: list[str] = []
    lines = path.read_bytes().split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    kinds: dict[str, list[dict]] = {"train": [], "val": []}
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        rec = parse_line(raw)
        if rec == NOT_JSON:
            what = "truncated last line (killed while writing?)" if i == last else "not valid JSON"
            problems.append(f"metrics.jsonl line {i + 1}: {what}, ignored")
            continue
        if rec == NOT_RECORD:
            problems.append(f"metrics.jsonl line {i + 1}: not a record with a non-negative integer step, ignored")
            continue
        if isinstance(rec.get("kind"), str) and rec["kind"] in kinds:
            kinds[rec["kind"]].append(rec)
    out = {}
    for kind, recs in kinds.items():
        kept: list[dict] = []
        for rec in recs:
            if kept and rec["step"] <= kept[-1]["step"]:
                if rec["step"] < kept[-1]["step"]:
                    problems.append(f"metrics.jsonl: {kind} steps >= {rec['step']} logged again (resumed run); "
                                    "the later records are used")
                kept = [r for r in kept if r["step"] < rec["step"]]
            kept.append(rec)
        out[kind] = kept
    if not out["train"] and not out["val"]:
        problems.append("metrics.jsonl: empty (no train or val records)")
    return out["train"], out["val"], problems


def _read_json(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
        if isinstance(d, dict):
            return d
        problems.append(f"{path.name}: not a JSON object")
    except FileNotFoundError:
        problems.append(f"{path.name}: missing")
    except (OSError, ValueError) as e:
        problems.append(f"{path.name}: unreadable ({e.__class__.__name__})")
    return {}


def last_launch(path: Path) -> dict[str, Any]:
    """The last attempt recorded by the sweep launcher (launcher.json), {} if none: it tells a run that failed
    before the trainer wrote run.json."""
    try:
        attempts = json.loads((path / "launcher.json").read_text()).get("attempts") or [{}]
        return attempts[-1] if isinstance(attempts[-1], dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


def load_run(path: str | Path) -> Run:
    """One run directory as a `Run`. Missing or damaged files become `problems`, never exceptions."""
    path = Path(path)
    problems: list[str] = []
    info = read_run_record(path, problems) or {}
    config = read_run_config(path, problems)
    train: list[dict] = []
    val: list[dict] = []
    if (path / "metrics.jsonl").is_file():
        train, val, more = read_metrics(path / "metrics.jsonl")
        problems += more
    else:
        problems.append("metrics.jsonl: missing")
    summary: dict[str, Any] = {}
    has_summary = (path / "summary.json").is_file()
    if has_summary:
        summary = _read_json(path / "summary.json", problems)
    raw = info.get("status")
    error = info.get("error")
    if not info and (launch := last_launch(path)).get("status") == "failed":
        raw, error = "failed", launch.get("reason") or f"launcher exit code {launch.get('returncode')}"
    if raw == "failed":
        status = "failed"
    elif raw == "completed" or summary.get("status") == "completed":
        status = "completed"
        if not has_summary:
            problems.append("summary.json: missing although run.json says completed")
    else:
        status = "incomplete"
    if raw not in ("completed", "failed", "running", None):
        problems.append(f"run.json: status {raw!r}")  # e.g. "interrupted" (SIGTERM; resumable)
    run_id = str(info.get("run_id") or path.name)
    return Run(run_id=run_id, path=path, status=status, config=config, info=info, train=Records(train),
               val=Records(val), error=error, problems=problems, has_summary=has_summary)


def find_run_dirs(root: str | Path) -> list[Path]:
    """Directories under `root` (or `root` itself) holding one of RUN_FILES, sorted; a run directory's own
    subfolders (checkpoints, tb) are not searched."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such runs directory")
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        if any(f in filenames for f in RUN_FILES):
            found.append(Path(dirpath))
            dirnames[:] = []
        else:
            dirnames[:] = sorted(d for d in dirnames if d not in NOT_RUNS and not d.startswith("."))
    return sorted(found)


def load_runs(root: str | Path) -> list[Run]:
    """Every run under `root` (see `find_run_dirs`), sorted by path; failed and incomplete runs included."""
    return [load_run(p) for p in find_run_dirs(root)]
