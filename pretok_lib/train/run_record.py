"""`runs/<id>/run.json`, the record of a training run (docs/RUNS.md): the one reader, torch-free, used by the
trainer (resume, skip completed), the sweep (what happened to a point) and the analysis; and `read_run_config`,
the one reader of the run's `config.yaml` as data (the trainer loads it as a `Config`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

RECORD_STATUSES = ("running", "completed", "interrupted", "failed")  # the values of run.json's "status"
FILE = "run.json"
CONFIG = "config.yaml"  # the run's resolved config, as the trainer saved it


def read_run_record(run_dir: str | os.PathLike, problems: list[str] | None = None) -> dict[str, Any] | None:
    """The run's record, or None when it is missing, unreadable or not a JSON object (why is appended to
    `problems` when given, e.g. "run.json: missing")."""
    path = Path(run_dir) / FILE
    why = None
    try:
        d = json.loads(path.read_text())
        if isinstance(d, dict):
            return d
        why = "not a JSON object"
    except FileNotFoundError:
        why = "missing"
    except (OSError, ValueError) as e:
        why = f"unreadable ({e.__class__.__name__})"
    if problems is not None:
        problems.append(f"{FILE}: {why}")
    return None


def read_run_config(run_dir: str | os.PathLike, problems: list[str] | None = None) -> dict[str, Any]:
    """A run's resolved `config.yaml` as plain nested dicts, {} when missing or unreadable (why is appended to
    `problems` when given). The one reader of the file as data (the trainer loads it as a `Config`)."""
    path = Path(run_dir) / CONFIG
    why = None
    try:
        loaded = yaml.safe_load(path.read_text())
        return loaded if isinstance(loaded, dict) else {}
    except FileNotFoundError:
        why = "missing"
    except (OSError, yaml.YAMLError) as e:
        why = f"unreadable ({e.__class__.__name__})"
    if problems is not None:
        problems.append(f"{CONFIG}: {why}")
    return {}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts (a run's config.yaml) as one level with dotted keys ({"a": {"b": 1}} -> {"a.b": 1})."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def run_status(run_dir: str | os.PathLike) -> str | None:
    """`status` of the run's record (one of RECORD_STATUSES), None if there is no readable record."""
    return (read_run_record(run_dir) or {}).get("status")


def run_error(run_dir: str | os.PathLike) -> str | None:
    """The error the run recorded, if any."""
    return (read_run_record(run_dir) or {}).get("error")
