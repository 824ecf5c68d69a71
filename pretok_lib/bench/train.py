"""`pretok bench train`: the same tiny model on the same corpus through all five data paths, in one run.

Each path trains as its own `python -m pretok_lib.train` process (fresh interpreter, like a real run), one
after the other on the same machine, for --steps optimizer steps. Reported from each run's metrics.jsonl
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

from ..datapaths import KINDS, ON_THE_FLY, PACKED
from ..errors import PretokError
from ..procs import run_child
from . import fmt_num
from .common import (BenchConfig, add_common_args, add_output_args, at_least, check_targets, corpus_and_tokenizer,
                     environment, from_args, write_json)
from .loaders import FORMAT_OF, pretokenize, render, variant_dir

PRETOK = ("pretok-padded", "pretok-token-list", "pretok-memmap")


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


def run_path(kind: str, data_path: str, tok: str, a: TrainBench, runs: Path) -> dict:
    overrides = [f"run.dir={runs}", f"run.id={kind}", "run.overwrite=true", f"data.kind={kind}",
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
    p = run_child(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise PretokError(f"training on {kind} failed (exit {p.returncode}): {tail[0]}", runs / kind)
    return {"kind": kind, "run_dir": str(runs / kind), **measure_run(runs / kind, a.skip)}


def table(res: dict[str, dict]) -> str:
    base = res.get("padded", {}).get("effective_tokens_per_s")
    rows = [["data path", "tok/s", "eff tok/s", "x padded (eff)", "data stall", "padding", "masked", "step ms",
             "MFU*", "loss"]]
    for kind, r in res.items():
        rows.append([kind, fmt_num(r["tokens_per_s"], True), fmt_num(r["effective_tokens_per_s"], True),
                     f"{r['effective_tokens_per_s'] / base:.2f}x" if base else "-", f"{100 * r['data_stall']:.2f}%",
                     f"{100 * r['padding_frac']:.1f}%", f"{100 * r['masked_frac']:.2f}%",
                     f"{1000 * r['step_time_s']:.0f}", f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-",
                     f"{r['final_loss']:.3f}"])
    return render(rows)


def targets(res: dict[str, dict]) -> list[dict]:
    out = []
    base = res.get("padded")
    for kind in PACKED:
        if kind in res and base:
            v = res[kind]["effective_tokens_per_s"] / base["effective_tokens_per_s"]
            out.append({"target": f"{kind} effective tok/s >= 3x padded", "value": v, "pass": v >= 3.0})
    for kind in PRETOK:
        if kind in res:
            v = res[kind]["data_stall"]
            out.append({"target": f"{kind} data stall < 1%", "value": v, "pass": v < 0.01})
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
            data[kind] = str(pre / variant_dir(fmt, "zstd:3"))
            pretokenize(corpus, tok, fmt, args.seq_len, "zstd:3", Path(data[kind]))
    print(f"corpus {corpus}; tokenizer {tok}; {args.steps} steps of micro-batch {args.micro_batch} x "
          f"{args.seq_len}, {args.precision}, {args.num_workers} DataLoader workers; means after {args.skip} steps",
          flush=True)
    res = {kind: run_path(kind, data[kind], tok, args, work / "runs") for kind in kinds}
    print()
    print(table(res))
    used = dict.fromkeys(f"{r['precision']} ({r['precision_reason']})" for r in res.values())
    print(f"precision: {'; '.join(used)}")
    print(f"* MFU = model FLOP/s / peak: {'; '.join(dict.fromkeys(str(r['peak_source']) for r in res.values()))}")
    tg = targets(res)
    for t in tg:
        print(f"{'PASS' if t['pass'] else 'FAIL'}  {t['target']}: {t['value']:.3g}")
    out = {"corpus": corpus, "tokenizer": tok, "args": args.record(), "results": res, "targets": tg,
           "environment": environment()}
    write_json(args.json, out)
    if args.json:
        print(f"wrote {args.json}")
    check_targets(args, not all(t["pass"] for t in tg))
    return out
