"""Would this loader stall a GPU? Predicted data-stall fraction and headroom per data path on accelerators the user
does not have, from the loader benchmark (`pretok bench loaders` JSON) and the model's FLOPs per token.

The model (per rank; "tokens" are input slots, padding included, on both sides: a padded slot costs the same
compute as a real one and the loader benchmark's `tokens_per_s` counts slots):

    C = MFU · peak / F             consumption of the accelerator, tokens/s
    F = 6·N + 12·L·H·S             training FLOPs per token (N matmul parameters, L layers, H hidden, S seq_len)
    S                              loader supply per rank, tokens/s: measured on this CPU, carried to the target
                                   rank as each loader works (`supply.py`: workers, cores, ranks, seq_len)
    m                              main-process seconds per slot with workers (receive and collate a batch)
    headroom h = S / C, μ = m · C
    stall = max(μ, 1/h − 1) / max(1/h, 1 + μ)
                                   W > 0: workers prefetch while the step computes; the main process's own
                                   share of each batch (m) overlaps nothing (μ = 0: max(0, 1 − h))
    stall = 1 / (1 + h)            W = 0: loading runs in the training process between steps (the loop
                                   synchronizes the device every step, so nothing overlaps)

Effective tokens/s (labels that count) per rank = min(S, C) · (effective / slots) of that path. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..datapaths import KINDS
from ..errors import PretokError
from ..train.config import SKIP_STEPS
from ..train.flops import ACCELERATORS, Accelerator, config_flops_per_token
from .supply import PACED_KEYS, target_supply
from .uncertainty import bootstrap_sum_ratio

FORMULA = """
**Model** (per rank). Tokens are input slots, padding included, on both sides (a padded slot costs as much
compute as a real one; the loader benchmark counts slots):

- consumption C = MFU · peak / F tokens/s, with F = 6N + 12·L·H·S training FLOPs per token
  (N matmul parameters, L layers, H hidden size, S sequence length);
- supply S<sub>loader</sub> per rank: the loader benchmark's tokens/s for the path with W workers, measured on
  this CPU, carried to the target as each loader works: paths that split the samples among ranks and workers
  (padded, pretokenized) × k / min(W, cores measured) for k cores per rank when W > 0 (linear in cores: an upper
  bound); padding-free, whose every rank and worker tokenizes the whole stream, × W / min(W, cores measured) / R
  for R ranks (more workers add nothing); padded at the target's seq_len L: 1/S = a/L + b (a per document,
  b per slot, from the pretokenized padded path);
- main-process cost m s/slot with workers (the randint-via-DataLoader reference); headroom h = S<sub>loader</sub> / C,
  μ = m·C;
- stall fraction (time waiting / step time): max(μ, 1/h - 1) / max(1/h, 1 + μ) with workers (prefetching overlaps
  loading with the step, not the main process's share; μ = 0: max(0, 1 - h)), 1 / (1 + h) with W = 0 (the batch
  is made between steps);
