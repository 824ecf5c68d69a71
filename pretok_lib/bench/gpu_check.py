"""`pretok gpu-check`: acceptance test of a GPU machine (no network needed), ending in one JSON verdict.

On CUDA it trains the tiny model through torchrun (one process per GPU, NCCL) with bf16 autocast, pinned-memory
batches and `torch.compile`, trains once more in fp32 with TF32 matmuls (`train.tf32`), kills a second run with
SIGKILL after its first checkpoint and resumes it (the losses must follow the uninterrupted run's), then runs the
smoke study (`pretok study --profile smoke`, world sizes up to the GPUs present). `--device cpu` runs the same
checks with gloo and fp32 where they mean something on a CPU and marks the others skipped ("no CUDA"); `--dry-run`
runs nothing and prints the plan as the verdict. Exit code 0 when no check failed. See docs/GPU_CHECK.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..datapaths import BASELINE, PRETOK_MEMMAP
from ..errors import PretokError
from ..launch import procs
from ..machine.cpu_affinity import usable_cpus
from ..train.metrics import read_records
from ..train.run_record import read_run_config, read_run_record

VERDICT_VERSION = 1
CHECKS = ("cuda", "pin_memory", "data", "train", "nccl", "bf16", "compile", "tf32", "resume", "study")
NO_CUDA = "no CUDA (cpu mode)"
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
CUDA_LOSS_TOL = 0.05   # a resumed bf16 run on a GPU is not bit-identical (non-deterministic kernels)
MARKER = ".pretok-gpu-check"  # names a work directory this command may empty


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/gpu-check", help="work directory (data, runs, study, verdict.json)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="auto: cuda when available; cpu: gloo/fp32, the CUDA-only checks skipped")
    p.add_argument("--gpus", type=int, default=None, help="processes (GPUs) for torchrun (default: every GPU)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps of each training run (>= 4)")
    p.add_argument("--skip", nargs="*", default=[], choices=CHECKS, metavar="CHECK",
                   help=f"checks to skip ({', '.join(CHECKS)})")
    p.add_argument("--corpus", default=None, help="text corpus (default: the embedded one, built offline)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: a BPE trained on the corpus)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per launched process")
    p.add_argument("--dry-run", action="store_true", help="print the plan as the verdict; run nothing")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the verdict here "
                   "(always written to <out>/verdict.json)")


def validate_args(a: argparse.Namespace) -> None:
    if a.steps < 4:
        raise PretokError(f"--steps must be >= 4 (got {a.steps}): the resume check kills a run after a checkpoint")
    if a.gpus is not None and a.gpus < 1:
        raise PretokError(f"--gpus must be >= 1 (got {a.gpus})")
    if a.timeout <= 0:
        raise PretokError(f"--timeout must be > 0 (got {a.timeout})")
    for name in ("corpus", "tokenizer"):
        v = getattr(a, name)
        if v and not Path(v).exists():
            raise PretokError(f"--{name} not found", v)


def environment() -> dict[str, Any]:
    """What the machine offers: torch, CUDA, NCCL, bf16, the packages the check needs (no import fails)."""
    import importlib.metadata as md

    import torch

    def ver(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    cuda = torch.cuda.is_available()
    env: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "cuda_runtime": torch.version.cuda, "cuda_available": cuda,
                           "gpu_count": torch.cuda.device_count() if cuda else 0,
                           "nccl": torch.distributed.is_nccl_available(), "cpus": usable_cpus(),
                           "packages": {p: ver(p) for p in ("transformers", "fastokens", "tokenizers", "papermill",
                                                             "pyarrow", "numpy")}}
    if cuda:
        env.update(gpu_name=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                   bf16=torch.cuda.is_bf16_supported(), nccl_version=".".join(map(str, torch.cuda.nccl.version())))
    return env


def fresh_out(out: Path, dry_run: bool) -> None:
    """Every check measures anew: a previous check's runs would otherwise be found complete and their old metrics
    reported (a completed run id is resumed, not retrained). Empties `out` when it is empty or one of our work
    directories (marker or verdict.json); refuses any other non-empty directory. A dry run only checks."""
    import shutil

    if out.exists() and not out.is_dir():
        raise PretokError("--out is not a directory", str(out))
    entries = list(out.iterdir()) if out.is_dir() else []
    if entries and not ((out / MARKER).exists() or (out / "verdict.json").exists()):
        raise PretokError("--out is not empty and is not a gpu-check work directory (it would be emptied): "
                          "choose another", str(out))
    if dry_run:
        return
    for e in entries:
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("work directory of `pretok gpu-check`: emptied at the start of every check\n")


class Verdict:
    """The checks' outcomes, in CHECKS order; `to_dict()` is the printed JSON."""

    def __init__(self, mode: str, out: Path, dry_run: bool, env: dict, settings: dict):
        self.mode, self.out, self.dry_run, self.env, self.settings = mode, out, dry_run, env, settings
        self.started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.checks: dict[str, dict] = {}

    def set(self, name: str, status: str, reason: str | None = None, seconds: float = 0.0, **details) -> None:
        assert name in CHECKS and status in ("pass", "fail", "skip")
        self.checks[name] = {"status": status, "reason": reason, "seconds": round(seconds, 2), "details": details}

    def run(self, name: str, fn: Callable[[], dict], skip: str | None = None) -> None:
        """Run check `fn` (returns details; raises to fail) unless `skip` says why not."""
        if skip:
            return self.set(name, "skip", skip)
        t0 = time.monotonic()
        try:
            details = fn()
            self.set(name, "pass", None, time.monotonic() - t0, **details)
        except Exception as e:  # noqa: BLE001 - a failing check is a verdict, not a crash
            self.set(name, "fail", f"{type(e).__name__}: {e}" if not isinstance(e, CheckFailed) else str(e),
                     time.monotonic() - t0, **getattr(e, "details", {}))

    def to_dict(self) -> dict:
        checks = {n: self.checks.get(n, {"status": "skip", "reason": "not reached", "seconds": 0.0, "details": {}})
                  for n in CHECKS}
        failed = [n for n, c in checks.items() if c["status"] == "fail"]
        return {"version": VERDICT_VERSION, "ok": not failed, "mode": self.mode, "dry_run": self.dry_run,
                "started": self.started, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "out": str(self.out), "settings": self.settings, "environment": self.env, "checks": checks,
                "passed": [n for n, c in checks.items() if c["status"] == "pass"], "failed": failed,
                "skipped": {n: c["reason"] for n, c in checks.items() if c["status"] == "skip"}}


