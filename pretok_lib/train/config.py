"""Training configuration: dataclasses, a YAML file, dotted CLI overrides, checked (unknown keys, types)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..datapaths import DEFAULT, ON_THE_FLY, PARQUET_KINDS, PRETOK_PADDED, global_batch
from ..errors import PretokError
from . import strict_yaml

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SKIP_STEPS = 2  # log.skip_steps: the warm-up steps every summary of a run leaves out (trainer, analysis, measure)


@dataclass
class RunConfig:
    id: str | None = None          # directory name under `dir`; default: <config name>-<UTC time>
    dir: str = "runs"
    seed: int = 0
    overwrite: bool = False         # start over even when the run directory holds a completed run


@dataclass
class ModelConfig:
    """A Llama-style decoder (grouped-query attention, RoPE, SwiGLU, RMSNorm) built with transformers."""
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int | None = None   # default: Llama's 8/3·hidden rounded up to a multiple of 64
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    vocab_size: int | None = None           # default: the tokenizer's, rounded up to vocab_multiple
    vocab_multiple: int = 64
    init_std: float = 0.02


@dataclass
class MixtureEntry:
    """One dataset of `data.mixture` (docs/MIXTURES.md): a `pretok tokenize` output dir and its weight."""
    path: str = ""
    weight: float | None = None     # relative: the weights need not sum to 1


@dataclass
class DataConfig:
    kind: str = DEFAULT             # one of pretok_lib.data.KINDS
    path: str | list[str] = ""      # a `pretok tokenize` output dir, or text inputs for the on-the-fly baselines
    tokenizer: str | None = None    # required by the baselines; checked against pretokenized data when given
    seq_len: int = 256
    micro_batch: int = 8            # per device
    num_workers: int = 0            # DataLoader workers (0 is fastest for pretokenized paths: docs/BENCHMARKS.md)
    shuffle: bool = True
    text_column: str = "text"
    bos: str = "auto"               # on-the-fly baselines: BOS/EOS/separator as `pretok tokenize --bos/--eos/
    eos: str = "no"                 #   --separator` (auto|yes|no; yes|no; a regex splitting .txt inputs);
    separator: str | None = None    #   pretokenized data carries its own policy (manifest)
    verify_on_open: bool = False    # pretokenized data: check files against manifest checksums at open
    mixture: list[MixtureEntry] = field(default_factory=list)  # instead of path: weighted pretokenized datasets
    mixture_exhausted: str = "epoch"   # a mixture's dataset that runs out: epoch (wraps it) | stop (ends the epoch)
    order: str | None = None        # block | exact; default: block for the parquet paths (row groups shuffled
    #                                 block_groups at a time; exact on data of <= block_groups row groups), else exact
    block_groups: int = 16          # row groups per window of the block order
    cache_mb: float = 128           # parquet paths: decoded row groups kept per process (rank, DataLoader worker)


@dataclass
class TrainConfig:
    steps: int = 100                # optimizer steps
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"        # cosine | constant (both after linear warmup)
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0          # 0 disables clipping
    precision: str = "auto"         # auto | fp32 | bf16 | fp16 (autocast; fp16 with a gradient scaler); auto: bf16
    #                                 where the hardware computes it natively (most GPUs, AMX CPUs), else fp32
    time_budget_s: float | None = None  # stop early, completed, after the step that passes this much training time
    tf32: bool = True               # CUDA: fp32 matmuls on TF32 tensor cores (the datasheet's fp32 peak assumes it);
    #                                 false: IEEE fp32, MFU against a measured fp32 matmul rate
    compile: bool = False
    activation_checkpointing: bool = False
    gc_every: int = 50              # Python GC in the loop: automatic collection off, young generations every N steps
    #                                 on every rank, a full one at checkpoints and evals (collector.py); 0: automatic
    target_loss: float | None = None   # time-to-target is reported when set


@dataclass
class EvalConfig:
    kind: str = DEFAULT             # the held-out split; the same for every data path so losses compare
    path: str | None = None         # no validation when empty
    every: int = 50
    batches: int = 8                # global batches (micro_batch x ranks x grad_accum samples each)
    own_kind: str = PRETOK_PADDED    # a second held-out split in the training data's own layout (padded paths:
    own_path: str | None = None     # one document per row); its loss is val_loss_own beside val_loss. None: none


YES_NO_KEYS = ("bos", "eos")   # str settings of auto|yes|no that YAML may read as booleans


@dataclass
class LogConfig:
    every: int = 1
    tensorboard: bool = True
    skip_steps: int = SKIP_STEPS    # first steps left out of the summary means (compile, warm caches)
    tracking: list[str] = field(default_factory=list)  # trackers beside TensorBoard: mlflow, wandb (train/tracking.py)
    mlflow_uri: str | None = None   # default: a file store in <run.dir>/mlruns
    wandb_mode: str = "offline"     # offline (written under the run: `wandb sync` it), online, disabled
    experiment: str | None = None   # MLflow experiment / W&B project; default: the config's name
    profile_step: int = 0           # > 0: that step runs under torch.profiler; <run>/profile-step<N>.{txt,json}


@dataclass
class CheckpointConfig:
    every: int = 50                 # 0: only at the end and on SIGTERM/SIGUSR1
    keep: int = 2
    resume: bool = True             # continue from the newest checkpoint in the run directory (false: start
    #                                 over, deleting the run directory's checkpoints first)
    export: bool = True             # a completed run writes <run>/hf: transformers model + tokenizer (export.py)
    at_end: bool = True             # false: no checkpoint at the last step (a measurement run nothing resumes;
    #                                 a stop signal still writes one)


@dataclass
class HardwareConfig:
    peak_tflops: float | None = None   # per-device peak for MFU; default from the device table
    device: str | None = None          # default: cuda:<local rank> when available, else cpu


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    name: str = "run"                  # config name (file stem), used for default run ids

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def global_batch(self, world: int) -> int:
        """Sequences per optimizer step: micro-batch x ranks x gradient-accumulation steps."""
        return global_batch(self.data.micro_batch, world, self.train.grad_accum)


def _check_value(where: str, value, tp, source: str):
    """`value` converted to the annotated type `tp`, or a one-line error."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_value(where, value, a, source)
            except PretokError as e:
                errors.append(e)
        raise errors[0]
    if dataclasses.is_dataclass(tp):
        obj = tp()
        _merge(obj, value, where, source)
        return obj
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise PretokError(f"{where}: expected a list, got {type(value).__name__} {value!r}", source)
        return [_check_value(f"{where}[{i}]", v, item, source) for i, v in enumerate(value)]
    if tp is str and isinstance(value, bool) and where.rsplit(".", 1)[-1] in YES_NO_KEYS:
        return "yes" if value else "no"          # YAML 1.1 reads `bos: yes` as true
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):   # YAML 1.1 reads 1e-3 as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is bool and not isinstance(value, bool) or tp is not bool and isinstance(value, bool) \
            or not isinstance(value, tp):
        raise PretokError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}", source)
    return value