- effective tokens/s = min(S<sub>loader</sub>, C) × the path's share of labels that count.
"""


# The accelerators a prediction covers unless told (rows of `train.flops.ACCELERATORS`: name, peaks, datasheet).
DEFAULT_ACCELERATORS = ("H100 SXM", "GH200", "H200", "H200 NVL", "B200", "A100", "L40S", "A10")
DEFAULT_MFU = (0.35, 0.45)
PATHS = KINDS


# ---------------------------------------------------------------- consumption


def consumption(mfu: float, peak_flops: float, flops_per_token_: float) -> float:
    """Tokens/s one accelerator consumes: C = MFU · peak / F."""
    return mfu * peak_flops / flops_per_token_


# ---------------------------------------------------------------- supply and stall


def stall_fraction(supply: float, consume: float, prefetch: bool, main: float = 0.0, loop: float = 0.0) -> float:
    """Predicted share of the step spent waiting for data. Prefetching workers make a batch every p s while the
    training process computes (c), receives the batch (m, `main` s/slot) and does its bookkeeping between steps
    (o, `loop` s/slot, outside the step's timing): a step waits w = max(m, p − c − o) and stall = w / (c + w).
    With h = S/C, μ = m·C and o = 0: max(μ, 1/h − 1) / max(1/h, 1 + μ), which is max(0, 1 − h) when μ = 0.
    Without workers the batch is made between steps: C/(C + S)."""
    if consume <= 0:
        return 0.0
    if supply <= 0:
        return 1.0
    if not prefetch:
        return 1.0 / (1.0 + supply / consume)
    wait = max(max(0.0, main), 1.0 / supply - 1.0 / consume - max(0.0, loop))
    return wait / (1.0 / consume + wait)


def mid_stall(row: Mapping[str, Any]) -> float:
    """The stall at the middle of a `predict` row's MFU range. Consumption is linear in MFU but the stall is not,
    so this is not (stall_low + stall_high) / 2 (which can be off by a factor of 2 or more)."""
    c_mid = (row["consumption_low"] + row["consumption_high"]) / 2
    return stall_fraction(row["supply"], c_mid, row["target_workers"] > 0, row.get("main_per_slot", 0.0))


def supply_rows(loaders: Mapping[str, Any], cores_per_rank: int | None = None, cpu_speed: float = 1.0,
                seq_len: int | None = None, ranks: int = 1) -> list[dict]:
    """One row per data path x worker count of a loader benchmark JSON: measured and target supply (tokens/s per
    rank, `supply.target_supply`), main-process cost, the share of effective tokens, the worker counts.
    `cpu_speed`: the target's per-core speed relative to the benchmark machine; `seq_len`: the target's (None: the
    benchmark's); `ranks`: the target's world size. Back-to-back rates only: paced rows (`--pace-ms`) feed the
    check against measured runs (stall_check.py), not this prediction, until a GPU's runs say which is right."""
    out = []
    for name, r in (loaders.get("loaders") or {}).items():
        kind = r.get("kind")
        if kind not in PATHS or not r.get("tokens_per_s"):
            continue
        r = {k: v for k, v in r.items() if k not in PACED_KEYS}
        t = target_supply(loaders, r, cores_per_rank, cpu_speed, seq_len, ranks)
        out.append({"path": kind, "workers": int(r.get("workers") or 0), **t,
                    "supply_measured": float(r["tokens_per_s"]),
                    "effective_share": float(r.get("effective_tokens_per_s", r["tokens_per_s"])) / r["tokens_per_s"]})
    return sorted(out, key=lambda r: (PATHS.index(r["path"]), r["workers"]))


def predict(loaders: Mapping[str, Any], flops_per_token_: float,
            accelerators: Iterable[Accelerator | str] = DEFAULT_ACCELERATORS, mfu: Sequence[float] = DEFAULT_MFU,
            cores_per_rank: int | None = None, cpu_speed: float = 1.0, seq_len: int | None = None,
            ranks: int = 1) -> list[dict]:
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
        for s in supply_rows(loaders, cores_per_rank, cpu_speed, seq_len, ranks):
            stall = lambda c: stall_fraction(s["supply"], c, s["target_workers"] > 0, s["main_per_slot"])  # noqa: E731
            rows.append({"accelerator": a.name, "peak_tflops": a.bf16_tflops, **s,
                         "mfu_low": lo, "mfu_high": hi, "consumption_low": c_lo, "consumption_high": c_hi,
                         "headroom_low": s["supply"] / c_hi, "headroom_high": s["supply"] / c_lo,
                         "stall_low": stall(c_lo), "stall_high": stall(c_hi), "stall_mid": stall((c_lo + c_hi) / 2),
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


def measured_rates(records: Iterable[Mapping[str, Any]], skip: int = SKIP_STEPS) -> dict | None:
    """From a run's train records (after `skip` warm-up records): the measured consumption per device C =
    slots / (step time − data wait), the measured data stall (total data wait / total step time: a time share,
    as the model predicts; workers that finish together make a step that waits and one that does not, whose
    per-step mean is half of it; that mean beside it as `data_stall_step_mean`), the
    loader's in-run supply slots / data wait and the loop's own time between steps per slot (`loop`: wall time
    between records of consecutive steps minus the later one's step time; 0 when no two are consecutive). The
    stall's interval (`data_stall_interval`) is a seeded bootstrap over the steps."""
    train = [r for r in records if r.get("kind") == "train"]
    train = train[skip:] if len(train) > skip else train
    if not train:
        return None
    world = max(1, round(train[0]["tokens_per_s"] / train[0]["tokens_per_s_per_device"]))
    slots = sum(r["tokens"] for r in train) / world
    compute = sum(r["step_time_s"] - r["data_wait_s"] for r in train)
    wait = sum(r["data_wait_s"] for r in train)
    pairs = [(a, b) for a, b in zip(train, train[1:]) if b["step"] == a["step"] + 1]
    between = sum(max(0.0, b["wall_s"] - a["wall_s"] - b["step_time_s"]) for a, b in pairs)
    loop = between / (sum(b["tokens"] for _, b in pairs) / world) if pairs else 0.0
    share = bootstrap_sum_ratio([r["data_wait_s"] for r in train], [r["step_time_s"] for r in train])
    return {"consumption": slots / compute if compute > 0 else math.inf, "loop_per_slot": loop,
            "data_stall": wait / max(1e-12, sum(r["step_time_s"] for r in train)),
            "data_stall_interval": list(share[1:]) if share else None,
            "data_stall_step_mean": sum(r["data_stall"] for r in train) / len(train),
            "in_run_supply": slots / wait if wait > 0 else math.inf, "steps": len(train), "world": world,
            "step_compute": [((r["step_time_s"] - r["data_wait_s"]), r["tokens"] / world) for r in train]}


def check_run(records: Iterable[Mapping[str, Any]], supply: float, workers: int, skip: int = SKIP_STEPS,
              main: float = 0.0) -> dict | None:
    """Predicted stall (from the run's measured consumption and time between steps, a loader supply measured apart
    and the main-process cost `main` s/slot) beside the stall the run measured."""
    m = measured_rates(records, skip)
    return None if m is None else predict_for(m, supply, workers, main)


def predict_for(m: Mapping[str, Any], supply: float, workers: int, main: float = 0.0) -> dict:
    """`check_run` on a run's `measured_rates` (computed once for the many supplies a check tries)."""
    steps = m["step_compute"]
    # the model step by step, with each step's own compute: waits add up unevenly when the compute varies (a
    # step far below the batch time waits the difference, one above it waits m). Prefetched batches carry some of
    # a slow step's slack over to the next, which the mean compute assumes entirely and this not at all: the run's
    # stall lies between the two.
    load = 1.0 / supply if supply > 0 else math.inf
    waits = [n * load if not workers else max(main * n, n * (load - m["loop_per_slot"]) - c) for c, n in steps]
    total = sum(c for c, _ in steps) + sum(waits)
    return {**{k: v for k, v in m.items() if k != "step_compute"}, "supply": supply, "workers": workers,
            "headroom": supply / m["consumption"], "main_per_slot": main,
            "predicted_stall": stall_fraction(supply, m["consumption"], workers > 0, main, m["loop_per_slot"]),
            "predicted_stall_per_step": sum(waits) / total if total > 0 else 0.0}


def check_study_runs(runs: Iterable[Any], loaders: Mapping[str, Any] | None, skip: int | None = None) -> list[dict]:
    """Prediction vs measurement for every completed run of a study whose data path and worker count the loader
    benchmark measured (same seq_len and micro-batch): the model checked on this machine (the supply carried to
    the run's world size, which divides padding-free's). Each: the run's measured rates, the prediction as the
    study makes it (`predicted_stall`), and `check`: the most complete version of the model the benchmark allows
    (analysis/stall_check.py: `either` where it paced the paths, else `back_to_back`) with both intervals."""
    from .stall_check import stall_check

    if not loaders:
        return []
    bench = {(r.get("kind"), int(r.get("workers") or 0)) for r in (loaders.get("loaders") or {}).values()
             if r.get("kind") in PATHS and r.get("tokens_per_s")}
    out = []
    for run in runs:
        cfg = getattr(run, "config", {}) or {}
        data = cfg.get("data", {})
        key = (data.get("kind"), int(data.get("num_workers") or 0))
        if getattr(run, "status", None) != "completed" or key not in bench or \
                data.get("seq_len") != loaders.get("seq_len") or data.get("micro_batch") != loaders.get("micro_batch"):
            continue
        sk = skip if skip is not None else int((cfg.get("log") or {}).get("skip_steps", SKIP_STEPS))
        world = int((getattr(run, "settings", None) or {}).get("world_size") or 1)
        models = stall_check(loaders, key[0], key[1], run.train.rows, sk, ranks=world)
        if not models:
            continue
        model = "either" if models.get("either") else "back_to_back"
        b = models["back_to_back"]
        out.append({"run_id": run.run_id, "path": key[0], "workers": key[1], "data_stall": b["measured_stall"],
                    **{k: b[k] for k in ("consumption", "supply", "headroom", "main_per_slot", "predicted_stall")},
                    "model": model, "check": models[model]})
    return out


def load_json(path: str | Path) -> dict | None:
    import json

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def target_vocab(config: Mapping[str, Any], vocab: int | None, loaders: Mapping[str, Any]) -> tuple[int, str]:
    """The target's vocabulary and where it came from: `vocab` if given, else the config's `model.vocab_size`,
    else the size of its `data.tokenizer` (loaded), else the benchmark's tokenizer (said so: the FLOPs of another
    vocabulary), else 32000."""
    if vocab:
        return int(vocab), "given"
    model, data = config.get("model") or {}, config.get("data") or {}
    if model.get("vocab_size"):
        return int(model["vocab_size"]), "the config's model.vocab_size"
    if data.get("tokenizer"):
        from ..tokenizer import load_tokenizer

        return int(load_tokenizer(data["tokenizer"]).vocab_size), f"the config's tokenizer {data['tokenizer']}"
    bench = ((loaders.get("tokenizer") or {}).get("info") or {}).get("vocab_size")
    if bench:
        return int(bench), "the benchmark's tokenizer: the target config names none (give the target's vocabulary)"
    return 32000, "a default: neither the config nor the benchmark names a tokenizer"


def study_prediction(loaders: Mapping[str, Any] | None, config: str | Path | Mapping[str, Any],
                     vocab: int | None = None, seq_len: int | None = None, mfu: Sequence[float] = DEFAULT_MFU,
                     cores_per_rank: int | None = None, accelerators: Iterable[str] | None = None,
                     cpu_speed: float = 1.0, ranks: int = 1) -> dict:
    """The prediction for a training config (YAML path or dict; its `model` section and `data.seq_len`) fed by the
    loaders a benchmark measured: rows, the markdown table with the formula and the numbers it used.

    Args:
        loaders: `pretok bench loaders` results (None: no measured rates, the table says so).
        config: the training config; vocab, seq_len: override the config's (None: from it, `target_vocab`).
        mfu: the MFU range assumed on the accelerators; accelerators: datasheet names (None: the default set).
        cores_per_rank: CPU cores feeding one rank's loader; cpu_speed: that core's speed relative to this one's.
        ranks: the target's world size (padding-free's every rank tokenizes the whole stream).
    """
    import yaml

    cfg = dict(config) if isinstance(config, Mapping) else yaml.safe_load(Path(config).read_text()) or {}
    model, data = cfg.get("model") or {}, cfg.get("data") or {}
    loaders = loaders or {}
    vocab, vocab_from = target_vocab(cfg, vocab, loaders)
    seq = seq_len or int(data.get("seq_len", 256))
    f = config_flops_per_token(model, int(vocab), seq)
    rows = predict(loaders, f, accelerators or DEFAULT_ACCELERATORS, mfu, cores_per_rank, cpu_speed, seq,
                   ranks) if loaders else []
    cores = (loaders.get("environment") or {}).get("cpus")
    name = config if isinstance(config, (str, Path)) else "the given config"
    facts = (f"Target: `{name}` (hidden {model.get('hidden_size')}, {model.get('num_layers')} layers), vocab "
             f"{vocab} ({vocab_from}), seq_len {seq}, {ranks} rank{'s' if ranks != 1 else ''}: F = {f:.3g} "
             f"FLOPs/token. Supply: `pretok bench loaders` on this machine ({cores} CPUs, seq_len "
             f"{loaders.get('seq_len')}, micro-batch {loaders.get('micro_batch')}), padded carried to seq_len {seq}, "
             + ("workers as measured" if cores_per_rank is None else f"scaled to {cores_per_rank} CPU cores per rank")
             + (f", x{cpu_speed:g} per-core speed" if cpu_speed != 1 else "") + ". Peaks: dense bf16 datasheet "
             "figures (`train.flops.ACCELERATORS`).")
    return {"rows": rows, "flops_per_token": f, "vocab": vocab, "vocab_from": vocab_from, "seq_len": seq,
            "ranks": ranks,
            "markdown": "\n\n".join([FORMULA.strip(), facts, markdown_table(rows)])}


def check_markdown(checks: Sequence[Mapping[str, Any]]) -> str:
    """The model checked on this machine's runs, as markdown."""
    if not checks:
        return ("No run to check the model on (runs with the loader benchmark's data path, worker count, seq_len "
                "and micro-batch).")
    lines = ["| run | data path | workers | C measured tok/s | S benchmark tok/s | predicted stall [interval] | "
             "measured stall [interval] | agree? |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for c in checks:
        k = c.get("check") or {}
        lo, hi = k.get("interval") or (None, None)
        mlo, mhi = k.get("measured_interval") or (None, None)
        agree = "-" if not k else "inside" if k["inside"] else "intervals overlap" if k["agrees"] else \
            f"no: off by {k['off_by']:+.2%}"
        lines.append(f"| {c['run_id']} | {c['path']} | {c['workers']} | {_num(c['consumption'])} | {_num(c['supply'])} "
                     f"| {_pct(c['predicted_stall'])}" + (f" [{_pct(lo)}, {_pct(hi)}]" if k else "")
                     + f" | {_pct(c['data_stall'])}" + (f" [{_pct(mlo)}, {_pct(mhi)}]" if k else "") + f" | {agree} |")
    models = {c.get("model") for c in checks}
    return "\n".join(lines) + (
        "\n\nC: the run's slots per second of compute (step time − data wait) per rank; S: the loader benchmark's "
        "rate for that path and worker count. Predicted: the point as the study predicts (the benchmark's fastest "
        "rate), its interval over the rate's interval and the run's step-to-step compute"
        + (", from back to back to paced (`either`)" if "either" in models else "") + "; measured: the run's "
        "stall with a bootstrap interval over its steps. A loader called once per step runs with cold caches: "
        "back-to-back rates predict too little stall without workers where batches are cheap (docs/BENCHMARKS.md, "
        "the GPU machine's check).")