class CheckFailed(Exception):
    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.details = details


def train_command(out: Path, run_id: str, data: Path, s: dict, extra: dict[str, Any] | None = None) -> list[str]:
    """torchrun (one process per GPU; gloo on CPU) of the tiny model on the check's memmap data; `extra`: more
    config overrides (dotted keys)."""
    over = {"run.dir": out / "runs", "run.id": run_id, "data.kind": PRETOK_MEMMAP, "data.path": data,
            "data.seq_len": s["seq_len"], "data.micro_batch": 8, "train.steps": s["steps"], "train.warmup_steps": 2,
            "train.precision": s["precision"], "train.compile": str(s["compile"]).lower(),
            "checkpoint.every": s["checkpoint_every"], "log.tensorboard": "false", "log.skip_steps": 1,
            **(extra or {})}
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={s['world']}",
            "-m", "pretok_lib.train", "--config", str(TINY), *(f"{k}={v}" for k, v in over.items())]


def _env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _launch(cmd: list[str], log: Path, timeout: float) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        try:
            return procs.run_child(cmd, cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                   grace_s=10.0).returncode
        except subprocess.TimeoutExpired:
            return 124


def _tail(path: Path, n: int = 6) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def train_records(run_dir: Path) -> list[dict]:
    """The train records of a run's metrics.jsonl."""
    return read_records(run_dir / "metrics.jsonl", "train")


def _finished_run(out: Path, run_id: str, rc: int) -> tuple[dict, list[dict]]:
    run_dir = out / "runs" / run_id
    info = read_run_record(run_dir) or {}
    if rc != 0 or info.get("status") != "completed":
        raise CheckFailed(f"run {run_id} exit {rc}, status {info.get('status')}: "
                          f"{info.get('error') or _tail(run_dir / 'launcher.log')}", log=str(run_dir / "launcher.log"))
    return info, train_records(run_dir)


