"""Notebook parameters per study profile. Each notebook receives the parameters its `parameters` cell declares.

- quick: this laptop-class machine (2 CPU cores, no GPU), under 10 minutes: embedded 20 MB corpus, tiny model,
  gloo world sizes 1 and 2, every data path, and fp32 vs bf16. Every run stops after the step that passes
  `train.time_budget_s` (45 s for notebook 03's run, 15 s per sweep point), so bf16 on a CPU that emulates it
  (a step ~12x slower) or a busy machine costs bounded time; tokens/s stay means over the steps measured.
- full: real hardware: 500 MB corpus (or `--set corpus=... tokenizer=...`), the original study's model
  (configs/study.yaml), world sizes 1, 2, 4, ... up to the GPUs present.
- smoke: the smallest run that exercises every notebook (the notebook tests), about a minute.
"""

from __future__ import annotations

import copy
from typing import Any

from ..cpu_affinity import usable_cpus
from ..errors import PretokError
from ..datapaths import KINDS

PATHS = list(KINDS)
CODECS = ["none", "snappy", "zstd:3", "zstd:22"]
# The stall prediction of notebook 05: the original study's model at 35-45% MFU, supply as measured here
STALL = {"target_config": "configs/study.yaml", "target_vocab": None, "target_seq_len": None,
         "target_mfu": [0.35, 0.45], "cores_per_rank": None}
QUIET_RUN = {"checkpoint.every": 0, "log.tensorboard": False}  # checkpoint at the end only, no TensorBoard files
# Sweep points are measurements: no transformers export (one fp32 copy of the weights per point; notebook 03's run
# exports, `pretok export runs/<id>` exports any point later).
NO_EXPORT = {"checkpoint.export": False}

PROFILES: dict[str, dict[str, Any]] = {
    "quick": {
        "corpus": "", "corpus_mb": 20.0, "tokenizer": "", "vocab_size": 8192, "seq_len": 256,
        "compressions": CODECS, "workers": 2, "bench_loop_mb": 2.0,
        "micro_batch": 8, "loader_workers": "0,2", "loader_batches": 500, "loader_slow_batches": 40,
        "loader_repeats": 1,
        "config": "configs/tiny.yaml", "train_data_kind": "pretok-memmap", "train_world": 1,
        "train_overrides": {"train.steps": 60, "train.warmup_steps": 5, "eval.every": 20,
                            "train.time_budget_s": 45, **QUIET_RUN},
        "sweep_grids": [{"data": PATHS, "world": [1, 2]},
                        {"data": ["pretok-memmap"], "precision": ["fp32", "bf16"]}],
        "sweep_base": {"train.steps": 40, "train.warmup_steps": 5, "train.precision": "auto", "eval.every": 20,
                       "train.time_budget_s": 15, **QUIET_RUN, **NO_EXPORT},
        "launcher": "local", "sweep_prefix": "sweep", "sweep_timeout_s": 900, "sweep_repeats": 1,
        "target_loss": None, "png": True, **STALL,
    },
    "full": {
        "corpus": "", "corpus_mb": 500.0, "tokenizer": "", "vocab_size": 32768, "seq_len": 2048,
        "compressions": CODECS, "workers": 0, "bench_loop_mb": 20.0,  # workers 0: every CPU
        "micro_batch": 4, "loader_workers": "0,2,4", "loader_batches": 500, "loader_slow_batches": 20,
        "loader_repeats": 3,
        "config": "configs/study.yaml", "train_data_kind": "pretok-memmap", "train_world": 0,  # 0: every GPU
        "train_overrides": {"train.steps": 300, "eval.every": 100},
        "sweep_grids": [{"data": PATHS, "world": "gpus"},  # "gpus": 1, 2, 4, ... up to the GPUs present
                        {"data": ["pretok-memmap"], "precision": ["fp32", "bf16"], "world": "max"},
                        {"data": ["pretok-memmap"], "micro_batch": [1, 2, 4], "world": "max"}],
        "sweep_base": {"train.steps": 300, "train.precision": "auto", "eval.every": 100, "checkpoint.every": 100,
                       **NO_EXPORT},
        "launcher": "local", "sweep_prefix": "sweep", "sweep_timeout_s": None, "sweep_repeats": 3,
        "target_loss": None, "png": True, **STALL,
    },
    "smoke": {
        "corpus": "", "corpus_mb": 2.0, "tokenizer": "", "vocab_size": 1024, "seq_len": 64,
        "compressions": ["none", "zstd:3"], "workers": 2, "bench_loop_mb": 0.3,
        "micro_batch": 4, "loader_workers": "0", "loader_batches": 20, "loader_slow_batches": 3,
        "loader_repeats": 1,
        "config": "configs/tiny.yaml", "train_data_kind": "pretok-memmap", "train_world": 1,
        "train_overrides": {"train.steps": 3, "train.warmup_steps": 1, "eval.every": 3, "eval.batches": 1,
                            "model.hidden_size": 64, "model.num_layers": 1, **QUIET_RUN},
        "sweep_grids": [{"data": ["padded", "pretok-memmap"], "world": [1]}, {"data": ["pretok-memmap"], "world": [2]}],
        "sweep_base": {"train.steps": 2, "train.warmup_steps": 1, "eval.every": 2, "eval.batches": 1,
                       "model.hidden_size": 64, "model.num_layers": 1, **QUIET_RUN, **NO_EXPORT},
        "launcher": "local", "sweep_prefix": "sweep", "sweep_timeout_s": 300, "sweep_repeats": 1,
        "target_loss": None, "png": True, **STALL,
    },
}


