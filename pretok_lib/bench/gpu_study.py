"""`pretok gpu-study`: the study's model, the five data paths and the engine measured on a GPU machine, in one
command that writes one JSON (docs/GPU_CHECK.md, "The study on a GPU").

Parts, in `--parts` order, each given what is left of `--budget` seconds (a part whose minimum no longer fits is
skipped and says so); the JSON is rewritten after every run, so a command cut short still returns what it measured:

- mfu: the study's model (`--config`, default configs/study.yaml: ~1.5B parameters with tekken's 131k vocabulary)
  on the pretokenized memmap path under bf16 autocast (`precision: auto`) and `torch.compile`: MFU against the
  datasheet's dense bf16 peak (goal >= 40%), the median over the steps after `--mfu-skip` with its interval, and its
  last step profiled (`log.profile_step`: where the step's time goes);
- paths: the five data paths, eager, with 0 and `--workers` DataLoader workers (pinned memory and non-blocking
  copies: the loader's CUDA defaults): tokens/s, effective tokens/s, data stall;
- loaders: `pretok bench loaders` on this machine's CPUs at the runs' seq_len, micro-batch and worker counts, and
  beside every path run the stall the model of analysis/stall.py predicts from it, over the loader rate's interval
  and the run's own compute: the measured stall inside that interval or not;
- engine: `pretok bench tokenize --workers N` on `--engine-mb` MB for each N (one child each), then the scaling
  curve (bench/scaling_curve.py): per-core efficiency against the N-core ceiling, Amdahl and USL fits, 72/288-core
  predictions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..analysis.stall_check import stall_check as check_path_run
from ..analysis.uncertainty import estimate
from ..datapaths import FORMAT_OF, KINDS, ON_THE_FLY, PRETOK_MEMMAP
from ..errors import PretokError
from ..formats import TRAIN_COMPRESSION
from .common import (BenchConfig, add_common_args, at_least, corpus_and_tokenizer, counts, environment, positive,
                     write_json)
from .gpu_check import environment as gpu_env
from .gpu_check import train_records
from .repeats import est_dict
from .scaling_curve import curve_lines, scaling_curve

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("mfu", "paths", "loaders", "engine")
MIN_SECONDS = {"mfu": 90.0, "paths": 40.0, "loaders": 20.0, "engine": 40.0}  # a part starts only with this left
MFU_GOAL = 0.40
MEASURE_RUN = ["checkpoint.at_end=false", "checkpoint.export=false"]   # run_path sets checkpoint.every=0


@dataclass
class GpuStudy(BenchConfig):
    """`pretok gpu-study`: what each part runs and the time they share."""

    workdir: str = "runs/gpu-study"
    config: str = str(ROOT / "configs" / "study.yaml")
    set: list[str] = field(default_factory=list)   # training overrides for every run, KEY=VALUE
    parts: str = ",".join(PARTS)
    budget: float = 540.0          # seconds for all parts together
    mfu_steps: int = 40
    mfu_skip: int = 10             # compilation and warm-up steps left out
    compile: bool = True
    path_steps: int = 14
    path_skip: int = 4
    workers: int = 2               # the DataLoader workers of the paths' second runs
    paths: str = ",".join(KINDS)   # the data paths the paths part runs
    loader_batches: int = 200
    loader_slow_batches: int = 20
    loader_repeats: int = 3
    paced_batches: int = 10        # loader calls timed at the runs' pace (the stall model's paced correction)
    engine_tokenizer: str | None = None   # None: --tokenizer
    engine_mb: float = 1000.0
    engine_workers: str = "1,15,8,4,2"    # run in this order (the most telling first), tabulated by N
    engine_repeats: int = 2
    engine_pair_w1: bool = False          # w1 beside every N (else once, from the N = 1 run: less time)


def add_args(p: argparse.ArgumentParser) -> None:
    d = GpuStudy()
    add_common_args(p, d, "the work directory (data, runs, benchmark JSONs)")
    p.add_argument("--config", default=d.config, help="the study's training config (default: configs/study.yaml)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="training overrides for every run")
    p.add_argument("--parts", default=d.parts, help=f"comma-separated, run in this order ({', '.join(PARTS)})")
    p.add_argument("--budget", type=positive, default=d.budget, help="seconds for all parts together")
    p.add_argument("--mfu-steps", type=at_least(2), default=d.mfu_steps)
    p.add_argument("--mfu-skip", type=at_least(0), default=d.mfu_skip, help="warm-up steps left out of the MFU")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="the mfu run without torch.compile")
    p.add_argument("--path-steps", type=at_least(2), default=d.path_steps)
    p.add_argument("--path-skip", type=at_least(0), default=d.path_skip)
    p.add_argument("--workers", type=at_least(1), default=d.workers, help="DataLoader workers of the second runs")
    p.add_argument("--paths", default=d.paths, help="the data paths to run, comma-separated (default: all five)")
    p.add_argument("--loader-batches", type=at_least(1), default=d.loader_batches)
    p.add_argument("--loader-slow-batches", type=at_least(1), default=d.loader_slow_batches)
    p.add_argument("--loader-repeats", type=at_least(2), default=d.loader_repeats)
    p.add_argument("--paced-batches", type=at_least(1), default=d.paced_batches,
                   help="loader calls timed at the runs' step time (the stall model's paced correction)")
    p.add_argument("--engine-tokenizer", default=None, help="the engine part's tokenizer (default: --tokenizer)")
    p.add_argument("--engine-mb", type=positive, default=d.engine_mb)
    p.add_argument("--engine-workers", type=counts(1), default=d.engine_workers)
    p.add_argument("--engine-repeats", type=at_least(1), default=d.engine_repeats)
    p.add_argument("--engine-pair-w1", action="store_true",
                   help="time w1 in every N's rounds (default: once, in the N = 1 run, which N > 1 divide by)")
    p.add_argument("--json", default=None, metavar="OUT", help="the results (default: <workdir>/gpu-study.json)")


class Study:
    """The results JSON, rewritten after every run, and the budget the parts share."""

    def __init__(self, cfg: GpuStudy):
        self.cfg, self.t0 = cfg, time.monotonic()
        self.path = Path(cfg.json or Path(cfg.workdir) / "gpu-study.json")
        self.out: dict[str, Any] = {"version": 1, "started": _now(), "finished": None, "budget_s": cfg.budget,
                                    "args": cfg.record(), "environment": _environment(), "parts": {},
                                    "skipped": {}, "errors": {}}

    def left(self) -> float:
        return self.cfg.budget - (time.monotonic() - self.t0)

    def save(self) -> None:
        self.out["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        write_json(self.path, self.out)

    def part(self, name: str, fn: Callable[[dict], None]) -> None:
        """Run one part into out["parts"][name] (filled as it goes); an error is recorded and the next part runs."""
        if self.left() < MIN_SECONDS[name]:
            self.out["skipped"][name] = f"budget: {self.left():.0f} s left, the part needs >= {MIN_SECONDS[name]:.0f}"
            print(f"[gpu-study] {name}: skipped ({self.out['skipped'][name]})", flush=True)
            return self.save()
        print(f"[gpu-study] {name}: {self.left():.0f} s of the budget left", flush=True)
        res = self.out["parts"][name] = {"started_s": round(time.monotonic() - self.t0, 1)}
        try:
            fn(res)
        except (PretokError, OSError, subprocess.SubprocessError, KeyError, ValueError) as e:
            self.out["errors"][name] = f"{type(e).__name__}: {e}"
            print(f"[gpu-study] {name}: failed: {e}", flush=True)
        res["seconds"] = round(time.monotonic() - self.t0 - res["started_s"], 1)
        self.save()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _environment() -> dict:
    env = {**environment(), **gpu_env()}
    try:  # the driver, as nvidia-smi reports it
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        env["nvidia_smi"] = q.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["nvidia_smi"] = None
    return env


def steady(rows: list[dict], skip: int, leave_out: int = 0) -> list[dict]:
    """The records after `skip` warm-up steps, without step `leave_out` (the profiled one)."""
    return [r for r in rows if r["step"] > skip and r["step"] != leave_out]


def _est(values) -> dict | None:
    return est_dict(estimate([v for v in values if v is not None]))


def mfu_part(cfg: GpuStudy, study: Study, data: dict, tok: str, seq: int, batch: int) -> Callable[[dict], None]:
    """The study's model on the memmap path with torch.compile: MFU per step, tokens/s, memory, the profile."""
    from .train import TrainBench, run_path

    def run(res: dict) -> None:
        runs = Path(cfg.workdir) / "runs"
        tb = TrainBench(config=cfg.config, steps=cfg.mfu_steps, skip=cfg.mfu_skip, seq_len=seq, micro_batch=batch,
                        set=[*MEASURE_RUN, f"train.compile={str(cfg.compile).lower()}",
                             f"log.profile_step={cfg.mfu_steps}", *cfg.set])
        r = run_path(PRETOK_MEMMAP, data[PRETOK_MEMMAP], tok, tb, runs, "mfu", timeout=study.left())
        rows = steady(train_records(runs / "mfu"), cfg.mfu_skip, cfg.mfu_steps)
        record = json.loads((runs / "mfu" / "run.json").read_text())
        prof = runs / "mfu" / f"profile-step{cfg.mfu_steps}.json"
        mfu = _est(x["mfu"] for x in rows)
        res.update(run_dir=str(runs / "mfu"), steps=cfg.mfu_steps, measured_steps=len(rows), compile=cfg.compile,
                   mfu=mfu, tokens_per_s=_est(x["tokens_per_s"] for x in rows),
                   step_time_s=_est(x["step_time_s"] for x in rows), data_stall=_est(x["data_stall"] for x in rows),
                   peak_mem_mb=max((x.get("peak_mem_mb") or 0) for x in rows) if rows else None,
                   goal=MFU_GOAL, met=bool(mfu and mfu["median"] >= MFU_GOAL),
                   facts={k: record.get(k) for k in ("params", "vocab_size", "flops_per_token", "peak_flops",
                                                      "peak_source", "precision", "matmul_precision")},
                   final_loss=r.get("final_loss"),
                   profile=json.loads(prof.read_text()) if prof.is_file() else None)
        m = mfu["median"] if mfu else float("nan")
        print(f"[gpu-study] mfu: {m:.1%} of {record.get('peak_source')} ({len(rows)} steps)", flush=True)
    return run