def prepare_data(out: Path, a: argparse.Namespace, seq_len: int) -> dict:
    """A small memmap dataset, built offline: the embedded corpus (Python sources) and a BPE trained on it,
    unless --corpus / --tokenizer are given."""
    from ..demo.corpus import default_corpus_and_tokenizer, train_default_tokenizer
    from ..pretokenize import TokenizeConfig, run_tokenize

    if a.corpus:
        corpus = str(Path(a.corpus).resolve())
        tok = a.tokenizer or str(train_default_tokenizer(corpus, out / "data" / "tokenizer", 1024, max_train_mb=2))
    else:
        default, trained = default_corpus_and_tokenizer(out / "data" / "default", max_mb=2.0, vocab_size=1024)
        corpus, tok = default.path, a.tokenizer or str(trained)
    m = run_tokenize(TokenizeConfig(inputs=[corpus], out=str(out / "data" / "memmap"), tokenizer=str(tok),
                                    format="memmap", seq_len=seq_len, workers=0, progress=False))
    return {"corpus": str(corpus), "tokenizer": str(tok), "memmap": str(out / "data" / "memmap"),
            "tokens": m["counts"]["tokens"]}


def fp32_matmul_rates() -> dict[str, float]:
    """This GPU's best fp32 matmul TFLOP/s with TF32 tensor cores allowed ("high") and in IEEE fp32 ("highest")."""
    import torch

    from ..train.hardware import GPU_SIZES, best_matmul_flops

    before, dev = torch.get_float32_matmul_precision(), torch.device("cuda", 0)
    try:
        rates = {}
        for mode in ("high", "highest"):
            torch.set_float32_matmul_precision(mode)
            rates[mode] = best_matmul_flops(dev, torch.float32, GPU_SIZES, 0.5) / 1e12
        return rates
    finally:
        torch.set_float32_matmul_precision(before)


def tf32_verdict(info: dict, recs: list[dict], steps: int, rates: dict[str, float]) -> dict:
    """The fp32 run with `train.tf32=true`: it trained (every step, finite loss) in fp32 with torch's matmul
    precision "high" (TF32), and its MFU, against the TF32 datasheet peak or a measured one, stayed <= 1. The
    measured TF32 / IEEE fp32 matmul speed-up is reported (Ampere and later: several x; it is not a pass
    condition, since some cards' TF32 is no faster)."""
    losses = [r["loss"] for r in recs]
    if len(recs) != steps or not all(map(math.isfinite, losses)):
        raise CheckFailed(f"{len(recs)} of {steps} steps logged, losses {losses[:1]} -> {losses[-1:]}")
    if info.get("precision") != "fp32" or info.get("matmul_precision") != "high":
        raise CheckFailed(f"the run computed in {info.get('precision')!r} with matmul precision "
                          f"{info.get('matmul_precision')!r}, expected 'fp32' with 'high' (TF32)")
    mfu = max(r["mfu"] for r in recs)
    if not 0 < mfu <= 1:
        raise CheckFailed(f"MFU {mfu:.3g} is outside (0, 1] (peak {info.get('peak_source')})")
    tail = recs[1:] or recs
    return {"precision": "fp32", "matmul_precision": "high", "peak_source": info.get("peak_source"),
            "peak_tflops": info.get("peak_flops", 0) / 1e12, "mfu_max": mfu,
            "tokens_per_s": sum(r["tokens_per_s"] for r in tail) / len(tail),
            "loss_first": losses[0], "loss_last": losses[-1],
            "fp32_matmul_tflops": {"tf32": round(rates["high"], 1), "ieee": round(rates["highest"], 1)},
            "tf32_speedup": round(rates["high"] / rates["highest"], 2)}


def check_pinned(data: str, seq_len: int) -> dict:
    """The loader's batches come out of page-locked memory on a CUDA machine (asynchronous host-to-device copy)."""
    from ..data import make_dataset, make_loader

    loader = make_loader(make_dataset(PRETOK_MEMMAP, data, seq_len, micro_batch=2, rank=0, world=1))
    batch = next(iter(loader))
    if not loader.pin_memory or not batch["input_ids"].is_pinned():
        raise CheckFailed("loader batches are not in pinned memory", pin_memory=loader.pin_memory)
    return {"pin_memory": True}