# The shape of every notebook parameter (tests/test_study.py: each one a notebook declares is here): `pretok study
# --set` values are checked against it before anything runs. "number": int or float; "count": int; None: may be null.
PARAMETER_TYPES: dict[str, tuple] = {
    "study_dir": ("text",), "corpus": ("text",), "corpus_mb": ("number",), "tokenizer": ("text",),
    "vocab_size": ("count",), "seq_len": ("count",), "compressions": ("list of text",), "workers": ("count",),
    "bench_loop_mb": ("number",), "micro_batch": ("count",), "loader_workers": ("text", "count"),
    "loader_batches": ("count",), "loader_slow_batches": ("count",), "loader_repeats": ("count",),
    "config": ("text",), "train_data_kind": ("text",), "train_world": ("count",), "train_overrides": ("mapping",),
    "sweep_grids": ("list of mappings",), "sweep_base": ("mapping",), "launcher": ("text",),
    "sweep_prefix": ("text",), "sweep_timeout_s": ("number", None), "sweep_repeats": ("count",),
    "target_loss": ("number", None),
    "png": ("bool",), "target_config": ("text",), "target_vocab": ("count", None), "target_seq_len": ("count", None),
    "target_mfu": ("list of numbers",), "cores_per_rank": ("count", None),
}


def _is(value: Any, kind: str | None) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {None: value is None, "text": isinstance(value, str), "number": number,
            "count": number and float(value).is_integer(), "bool": isinstance(value, bool),
            "mapping": isinstance(value, dict),
            "list of text": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "list of numbers": isinstance(value, list) and bool(value) and all(_is(v, "number") for v in value),
            "list of mappings": isinstance(value, list) and all(isinstance(v, dict) for v in value)}[kind]


def check_parameters(values: dict[str, Any]) -> None:
    """PretokError (one line) naming every value whose shape its parameter does not take (`target_mfu=0.4` for
    [0.35, 0.45] failed notebook 05 and then the report with a TypeError traceback)."""
    bad = [f"{k}={v!r} (takes {' or '.join('null' if t is None else t for t in PARAMETER_TYPES[k])})"
           for k, v in values.items() if k in PARAMETER_TYPES and not any(_is(v, t) for t in PARAMETER_TYPES[k])]
    if bad:
        raise PretokError("notebook parameter(s) of the wrong shape: " + "; ".join(bad))


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def world_sizes(n: int) -> list[int]:
    """1, 2, 4, ... below `n`, then `n` itself (at least [1])."""
    out, w = [], 1
    while w < n:
        out.append(w)
        w *= 2
    return out + [max(1, n)]


def profile_parameters(profile: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parameters of `profile` with `overrides`, machine-dependent values resolved ("gpus", "max", 0)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown study profile '{profile}' (choose from {', '.join(PROFILES)})")
    p = copy.deepcopy(PROFILES[profile])
    p.update(overrides or {})
    gpus = gpu_count()
    worlds = world_sizes(gpus) if gpus else [1, 2]
    if p.get("workers") == 0:
        p["workers"] = usable_cpus()
    if p.get("train_world") == 0:
        p["train_world"] = worlds[-1]
    for g in p.get("sweep_grids", []):
        if g.get("world") == "gpus":
            g["world"] = worlds
        elif g.get("world") == "max":
            g["world"] = [worlds[-1]]
    return p