def paths_part(cfg: GpuStudy, study: Study, data: dict, tok: str, seq: int, batch: int) -> Callable[[dict], None]:
    """Every data path with 0 and `workers` DataLoader workers, eager."""
    from .train import TrainBench, run_path

    def run(res: dict) -> None:
        runs = Path(cfg.workdir) / "runs"
        res["runs"] = {}
        for w in (0, cfg.workers):
            for kind in (k.strip() for k in cfg.paths.split(",") if k.strip()):
                if study.left() < 10:
                    study.out["skipped"][f"paths {kind} w{w}"] = "budget"
                    continue
                tb = TrainBench(config=cfg.config, steps=cfg.path_steps, skip=cfg.path_skip, seq_len=seq,
                                micro_batch=batch, num_workers=w, set=[*MEASURE_RUN, "train.compile=false", *cfg.set])
                try:
                    r = run_path(kind, data[kind], tok, tb, runs, f"{kind}-w{w}", timeout=study.left())
                except subprocess.TimeoutExpired:
                    study.out["skipped"][f"paths {kind} w{w}"] = "budget: stopped when it ran out"
                    continue
                res["runs"][f"{kind} w{w}"] = {**r, "workers": w}
                study.save()
    return run


def loaders_part(cfg: GpuStudy, study: Study, seq: int, batch: int) -> Callable[[dict], None]:
    """`pretok bench loaders` here at the runs' settings, and each path run's measured stall beside the prediction."""
    from .loaders import LoadersBench, run as loaders_run

    def run(res: dict) -> None:
        runs = (study.out["parts"].get("paths") or {}).get("runs") or {}
        steps = sorted(r["step_time_s"] for r in runs.values() if r.get("step_time_s"))
        pace = 1e3 * steps[len(steps) // 2] if steps else 200.0   # the runs' step time: the pace a loader is called
        lb = LoadersBench(corpus=cfg.corpus, tokenizer=cfg.tokenizer, workdir=cfg.workdir, seq_len=seq,
                          micro_batch=batch, workers=f"0,{cfg.workers}", batches=cfg.loader_batches,
                          slow_batches=cfg.loader_slow_batches, compressions="", repeats=cfg.loader_repeats,
                          probe=False, json=str(Path(cfg.workdir) / "loaders.json"), pace_ms=pace,
                          paced_batches=cfg.paced_batches, paths=cfg.paths)
        loaders = loaders_run(lb)
        res["json"] = lb.json
        res["rates"] = {name: {"tokens_per_s": r["tokens_per_s"], "estimate": r.get("estimate")}
                        for name, r in loaders["loaders"].items()}
        res["checks"] = {name: stall_check(loaders, r, cfg.path_skip) for name, r in runs.items()}
        for name, c in res["checks"].items():
            print(f"[gpu-study] stall {name}: " + "; ".join(
                f"{k} {v['measured_stall']:.2%} measured, {v['interval'][0]:.2%}-{v['interval'][1]:.2%} predicted"
                f"{'' if v['inside'] else ' (outside' + (', the intervals overlap)' if v['agrees'] else ')')}"
                for k, v in (c or {}).items() if v), flush=True)
    return run


def stall_check(loaders: dict, run: dict, skip: int) -> dict | None:
    """A path run's measured stall beside the stall predicted from the loader benchmark's row for that path and
    worker count: `back_to_back`, `paced` and `either` (analysis/stall_check.py)."""
    return check_path_run(loaders, run["kind"], int(run["workers"]), train_records(Path(run["run_dir"])), skip)


def engine_part(cfg: GpuStudy, study: Study) -> Callable[[dict], None]:
    """`pretok bench tokenize --workers N` for each N, one child each (its own start-up is what it times)."""
    def run(res: dict) -> None:
        work = Path(cfg.workdir) / "engine"
        tok = cfg.engine_tokenizer or cfg.tokenizer
        res["runs"], results = {}, []
        for n in (int(x) for x in cfg.engine_workers.split(",") if x.strip()):
            left = study.left()
            if left < 15:
                study.out["skipped"][f"engine w{n}"] = f"budget: {left:.0f} s left"
                continue
            out = work / f"tokenize-w{n}.json"
            skip = ["loop", "datasets-map", "rss-scan", *(["engine-1"] if n > 1 and not cfg.engine_pair_w1 else [])]
            cmd = [sys.executable, "-m", "pretok_lib.cli", "bench", "tokenize", "--mb", f"{cfg.engine_mb:g}",
                   "--workdir", str(work), "--workers", str(n), "--formats", "memmap", "--skip", *skip,
                   "--repeat", str(cfg.engine_repeats), "--no-probe", "--json", str(out),
                   *(["--tokenizer", tok] if tok else [])]
            t = time.monotonic()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
                ok, tail = p.returncode == 0, (p.stdout + p.stderr).strip().splitlines()[-3:]
            except subprocess.TimeoutExpired:
                ok, tail = False, [f"timed out after {left:.0f} s (the budget)"]
            res["runs"][f"w{n}"] = {"ok": ok, "seconds": round(time.monotonic() - t, 1), "json": str(out),
                                    **({} if ok else {"tail": tail})}
            print(f"[gpu-study] engine w{n}: {'done' if ok else 'failed: ' + ' | '.join(tail)} "
                  f"({time.monotonic() - t:.0f} s)", flush=True)
            if ok:
                results.append(json.loads(out.read_text()))
                res["curve"] = scaling_curve(results)
            study.save()
        if res.get("curve"):
            print("\n".join(curve_lines(res["curve"])), flush=True)
    return run


def prepare_data(cfg: GpuStudy, res: dict, kinds: set[str]) -> tuple[dict, str, int, int]:
    """The corpus pretokenized (by the engine, every core) for those of `kinds` that read pretokenized data; the
    paths' inputs, the tokenizer spec, the seq_len and micro-batch of the study's config (`--set` applied)."""
    import yaml

    from .loaders import pretokenize, variant_dir  # imports torch: not at `pretok gpu-study --help`

    conf = yaml.safe_load(Path(cfg.config).read_text()) or {}
    over = dict(s.split("=", 1) for s in cfg.set if "=" in s)
    seq = int(over.get("data.seq_len", (conf.get("data") or {}).get("seq_len", 2048)))
    batch = int(over.get("data.micro_batch", (conf.get("data") or {}).get("micro_batch", 4)))
    work, corpus, tok = corpus_and_tokenizer(cfg)
    data = dict.fromkeys(ON_THE_FLY, corpus)
    t = time.monotonic()
    for kind, fmt in ((k, f) for k, f in FORMAT_OF.items() if k in kinds):
        data[kind] = str(work / f"pretok-s{seq}" / variant_dir(fmt, TRAIN_COMPRESSION))
        m = pretokenize(corpus, tok, fmt, seq, TRAIN_COMPRESSION, Path(data[kind]))
        res.setdefault("tokens", m["counts"]["tokens"])
    res.update(corpus=corpus, tokenizer=tok, seq_len=seq, micro_batch=batch, seconds=round(time.monotonic() - t, 1))
    cfg.corpus, cfg.tokenizer = corpus, tok
    return data, tok, seq, batch


def run(cfg: GpuStudy) -> dict:
    """Every part of `cfg.parts` in order, within `cfg.budget` seconds; the JSON at `cfg.json`."""
    parts = [p.strip() for p in cfg.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise PretokError(f"unknown part(s) {', '.join(bad)} (choose from {', '.join(PARTS)})")
    paths = {k.strip() for k in cfg.paths.split(",") if k.strip()}
    bad = sorted(paths - set(KINDS))
    if bad:
        raise PretokError(f"unknown data path(s) {', '.join(bad)} (choose from {', '.join(KINDS)})")
    Path(cfg.workdir).mkdir(parents=True, exist_ok=True)
    study = Study(cfg)
    study.save()
    if {"mfu", "paths", "loaders"} & set(parts):
        kinds = ({PRETOK_MEMMAP} if "mfu" in parts else set()) | (paths if {"paths", "loaders"} & set(parts) else set())
        data, tok, seq, batch = prepare_data(cfg, study.out["parts"].setdefault("data", {}), kinds)
        study.save()
    fns = {"mfu": lambda: mfu_part(cfg, study, data, tok, seq, batch),
           "paths": lambda: paths_part(cfg, study, data, tok, seq, batch),
           "loaders": lambda: loaders_part(cfg, study, seq, batch), "engine": lambda: engine_part(cfg, study)}
    for name in parts:
        study.part(name, fns[name]())
    study.out["finished"] = _now()
    study.save()
    print(f"[gpu-study] wrote {study.path} ({study.out['elapsed_s']} s)", flush=True)
    return study.out


def main(a: argparse.Namespace) -> int:
    from .common import from_args

    out = run(from_args(GpuStudy, a))
    return 1 if out["errors"] else 0