def kill_and_resume(out: Path, cmd: list[str], run_id: str, timeout: float) -> int:
    """Start `cmd`, SIGKILL its whole process group once its first checkpoint is complete, then run it again."""
    from ..train.checkpoint import list_checkpoints

    ckpt = out / "runs" / run_id / "checkpoints"
    log = out / "runs" / run_id / "launcher.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=procs.die_with_parent_hook())
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if list_checkpoints(ckpt):
                    break
                time.sleep(0.05)
        except BaseException:  # SIGTERM (the CLI's Terminated), Ctrl-C: the run must not outlive the check
            with procs.stop_signals(procs.ignore):
                procs.stop_tree(proc, grace_s=10.0)
            raise
        killed = proc.poll() is None
        if killed:  # torchrun starts its workers in sessions of their own: kill every descendant, like a power cut
            procs.stop_tree(proc, grace_s=10.0, sig=signal.SIGKILL)
        proc.wait()
        time.sleep(0.5)  # let the killed workers' ports and files go
    if not killed:
        raise CheckFailed(f"run {run_id} ended (exit {proc.returncode}) before it could be killed after a "
                          f"checkpoint: {_tail(log)}")
    return _launch(cmd, log, timeout)


def compare_losses(ref: list[dict], res: list[dict], exact: bool) -> dict:
    a, b = {r["step"]: r["loss"] for r in ref}, {r["step"]: r["loss"] for r in res}
    if sorted(a) != sorted(b):
        raise CheckFailed(f"steps differ after resume: {sorted(set(a) ^ set(b))[:10]}")
    diff = max(abs(a[s] - b[s]) for s in a)
    if not all(math.isfinite(v) for v in b.values()) or diff > (0.0 if exact else CUDA_LOSS_TOL):
        raise CheckFailed(f"losses after resume differ from the uninterrupted run's by up to {diff:.3g}",
                          max_loss_diff=diff)
    return {"max_loss_diff": diff, "exact": exact}


def run_check(a: argparse.Namespace) -> dict:
    """All checks; returns the verdict dict (also written to <out>/verdict.json)."""
    validate_args(a)
    env = environment()
    mode = "cuda" if a.device == "cuda" or (a.device == "auto" and env["cuda_available"]) else "cpu"
    if mode == "cuda" and not env["cuda_available"]:
        raise PretokError("--device cuda: torch sees no CUDA device")
    cuda = mode == "cuda"
    world = a.gpus or (env["gpu_count"] if cuda else 1)
    if cuda and world > env["gpu_count"]:
        raise PretokError(f"--gpus {world}: only {env['gpu_count']} GPU(s) visible")
    s = {"world": world, "backend": "nccl" if cuda else "gloo", "precision": "bf16" if cuda else "fp32",
         "compile": cuda and "compile" not in a.skip, "pin_memory": cuda, "steps": a.steps, "seq_len": 128,
         "checkpoint_every": max(2, a.steps // 2)}
    out = Path(a.out).resolve()
    fresh_out(out, a.dry_run)
    v = Verdict(mode, out, a.dry_run, env, s)
    data_path = out / "data" / "memmap"
    cmds = {"train": train_command(out, "reference", data_path, s),
            "tf32": train_command(out, "fp32-tf32", data_path, {**s, "precision": "fp32", "compile": False},
                                  {"train.tf32": "true", "checkpoint.every": a.steps + 1}),
            "resume": train_command(out, "resumed", data_path, s), "study": study_command(out, world)}
    s["commands"] = {k: shlex.join(c) for k, c in cmds.items()}
    why = lambda name, cuda_only=False: (NO_CUDA if cuda_only and not cuda else "--skip" if name in a.skip  # noqa
                                         else "dry run" if a.dry_run else None)
    v.run("cuda", lambda: {"gpu": env["gpu_name"], "count": env["gpu_count"]}, why("cuda", True))
    data: dict = {}
    v.run("data", lambda: data.update(prepare_data(out, a, s["seq_len"])) or dict(data), why("data"))
    need_data = "no data (check 'data' did not pass)" if v.checks["data"]["status"] != "pass" else None
    v.run("pin_memory", lambda: check_pinned(data["memmap"], s["seq_len"]), why("pin_memory", True) or need_data)
    ref: dict = {}

    def train() -> dict:
        info, recs = _finished_run(out, "reference", _launch(cmds["train"],
                                                             out / "runs" / "reference" / "launcher.log", a.timeout))
        ref.update(info=info, records=recs)
        losses = [r["loss"] for r in recs]
        if len(recs) != a.steps or not all(map(math.isfinite, losses)) or not losses[-1] < losses[0]:
            raise CheckFailed(f"{len(recs)} of {a.steps} steps logged, loss {losses[:1]} -> {losses[-1:]}")
        tail = recs[1:] or recs
        cfg = read_run_config(out / "runs" / "reference")
        return {"precision": cfg["train"]["precision"], "compile": cfg["train"]["compile"],
                "pin_memory": cuda, "world_size": info.get("world_size"), "backend": info.get("backend"), "device": info.get("device_name"),
                "loss_first": losses[0], "loss_last": losses[-1], "peak_source": info.get("peak_source"),
                "tokens_per_s": sum(r["tokens_per_s"] for r in tail) / len(tail),
                "mfu": sum(r["mfu"] for r in tail) / len(tail),
                "data_stall": sum(r["data_stall"] for r in tail) / len(tail)}

    v.run("train", train, why("train") or need_data)
    trained = v.checks["train"]["status"] == "pass"
    no_train = None if trained else "the training run did not pass"

    def from_run(key: str, want: Any) -> Callable[[], dict]:
        def fn() -> dict:
            got = v.checks["train"]["details"].get(key)
            if got != want:
                raise CheckFailed(f"{key} is {got!r}, expected {want!r}")
            return {key: got}
        return fn

    v.run("nccl", from_run("backend", "nccl"), why("nccl", True) or no_train)
    v.run("bf16", from_run("precision", "bf16"), why("bf16", True) or no_train)
    v.run("compile", from_run("compile", True), why("compile", True) or no_train)

    def tf32() -> dict:
        info, recs = _finished_run(out, "fp32-tf32", _launch(cmds["tf32"], out / "runs" / "fp32-tf32" / "launcher.log",
                                                             a.timeout))
        return tf32_verdict(info, recs, a.steps, fp32_matmul_rates())

    v.run("tf32", tf32, why("tf32", True) or no_train)

    def resume() -> dict:
        rc = kill_and_resume(out, cmds["resume"], "resumed", a.timeout)
        info, recs = _finished_run(out, "resumed", rc)
        if not info.get("resumed_from_step"):
            raise CheckFailed("the rerun did not resume from a checkpoint", run=info)
        return {"resumed_from_step": info["resumed_from_step"],
                **compare_losses(ref["records"], recs, exact=not cuda)}

    v.run("resume", resume, why("resume") or no_train)
    study_skip = why("study", True)
    if not study_skip and env["packages"]["papermill"] is None:
        study_skip = "papermill not installed"
    v.run("study", lambda: run_study_check(out, world, a.timeout), study_skip)
    verdict = v.to_dict()
    text = json.dumps(verdict, indent=2, default=str) + "\n"
    from ..atomic import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "verdict.json", text)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.json), text)
    return verdict


