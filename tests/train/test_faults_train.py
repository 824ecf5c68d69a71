"""Faults during training, for real: disk full in the run directory (a small tmpfs, at sizes that make the fault hit
run.json, metrics.jsonl or a checkpoint), a read-only run directory (read-only bind mount), a damaged checkpoint,
SIGKILL / SIGTERM / SIGINT at seeded random moments. Each: one clean error line, the contract's exit code
(docs/RUNS.md), run.json's status, intact checkpoints, and a rerun once the fault is gone equal to an
uninterrupted run bit for bit. Mounting needs root (skipped otherwise)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretok_lib.cli import main as cli_main
from pretok_lib.train import checkpoint
from pretok_lib.train.metrics import read_records

from ..conftest import ROOT, SIGNAL_CONVERSIONS, needs_root, signals_turned_into, tiny_memmap

STEPS = 8
PAGE = 4096


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 0.3 MB stdlib corpus, 512-token BPE, memmap: a model of ~50k parameters (checkpoints of ~0.6 MB)."""
    return tiny_memmap(tmp_path_factory.mktemp("faults-data"))[0]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


def overrides(data: Path, runs: Path) -> list[str]:
    o = {"run.dir": runs, "run.id": "run", "model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 2,
         "model.num_kv_heads": 1, "data.path": data, "data.seq_len": 32, "data.micro_batch": 2,
         "train.steps": STEPS, "train.warmup_steps": 2, "train.precision": "fp32", "log.tensorboard": False,
         "checkpoint.every": 2, "checkpoint.keep": 2}
    return [f"{k}={v}" for k, v in o.items()]


