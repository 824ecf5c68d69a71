"""`pretok bench train`: the same tiny model on the same corpus through all five data paths, in one run.

Each path trains as its own `python -m pretok_lib.train` process (fresh interpreter, like a real run), one
after the other on the same machine, for --steps optimizer steps, --repeats times in interleaved rounds whose
order rotates (every run probed: machine_probe); the table shows medians, the targets paired-round ratios with
their intervals, and a run with fewer than --min-measured-steps steps after the warm-up is too short to measure.
Reported from each run's metrics.jsonl
(after --skip warm-up steps): tokens/s, effective tokens/s (labels that count: no padding, no masked
document crossings), data-stall fraction (time waiting for the batch / step time), padding and masked
fractions, and effective tokens/s as a ratio to `padded` (the original study's baseline).
Targets: the packed paths (padding-free, pretok-token-list, pretok-memmap) >= 3x padded's effective tokens/s;
the pretokenized paths' data stall < 1%.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.uncertainty import estimate
from ..datapaths import BASELINE, KINDS, ON_THE_FLY, PACKED, PRETOKENIZED
from ..errors import PretokError
from ..formats import TRAIN_COMPRESSION
from ..launch.procs import run_child
from ..machine.probe import machine_line
from . import fmt_num
from .common import (BenchConfig, add_common_args, add_output_args, at_least, check_targets, corpus_and_tokenizer,
                     environment, from_args, write_json)
from .loaders import FORMAT_OF, pretokenize, render, variant_dir
from .repeats import est_dict, probes_of, ratio_estimate, rounds, text, threshold_resolved

PRETOK = PRETOKENIZED


@dataclass
class TrainBench(BenchConfig):
    """`pretok bench train`: the training runs, one per data path, and their shared settings."""

    mb: float = 5.0
    workdir: str = "runs/bench/train"
    config: str | None = None  # base training config (None: configs/tiny.yaml values)
    steps: int = 30
    skip: int = 5  # warm-up steps left out of the means
    seq_len: int = 512
    micro_batch: int = 8
    num_workers: int = 0  # DataLoader workers of every path
    precision: str = "auto"
    paths: str = ",".join(KINDS)  # data paths to run, comma-separated
    set: list[str] = field(default_factory=list)  # more training overrides, KEY=VALUE
    repeats: int = 3  # runs per path, interleaved in rounds (order rotated each round)
    min_measured_steps: int = 3  # fewer steps after the warm-up: "too short to measure", not a number
    probe: bool = True  # machine_probe around every run


def add_args(p: argparse.ArgumentParser) -> None:
    """Arguments of `pretok bench train` (defaults: `TrainBench`)."""
    d = TrainBench()
    add_common_args(p, d, "corpus cache, pretokenized data, the runs")
    p.add_argument("--config", default=d.config, help="base training config (default: configs/tiny.yaml values)")
    p.add_argument("--steps", type=at_least(1), default=d.steps)
    p.add_argument("--skip", type=at_least(0), default=d.skip, help="warm-up steps left out of the means")
    p.add_argument("--seq-len", type=at_least(1), default=d.seq_len)
    p.add_argument("--micro-batch", type=at_least(1), default=d.micro_batch)
    p.add_argument("--num-workers", type=at_least(0), default=d.num_workers, help="DataLoader workers of every path")
    p.add_argument("--precision", default=d.precision, choices=("auto", "fp32", "bf16", "fp16"),
                   help="auto: bf16 where the hardware computes it natively, else fp32 (see run.json)")
    p.add_argument("--paths", default=d.paths, help="data paths to run, comma-separated")
    p.add_argument("--set", nargs="*", default=list(d.set), metavar="KEY=VALUE", help="more training overrides")
    p.add_argument("--repeats", type=at_least(1), default=d.repeats,
                   help="runs per path, interleaved in rounds with the order rotated; medians with intervals")
    p.add_argument("--min-measured-steps", type=at_least(1), default=d.min_measured_steps,
                   help="fewer steps after --skip: the run is too short to measure")
    p.add_argument("--no-probe", dest="probe", action="store_false", help="no machine probe around the runs")
    add_output_args(p)


def measure_run(run_dir: Path, skip: int) -> dict:
    """Means over the steady-state train records of one run, as the analysis computes them from metrics.jsonl."""
    from ..analysis.metrics import mean_after, run_metrics
    from ..analysis.runs import load_run

    run = load_run(run_dir)
    if not len(run.train):
        raise PretokError("the run logged no steps", run_dir / "metrics.jsonl")
    m = run_metrics(run, skip)
    return {"steps": m.steps, "measured_steps": m.used, "final_loss": m.final_loss, "precision": m.precision,
            "precision_reason": m.precision_reason, "peak_source": m.peak_source,
            **{k: getattr(m, k) for k in ("tokens_per_s", "effective_tokens_per_s", "data_stall", "padding_frac",
                                          "masked_frac", "mfu")},
            **{k: mean_after(run.train[k], skip) for k in ("step_time_s", "data_wait_s")}}


def run_path(kind: str, data_path: str, tok: str, a: TrainBench, runs: Path, run_id: str | None = None,
             timeout: float | None = None) -> dict:
    """Train `kind` in its own process (`python -m pretok_lib.train`) and measure its run; past `timeout` seconds the
    process tree is stopped and `subprocess.TimeoutExpired` raised."""
    run_id = run_id or kind
    overrides = [f"run.dir={runs}", f"run.id={run_id}", "run.overwrite=true", f"data.kind={kind}",
                 f"data.path={data_path}", f"data.tokenizer={tok}", f"data.seq_len={a.seq_len}",
                 f"data.micro_batch={a.micro_batch}", f"data.num_workers={a.num_workers}",
                 f"train.steps={a.steps}", f"train.precision={a.precision}", "checkpoint.every=0",
                 "log.tensorboard=false", "eval.path=null"]
    if a.config is None:
        overrides += ["model.hidden_size=128", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
                      "train.lr=1e-3"]
    overrides += a.set  # last: --set overrides the defaults above
    cmd = [sys.executable, "-m", "pretok_lib.train", *(["--config", a.config] if a.config else []), *overrides]
    print(f"  {kind}: {' '.join(cmd[3:])}", flush=True)
    p = run_child(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=timeout,
                  grace_s=10.0)
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise PretokError(f"training on {kind} failed (exit {p.returncode}): {tail[0]}", runs / run_id)
    return {"kind": kind, "run_id": run_id, "run_dir": str(runs / run_id), **measure_run(runs / run_id, a.skip)}


METRICS = ("tokens_per_s", "effective_tokens_per_s", "data_stall", "padding_frac", "masked_frac", "mfu",
           "step_time_s", "data_wait_s", "final_loss")


def summarize(samples: list[dict], min_steps: int) -> dict:
    """One path's repeats: the median of each metric over the runs long enough to measure (the table's
    numbers), each metric's estimate, every run, and the runs too short to measure."""
    ok = [r for r in samples if (r.get("measured_steps") or 0) >= min_steps]
    short = [r["run_id"] for r in samples if r not in ok]
    est = {k: est_dict(estimate(r[k] for r in ok if r.get(k) is not None)) for k in METRICS}
    first = (ok or samples)[0]
    out = {k: (est[k]["median"] if est[k] else None) for k in METRICS}
    return {**{k: first[k] for k in ("kind", "steps", "measured_steps", "precision", "precision_reason",
                                     "peak_source", "run_dir")},
            **out, "estimates": est, "samples": samples, "too_short": short}


