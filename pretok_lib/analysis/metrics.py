"""Derived numbers, all recomputed from metrics.jsonl records (never from summary.json).

Numbers over logged train records skip the first `skip` of them (warm-up: compilation, first batches, page cache);
`skip=None` takes each run's `log.skip_steps` (as `pretok train`'s summary does; default 2), and a run with no
more records than that keeps them all (as the summary does). Rates are totals over the records kept: tokens/s =
Σ tokens / Σ step time (likewise effective tokens/s, per device, MFU; data stall = Σ data wait / Σ step time;
padding and masked fractions weighted by tokens), not means of per-step rates (which weight a fast step like a
slow one: 2-5% off); the per-step spread (10th and 90th percentile of the steps' rates) is kept beside them.
Every comparison groups runs by `config_signature`: runs equal in all settings but the one compared.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..datapaths import BASELINE
from ..datapaths import rank as _rank
from ..train.config import SKIP_STEPS
from .runs import BATCH_SHAPE_KEYS, DATA_PATH_KEYS, PRECISION_KEYS, WORLD_SIZE_KEYS, Run, config_signature
from .series import (TIME_WEIGHTED, TOKEN_WEIGHTED, last_finite, mean_after, spread_after, time_to_target,  # noqa: F401
                     weighted_after)

DEFAULT_SKIP = SKIP_STEPS  # `pretok train`'s log.skip_steps default


@dataclass
class RunMetrics:
    """The derived numbers of one run; None when the run did not log what they need."""

    run_id: str
    status: str
    data_kind: str | None
    world_size: int | None
    global_batch: int | None
    seq_len: int | None
    precision: str | None
    precision_reason: str | None = None   # run.json: why this precision (`requested`, or what `auto` measured)
    peak_source: str | None = None        # run.json: where the MFU's peak FLOP/s came from
    steps: int | None = None
    logged: int = 0
    used: int = 0
    tokens_per_s: float | None = None
    effective_tokens_per_s: float | None = None
    tokens_per_s_per_device: float | None = None
    tokens_per_s_p10: float | None = None          # per-step spread of tokens/s (the rates are totals)
    tokens_per_s_p90: float | None = None
    effective_tokens_per_s_p10: float | None = None
    effective_tokens_per_s_p90: float | None = None
    measured_s: float | None = None                # Σ step time of the records the rates use
    mfu: float | None = None
    data_stall: float | None = None
    padding_frac: float | None = None
    masked_frac: float | None = None
    peak_mem_mb: float | None = None
    final_loss: float | None = None
    final_val_loss: float | None = None
    final_val_ppl: float | None = None
    final_val_loss_own: float | None = None         # on the held-out split in the run's own layout (eval.own_path)
    wall_s: float | None = None
    target_loss: float | None = None
    time_to_target_s: float | None = None           # interpolated between the records around the crossing
    step_to_target: int | None = None
    time_to_target_own_s: float | None = None       # the same target on val_loss_own
    note: str = ""
    run: Run | None = field(default=None, repr=False, compare=False)


def skip_of(run: Run, skip: int | None = None) -> int:
    """Warm-up records to skip: `skip` if given, else the run's `log.skip_steps`, else DEFAULT_SKIP."""
    if skip is None:
        cfg = run.settings["skip_steps"]
        skip = int(cfg) if isinstance(cfg, (int, float)) and not isinstance(cfg, bool) else DEFAULT_SKIP
    return max(0, skip)