def curve(run: Path) -> list[tuple]:
    """(step, loss, grad_norm, cum_tokens) of every train record: equal lists mean bit-exact training."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"], r["grad_norm"], r["cum_tokens"]) for r in map(json.loads, lines)
            if r["kind"] == "train"]


def train_cli(args: list[str], capsys) -> tuple[int, list[str], str]:
    """`pretok train ARGS` in this process: (exit code, the error lines, all of stderr)."""
    capsys.readouterr()
    rc = cli_main(["train", *args])
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if "error:" in ln], err


def status(run: Path) -> dict | None:
    try:
        return json.loads((run / "run.json").read_text())
    except FileNotFoundError:
        return None


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory) -> list[tuple]:
    runs = tmp_path_factory.mktemp("ref")
    assert cli_main(["train", *overrides(tiny, runs)]) == 0
    return curve(runs / "run")


def assert_checkpoints_intact(run: Path, killed: bool = False) -> None:
    """Every complete checkpoint matches its checksums; no temp dir left (a SIGKILL mid-save leaves one, which
    is ignored and replaced)."""
    ckpts = run / "checkpoints"
    if ckpts.is_dir():
        assert killed or not [p.name for p in ckpts.iterdir() if p.name.startswith(".tmp")]
        for p in checkpoint.list_checkpoints(ckpts):
            assert checkpoint.damage(p) is None and (p / checkpoint.CHECKSUMS).is_file()


@contextlib.contextmanager
def tmpfs(path: Path, size: int):
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def grow(path: Path) -> None:
    """The fault removed: the tmpfs gets room."""
    subprocess.run(["mount", "-o", "remount,size=64m", str(path)], check=True)


def ckpt_pages(run: Path) -> int:
    newest = checkpoint.list_checkpoints(run / "checkpoints")[-1]
    return sum(-(-f.stat().st_size // PAGE) for f in newest.iterdir())


def _enospc_case(tiny, reference, tmp_path, capsys, size: int) -> str:
    """A run in a tmpfs of `size` bytes fails cleanly, then resumes bit-exactly once there is room; returns
    the error line."""
    runs = tmp_path / f"fs{size}"
    with tmpfs(runs, size):
        rc, errors, err = train_cli(overrides(tiny, runs), capsys)
        run = runs / "run"
        assert rc == 1 and len(errors) == 1 and "Traceback" not in err, err
        line = errors[0]
        assert "No space left on device" in line and str(run) in line, line
        info = status(run)
        if info is not None:     # absent only when the fault hit the first run.json write
            assert info["status"] == "failed" and "No space left on device" in info["error"]
        assert_checkpoints_intact(run)
        grow(runs)
        rc, errors, err = train_cli(overrides(tiny, runs), capsys)
        assert rc == 0 and not errors, err
        assert curve(run) == reference
        assert status(run)["status"] == "completed"
        assert_checkpoints_intact(run)
    return line


@needs_root
def test_disk_full_hits_run_json_metrics_and_checkpoints(tiny, reference, tmp_path, capsys):
    """1 page: config.yaml fits, run.json does not; 2: the first metrics record does not; 3: the first
    checkpoint does not; room for one checkpoint but not two: the second one fails, the first stays."""
    hit = {}
    for pages in (1, 2, 3):
        hit[pages] = _enospc_case(tiny, reference, tmp_path, capsys, pages * PAGE)
    assert "run/run.json: No space" in hit[1]
    assert "run/metrics.jsonl: No space" in hit[2]
    assert "/checkpoints/.tmp-step_00000002/" in hit[3]


@needs_root
@pytest.mark.parametrize("seed", range(4))
def test_disk_full_at_random_sizes(tiny, reference, tmp_path, capsys, seed):
    """Sizes from one page to just under what the run needs at its peak (three checkpoints during a save)."""
    rng = random.Random(seed)
    size = PAGE * rng.randrange(4, 3 * 160)
    line = _enospc_case(tiny, reference, tmp_path, capsys, size)
    assert "No space left on device" in line


@needs_root
def test_read_only_run_dir(tiny, reference, tmp_path, capsys):
    """A run stopped by a full disk, its directory then read-only (bind mount): one line naming the path and
    EROFS, run.json cannot change (it keeps `failed`); writable again: resumes bit-exactly. A fresh run under
    a read-only directory: one line, exit 1."""
    fs, ro = tmp_path / "fs", tmp_path / "ro"
    ro.mkdir()
    with tmpfs(fs, PAGE * 160):                      # room for one checkpoint, not for two
        rc, errors, _ = train_cli(overrides(tiny, fs), capsys)
        assert rc == 1 and "No space left on device" in errors[0]
        grow(fs)
        subprocess.run(["mount", "--bind", str(fs), str(ro)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
            before = (ro / "run" / "run.json").read_text()
            rc, errors, err = train_cli(overrides(tiny, ro), capsys)
            assert rc == 1 and len(errors) == 1 and "Traceback" not in err, err
            assert "Read-only file system" in errors[0] and str(ro / "run") in errors[0], errors
            assert "run.json could not be updated" in errors[0]
            assert (ro / "run" / "run.json").read_text() == before and json.loads(before)["status"] == "failed"
            rc, errors, err = train_cli([*overrides(tiny, ro), "run.id=fresh"], capsys)
            assert rc == 1 and len(errors) == 1 and "Read-only file system" in errors[0] and "fresh" in errors[0]
        finally:
            subprocess.run(["umount", str(ro)], check=False)
        rc, errors, err = train_cli(overrides(tiny, fs), capsys)
        assert rc == 0 and "resumed from" in err and curve(fs / "run") == reference


@needs_root
def test_damaged_newest_checkpoint_falls_back(tiny, reference, tmp_path, capsys):
    """A flipped byte inside the newest checkpoint's model.pt: a warning, the run resumes from the checkpoint
    before and trains exactly like the uninterrupted run (before: exit 0 and a different loss curve)."""
    fs = tmp_path / "fs"
    with tmpfs(fs, PAGE * (4 + 2 * 160 + 40)):        # steps 2 and 4 checkpointed, step 6's save fails
        assert train_cli(overrides(tiny, fs), capsys)[0] == 1
        grow(fs)
        ckpts = checkpoint.list_checkpoints(fs / "run" / "checkpoints")
        assert [p.name for p in ckpts] == ["step_00000002", "step_00000004"]
        model = ckpts[-1] / "model.pt"
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0x10
        model.write_bytes(bytes(data))
        rc, errors, err = train_cli(overrides(tiny, fs), capsys)
        assert rc == 0 and not errors, err
        warn = [ln for ln in err.splitlines() if "warning" in ln]
        assert len(warn) == 1 and "step_00000004" in warn[0] and "model.pt does not match" in warn[0]
        assert "resumed from" in err and "step_00000002" in err
        assert curve(fs / "run") == reference


@needs_root
def test_a_damaged_metrics_log_is_cleaned_on_resume(tiny, reference, tmp_path, capsys):
    """Bytes that are not UTF-8, JSON that is not a record and a torn last line in metrics.jsonl (a crash, a bad
    disk, a hand edit): the resumed run keeps the records up to its checkpoint, drops the rest and trains exactly
    like the uninterrupted run (before: a UnicodeDecodeError ended the resume)."""
    fs = tmp_path / "fs"
    with tmpfs(fs, PAGE * (4 + 2 * 160 + 40)):        # steps 2 and 4 checkpointed, step 6's save fails
        assert train_cli(overrides(tiny, fs), capsys)[0] == 1
        grow(fs)
        log = fs / "run" / "metrics.jsonl"
        first, *rest = log.read_bytes().split(b"\n")
        log.write_bytes(b"\n".join([first, b"\xff\xfe\x00 not text", b"[1, 2]", b'{"step": -3}', *rest])
                        + b'{"kind": "train", "st')
        rc, errors, err = train_cli(overrides(tiny, fs), capsys)
        assert rc == 0 and not errors, err
        assert curve(fs / "run") == reference
        assert all(isinstance(json.loads(line), dict) for line in log.read_text().splitlines())


def _popen(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "pretok_lib.train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _last_step(run: Path) -> int:
    done = read_records(run / "metrics.jsonl")   # live: a half-written last line is left out
    return done[-1]["step"] if done else 0


@pytest.mark.parametrize("seed", range(6))
def test_stop_signal_at_a_random_moment_then_resume_bit_exact(tiny, reference, tmp_path, capsys, seed):
    """SIGTERM (even seeds) or SIGINT (odd) at a seeded random moment of an in-process run (after a random step,
    plus a random delay: inside a step, a checkpoint, a log write): exit 3, one line per event and no
    traceback, run.json `interrupted`, a checkpoint at the last logged step (or exit 0 if it had finished);
    the rerun equals the uninterrupted run bit for bit."""
    import signal
    import threading

    rng = random.Random(seed)
    sig = signal.SIGINT if seed % 2 else signal.SIGTERM
    after, delay = rng.randrange(0, STEPS), rng.random() * 0.3
    run = tmp_path / "run"

    def sender():
        while _last_step(run) < after and not done.is_set():
            time.sleep(0.002)
        time.sleep(delay)
        os.kill(os.getpid(), sig)

    done = threading.Event()
    previous = signal.signal(sig, lambda *a: None)    # a signal arriving after the run is harmless
    try:
        t = threading.Thread(target=sender)
        t.start()
        rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
        done.set()
        t.join()
    finally:
        signal.signal(sig, previous)
    assert rc in (3, 0) and not errors and "Traceback" not in err, err
    if rc == 3:
        assert status(run)["status"] == "interrupted"
        step = _last_step(run)
        assert checkpoint.list_checkpoints(run / "checkpoints")[-1].name == f"step_{step:08d}"
    assert_checkpoints_intact(run)
    rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
    assert rc == 0 and not errors, err
    assert curve(run) == reference


def test_kill_and_stop_real_processes_at_random_moments(tiny, reference, tmp_path, capsys):
    """Three real runs at once: SIGKILL, SIGKILL, SIGTERM, each at a seeded random moment. Killed: run.json
    still says `running` with the dead pid (docs/RUNS.md: a stale `running`). Stopped: exit 3, `interrupted`.
    Each rerun equals the uninterrupted run bit for bit."""
    import signal

    rng = random.Random(7)
    plan = [(sig, rng.randrange(0, STEPS), rng.random() * 0.4) for sig in ("SIGKILL", "SIGKILL", "SIGTERM")]
    procs = []
    for i, (sig, _, _) in enumerate(plan):
        args = overrides(tiny, tmp_path) + [f"run.id={sig}-{i}"]
        procs.append((_popen(args), args, tmp_path / f"{sig}-{i}"))
    sent = [False] * len(plan)
    end = time.monotonic() + 300
    while not all(sent):
        assert time.monotonic() < end, "runs did not reach their steps"
        for i, ((sig, after, delay), (proc, _, run)) in enumerate(zip(plan, procs)):
            if not sent[i] and (_last_step(run) >= after and (run / "run.json").exists() or proc.poll() is not None):
                time.sleep(delay)
                proc.send_signal(getattr(signal, sig))
                sent[i] = True
        time.sleep(0.01)
    for (sig, _, _), (proc, args, run) in zip(plan, procs):
        rc = proc.wait(120)
        err = proc.stderr.read()
        assert "Traceback" not in err, err
        info = status(run)
        if sig == "SIGKILL":
            assert rc in (-9, 0), err
            if rc == -9:
                assert info["status"] in ("running", "completed") and info["pid"] == proc.pid
        else:
            assert rc in (3, 0), err
            if rc == 3:
                assert info["status"] == "interrupted"
        assert_checkpoints_intact(run, killed=sig == "SIGKILL")
        rc2, errors, err2 = train_cli(args, capsys)
        assert rc2 == 0 and not errors, err2
        assert curve(run) == reference, (sig, rc)
        assert_checkpoints_intact(run)


def test_final_writes_failing_leave_a_failed_run_json(tiny, reference, tmp_path, capsys, monkeypatch):
    """The disk fills just as the run ends: summary.json cannot be written, and neither can a new run.json
    (atomic rewrite refused): run.json is overwritten in place with `failed`; a rerun completes bit-exactly."""
    import errno

    from pretok_lib.train import run as run_mod

    real = run_mod.atomic_write_json

    def full(path, data, *a, **k):
        if Path(path).name == "summary.json" or (Path(path).name == "run.json" and data["status"] != "running"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data, *a, **k)

    monkeypatch.setattr(run_mod, "atomic_write_json", full)
    rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
    assert rc == 1 and len(errors) == 1 and "Traceback" not in err
    assert errors[0].endswith(f"{tmp_path / 'run' / 'summary.json'}: No space left on device"), errors
    info = status(tmp_path / "run")
    assert info["status"] == "failed" and "summary.json: No space left on device" in info["error"]
    monkeypatch.setattr(run_mod, "atomic_write_json", real)
    (tmp_path / "run" / "checkpoints" / "step_00000008").rename(tmp_path / "run" / "checkpoints" / "x")
    rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
    assert rc == 0 and curve(tmp_path / "run") == reference


def test_second_sigint_stops_at_once(tiny, reference, tmp_path, capsys, monkeypatch):
    """A second Ctrl-C before the checkpoint (KeyboardInterrupt mid-step): exit 130, one line, run.json failed;
    the rerun resumes from the last checkpoint bit-exactly."""
    from pretok_lib.train import loop

    real = loop.Trainer.step

    def step(self, batches):
        if self.progress.step == 4 and not self.resumed_from:
            raise KeyboardInterrupt
        return real(self, batches)

    monkeypatch.setattr(loop.Trainer, "step", step)
    rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
    assert rc == 130 and len(errors) == 1 and "second SIGINT" in errors[0] and "Traceback" not in err
    assert status(tmp_path / "run")["status"] == "failed"
    monkeypatch.setattr(loop.Trainer, "step", real)
    rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
    assert rc == 0 and "step_00000004" in err and curve(tmp_path / "run") == reference


@pytest.mark.parametrize("turned_into", SIGNAL_CONVERSIONS)
def test_second_sigint_turned_into_another_error_still_stops_at_once(tiny, reference, tmp_path, capsys, monkeypatch,
                                                                    turned_into):
    """Two real SIGINTs mid-step whose KeyboardInterrupt the interrupted code turns into another error (an import:
    ImportError): still the second Ctrl-C (exit 130, one line, run.json failed, no traceback), and the rerun
    resumes bit-exactly."""
    from pretok_lib.train import loop

    real = loop.Trainer.step

    def step(self, batches):
        if self.progress.step == 4 and not self.resumed_from:
            signals_turned_into(turned_into, signal.SIGINT, signal.SIGINT)  # checkpoint at the step's end; stop now
        return real(self, batches)

    monkeypatch.setattr(loop.Trainer, "step", step)
    rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
    assert rc == 130 and len(errors) == 1 and "second SIGINT" in errors[0] and "Traceback" not in err, err
    assert status(tmp_path / "run")["status"] == "failed"
    monkeypatch.setattr(loop.Trainer, "step", real)
    rc, errors, err = train_cli(overrides(tiny, tmp_path), capsys)
    assert rc == 0 and "step_00000004" in err and curve(tmp_path / "run") == reference


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_to_the_process_group_reaches_the_loader_workers_too(tiny, tmp_path, capsys, sig):
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group, the trainer and its DataLoader
    workers alike; SIGTERM reaches them all from `kill -TERM -PGID`, torchrun's shutdown, a sweep's stop, SLURM's
    scancel (every process of the step). The workers must not take the run down with them (SIGTERM killed them:
    exit 1, "DataLoader worker (pid N) is killed by signal: Terminated", no checkpoint): exit 3, one line, run.json
    `interrupted`, a checkpoint at the last logged step; the rerun resumes and equals an uninterrupted run bit for
    bit."""
    steps = 100
    o = overrides(tiny, tmp_path) + [f"train.steps={steps}", "checkpoint.every=50", "data.num_workers=2"]
    rc, errors, err = train_cli(o + ["run.id=ref"], capsys)
    assert rc == 0, err
    proc = subprocess.Popen([sys.executable, "-m", "pretok_lib.train", *o], cwd=ROOT, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run, end = tmp_path / "run", time.monotonic() + 120
    while _last_step(run) < 3:
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[1]
        time.sleep(0.005)
    os.killpg(proc.pid, sig)
    err = proc.communicate(timeout=120)[1]
    errors = [ln for ln in err.splitlines() if "error:" in ln or "Traceback" in ln]
    assert proc.returncode == 3 and not errors, err
    assert status(run)["status"] == "interrupted"
    step = _last_step(run)
    assert step < steps and checkpoint.list_checkpoints(run / "checkpoints")[-1].name == f"step_{step:08d}"
    rc, errors, err = train_cli(o, capsys)
    assert rc == 0 and "resumed from" in err, err
    assert curve(run) == curve(tmp_path / "ref")


@pytest.mark.parametrize("why", ["steps", "time budget"])
def test_a_stop_signal_during_the_last_step_completes_the_run(tiny, reference, tmp_path, capsys, monkeypatch, why):
    """SIGTERM during the step that ends the run (its last step, or the one that passes train.time_budget_s): the
    run has nothing left to do, yet it stopped `interrupted` (exit 3, no summary.json, no export; under SLURM a
    requeue or a resubmission only to finish). Now exit 0, `completed`, summary written."""
    from pretok_lib.train import loop

    real, last = loop.Trainer.step, STEPS if why == "steps" else 4
    extra = [] if why == "steps" else ["train.time_budget_s=1e-6", "log.skip_steps=2"]

    def step(self, batches):
        if self.progress.step == last - 1:
            os.kill(os.getpid(), signal.SIGTERM)   # handled by the run's StopFlag: the step goes on
        return real(self, batches)

    monkeypatch.setattr(loop.Trainer, "step", step)
    rc, errors, err = train_cli(overrides(tiny, tmp_path) + extra, capsys)
    assert rc == 0 and not errors, err
    run = tmp_path / "run"
    assert status(run)["status"] == "completed" and (run / "summary.json").is_file()
    assert json.loads((run / "summary.json").read_text())["steps"] == last
    assert curve(run) == reference[:last]
