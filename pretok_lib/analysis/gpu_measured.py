"""A GPU machine's measurement (`pretok gpu-study` JSON, bench/gpu_study.py) beside this study's prediction for that
GPU (notebook 05): the study model's MFU there, and per data path and worker count the stall measured on the GPU,
the stall its own loader benchmark predicted (the model as first built, and paced where measured) and the stall
this study predicts for that accelerator from this machine's loaders. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..train.flops import match_accelerator

NONE = ("No GPU measurement: run `pretok gpu-study` on a GPU machine (docs/GPU_CHECK.md) and give its JSON to the "
        "study (`--set gpu_study=FILE`).")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.2%}" if v < 0.01 else f"{v:.1%}"


def _interval(check: Mapping[str, Any] | None) -> str:
    if not check:
        return "-"
    lo, hi = check["interval"]
    return f"{_pct(lo)}-{_pct(hi)}" + ("" if check["inside"] else " (outside)")


def gpu_rows(gpu: Mapping[str, Any], prediction_rows: Sequence[Mapping[str, Any]] = ()) -> list[dict]:
    """One row per path run of the GPU measurement: measured stall, the GPU machine's own predictions, and this
    study's prediction for the matching accelerator (None when the study's table has no such row)."""
    env = gpu.get("environment") or {}
    acc = match_accelerator(str(env.get("gpu_name") or ""))
    ours = {(r["path"], r["workers"]): r for r in prediction_rows if acc and r["accelerator"] == acc.name}
    runs = ((gpu.get("parts") or {}).get("paths") or {}).get("runs") or {}
    checks = ((gpu.get("parts") or {}).get("loaders") or {}).get("checks") or {}
    rows = []
    for name, r in runs.items():
        c = checks.get(name) or {}
        p = ours.get((r["kind"], int(r["workers"])))
        rows.append({"run": name, "path": r["kind"], "workers": int(r["workers"]),
                     "tokens_per_s": r.get("tokens_per_s"), "effective_tokens_per_s": r.get("effective_tokens_per_s"),
                     "measured_stall": r.get("data_stall"), "back_to_back": c.get("back_to_back"),
                     "paced": c.get("paced"), "either": c.get("either"),
                     "study_prediction": None if p is None else (p["stall_low"], p["stall_high"])})
    return rows


def gpu_markdown(gpu: Mapping[str, Any] | None, prediction_rows: Sequence[Mapping[str, Any]] = (),
                 source: str | None = None) -> str:
    """The GPU measurement as markdown: where and when, the MFU, and the stall table (`gpu_rows`); `source`: the
    file it was read from (named when it could not be read)."""
    if not gpu:
        return f"`{source}`: not a readable `pretok gpu-study` JSON." if source else NONE
    env = gpu.get("environment") or {}
    acc = match_accelerator(str(env.get("gpu_name") or ""))
    mfu = (gpu.get("parts") or {}).get("mfu") or {}
    m = mfu.get("mfu") or {}
    head = (f"**Measured on a GPU** ({env.get('gpu_name')}, driver {env.get('nvidia_smi') or '-'}, torch "
            f"{env.get('torch')}, {env.get('cpus')} CPUs: {env.get('cpu_model')}; {gpu.get('started')}).")
    if m:
        lo, hi = m["interval"]
        head += (f" The study's model ({(mfu.get('facts') or {}).get('params', 0) / 1e9:.2f}B parameters, "
                 f"torch.compile, {(mfu.get('facts') or {}).get('precision')}): **MFU {m['median']:.1%}** [{lo:.1%}, "
                 f"{hi:.1%}] over {m['n']} steps of the {(mfu.get('facts') or {}).get('peak_source')} peak "
                 f"(goal >= {mfu.get('goal', 0.4):.0%}: {'met' if mfu.get('met') else 'not met'}).")
    rows = gpu_rows(gpu, prediction_rows)
    if not rows:
        return head + "\n\nNo data-path runs in this measurement."
    ours = f"this study's prediction for {acc.name}" if acc else "this study's prediction (no matching accelerator)"
    lines = [head, "", f"| path | workers | tokens/s | measured stall | predicted there (as built) | predicted there "
             f"(paced) | either | {ours} |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        sp = r["study_prediction"]
        lines.append(f"| {r['path']} | {r['workers']} | {r['tokens_per_s'] or 0:,.0f} | {_pct(r['measured_stall'])} | "
                     f"{_interval(r['back_to_back'])} | {_interval(r['paced'])} | {_interval(r['either'])} | "
                     f"{'-' if sp is None else _pct(sp[0]) + '-' + _pct(sp[1])} |")
    lines.append("\nPredicted there: the stall model fed by `pretok bench loaders` on the GPU machine's own CPUs and "
                 "each run's measured compute (interval over the loader rate's and the run's variation); as built: "
                 "back-to-back loader rates; paced: next() timed once per step, after an idle wait of the step's "
                 "length; either: from the lower end of the two to the higher (docs/BENCHMARKS.md). This study's "
                 "prediction: this machine's loaders at the target MFU range, as in the table above.")
    return "\n".join(lines)