def study_command(out: Path, world: int) -> list[str]:
    """The smoke study with its sweep on world sizes 1, 2, 4, ... up to `world` (one process per GPU)."""
    from ..study.profiles import world_sizes

    grids = [{"data": [BASELINE, PRETOK_MEMMAP], "world": world_sizes(world)}]
    return [sys.executable, "-m", "pretok_lib.cli", "study", "--profile", "smoke", "--out", str(out / "study"),
            "--set", f"sweep_grids={json.dumps(grids)}"]


STUDY_NEEDS = ("papermill", "nbformat", "nbconvert.exporters", "ipykernel", "plotly")


def run_study_check(out: Path, world: int, timeout: float) -> dict:
    import importlib

    for mod in STUDY_NEEDS:  # a broken install fails here in a second, not after the notebooks ran
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - e.g. nbconvert's NameError when bleach lacks its css extra
            raise CheckFailed(f"the study needs {', '.join(STUDY_NEEDS)}; import {mod} failed: "
                              f"{type(e).__name__}: {e}") from None
    log = out / "study.log"
    rc = _launch(study_command(out, world), log, timeout)
    from ..study.reporting import read_record

    rec = read_record(out / "study")
    if rc != 0 or rec is None:
        raise CheckFailed(f"pretok study --profile smoke exit {rc}: {_tail(log)}", log=str(log))
    notebooks = rec.get("notebooks", {})
    bad = {n: r.get("status") for n, r in notebooks.items() if r.get("status") != "completed"}
    if bad:
        raise CheckFailed(f"study notebooks not completed: {bad}", log=str(log))
    return {"report": str(out / "study" / "report_nocode.html"), "notebooks": len(notebooks)}


def main(a: argparse.Namespace) -> int:
    verdict = run_check(a)
    print(json.dumps(verdict, indent=2, default=str))
    return 0 if verdict["ok"] else 1