def _merge(obj, data: dict, prefix: str, source: str) -> None:
    if not isinstance(data, dict):
        raise PretokError(f"{prefix or 'config'}: expected a mapping, got {data!r}", source)
    hints = typing.get_type_hints(type(obj))
    prefix = f"{prefix}." if prefix else ""
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in names:
            raise PretokError(f"unknown config key '{where}' (known: {', '.join(sorted(names))})", source)
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _merge(current, value, where, source)
        else:
            setattr(obj, key, _check_value(where, value, hints[key], source))


def _set_dotted(raw: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise PretokError(f"override '{dotted}': '{k}' is not a section")
    node[keys[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """The config in YAML file `path` (optional) with `key.sub=value` overrides (values parsed as YAML)."""
    raw: dict = {}
    source = str(path) if path else "overrides"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise PretokError("config file not found", p)
        try:
            raw = strict_yaml.load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise PretokError(f"not valid YAML ({str(e).strip().splitlines()[0]})", p) from None
    if not isinstance(raw, dict):
        raise PretokError("a config must be a YAML mapping of sections", source)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise PretokError(f"override '{item}' is not of the form section.key=value")
        try:
            value = strict_yaml.load(text) if text.strip() else None
        except yaml.YAMLError as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PretokError(f"override '{item}': the value is not YAML ({first}); quote it to pass it as text") \
                from None
        _set_dotted(raw, key.strip(), value)
    _drop_replaced_alternatives(raw, {item.partition("=")[0].strip() for item in overrides})
    cfg = Config(name=Path(path).stem if path else "run")
    _merge(cfg, raw, "", source)
    validate(cfg, source)
    return cfg


# Keys of which a config gives one: an override of one replaces the other where the file gives it (a
# `data.mixture=...` on the command line trains on the mixture instead of the file's `data.path`); both as
# overrides, or both in the file, stay an error.
ALTERNATIVES = {"data.mixture": "data.path", "data.path": "data.mixture"}


def _drop_replaced_alternatives(raw: dict, overridden: set[str]) -> None:
    for key in overridden:
        other = ALTERNATIVES.get(key)
        if other and other not in overridden:
            section, name = other.split(".")
            if isinstance(raw.get(section), dict):
                raw[section].pop(name, None)


def validate(cfg: Config, source: str = "config") -> None:
    """Cross-field checks a type check cannot do."""
    from ..datapaths import KINDS

    def bad(msg: str):
        raise PretokError(msg, source)

    check_limits(cfg, source)
    if cfg.data.kind not in KINDS:
        bad(f"data.kind '{cfg.data.kind}' is not one of {', '.join(KINDS)}")
    if cfg.data.mixture:
        validate_mixture(cfg, bad)
    elif not cfg.data.path:
        bad("data.path is empty: give a `pretok tokenize` output dir (or text inputs for the baselines)")
    if cfg.data.kind in ON_THE_FLY and not cfg.data.tokenizer:
        bad(f"data.kind '{cfg.data.kind}' tokenizes on the fly: set data.tokenizer")
    for key, kind, path in (("eval.kind", cfg.eval.kind, cfg.eval.path),
                            ("eval.own_kind", cfg.eval.own_kind, cfg.eval.own_path)):
        if path and kind not in KINDS:
            bad(f"{key} '{kind}' is not one of {', '.join(KINDS)}")
        if path and kind in ON_THE_FLY and not cfg.data.tokenizer:
            bad(f"{key} '{kind}' tokenizes on the fly: set data.tokenizer")
    if cfg.eval.own_path and not cfg.eval.path:
        bad("eval.own_path is set but eval.path is empty: the own-layout loss is logged beside val_loss")
    if cfg.data.bos not in ("auto", "yes", "no") or cfg.data.eos not in ("yes", "no"):
        bad(f"data.bos '{cfg.data.bos}' / data.eos '{cfg.data.eos}': bos is auto, yes or no; eos yes or no "
            "(as pretok tokenize --bos/--eos)")
    if cfg.train.precision not in PRECISIONS:
        bad(f"train.precision '{cfg.train.precision}' is not one of {', '.join(PRECISIONS)}")
    if cfg.log.tracking:
        from .tracking import check_tracking

        if why := check_tracking(cfg.log.tracking, cfg.log.wandb_mode):
            bad(why)
    if cfg.data.order not in (None, "exact", "block"):
        bad(f"data.order '{cfg.data.order}' is not exact or block")
    if cfg.data.order == "block" and cfg.data.kind not in PARQUET_KINDS:
        bad(f"data.order '{cfg.data.order}' applies to the parquet paths ({', '.join(PARQUET_KINDS)}), "
            f"not data.kind '{cfg.data.kind}'")
    if cfg.train.schedule not in ("cosine", "constant"):
        bad(f"train.schedule '{cfg.train.schedule}' is not cosine or constant")
    m = cfg.model
    if m.hidden_size % m.num_heads or m.num_heads % m.num_kv_heads:
        bad(f"model: hidden_size {m.hidden_size} must divide by num_heads {m.num_heads}, "
            f"and num_heads by num_kv_heads {m.num_kv_heads}")
    if cfg.run.id is not None and ("/" in cfg.run.id or cfg.run.id in ("", ".", "..")):
        bad(f"run.id '{cfg.run.id}' must be a plain directory name")


def validate_mixture(cfg: Config, bad) -> None:
    d = cfg.data
    if d.path:
        bad("give data.path or data.mixture, not both")
    if d.kind in ON_THE_FLY:
        bad(f"data.mixture mixes pretokenized datasets; data.kind '{d.kind}' tokenizes on the fly")
    if d.mixture_exhausted not in ("epoch", "stop"):
        bad(f"data.mixture_exhausted '{d.mixture_exhausted}' is not epoch or stop")
    for i, e in enumerate(d.mixture):
        if not e.path:
            bad(f"data.mixture[{i}].path is empty: give a `pretok tokenize` output dir")
        if e.weight is None:
            bad(f"data.mixture[{i}].weight is missing: give each dataset a weight > 0")
    seen: dict[str, int] = {}
    for i, e in enumerate(d.mixture):   # twice, it would repeat each sample back to back (one order per dataset)
        real = os.path.realpath(e.path) if e.path and "://" not in e.path else e.path
        if real in seen:
            bad(f"data.mixture[{i}].path is data.mixture[{seen[real]}]'s dataset again: give it once, with the "
                "sum of the weights")
        seen[real] = i


@dataclass(frozen=True)
class Limit:
    """The allowed range of a number in the config (every number must also be finite)."""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False           # `lo` itself not allowed
    hi_open: bool = False

    def allows(self, v: float) -> bool:
        return ((self.lo is None or (v > self.lo if self.lo_open else v >= self.lo))
                and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)))

    def __str__(self) -> str:
        if self.lo is None:
            return ""
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi}{')' if self.hi_open else ']'}"


