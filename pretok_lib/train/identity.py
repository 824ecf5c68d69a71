"""A run directory belongs to one config: resuming it, or finding it complete, under another would mix two runs or
report the old one's results as the new one's. `changed(run_dir, cfg, world)` names what differs (docs/RUNS.md).

What may change between the attempts of one run (requeue, elastic resume, another node) is exempt: where the run
lives and what it is called, operational settings (loader workers, cache, checksum on open, logging, checkpoint
cadence, device), and the split of the global batch (micro-batch x ranks x accumulation: the product, recorded in
run.json, must stay). A value resolved at run time (`RESOLVED_AT_RUN_TIME`: `auto`, or unset, where the run recorded
what it resolved to) matches whatever was recorded; any other setting left out that the run had set is a change.
Existing paths compare after resolving links, and relative ones against the directory each attempt ran in
(run.json's `cwd`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from ..run_record import flatten, read_run_record
from .config import Config

EXEMPT_KEYS = {"name", "run.id", "run.dir", "run.overwrite", "data.num_workers", "data.verify_on_open",
               "data.cache_mb", "data.micro_batch", "train.grad_accum", "hardware.device"}
EXEMPT_SECTIONS = ("log.", "checkpoint.")
PATH_KEYS = {"data.path", "data.tokenizer", "eval.path"}
# Settings whose unset value (None / "auto") the run resolves itself; config.yaml records what it resolved to.
RESOLVED_AT_RUN_TIME = {"train.precision": "auto", "model.vocab_size": None, "model.intermediate_size": None,
                        "data.order": None}


def _path(p: Any, cwd: str | None = None) -> Any:
    """A local path that exists, resolved (links, and relative to `cwd`, default the working directory); anything
    else as written (URLs, names such as a tiktoken encoding, paths gone since)."""
    if isinstance(p, list):
        return [_path(x, cwd) for x in p]
    if isinstance(p, str) and p and "://" not in p:
        full = os.path.join(cwd, p) if cwd else p
        if os.path.exists(full):
            return os.path.realpath(full)
    return p


def _norm(key: str, v: Any, cwd: str | None = None) -> Any:
    if key in PATH_KEYS:
        return _path(v, cwd)
    if key == "data.mixture" and isinstance(v, list):
        return [{**e, "path": _path(e.get("path"), cwd)} if isinstance(e, dict) else e for e in v]
    return v


def _exempt(key: str) -> bool:
    return key in EXEMPT_KEYS or key.startswith(EXEMPT_SECTIONS)


def differences(saved: dict, new: dict, saved_cwd: str | None = None) -> list[str]:
    """`key: saved -> new` for every identity key (present in both) whose values differ; `saved_cwd`: the directory
    the saved config's relative paths were given in (default: the working directory, as the new config's)."""
    a, b = flatten(saved), flatten(new)
    out = []
    for key in sorted(a.keys() & b.keys()):
        if _exempt(key) or (key in RESOLVED_AT_RUN_TIME and b[key] == RESOLVED_AT_RUN_TIME[key]):
            continue
        old, cur = _norm(key, a[key], saved_cwd), _norm(key, b[key])
        if old != cur:
            out.append(f"{key}: {json.dumps(a[key], default=str)} -> {json.dumps(b[key], default=str)}")
    return out


def changed(run_dir: str | os.PathLike, cfg: Config, world: int) -> str | None:
    """Why `run_dir` (an earlier attempt: config.yaml, run.json) is not a run of `cfg` on `world` ranks; None when
    it is, or when it holds no earlier attempt. Unreadable records count as different (nothing is reused blind)."""
    run_dir = Path(run_dir)
    saved_cfg = run_dir / "config.yaml"
    if not saved_cfg.exists():
        return None
    try:
        saved = yaml.safe_load(saved_cfg.read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError, yaml.YAMLError) as e:
        return f"its config.yaml cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    record = read_run_record(run_dir) or {}
    diffs = differences(saved, cfg.to_dict(), record.get("cwd"))
    gb = record.get("global_batch", _summary_global_batch(run_dir))
    if gb is not None and gb != cfg.global_batch(world):
        diffs.append(f"global batch (micro-batch x ranks x grad_accum): {gb} -> {cfg.global_batch(world)}")
    if not diffs:
        return None
    shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
    return f"holds a run of another config ({shown})"


def _summary_global_batch(run_dir: Path) -> int | None:
    """The global batch a completed run recorded in summary.json (run.json holds it since 2026-11-26)."""
    try:
        return json.loads((run_dir / "summary.json").read_text())["global_batch"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def refusal(run_dir: str | os.PathLike, why: str) -> str:
    """The one-line error for a run directory that `changed` rejected."""
    return (f"{run_dir}: {why}: resuming it or reusing its results would mix two runs; run.overwrite=true starts "
            f"it over, or choose another run.id")
