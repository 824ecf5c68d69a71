"""Would this loader stall a GPU? Predicted data-stall fraction and headroom per data path on accelerators the user
does not have, from the loader benchmark (`pretok bench loaders` JSON) and the model's FLOPs per token.

The model (per rank; "tokens" are input slots, padding included, on both sides: a padded slot costs the same
compute as a real one and the loader benchmark's `tokens_per_s` counts slots):

    C = MFU · peak / F             consumption of the accelerator, tokens/s
    F = 6·N + 12·L·H·S             training FLOPs per token (N matmul parameters, L layers, H hidden, S seq_len)
    S = S_bench · scale            loader supply, tokens/s (measured on this CPU with W workers, see `supply_scale`)
    headroom h = S / C
    stall = max(0, 1 − h)          W > 0: DataLoader workers prefetch while the step computes
    stall = 1 / (1 + h)            W = 0: loading runs in the training process between steps (the loop
                                   synchronizes the device every step, so nothing overlaps)

Effective tokens/s (labels that count) per rank = min(S, C) · (effective / slots) of that path. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..datapaths import KINDS
from ..errors import PretokError

FORMULA = """
**Model** (per rank). Tokens are input slots, padding included, on both sides (a padded slot costs as much
compute as a real one; the loader benchmark counts slots):

- consumption C = MFU · peak / F tokens/s, with F = 6N + 12·L·H·S training FLOPs per token
  (N matmul parameters, L layers, H hidden size, S sequence length);
- supply S<sub>loader</sub>: the loader benchmark's tokens/s for the path with W workers, measured on this CPU,
  scaled to the target's CPU cores per rank k when W > 0: × k / min(W, cores measured) (linear in cores:
  an upper bound), unchanged when W = 0 (one process);
- headroom h = S<sub>loader</sub> / C;
- stall fraction (time waiting / step time): max(0, 1 - h) with workers (prefetching overlaps loading with the
  step), 1 / (1 + h) with W = 0 (the batch is made between steps);