def table(res: dict[str, dict]) -> str:
    base = res.get(BASELINE, {}).get("effective_tokens_per_s")
    rows = [["data path", "tok/s", "eff tok/s", "x padded (eff)", "data stall", "padding", "masked", "step ms",
             "MFU*", "loss"]]
    for kind, r in res.items():
        if r["effective_tokens_per_s"] is None:
            rows.append([kind, "too short to measure", *["-"] * 8])
            continue
        rows.append([kind, fmt_num(r["tokens_per_s"], True), fmt_num(r["effective_tokens_per_s"], True),
                     f"{r['effective_tokens_per_s'] / base:.2f}x" if base else "-", f"{100 * r['data_stall']:.2f}%",
                     f"{100 * r['padding_frac']:.1f}%", f"{100 * r['masked_frac']:.2f}%",
                     f"{1000 * r['step_time_s']:.0f}", f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-",
                     f"{r['final_loss']:.3f}"])
    return render(rows)


def _values(r: dict, key: str) -> list[float | None]:
    """`key` of each repeat, by round (None for a run too short to measure)."""
    return [None if s["run_id"] in r["too_short"] else s.get(key) for s in r["samples"]]


def targets(res: dict[str, dict]) -> list[dict]:
    """Packing gain (paired by round: round i's packed run over round i's padded run) and the pretokenized paths'
    stall, each the median with its interval; `resolved`: the interval wholly on one side of the threshold."""
    out = []
    base = res.get(BASELINE)

    def add(name: str, e: dict | None, need: float, below: bool = False) -> None:
        v = e["median"] if e else None
        ok = None if v is None else (v < need if below else v >= need)
        out.append({"target": name, "value": v, "pass": ok, "estimate": e, "interval": e and e["interval"],
                    "n": e["n"] if e else 0, "resolved": threshold_resolved(e, need)})

    for kind in PACKED:
        if kind in res and base:
            add(f"{kind} effective tok/s >= 3x padded",
                ratio_estimate(_values(res[kind], "effective_tokens_per_s"), _values(base, "effective_tokens_per_s")),
                3.0)
    for kind in PRETOK:
        if kind in res:
            add(f"{kind} data stall < 1%", est_dict(estimate(v for v in _values(res[kind], "data_stall")
                                                             if v is not None)), 0.01, below=True)
    return out


