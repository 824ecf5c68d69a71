"""`pretok gpu-check`: argument handling, the verdict's schema (dry run and a failing check), the loss comparison
of the resume check, and (slow) the CPU mode end to end: gloo/fp32 training, SIGKILL + resume, CUDA checks skipped."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pretok_lib.bench import gpu_check as G
from pretok_lib.cli import main as cli_main
from pretok_lib.errors import PretokError

from ..conftest import ROOT, one_line


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    G.add_args(p)
    return p.parse_args(["--out", str(tmp_path / "gc"), *argv])


def _check_schema(v: dict) -> None:
    assert v["version"] == G.VERDICT_VERSION and isinstance(v["ok"], bool) and v["mode"] in ("cuda", "cpu")
    assert list(v["checks"]) == list(G.CHECKS)
    for name, c in v["checks"].items():
        assert set(c) == {"status", "reason", "seconds", "details"} and c["status"] in ("pass", "fail", "skip")
        assert (c["reason"] is not None) == (c["status"] != "pass"), name
    assert set(v["passed"]) | set(v["failed"]) | set(v["skipped"]) == set(G.CHECKS)
    assert v["ok"] == (not v["failed"])
    assert {"torch", "cuda_available", "gpu_count", "nccl", "packages"} <= set(v["environment"])
    assert {"world", "backend", "precision", "compile", "pin_memory", "commands"} <= set(v["settings"])


def test_dry_run_cpu_verdict(tmp_path: Path, capsys) -> None:
    assert cli_main(["gpu-check", "--device", "cpu", "--dry-run", "--out", str(tmp_path / "gc"),
                     "--json", str(tmp_path / "v.json")]) == 0
    v = json.loads(capsys.readouterr().out)
    _check_schema(v)
    assert v["ok"] and v["dry_run"] and v["mode"] == "cpu" and not v["passed"]
    cuda_only = {"cuda", "pin_memory", "nccl", "bf16", "compile", "tf32", "study"}
    assert {n for n, r in v["skipped"].items() if r == G.NO_CUDA} == cuda_only
    assert {n for n, r in v["skipped"].items() if r == "dry run"} == set(G.CHECKS) - cuda_only
    s = v["settings"]
    assert (s["backend"], s["precision"], s["compile"], s["pin_memory"], s["world"]) == ("gloo", "fp32", False,
                                                                                          False, 1)
    assert "torch.distributed.run --standalone --nproc_per_node=1 -m pretok_lib.train" in s["commands"]["train"]
    assert "--profile smoke" in s["commands"]["study"]
    tf32 = s["commands"]["tf32"]
    assert all(f" {o}" in tf32 for o in ("train.precision=fp32", "train.compile=false", "train.tf32=true",
                                          "run.id=fp32-tf32", "checkpoint.every=21"))
    assert json.loads((tmp_path / "gc" / "verdict.json").read_text())["checks"] == v["checks"]
    assert json.loads((tmp_path / "v.json").read_text())["checks"] == v["checks"]
    assert not (tmp_path / "gc" / "data").exists()  # a dry run builds nothing


def test_skip_is_reported(tmp_path: Path) -> None:
    v = G.run_check(_args(tmp_path, "--device", "cpu", "--skip", "data", "train", "resume"))
    _check_schema(v)
    assert v["skipped"]["data"] == "--skip" and v["skipped"]["train"] == "--skip"
    assert v["ok"] and not v["passed"]


@pytest.mark.parametrize("argv, message", [
    (["--steps", "2"], "--steps must be >= 4"),
    (["--gpus", "0"], "--gpus must be >= 1"),
    (["--corpus", "/nonexistent/corpus.parquet"], "--corpus not found"),
    (["--device", "cuda"], "torch sees no CUDA device"),
])
def test_bad_arguments_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    import torch

    if argv == ["--device", "cuda"] and torch.cuda.is_available():
        argv = ["--gpus", str(torch.cuda.device_count() + 1)]
        message = "GPU(s) visible"
    p = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "gpu-check", "--out", str(tmp_path / "gc"),
                        "--dry-run", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout == ""
    one_line(p.stderr, message)


def test_unknown_check_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        _args(tmp_path, "--skip", "nonsense")
    assert e.value.code == 2


def test_failing_check_makes_the_verdict_fail(tmp_path: Path) -> None:
    v = G.Verdict("cpu", tmp_path, False, {}, {})
    v.run("data", lambda: {"tokens": 1})
    v.run("train", lambda: (_ for _ in ()).throw(G.CheckFailed("loss is nan", loss="nan")))
    v.run("resume", lambda: 1 / 0)
    d = v.to_dict()
    assert not d["ok"] and d["failed"] == ["train", "resume"] and d["passed"] == ["data"]
    assert d["checks"]["train"]["reason"] == "loss is nan" and d["checks"]["train"]["details"] == {"loss": "nan"}
    assert d["checks"]["resume"]["reason"].startswith("ZeroDivisionError")
    assert d["skipped"]["study"] == "not reached"


def test_compare_losses() -> None:
    ref = [{"step": s, "loss": 3.0 - s / 10} for s in range(1, 7)]
    assert G.compare_losses(ref, [dict(r) for r in ref], exact=True)["max_loss_diff"] == 0.0
    off = [dict(r, loss=r["loss"] + 0.01) for r in ref]
    with pytest.raises(G.CheckFailed, match="differ"):
        G.compare_losses(ref, off, exact=True)
    assert G.compare_losses(ref, off, exact=False)["max_loss_diff"] == pytest.approx(0.01)
    with pytest.raises(G.CheckFailed, match="steps differ"):
        G.compare_losses(ref, ref[:-1], exact=False)


@pytest.mark.slow
def test_cpu_mode_end_to_end(tmp_path: Path) -> None:
    """gloo/fp32 through torchrun on the embedded corpus and a BPE trained on it (what a bare machine has): the
    run trains, a second one is SIGKILLed (with its torchrun worker) after its first checkpoint and resumes to
    the very same losses."""
    p = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "gpu-check", "--device", "cpu", "--steps", "4",
                        "--out", str(tmp_path / "gc")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    v = json.loads(p.stdout)
    _check_schema(v)
    assert p.returncode == 0 and v["ok"], json.dumps(v, indent=1)[-3000:]
    assert v["passed"] == ["data", "train", "resume"]
    assert v["checks"]["train"]["details"]["backend"] == "gloo"
    r = v["checks"]["resume"]["details"]
    assert r["resumed_from_step"] == 2 and r["max_loss_diff"] == 0.0 and r["exact"]

    # A second check in the same work directory measures anew: it must not find the first one's runs complete and
    # report their (here falsified) metrics, nor resume from their checkpoints.
    gc = tmp_path / "gc"
    metrics = gc / "runs" / "reference" / "metrics.jsonl"
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps({**x, "loss": 99.0} if "loss" in x else x) + "\n" for x in recs))
    (gc / "runs" / "resumed" / "planted").write_text("stale")
    p2 = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "gpu-check", "--device", "cpu", "--steps", "4",
                         "--skip", "resume", "--out", str(gc)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    v2 = json.loads(p2.stdout)
    assert p2.returncode == 0 and v2["ok"], json.dumps(v2, indent=1)[-3000:]
    t1, t2 = v["checks"]["train"]["details"], v2["checks"]["train"]["details"]
    assert t2["loss_first"] == t1["loss_first"] != 99.0 and t2["loss_last"] == t1["loss_last"]
    assert not (gc / "runs" / "resumed").exists()  # the earlier check's runs are gone (no checkpoint to resume)


def test_foreign_out_directory_is_refused_and_kept(tmp_path: Path) -> None:
    """--out holding anything but a gpu-check work directory is refused (the check empties its directory)."""
    own = tmp_path / "mine"
    own.mkdir()
    (own / "thesis.tex").write_text("precious")
    for extra in ([], ["--dry-run"]):
        with pytest.raises(PretokError, match="not a gpu-check work directory"):
            G.run_check(_args(tmp_path, "--device", "cpu", "--skip", *G.CHECKS, *extra, "--out", str(own)))
    assert (own / "thesis.tex").read_text() == "precious" and sorted(p.name for p in own.iterdir()) == ["thesis.tex"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(PretokError, match="not a directory"):
        G.run_check(_args(tmp_path, "--device", "cpu", "--skip", *G.CHECKS, "--out", str(afile)))
    # our own directory (marker written by an earlier check) is emptied, stale verdict included
    gc = tmp_path / "gc"
    v = G.run_check(_args(tmp_path, "--device", "cpu", "--skip", *G.CHECKS))
    assert (gc / G.MARKER).is_file() and v["ok"]
    (gc / "runs").mkdir()
    (gc / "runs" / "old").write_text("old")
    G.run_check(_args(tmp_path, "--device", "cpu", "--skip", *G.CHECKS))
    assert sorted(p.name for p in gc.iterdir()) == sorted([G.MARKER, "verdict.json"])


def test_study_check_fails_at_once_on_a_broken_install(tmp_path: Path, monkeypatch) -> None:
    """A package the study needs that does not import (seen on a bare GPU machine: nbconvert without bleach's css
    extra) fails the check in a second with the import error, before any notebook runs."""
    monkeypatch.setitem(sys.modules, "plotly", None)
    with pytest.raises(G.CheckFailed, match="import plotly failed: ModuleNotFoundError"):
        G.run_study_check(tmp_path, 1, 5.0)
    assert not (tmp_path / "study.log").exists()


def _tf32_run(mfu: float = 0.004, matmul: str | None = "high", precision: str = "fp32", steps: int = 6):
    info = {"precision": precision, "matmul_precision": matmul, "peak_flops": 494.5e12,
            "peak_source": "datasheet H100 dense TF32"}
    return info, [{"step": i + 1, "loss": 7.0 - 0.1 * i, "mfu": mfu, "tokens_per_s": 9e4} for i in range(steps)]


def test_tf32_verdict_passes_a_tf32_run_and_reports_the_speedup() -> None:
    d = G.tf32_verdict(*_tf32_run(), 6, {"high": 350.4, "highest": 50.7})
    assert d["matmul_precision"] == "high" and d["tf32_speedup"] == 6.91 and d["peak_tflops"] == 494.5
    assert d["fp32_matmul_tflops"] == {"tf32": 350.4, "ieee": 50.7} and d["mfu_max"] == 0.004
    # a card whose TF32 is no faster still passes: the speed-up is reported, not required
    assert G.tf32_verdict(*_tf32_run(), 6, {"high": 80.0, "highest": 80.0})["tf32_speedup"] == 1.0


@pytest.mark.parametrize("run, message", [
    (dict(matmul=None), "matmul precision None"), (dict(matmul="highest"), "'highest'"),
    (dict(precision="bf16"), "computed in 'bf16'"), (dict(mfu=1.7), "MFU 1.7 is outside"),
    (dict(mfu=0.0), "MFU 0 is outside"), (dict(steps=5), "5 of 6 steps logged")])
def test_tf32_verdict_fails_what_is_not_a_tf32_run(run: dict, message: str) -> None:
    with pytest.raises(G.CheckFailed, match=re.escape(message)):
        G.tf32_verdict(*_tf32_run(**run), 6, {"high": 350.0, "highest": 50.0})