- effective tokens/s = min(S<sub>loader</sub>, C) × the path's share of labels that count.
"""


@dataclass(frozen=True)
class Accelerator:
    """Dense (no sparsity) bf16 tensor-core peak of one device, from its vendor datasheet."""

    name: str
    bf16_tflops: float
    source: str


ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    Accelerator("H100 SXM", 989.0, "NVIDIA H100 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity (SXM5)"),
    Accelerator("GH200", 989.0, "NVIDIA GH200 Grace Hopper datasheet: H100 GPU, BF16 1,979 TFLOPS with sparsity"),
    Accelerator("H200", 989.0, "NVIDIA H200 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity (SXM)"),
    Accelerator("B200", 2250.0, "NVIDIA HGX B200 datasheet: FP16/BF16 Tensor Core 4.5 PFLOPS with sparsity per GPU"),
    Accelerator("A100", 312.0, "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)"),
    Accelerator("L40S", 362.05, "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity)"),
    Accelerator("A10", 125.0, "NVIDIA A10 datasheet: BF16 Tensor Core 125 TFLOPS (250 with sparsity)"),
)}
DEFAULT_MFU = (0.35, 0.45)
PATHS = KINDS


# ---------------------------------------------------------------- consumption


def intermediate_size(hidden: int, intermediate: int | None = None) -> int:
    """The MLP width the trainer builds: explicit, or Llama's 8/3·hidden rounded up to a multiple of 64."""
    return intermediate or -(-(8 * hidden // 3) // 64) * 64


def matmul_params(hidden: int, layers: int, heads: int, kv_heads: int, vocab: int, intermediate: int | None = None
                  ) -> int:
    """Parameters in matmuls per token of the trainer's Llama model (attention q/k/v/o, SwiGLU, LM head; not the
    input embedding nor norms), computed from the config: equals `train.model.matmul_params` of the built model."""
    kv = hidden // heads * kv_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate_size(hidden, intermediate)
    return layers * per_layer + vocab * hidden


def flops_per_token(n_matmul: int, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token, as the trainer's MFU counts them: 6·N + 12·L·H·S."""
    return 6.0 * n_matmul + 12.0 * layers * hidden * seq_len


def config_flops_per_token(model: Mapping[str, Any], vocab: int, seq_len: int, vocab_multiple: int = 64) -> float:
    """F for a config's `model` section (keys of `train.config.ModelConfig`; defaults as there) and a tokenizer
    vocabulary (rounded up to `vocab_multiple` like the trainer, unless `model.vocab_size` is set)."""
    hidden, layers = int(model.get("hidden_size", 128)), int(model.get("num_layers", 2))
    v = model.get("vocab_size") or -(-vocab // max(1, int(model.get("vocab_multiple", vocab_multiple)))) \
        * max(1, int(model.get("vocab_multiple", vocab_multiple)))
    n = matmul_params(hidden, layers, int(model.get("num_heads", 4)), int(model.get("num_kv_heads", 2)), int(v),
                      model.get("intermediate_size"))
    return flops_per_token(n, layers, hidden, seq_len)


def consumption(mfu: float, peak_flops: float, flops_per_token_: float) -> float:
    """Tokens/s one accelerator consumes: C = MFU · peak / F."""
    return mfu * peak_flops / flops_per_token_


# ---------------------------------------------------------------- supply and stall


def stall_fraction(supply: float, consume: float, prefetch: bool) -> float:
    """Predicted share of the step spent waiting for data: max(0, 1 − S/C) with prefetching workers, C/(C + S)
    when the batch is made in the training process between steps."""
    if consume <= 0:
        return 0.0
    if supply <= 0:
        return 1.0
    h = supply / consume
    return max(0.0, 1.0 - h) if prefetch else 1.0 / (1.0 + h)


def mid_stall(row: Mapping[str, Any]) -> float:
    """The stall at the middle of a `predict` row's MFU range. Consumption is linear in MFU but the stall is not,
    so this is not (stall_low + stall_high) / 2 (which can be off by a factor of 2 or more)."""
    c_mid = (row["consumption_low"] + row["consumption_high"]) / 2
    return stall_fraction(row["supply"], c_mid, row["target_workers"] > 0)


def supply_scale(workers: int, cores_measured: int, cores_per_rank: int | None) -> float:
    """Factor from the measured supply to the target's: 1 with 0 workers (one process, more cores do not help) or
    when `cores_per_rank` is None (as measured); else k / min(W, cores measured): the target runs k workers on k
    cores, each as fast as a measured one (linear scaling, an upper bound)."""
    if not workers or cores_per_rank is None:
        return 1.0
    return cores_per_rank / max(1, min(workers, cores_measured))


def supply_rows(loaders: Mapping[str, Any], cores_per_rank: int | None = None, cpu_speed: float = 1.0
                ) -> list[dict]:
    """One row per data path x worker count of a loader benchmark JSON: measured and target supply (tokens/s per
    rank), the share of effective tokens, the worker counts. `cpu_speed`: the target's per-core speed relative to
    the benchmark machine."""
    cores = int((loaders.get("environment") or {}).get("cpus") or 1)
    out = []
    for name, r in (loaders.get("loaders") or {}).items():
        kind = r.get("kind")
        if kind not in PATHS or not r.get("tokens_per_s"):
            continue
        w = int(r.get("workers") or 0)
        scale = supply_scale(w, cores, cores_per_rank) * cpu_speed
        target_w = w if not w or cores_per_rank is None else cores_per_rank
        out.append({"path": kind, "workers": w, "target_workers": target_w, "cores_measured": cores,
                    "supply_measured": float(r["tokens_per_s"]), "supply": float(r["tokens_per_s"]) * scale,
                    "effective_share": float(r.get("effective_tokens_per_s", r["tokens_per_s"])) / r["tokens_per_s"]})
    return sorted(out, key=lambda r: (PATHS.index(r["path"]), r["workers"]))


def predict(loaders: Mapping[str, Any], flops_per_token_: float,
            accelerators: Iterable[Accelerator | str] = tuple(ACCELERATORS), mfu: Sequence[float] = DEFAULT_MFU,
            cores_per_rank: int | None = None, cpu_speed: float = 1.0) -> list[dict]:
    """The prediction table: one row per accelerator x data path x worker count, with consumption C, headroom
    S/C and stall fraction at the low and high end and the middle (`mid_stall`) of the MFU range (higher MFU: more
    consumption, more stall)."""
    lo, hi = min(mfu), max(mfu)
    if not (0 < lo <= hi <= 1):
        raise PretokError(f"target MFU range {list(mfu)} must lie in (0, 1] (a fraction of the peak; 0 consumes "
                          "nothing, above 1 is impossible)")
    rows = []
    for acc in accelerators:
        a = ACCELERATORS[acc] if isinstance(acc, str) else acc
        c_lo, c_hi = (consumption(m, a.bf16_tflops * 1e12, flops_per_token_) for m in (lo, hi))
        for s in supply_rows(loaders, cores_per_rank, cpu_speed):
            prefetch = s["target_workers"] > 0
            rows.append({"accelerator": a.name, "peak_tflops": a.bf16_tflops, **s,
                         "mfu_low": lo, "mfu_high": hi, "consumption_low": c_lo, "consumption_high": c_hi,
                         "headroom_low": s["supply"] / c_hi, "headroom_high": s["supply"] / c_lo,
                         "stall_low": stall_fraction(s["supply"], c_lo, prefetch),
                         "stall_high": stall_fraction(s["supply"], c_hi, prefetch),
                         "stall_mid": stall_fraction(s["supply"], (c_lo + c_hi) / 2, prefetch),
                         "effective_tokens_per_s_high": min(s["supply"], c_hi) * s["effective_share"]})
    return rows


def _nonfinite(v: float) -> str | None:
    """"inf", "-inf" or "-" (NaN) for a non-finite number, else None."""
    return None if math.isfinite(v) else "-" if math.isnan(v) else "inf" if v > 0 else "-inf"


def _pct(v: float) -> str:
    return _nonfinite(v) or (f"{v:.2%}" if v < 0.01 else f"{v:.1%}")


def _x(v: float) -> str:
    return "x" + (_nonfinite(v) or f"{v:.3g}")


def _num(v: float) -> str:
    if (bad := _nonfinite(v)) is not None:
        return bad
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Compact markdown: one line per data path x workers, one column per accelerator with the stall range
    and the worst-case headroom (at the high MFU)."""
    if not rows:
        return "No loader benchmark results: run notebook 02 (`pretok bench loaders --json ...`)."
    accs = list(dict.fromkeys(r["accelerator"] for r in rows))
    cons = {r["accelerator"]: (r["consumption_low"], r["consumption_high"]) for r in rows}
    head = "| data path | workers | supply tokens/s | " + " | ".join(
        f"{a}<br>C {_num(cons[a][0])}-{_num(cons[a][1])}/s" for a in accs) + " |"
    lines = [head, "|---|---:|---:|" + "---:|" * len(accs)]
    keys = list(dict.fromkeys((r["path"], r["workers"]) for r in rows))
    for path, w in keys:
        mine = {r["accelerator"]: r for r in rows if (r["path"], r["workers"]) == (path, w)}
        r0 = next(iter(mine.values()))
        wt = f"{w}" if r0["target_workers"] == w else f"{w} → {r0['target_workers']}"
        cells = []
        for a in accs:
            r = mine[a]
            st = _pct(r["stall_low"]) if r["stall_low"] == r["stall_high"] else \
                f"{_pct(r['stall_low'])}-{_pct(r['stall_high'])}"
            cells.append(f"{st} ({_x(r['headroom_low'])})")
        lines.append(f"| {path} | {wt} | {_num(r0['supply'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\nCells: predicted stall fraction over the MFU range "
                               f"{rows[0]['mfu_low']:.0%}-{rows[0]['mfu_high']:.0%} (headroom S/C at the high MFU).")


# ---------------------------------------------------------------- check against measured runs


def measured_rates(records: Iterable[Mapping[str, Any]], skip: int = 2) -> dict | None:
    """From a run's train records (after `skip` warm-up records): the measured consumption per device C =
    slots / (step time − data wait), the measured data stall (mean per step, as the analysis reports it) and
    the loader's in-run supply slots / data wait."""
    train = [r for r in records if r.get("kind") == "train"]
    train = train[skip:] if len(train) > skip else train
    if not train:
        return None
    world = max(1, round(train[0]["tokens_per_s"] / train[0]["tokens_per_s_per_device"]))
    slots = sum(r["tokens"] for r in train) / world
    compute = sum(r["step_time_s"] - r["data_wait_s"] for r in train)
    wait = sum(r["data_wait_s"] for r in train)
    return {"consumption": slots / compute if compute > 0 else math.inf,
            "data_stall": sum(r["data_stall"] for r in train) / len(train),
            "in_run_supply": slots / wait if wait > 0 else math.inf, "steps": len(train), "world": world}


def check_run(records: Iterable[Mapping[str, Any]], supply: float, workers: int, skip: int = 2) -> dict | None:
    """Predicted stall (from the run's measured consumption and a loader supply measured apart) beside the stall
    the run measured."""
    m = measured_rates(records, skip)
    if m is None:
        return None
    return {**m, "supply": supply, "workers": workers, "headroom": supply / m["consumption"],
            "predicted_stall": stall_fraction(supply, m["consumption"], workers > 0)}


def check_study_runs(runs: Iterable[Any], loaders: Mapping[str, Any] | None, skip: int | None = None) -> list[dict]:
    """Prediction vs measurement for every completed run of a study whose data path and worker count the loader
    benchmark measured (same seq_len and micro-batch): the model checked on this machine."""
    if not loaders:
        return []
    supply = {(s["path"], s["workers"]): s for s in supply_rows(loaders)}
    out = []
    for run in runs:
        cfg = getattr(run, "config", {}) or {}
        data = cfg.get("data", {})
        key = (data.get("kind"), int(data.get("num_workers") or 0))
        if getattr(run, "status", None) != "completed" or key not in supply or \
                data.get("seq_len") != loaders.get("seq_len") or data.get("micro_batch") != loaders.get("micro_batch"):
            continue
        sk = skip if skip is not None else int((cfg.get("log") or {}).get("skip_steps", 2))
        c = check_run(run.train.rows, supply[key]["supply"], key[1], sk)
        if c:
            out.append({"run_id": run.run_id, "path": key[0], **c})
    return out


def load_json(path: str | Path) -> dict | None:
    import json

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def study_prediction(loaders: Mapping[str, Any] | None, config: str | Path | Mapping[str, Any],
                     vocab: int | None = None, seq_len: int | None = None, mfu: Sequence[float] = DEFAULT_MFU,
                     cores_per_rank: int | None = None, accelerators: Iterable[str] | None = None,
                     cpu_speed: float = 1.0) -> dict:
    """The prediction for a training config (YAML path or dict; its `model` section and `data.seq_len`) fed by the
    loaders a benchmark measured: rows, the markdown table with the formula and the numbers it used.

    Args:
        loaders: `pretok bench loaders` results (None: no measured rates, the table says so).
        config: the training config; vocab, seq_len: override the config's (None: from it).
        mfu: the MFU range assumed on the accelerators; accelerators: datasheet names (None: the default set).
        cores_per_rank: CPU cores feeding one rank's loader; cpu_speed: that core's speed relative to this one's.
    """
    import yaml

    cfg = dict(config) if isinstance(config, Mapping) else yaml.safe_load(Path(config).read_text()) or {}
    model, data = cfg.get("model") or {}, cfg.get("data") or {}
    loaders = loaders or {}
    vocab = vocab or ((loaders.get("tokenizer") or {}).get("info") or {}).get("vocab_size") or 32000
    seq = seq_len or int(data.get("seq_len", 256))
    f = config_flops_per_token(model, int(vocab), seq)
    rows = predict(loaders, f, accelerators or tuple(ACCELERATORS), mfu, cores_per_rank, cpu_speed) if loaders \
        else []
    cores = (loaders.get("environment") or {}).get("cpus")
    name = config if isinstance(config, (str, Path)) else "the given config"
    facts = (f"Target: `{name}` (hidden {model.get('hidden_size')}, {model.get('num_layers')} layers), vocab "
             f"{vocab}, seq_len {seq}: F = {f:.3g} FLOPs/token. Supply: `pretok bench loaders` on this machine "
             f"({cores} CPUs, seq_len {loaders.get('seq_len')}, micro-batch {loaders.get('micro_batch')}), "
             + ("as measured" if cores_per_rank is None else f"scaled to {cores_per_rank} CPU cores per rank")
             + (f", x{cpu_speed:g} per-core speed" if cpu_speed != 1 else "") + ". Peaks: dense bf16 datasheet "
             "figures (`analysis.stall.ACCELERATORS`).")
    return {"rows": rows, "flops_per_token": f, "vocab": vocab, "seq_len": seq,
            "markdown": "\n\n".join([FORMULA.strip(), facts, markdown_table(rows)])}


def check_markdown(checks: Sequence[Mapping[str, Any]]) -> str:
    """The model checked on this machine's runs, as markdown."""
    if not checks:
        return ("No run to check the model on (runs with the loader benchmark's data path, worker count, seq_len "
                "and micro-batch).")
    lines = ["| run | data path | workers | C measured tok/s | S benchmark tok/s | predicted stall | measured stall |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c['run_id']} | {c['path']} | {c['workers']} | {_num(c['consumption'])} | {_num(c['supply'])} "
                     f"| {_pct(c['predicted_stall'])} | {_pct(c['data_stall'])} |")
    return "\n".join(lines) + ("\n\nC: the run's slots per second of compute (step time − data wait) per rank; "
                               "S: the loader benchmark's rate for that path and worker count.")
