"""Notebook parameters per study profile. Each notebook receives the parameters its `parameters` cell declares.

- quick: this laptop-class machine (2 CPU cores, no GPU), about 11 minutes: embedded 20 MB corpus, tiny model,
  gloo world sizes 1 and 2, every data path (3 interleaved repeats at world size 1), and fp32 vs bf16. Every run stops after the step that passes
  `train.time_budget_s` (45 s for notebook 03's run, 15 s per sweep point), so bf16 on a CPU that emulates it
  (training 10.6x slower, docs/STUDY.md) or a busy machine costs bounded time; tokens/s stay means over the steps
  measured. A vocabulary too large for those budgets gets a smaller model (budget.py, `model_fit`).
- full: real hardware: 500 MB corpus (or `--set corpus=... tokenizer=...`), the original study's model
  (configs/study.yaml), world sizes 1, 2, 4, ... up to the GPUs present.
- smoke: the smallest run that exercises every notebook (the notebook tests), about a minute.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..datapaths import BASELINE, DEFAULT, KINDS
from ..demo.corpus import SPECIAL_TOKENS
from ..errors import PretokError
from ..formats import CODEC_GRID, TRAIN_COMPRESSION
from ..launch.sweep import LAUNCHERS
from ..machine.cpu_affinity import usable_cpus
from ..train.config import _NONNEG, _ONE, _POS, Limit
from .budget import fit_runs

PATHS = list(KINDS)
CODECS = list(CODEC_GRID)
# The stall prediction of notebook 05: the original study's model at 35-45% MFU, supply as measured here
STALL = {"target_config": "configs/study.yaml", "target_vocab": 131072, "target_seq_len": None,
         "target_mfu": [0.35, 0.45], "cores_per_rank": None, "target_ranks": 1, "gpu_study": None}
# How the corpus is read and split (notebook 01; what `pretok tokenize` takes about the data): the study's own
# documents, so every profile has the same defaults
DATA = {"text_column": "text", "separator": None, "bos": "auto", "eos": "no", "heldout": 0.02}
QUIET_RUN = {"checkpoint.every": 0, "log.tensorboard": False}  # checkpoint at the end only, no TensorBoard files
# Sweep points are measurements: no transformers export (one fp32 copy of the weights per point; notebook 03's run
# exports, `pretok export runs/<id>` exports any point later).
NO_EXPORT = {"checkpoint.export": False}

PROFILES: dict[str, dict[str, Any]] = {
    "quick": {
        "corpus": "", "corpus_mb": 20.0, "tokenizer": "", "vocab_size": 8192, "seq_len": 256,
        **DATA,
        "compressions": CODECS, "workers": 2, "bench_loop_mb": 2.0, "bench_repeats": 3,
        "micro_batch": 8, "loader_workers": "0,2", "loader_batches": 500, "loader_slow_batches": 40,
        "loader_repeats": 3, "loader_pace_ms": 250.0, "loader_paced_batches": 8,   # pace: the CPU runs' step
        "config": "configs/tiny.yaml", "train_data_kind": DEFAULT, "train_world": 1,
        "train_overrides": {"train.steps": 60, "train.warmup_steps": 5, "eval.every": 20,
                            "train.time_budget_s": 45, **QUIET_RUN},
        # the world-1 paths repeated 3 times (interleaved): the packing gain and the speedups in training get
        # intervals; world 2 and the precisions once each (their findings say "not resolved" and why)
        "sweep_grids": [{"data": PATHS, "world": [1], "repeats": 3}, {"data": PATHS, "world": [2]},
                        {"data": [DEFAULT], "precision": ["fp32", "bf16"]}],
        "sweep_base": {"train.steps": 40, "train.warmup_steps": 5, "train.precision": "auto", "eval.every": 20,
                       "train.time_budget_s": 15, **QUIET_RUN, **NO_EXPORT},
        "launcher": "local", "sweep_prefix": "sweep", "sweep_timeout_s": 900, "sweep_repeats": 1,
        "target_loss": None, "png": True, **STALL,
    },
    "full": {
        "corpus": "", "corpus_mb": 500.0, "tokenizer": "", "vocab_size": 32768, "seq_len": 2048,
        **DATA,
        "compressions": CODECS, "workers": 0, "bench_loop_mb": 20.0, "bench_repeats": 3,  # workers 0: every CPU
        "micro_batch": 4, "loader_workers": "0,2,4", "loader_batches": 500, "loader_slow_batches": 20,
        "loader_repeats": 3, "loader_pace_ms": 200.0, "loader_paced_batches": 10,  # pace: a GPU step (~0.2 s)
        "config": "configs/study.yaml", "train_data_kind": DEFAULT, "train_world": 0,  # 0: every GPU
        "train_overrides": {"train.steps": 300, "eval.every": 100},
        "sweep_grids": [{"data": PATHS, "world": "gpus"},  # "gpus": 1, 2, 4, ... up to the GPUs present
                        {"data": [DEFAULT], "precision": ["fp32", "bf16"], "world": "max"},
                        {"data": [DEFAULT], "micro_batch": [1, 2, 4], "world": "max"}],
        "sweep_base": {"train.steps": 300, "train.precision": "auto", "eval.every": 100, "checkpoint.every": 100,
                       **NO_EXPORT},
        "launcher": "local", "sweep_prefix": "sweep", "sweep_timeout_s": None, "sweep_repeats": 3,
        "target_loss": None, "png": True, **STALL,
    },
    "smoke": {
        "corpus": "", "corpus_mb": 2.0, "tokenizer": "", "vocab_size": 1024, "seq_len": 64,
        **DATA,
        "compressions": ["none", TRAIN_COMPRESSION], "workers": 2, "bench_loop_mb": 0.3, "bench_repeats": 1,
        # micro_batch: the runs' (configs/tiny.yaml), so notebook 05 checks the stall model on them
        "micro_batch": 8, "loader_workers": "0", "loader_batches": 20, "loader_slow_batches": 3,
        "loader_repeats": 1, "loader_pace_ms": 20.0, "loader_paced_batches": 3,
        "config": "configs/tiny.yaml", "train_data_kind": DEFAULT, "train_world": 1,
        # 5 steps: 3 measured after the 2 warm-up records (log.skip_steps), the least a run's rates need
        "train_overrides": {"train.steps": 5, "train.warmup_steps": 1, "eval.every": 5, "eval.batches": 1,
                            "model.hidden_size": 64, "model.num_layers": 1, **QUIET_RUN},
        "sweep_grids": [{"data": [BASELINE, DEFAULT], "world": [1]}, {"data": [DEFAULT], "world": [2]}],
        "sweep_base": {"train.steps": 5, "train.warmup_steps": 1, "eval.every": 5, "eval.batches": 1,
                       "model.hidden_size": 64, "model.num_layers": 1, **QUIET_RUN, **NO_EXPORT},
        "launcher": "local", "sweep_prefix": "sweep", "sweep_timeout_s": 300, "sweep_repeats": 1,
        "target_loss": None, "png": True, **STALL,
    },
}


# The meaning of every notebook parameter (tests/study/test_study.py: each one a notebook declares is here, and every
# profile's value passes): its shapes ("number": int or float; "count": int; None: may be null), the range of its
# numbers (of a list's items too; every number finite) and, for text, what it must name. `pretok study --set` values
# are checked against it, and the training runs notebooks 03 and 04 would start against the trainer's config checks
# (`check_runs`), before the first notebook runs.
@dataclass(frozen=True)
class Param:
    shapes: tuple[str | None, ...]
    limit: Limit = Limit()
    text: tuple[str, Callable[[str], bool]] | None = None   # (what the text must be, its test)

    def __str__(self) -> str:
        shapes = " or ".join("null" if s is None else s for s in self.shapes)
        return " ".join(filter(None, [shapes, str(self.limit), self.text[0] if self.text else ""]))


def _accepted(check: Callable[[str], Any], text: str) -> bool:
    """Whether `check(text)` raises no PretokError."""
    try:
        check(text)
    except PretokError:
        return False
    return True


def _codec(text: str) -> bool:
    from ..formats.parquet import parse_compression

    return _accepted(parse_compression, text)


def _counts(text: str) -> bool:
    return re.fullmatch(r"\s*[0-9]+\s*(,\s*[0-9]+\s*)*", text) is not None


def _regex(text: str) -> bool:
    from ..sources import compile_separator

    return _accepted(compile_separator, text)


def _one_of(*choices: str) -> tuple[str, Callable[[str], bool]]:
    return f"({' | '.join(choices)})", lambda text: text in choices


_NAME = ("(letters, digits, . _ + -: the start of run ids)",
         lambda text: re.fullmatch(r"[A-Za-z0-9._+-]*", text) is not None)
_FILE = ("(a path, not empty)", bool)
PARAMETERS: dict[str, Param] = {
    "study_dir": Param(("text",), text=_FILE),
    "corpus": Param(("text", "list of text")),                            # files or globs; "": the default corpus
    "text_column": Param(("text",), text=("(a parquet column / JSON key, not empty)", bool)),
    "separator": Param(("text", None), text=("(a Python regex that matches no empty string: '\\n\\n+')", _regex)),
    "bos": Param(("text",), text=_one_of("auto", "yes", "no")), "eos": Param(("text",), text=_one_of("yes", "no")),
    "heldout": Param(("number",), Limit(0, 0.5, lo_open=True)),          # fraction of documents held out
    "corpus_mb": Param(("number",), _POS), "tokenizer": Param(("text",)),
    "vocab_size": Param(("count",), Limit(256 + len(SPECIAL_TOKENS))),   # the bytes and the special tokens
    "seq_len": Param(("count",), _ONE),
    "compressions": Param(("list of text",), text=("(parquet codecs: none, snappy, zstd:3, ...)", _codec)),
    "workers": Param(("count",), _NONNEG),                                # 0: every CPU
    "bench_loop_mb": Param(("number",), _POS), "micro_batch": Param(("count",), _ONE),
    "loader_workers": Param(("text", "count"), _NONNEG, ("(comma-separated counts >= 0: 0,2)", _counts)),
    "loader_batches": Param(("count",), _ONE), "loader_slow_batches": Param(("count",), _ONE),
    "loader_repeats": Param(("count",), _ONE), "bench_repeats": Param(("count",), _ONE),
    "loader_pace_ms": Param(("number",), _NONNEG), "loader_paced_batches": Param(("count",), _ONE),  # 0 ms: none
    "config": Param(("text",), text=_FILE), "train_data_kind": Param(("text",), text=_one_of(*KINDS)),
    "train_world": Param(("count",), _NONNEG),                            # 0: every GPU
    "train_overrides": Param(("mapping",)), "sweep_grids": Param(("list of mappings",)),
    "sweep_base": Param(("mapping",)),                                    # these three: `check_runs`
    "launcher": Param(("text",), text=_one_of(*LAUNCHERS)), "sweep_prefix": Param(("text",), text=_NAME),
    "sweep_timeout_s": Param(("number", None), _POS), "sweep_repeats": Param(("count",), _ONE),
    "target_loss": Param(("number", None), _NONNEG),
    "png": Param(("bool",)), "target_config": Param(("text",), text=_FILE),
    "target_vocab": Param(("count", None), _ONE), "target_seq_len": Param(("count", None), _ONE),
    "target_mfu": Param(("list of numbers",), Limit(0, 1, lo_open=True)),
    "cores_per_rank": Param(("count", None), _ONE), "target_ranks": Param(("count",), _ONE),
    "gpu_study": Param(("text", None), text=_FILE),                       # a `pretok gpu-study` JSON
}


def _is(value: Any, kind: str | None) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {None: value is None, "text": isinstance(value, str), "number": number,
            "count": number and isinstance(value, int), "bool": isinstance(value, bool),
            "mapping": isinstance(value, dict),
            "list of text": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "list of numbers": isinstance(value, list) and bool(value) and all(_is(v, "number") for v in value),
            "list of mappings": isinstance(value, list) and all(isinstance(v, dict) for v in value)}[kind]


def takes(name: str, value: Any) -> bool:
    """Whether parameter `name` takes `value`: one of its shapes, its numbers finite and in range, its texts valid."""
    p = PARAMETERS[name]
    if not any(_is(value, s) for s in p.shapes):
        return False
    items = value if isinstance(value, list) else [value]
    numbers = [v for v in items if _is(v, "number")]
    texts = [v for v in items if isinstance(v, str)]
    return (all(math.isfinite(v) and p.limit.allows(v) for v in numbers) and not any("\x00" in t for t in texts)
            and (p.text is None or all(p.text[1](t) for t in texts)))  # NUL: no path, argv or name holds one


def check_parameters(values: dict[str, Any]) -> None:
    """PretokError (one line) naming every value its parameter does not take (`seq_len=0` failed notebook 01 in a
    cell after the corpus was built; `target_mfu=0.4` for [0.35, 0.45] failed notebook 05, then the report)."""
    bad = [f"{k}={v!r} (takes {PARAMETERS[k]})" for k, v in values.items() if k in PARAMETERS and not takes(k, v)]
    if bad:
        raise PretokError("notebook parameter(s) not taken: " + "; ".join(bad))


def check_runs(params: dict[str, Any], notebooks: Sequence[str]) -> None:
    """Every training run that notebook 03 (`train_overrides`, ...) and 04 (`sweep_grids`, `sweep_base`, ...) of
    `notebooks` would start, its config checked as its run will check it (train/config.py, through
    `sweep.check_points`) with stand-ins for what notebook 01 makes (dataset paths, tokenizer): one line naming the
    notebook and run, before any notebook runs."""
    from ..launch.sweep import point_problem
    from .datasets import HELDOUT_FORMATS
    from .steps import resolve, sweep_points, train_points

    made = "<made by notebook 01>"
    index = {"tokenizer": params["tokenizer"] or made, "seq_len": params["seq_len"],
             "paths": dict.fromkeys(KINDS, made), "eval": dict.fromkeys(HELDOUT_FORMATS, made)}
    runs = resolve(params["study_dir"]) / "runs"
    planned = {"03_train": lambda: train_points(index, params["train_data_kind"], params["train_world"],
                                                params["train_overrides"]),
               "04_sweep": lambda: sweep_points(index, params["sweep_grids"], params["sweep_base"],
                                                params["sweep_prefix"])}
    config = resolve(params["config"])
    for name, points in planned.items():
        if name in notebooks:
            if not config.is_file():
                raise PretokError("config: config file not found", config)
            for p in points():
                if problem := point_problem(config, p, runs):
                    raise PretokError(f"notebook {name} would start run {p.run_id} of a config its trainer "
                                      f"refuses: {problem}", config)
    if "05_analysis" in notebooks and not resolve(params["target_config"]).is_file():
        raise PretokError("target_config: config file not found", resolve(params["target_config"]))


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
    """The parameters of `profile` with `overrides`, machine-dependent values resolved ("gpus", "max", 0), and
    the runs' model fitted to their time budgets (`budget.fit_runs`; recorded as `model_fit`)."""
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
    if fitted := fit_runs(p):   # a model that fits the runs' time budgets with this vocabulary (budget.py)
        p["model_fit"] = fitted
    return p