def main(args: argparse.Namespace) -> dict:
    """`pretok bench train`: `run` with the command line's config."""
    return run(from_args(TrainBench, args))


def run(args: TrainBench) -> dict:
    """Pretokenize what the paths need, train once per path, print the table and targets, write `args.json`."""
    work, corpus, tok = corpus_and_tokenizer(args)
    kinds = [k.strip() for k in args.paths.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise PretokError(f"unknown data path(s) {', '.join(unknown)} (choose from {', '.join(KINDS)})")
    pre = work / f"pretok-s{args.seq_len}"
    data = dict.fromkeys(ON_THE_FLY, corpus)
    for kind, fmt in FORMAT_OF.items():
        if kind in kinds:
            data[kind] = str(pre / variant_dir(fmt, TRAIN_COMPRESSION))
            pretokenize(corpus, tok, fmt, args.seq_len, TRAIN_COMPRESSION, Path(data[kind]))
    print(f"corpus {corpus}; tokenizer {tok}; {args.steps} steps of micro-batch {args.micro_batch} x "
          f"{args.seq_len}, {args.precision}, {args.num_workers} DataLoader workers; means after {args.skip} steps",
          flush=True)
    samples = rounds(kinds, args.repeats, lambda kind, k: run_path(
        kind, data[kind], tok, args, work / "runs", kind if args.repeats == 1 else f"{kind}-r{k}"), args.probe)
    res = {kind: summarize(samples[kind], args.min_measured_steps) for kind in kinds}
    print()
    print(f"medians over {args.repeats} runs per path, interleaved (order rotated each round)")
    print(table(res))
    used = dict.fromkeys(f"{r['precision']} ({r['precision_reason']})" for r in res.values())
    print(f"precision: {'; '.join(used)}")
    print(f"* MFU = model FLOP/s / peak: {'; '.join(dict.fromkeys(str(r['peak_source']) for r in res.values()))}")
    tg = targets(res)
    for t in tg:
        status = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        print(f"{status}  {t['target']}: {text(t['estimate'])}" + ("" if t["resolved"] else " (threshold inside "
                                                                     "the interval: noise decides)"))
    too_short = [i for r in res.values() for i in r["too_short"]]
    if too_short:
        print(f"too short to measure (< {args.min_measured_steps} steps after {args.skip}): {', '.join(too_short)}")
    mach = probes_of(samples)
    print(machine_line(mach))
    out = {"corpus": corpus, "tokenizer": tok, "args": args.record(), "results": res, "targets": tg,
           "machine": mach, "environment": environment()}
    write_json(args.json, out)
    if args.json:
        print(f"wrote {args.json}")
    check_targets(args, not all(t["pass"] for t in tg))
    return out