_POS, _ONE, _NONNEG = Limit(0, lo_open=True), Limit(1), Limit(0)
# Every number of the config (tests/train/test_config.py checks that none is missing).
LIMITS: dict[str, Limit] = {
    "run.seed": Limit(0, 2**63 - 1),
    "model.hidden_size": _ONE, "model.num_layers": _ONE, "model.num_heads": _ONE, "model.num_kv_heads": _ONE,
    "model.intermediate_size": _ONE, "model.rope_theta": _POS, "model.vocab_size": _ONE,
    "model.vocab_multiple": _ONE, "model.init_std": _NONNEG,
    "data.seq_len": _ONE, "data.micro_batch": _ONE, "data.num_workers": _NONNEG, "data.mixture.weight": _POS,
    "data.block_groups": _ONE, "data.cache_mb": _NONNEG,
    "train.steps": _ONE, "train.grad_accum": _ONE, "train.lr": _POS, "train.min_lr_ratio": Limit(0, 1),
    "train.warmup_steps": _NONNEG, "train.weight_decay": _NONNEG, "train.beta1": Limit(0, 1, hi_open=True),
    "train.beta2": Limit(0, 1, hi_open=True), "train.eps": _POS, "train.grad_clip": _NONNEG,
    "train.target_loss": _NONNEG, "train.time_budget_s": _POS, "train.gc_every": _NONNEG,
    "eval.every": _ONE, "eval.batches": _ONE,
    "log.every": _ONE, "log.skip_steps": _NONNEG, "log.profile_step": _NONNEG,
    "checkpoint.every": _NONNEG, "checkpoint.keep": _ONE,
    "hardware.peak_tflops": _POS,
}


def numbers(obj, prefix: str = "") -> dict[str, int | float]:
    """Every int/float value of the config (bools and unset optionals left out), by dotted key."""
    out: dict[str, int | float] = {}
    for f in dataclasses.fields(obj):
        v, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            out.update(numbers(v, key + "."))
        elif isinstance(v, list) and v and dataclasses.is_dataclass(v[0]):
            for i, item in enumerate(v):
                out.update(numbers(item, f"{key}[{i}]."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def check_limits(cfg: Config, source: str = "config") -> None:
    """Every number finite and within its `LIMITS` range, else a one-line error naming the key."""
    for key, v in numbers(cfg).items():
        limit = LIMITS.get(re.sub(r"\[\d+\]", "", key), Limit())   # data.mixture[2].weight: data.mixture.weight
        if not math.isfinite(v) or not limit.allows(v):
            what = " ".join(filter(None, ["a finite number" if isinstance(v, float) else "", str(limit)]))
            raise PretokError(f"{key} must be {what} (got {v!r})", source)


def save_config(cfg: Config, path: Path) -> None:
    from ..atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