def run_metrics(run: Run, skip: int | None = None, target_loss: float | None = None) -> RunMetrics:
    """Every derived number of one run. `target_loss` defaults to the run's configured target (if any)."""
    s, t, v = run.settings, run.train, run.val
    skip = skip_of(run, skip)
    target = target_loss if target_loss is not None else _float(s.get("target_loss"))
    m = RunMetrics(run_id=run.run_id, status=run.status, data_kind=s["data_kind"], world_size=s["world_size"],
                   global_batch=s["global_batch"], seq_len=s["seq_len"],
                   precision=None if s["precision"] is None else str(s["precision"]), run=run,
                   logged=len(t), used=len(t) - skip if len(t) > skip else len(t), target_loss=target,
                   precision_reason=_str(run.info.get("precision_reason")),
                   peak_source=_str(run.info.get("peak_source")))
    if len(t):
        time_w = t["step_time_s"] if t.has("step_time_s") else np.full(len(t), np.nan)
        tok_w = t["tokens"] if t.has("tokens") else np.full(len(t), np.nan)
        for key in TIME_WEIGHTED + TOKEN_WEIGHTED:
            setattr(m, key, weighted_after(t[key], time_w if key in TIME_WEIGHTED else tok_w, skip))
        m.tokens_per_s_p10, m.tokens_per_s_p90 = spread_after(t["tokens_per_s"], skip)
        m.effective_tokens_per_s_p10, m.effective_tokens_per_s_p90 = spread_after(t["effective_tokens_per_s"], skip)
        kept = np.asarray(time_w, dtype=float)[skip:] if len(t) > skip else np.asarray(time_w, dtype=float)
        m.measured_s = float(np.nansum(kept)) if np.isfinite(kept).any() else None
        m.steps = int(np.nanmax(t["step"]))
        m.peak_mem_mb = float(np.nanmax(t["peak_mem_mb"])) if t.has("peak_mem_mb") else None
        m.final_loss = last_finite(t["loss"])[0]
    if len(v):
        m.final_val_loss, i = last_finite(v["val_loss"])
        if i is not None:
            ppl = v["val_ppl"][i]
            m.final_val_ppl = float(ppl) if np.isfinite(ppl) else _exp(m.final_val_loss)
        m.final_val_loss_own = last_finite(v["val_loss_own"])[0]
    walls = np.concatenate([t["wall_s"], v["wall_s"]]) if len(t) + len(v) else np.array([])
    m.wall_s = float(np.nanmax(walls)) if np.isfinite(walls).any() else None
    if target is not None:
        m.time_to_target_s, m.step_to_target = time_to_target(run, target)
        if v.has("val_loss_own"):
            m.time_to_target_own_s = time_to_target(run, target, "val_own")[0]
    m.note = "; ".join([x for x in ([run.error] if run.error else []) + run.problems if x])
    return m


