"""Synthetic run directories written exactly as docs/RUNS.md specifies (config.yaml, run.json, metrics.jsonl,
summary.json), with numbers chosen so that derived values can be computed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml


def train_record(step: int, wall_s: float, *, tokens_per_s: float = 1000.0, eff_frac: float = 0.8,
                 loss: float = 3.0, mfu: float | None = 0.1, data_stall: float = 0.2, world_size: int = 1,
                 tokens: int = 256, peak_mem_mb: float = 500.0, padding_frac: float | None = None) -> dict:
    """One `kind: train` record with every key of the contract."""
    step_time = tokens / tokens_per_s
    eff = tokens_per_s * eff_frac
    return {"kind": "train", "step": step, "wall_s": wall_s, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
            "step_time_s": step_time, "data_wait_s": data_stall * step_time, "data_stall": data_stall,
            "tokens": tokens, "effective_tokens": int(tokens * eff_frac),
            "padding_frac": 1 - eff_frac if padding_frac is None else padding_frac, "masked_frac": 0.0,
            "tokens_per_s": tokens_per_s, "tokens_per_s_per_device": tokens_per_s / world_size,
            "effective_tokens_per_s": eff, "mfu": mfu, "peak_mem_mb": peak_mem_mb,
            "cum_tokens": tokens * step, "cum_effective_tokens": int(tokens * eff_frac) * step, "samples": 4 * step}


def val_record(step: int, wall_s: float, val_loss: float) -> dict:
    """One `kind: val` record."""
    return {"kind": "val", "step": step, "wall_s": wall_s, "val_loss": val_loss, "val_ppl": math.exp(val_loss),
            "val_tokens": 1024}


def write_run(root: Path, run_id: str, *, kind: str = "padded", world_size: int = 1, status: str = "completed",
              train: list[dict] | None = None, val: list[dict] | None = None, precision: str = "fp32",
              micro_batch: int = 4, seq_len: int = 64, seed: int = 0, error: str | None = None,
              summary: bool | None = None, raw_tail: str = "", config_extra: dict | None = None) -> Path:
    """A run directory. `summary` defaults to (status == completed); `raw_tail` is appended verbatim to
    metrics.jsonl (e.g. a truncated line)."""
    d = root / run_id
    d.mkdir(parents=True)
    config: dict[str, Any] = {
        "run": {"id": run_id, "dir": str(root)}, "seed": seed,
        "data": {"kind": kind, "path": f"/data/{kind}", "seq_len": seq_len, "micro_batch": micro_batch,
                 "num_workers": 2 if kind in ("padded", "padding-free") else 0},
        "model": {"n_layer": 2, "n_embd": 64}, "train": {"steps": 40, "precision": precision, "lr": 1e-3},
        "eval": {"every": 10}, "log": {"every": 5}, **(config_extra or {})}
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    info = {"run_id": run_id, "version": 1, "status": status, "error": error, "started": "2025-01-01T00:00:00Z",
            "finished": None if status == "running" else "2025-01-01T00:10:00Z", "world_size": world_size,
            "device": "cpu", "device_name": "cpu", "backend": "gloo" if world_size > 1 else None,
            "git_commit": None, "versions": {"python": "3.11"}, "host": "test", "slurm": {}}
    (d / "run.json").write_text(json.dumps(info))
    lines = [json.dumps(r) for r in (train or []) + (val or [])]
    lines.sort(key=lambda s: json.loads(s)["step"])
    (d / "metrics.jsonl").write_text("".join(x + "\n" for x in lines) + raw_tail)
    if summary if summary is not None else status == "completed":
        # deliberately wrong numbers: the analysis must never read them
        (d / "summary.json").write_text(json.dumps({"status": "completed", "tokens_per_s": -1.0,
                                                    "effective_tokens_per_s": -1.0, "final_loss": -1.0}))
    return d


def simple_run(root: Path, run_id: str, *, tokens_per_s: float, n: int = 6, loss0: float = 4.0, **kw: Any) -> Path:
    """A run of `n` logged train steps (every 5 steps, 1 s apart) at a constant rate, loss falling by 0.25 per
    record, and val every 2 records (val loss = train loss + 0.1). Other keywords go to `write_run` (and
    `eff_frac`, `mfu`, `data_stall`, `peak_mem_mb` to every train record)."""
    rec_kw = {k: kw.pop(k) for k in ("eff_frac", "mfu", "data_stall", "peak_mem_mb") if k in kw}
    ws = kw.get("world_size", 1)
    train = [train_record(5 * (i + 1), float(i + 1), tokens_per_s=tokens_per_s, loss=loss0 - 0.25 * i,
                          world_size=ws, **rec_kw) for i in range(n)]
    val = [val_record(5 * (i + 1), float(i + 1) + 0.5, loss0 - 0.25 * i + 0.1) for i in range(1, n, 2)]
    return write_run(root, run_id, train=train, val=val, **kw)


def study(root: Path) -> Path:
    """A small study: five data paths at world size 1 and 2, a seed repeat, a failed and an incomplete run, a
    bf16 variant and a larger-batch variant."""
    rates = {"padded": 1000.0, "padding-free": 1200.0, "pretok-padded": 1500.0, "pretok-token-list": 1800.0,
             "pretok-memmap": 1900.0}
    for kind, r in rates.items():
        eff = 0.6 if "padded" in kind else 0.99
        simple_run(root, f"{kind}-n1", kind=kind, tokens_per_s=r, eff_frac=eff)
        simple_run(root, f"{kind}-n2", kind=kind, tokens_per_s=1.8 * r, eff_frac=eff, world_size=2)
    simple_run(root, "pretok-memmap-n1-seed1", kind="pretok-memmap", tokens_per_s=2100.0, eff_frac=0.99, seed=1)
    simple_run(root, "pretok-memmap-n1-bf16", kind="pretok-memmap", tokens_per_s=3000.0, eff_frac=0.99,
               precision="bf16", peak_mem_mb=300.0, mfu=0.2)
    simple_run(root, "pretok-memmap-n1-b16", kind="pretok-memmap", tokens_per_s=2500.0, eff_frac=0.99,
               micro_batch=16, loss0=3.8)
    simple_run(root, "padded-failed", kind="padded", tokens_per_s=900.0, n=3, status="failed",
               error="RuntimeError: out of memory", micro_batch=32)
    simple_run(root, "padded-running", kind="padded", tokens_per_s=950.0, n=2, status="running", micro_batch=64,
               raw_tail='{"kind": "train", "step": 15, "wall_s": 3.0, "lo')
    return root


def add_own_val(run_dir: Path, offset: float) -> Path:
    """Give every val record of a run `val_loss_own` = val_loss + `offset` (eval.own_path: its own layout)."""
    path = run_dir / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in recs:
        if r["kind"] == "val":
            r.update(val_loss_own=r["val_loss"] + offset, val_ppl_own=math.exp(r["val_loss"] + offset),
                     val_tokens_own=512)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run_dir