def _str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def _float(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _exp(x: float | None) -> float | None:
    return None if x is None else (math.exp(x) if x < 700 else math.inf)


def all_metrics(runs: Iterable[Run], skip: int | None = None, target_loss: float | None = None
                ) -> list[RunMetrics]:
    """`run_metrics` of every run, in order."""
    return [run_metrics(r, skip, target_loss) for r in runs]


SUMMARY_COLUMNS = ("run_id", "status", "data_kind", "world_size", "global_batch", "seq_len", "precision", "steps",
                   "tokens_per_s", "tokens_per_s_p10", "tokens_per_s_p90", "effective_tokens_per_s", "mfu",
                   "data_stall", "padding_frac", "peak_mem_mb",
                   "final_loss", "final_val_loss", "final_val_ppl", "final_val_loss_own", "target_loss",
                   "time_to_target_s", "time_to_target_own_s", "wall_s",
                   "precision_reason", "peak_source", "note")


def summary_table(runs: Iterable[Run], skip: int | None = None, target_loss: float | None = None
                  ) -> list[dict[str, Any]]:
    """One row per run (failed and incomplete runs included, with their status and error/problems in `note`).
    Time to target uses `resolve_target_loss`."""
    runs = list(runs)
    target = resolve_target_loss(runs, target_loss, skip)
    return [{k: asdict_shallow(m)[k] for k in SUMMARY_COLUMNS} for m in all_metrics(runs, skip, target)]


def asdict_shallow(m: RunMetrics) -> dict[str, Any]:
    """RunMetrics as a dict without the `run` back-reference."""
    return {k: getattr(m, k) for k in RunMetrics.__dataclass_fields__ if k != "run"}


def path_rank(kind: str | None) -> tuple[int, str]:
    """Sort key putting the five data paths in their canonical order, others after."""
    return _rank(kind)


def _groups(metrics: Iterable[RunMetrics], ignore: Iterable[str], keep: Iterable[str] = ()
            ) -> dict[tuple, list[RunMetrics]]:
    out: dict[tuple, list[RunMetrics]] = defaultdict(list)
    for m in metrics:
        if m.run is not None:
            out[config_signature(m.run, ignore, keep)].append(m)
    return out


def group_label(ms: list[RunMetrics], fields: Iterable[str]) -> str:
    """The settings among `fields` shared by all runs of a group, e.g. "padded, N=2, B=8, L=1024, bf16"."""
    fmt = {"data_kind": "{}", "world_size": "N={}", "global_batch": "B={}", "seq_len": "L={}", "precision": "{}"}
    parts = []
    for f in fields:
        vals = {getattr(m, f) for m in ms}
        if len(vals) == 1 and (v := vals.pop()) is not None:
            parts.append(fmt.get(f, "{}").format(v))
    return ", ".join(parts) or "all runs"


def differing_keys(sigs: Iterable[tuple]) -> list[str]:
    """Config keys whose value differs among signatures (a key missing from some counts)."""
    flats = [dict(s) for s in sigs]
    keys = sorted({k for f in flats for k in f})
    return [k for k in keys if len({f.get(k) for f in flats}) > 1]


def shown_settings(sig: tuple, keys: list[str]) -> list[str]:
    """`key=value` of a signature's `keys` ("-" where it has none)."""
    flat = dict(sig)
    return [f"{k}={flat.get(k, '-').strip(chr(39))}" for k in keys]


def group_labels(groups: dict[tuple, list[RunMetrics]], fields: Iterable[str]) -> dict[tuple, str]:
    """A label per group (`group_label` of `fields`), unique: groups sharing one get the config keys that tell
    them apart (`train.lr=0.002`). Rows are paired by label (findings, figures): two configs under one label were
    taken for one, a ratio pairing a run of one lr with a run of another."""
    fields = tuple(fields)
    base = {sig: group_label(ms, fields) for sig, ms in groups.items()}
    out = {}
    for label in dict.fromkeys(base.values()):
        sigs = [s for s in groups if base[s] == label]
        more = differing_keys(sigs) if len(sigs) > 1 else []
        out.update({s: ", ".join([label, *shown_settings(s, more)]) for s in sigs})
    return out


def _mean(vals: list[float]) -> float | None:
    return float(np.mean(vals)) if vals else None


def completed_metrics(runs: Iterable[Run], skip: int | None = None) -> list[RunMetrics]:
    """`all_metrics` of the completed runs."""
    return [m for m in all_metrics(runs, skip) if m.status == "completed"]


def _values(ms: Iterable[RunMetrics], key: str) -> list[float]:
    return [v for m in ms if (v := getattr(m, key)) is not None and math.isfinite(v)]


def scaling_efficiency(runs: Iterable[Run], metric: str = "tokens_per_s", skip: int | None = None
                       ) -> list[dict[str, Any]]:
    """DDP scaling of groups of runs equal in all settings but the world size (only groups with >= 2 sizes).
    Per group and world size N: mean `metric` over repeats, speedup = T(N)/T(N0) and efficiency =
    T(N)/(N/N0 x T(N0)), N0 the smallest size measured (normally 1: efficiency = T(N)/(N x T(1))). Completed runs
    only: a failed or stopped run's partial numbers are no measurement of its config."""
    rows = []
    grouped = _groups(completed_metrics(runs, skip), WORLD_SIZE_KEYS)
    labels = group_labels(grouped, ("data_kind", "global_batch", "seq_len", "precision"))
    for sig, ms in sorted(grouped.items(), key=lambda kv: path_rank(kv[1][0].data_kind)):
        by_ws: dict[int, list[RunMetrics]] = defaultdict(list)
        for m in ms:
            if m.world_size and getattr(m, metric) is not None:
                by_ws[m.world_size].append(m)
        if len(by_ws) < 2:
            continue
        n0 = min(by_ws)
        base = _mean(_values(by_ws[n0], metric))
        label = labels[sig]
        for n in sorted(by_ws):
            v = _mean(_values(by_ws[n], metric))
            rows.append({"group": label, "data_kind": ms[0].data_kind, "world_size": n, "base_world_size": n0,
                         "value": v, "values": _values(by_ws[n], metric), "runs": [m.run_id for m in by_ws[n]],
                         "speedup": v / base if v is not None and base else None,
                         "efficiency": v * n0 / (n * base) if v is not None and base else None})
    return rows


def path_speedups(runs: Iterable[Run], baseline: str = BASELINE, metric: str = "effective_tokens_per_s",
                  skip: int | None = None) -> list[dict[str, Any]]:
    """Per group of runs equal in all but the data path: each path's mean `metric` and its ratio to `baseline`'s
    (None when the group has no baseline run). Completed runs only, as the figures' bars (a failed run's partial
    numbers would skew the ratios; notebook 05's table and the tokenization figure showed a failed baseline's)."""
    rows = []
    grouped = _groups(completed_metrics(runs, skip), DATA_PATH_KEYS, BATCH_SHAPE_KEYS)
    labels = group_labels(grouped, ("world_size", "global_batch", "seq_len", "precision"))
    for sig, ms in grouped.items():
        by_kind: dict[str | None, list[RunMetrics]] = defaultdict(list)
        for m in ms:
            by_kind[m.data_kind].append(m)
        base = _mean(_values(by_kind.get(baseline, []), metric))
        label = labels[sig]
        for kind in sorted(by_kind, key=path_rank):
            v = _mean(_values(by_kind[kind], metric))
            rows.append({"group": label, "data_kind": kind, "value": v, "baseline": baseline, "baseline_value": base,
                         "speedup": v / base if v is not None and base else None,
                         "runs": [m.run_id for m in by_kind[kind]]})
    return rows


def compare_by(runs: Iterable[Run], setting: str, ignore: Iterable[str], skip: int | None = None,
               fields: Iterable[str] = ("data_kind", "world_size", "global_batch", "seq_len")
               ) -> list[tuple[str, list[RunMetrics]]]:
    """Groups (label, metrics) of runs equal in all but `setting` (config keys `ignore`), keeping only groups
    where `setting` takes >= 2 values: the basis of e.g. the mixed vs full precision comparison."""
    grouped = {sig: ms for sig, ms in _groups(all_metrics(runs, skip), ignore).items()
               if len({getattr(m, setting) for m in ms}) >= 2}
    labels = group_labels(grouped, fields)
    return [(labels[sig], ms) for sig, ms in grouped.items()]


def precision_groups(runs: Iterable[Run], skip: int | None = None) -> list[tuple[str, list[RunMetrics]]]:
    """Groups of runs equal in all but the precision (mixed vs full), each with >= 2 precisions."""
    return compare_by(runs, "precision", PRECISION_KEYS, skip)


AUTO_TARGET_SHARE = 0.9   # of the descent every completed run made


def _curve(m: RunMetrics) -> np.ndarray:
    """The finite losses time-to-target reads for a run: val if it logged any, else train."""
    if m.run is None:
        return np.array([v for v in (m.final_val_loss, m.final_loss) if v is not None][:1], dtype=float)
    recs, key = (m.run.val, "val_loss") if m.run.val.has("val_loss") else (m.run.train, "loss")
    v = recs[key] if len(recs) else np.array([])
    return v[np.isfinite(v)]


def auto_target_loss(metrics: Iterable[RunMetrics]) -> float | None:
    """A target every completed run reaches before its end: 90% of the way from the lowest first loss among them
    down to the highest best loss (the best loss the worst run reached). The highest final loss, the old default,
    was reached by the worst run only at its end: its time to target was its whole wall time by construction."""
    curves = [c for m in metrics if m.status == "completed" and (c := _curve(m)).size]
    if not curves:
        return None
    lo, hi = max(float(c.min()) for c in curves), min(float(c[0]) for c in curves)
    return lo + (1 - AUTO_TARGET_SHARE) * (hi - lo) if hi > lo else lo


def target_loss_choice(runs: Iterable[Run], target_loss: float | None = None, skip: int | None = None
                       ) -> tuple[float | None, str]:
    """(target, how it was chosen): `target_loss` if given, else the target configured in every run that has one
    (if they agree), else `auto_target_loss`."""
    if target_loss is not None:
        return target_loss, "given"
    ms = all_metrics(runs, skip)
    cfg = {m.target_loss for m in ms if m.target_loss is not None}
    if len(cfg) == 1:
        return cfg.pop(), "configured"
    return auto_target_loss(ms), (f"{AUTO_TARGET_SHARE:.0%} of the descent every completed run made: all reach it")


def resolve_target_loss(runs: Iterable[Run], target_loss: float | None = None, skip: int | None = None
                        ) -> float | None:
    """The target of `target_loss_choice`."""
    return target_loss_choice(runs, target_loss, skip)[0]


# the benchmark tables and the text tables live in bench_tables.py and text.py; their names stay importable here
from .bench_tables import (ENGINE_PREFIX, LOOP_PREFIX, MAP_PREFIX, isolated_tokenization_speedups,  # noqa: F401
                           load_bench, storage_rows, tokenization_speedups)
from .text import format_value, rows_to_text  # noqa: F401
