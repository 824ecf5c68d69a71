"""Off Linux (macOS laptops, where users explore results) and on filesystems that refuse in-kernel copies: no affinity
masks, no copy_file_range or fdatasync, no /proc. Each is taken away here, in this process or in a subprocess, and
the engine writes the same bytes, and training runs and records its environment."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.machine import cpu_affinity
from pretok_lib.machine import memory
from pretok_lib.engine import memmap_place
from pretok_lib.engine.memmap_place import NO_KERNEL_COPY, append_bytes
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from .conftest import GPT2_JSON, ROOT, WIKI_EN, tiny_memmap

# sitecustomize of a "not Linux" interpreter: the Linux-only calls are gone and /proc does not exist.
NOT_LINUX = """
import builtins, io, os
for name in ("sched_getaffinity", "sched_setaffinity", "copy_file_range", "fdatasync"):
    if hasattr(os, name):
        delattr(os, name)
_open = builtins.open
def _open_without_proc(file, *args, **kwargs):
    if isinstance(file, (str, bytes, os.PathLike)) and os.fsdecode(file).startswith("/proc/"):
        raise FileNotFoundError(2, "No such file or directory (test: not Linux)", os.fsdecode(file))
    return _open(file, *args, **kwargs)
builtins.open = io.open = _open_without_proc
"""


def _files(tmp_path: Path, data: bytes, prefix: bytes) -> tuple[Path, Path]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(data)
    dst.write_bytes(prefix)
    return src, dst


def _append(src: Path, dst: Path, size: int) -> None:
    with open(src, "rb") as s, open(dst, "r+b") as d:   # as the appender holds it (O_APPEND refuses the kernel copy)
        d.seek(0, os.SEEK_END)
        append_bytes(s.fileno(), d.fileno(), size, src)


SIZES = [0, 1, 4097, (1 << 20) + 3, 3 * (1 << 20) - 1]   # empty, tiny, past one page, past the 1 MiB buffer


@pytest.mark.parametrize("refusal", ["absent", *sorted(NO_KERNEL_COPY)])
def test_append_falls_back_to_a_buffer_when_the_kernel_copy_is_refused(tmp_path, monkeypatch, refusal):
    rng = random.Random(refusal if isinstance(refusal, int) else 0)
    real = getattr(os, "copy_file_range", None)
    calls = {"n": 0}

    def refuse_after_some(src_fd, dst_fd, count, *a):  # copies part in the kernel, then is refused mid-file
        calls["n"] += 1
        if calls["n"] == 1 and real is not None and count > 1:
            return real(src_fd, dst_fd, count // 2)
        raise OSError(refusal, os.strerror(refusal))

    if refusal == "absent":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    else:
        monkeypatch.setattr(os, "copy_file_range", refuse_after_some, raising=False)
    for size in SIZES:
        calls["n"] = 0
        data, prefix = rng.randbytes(size), rng.randbytes(rng.randrange(0, 5000))
        src, dst = _files(tmp_path, data, prefix)
        _append(src, dst, size)
        assert dst.read_bytes() == prefix + data, (refusal, size)


@pytest.mark.parametrize("failure", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
def test_a_failing_copy_is_not_taken_for_a_refusal(tmp_path, monkeypatch, failure):
    def fail(*a):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(os, "copy_file_range", fail, raising=False)
    src, dst = _files(tmp_path, b"x" * 100, b"")
    with pytest.raises(OSError) as e:
        _append(src, dst, 100)
    assert e.value.errno == failure and dst.read_bytes() == b""


def test_a_source_shorter_than_its_size_is_an_error_naming_it(tmp_path, monkeypatch):
    for kernel in (True, False):
        if not kernel:
            monkeypatch.delattr(os, "copy_file_range", raising=False)
        src, dst = _files(tmp_path, b"y" * 10, b"")
        with pytest.raises(OSError, match=f"{src}: short copy"):
            _append(src, dst, 20)


def test_cpus_and_pinning_without_affinity_masks(monkeypatch):
    assert cpu_affinity.usable_cpus() == len(os.sched_getaffinity(0))
    for name in ("sched_getaffinity", "sched_setaffinity"):
        monkeypatch.delattr(os, name)
    monkeypatch.delattr(os, "process_cpu_count", raising=False)
    assert cpu_affinity.usable_cpus() == os.cpu_count()
    cpu_affinity.pin_to_one_cpu(0)   # a no-op there, not an AttributeError
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cpu_affinity.usable_cpus() == 1


def test_peak_rss_without_proc_is_in_megabytes(monkeypatch):
    with_proc = memory.peak_rss_mb()
    real_open = open

    def no_proc(file, *a, **k):
        if str(file).startswith("/proc/"):
            raise FileNotFoundError(file)
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", no_proc)
    without = memory.peak_rss_mb()   # ru_maxrss: KiB on Linux
    assert 0.5 * with_proc < without < 2 * with_proc + 50
    monkeypatch.setattr(memory.sys, "platform", "darwin")   # macOS counts ru_maxrss in bytes
    monkeypatch.setattr(memory.resource, "getrusage", lambda who: type("R", (), {"ru_maxrss": 300 << 20}))
    assert memory.peak_rss_mb() == 300


def _not_linux_env(tmp_path: Path) -> dict:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(NOT_LINUX)
    return dict(os.environ, PYTHONPATH=f"{shim}{os.pathsep}{ROOT}", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


def _cli(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = env or dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def test_the_shim_takes_linux_away(tmp_path):
    p = _cli(["-c", "import os; print(hasattr(os, 'sched_getaffinity'), hasattr(os, 'copy_file_range'));"
                    "open('/proc/self/status')"], _not_linux_env(tmp_path))
    assert p.stdout.strip() == "False False" and "not Linux" in p.stderr


@pytest.mark.parametrize("fmt", ["memmap", "token-list", "padded"])
def test_engine_off_linux_writes_the_same_bytes(tmp_path, shared_data, fmt):
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:1500]
    corpus = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": docs}), corpus, row_group_size=200)
    outs = {"linux": tmp_path / "linux", "not-linux": tmp_path / "not-linux"}
    run_tokenize(TokenizeConfig(inputs=[str(corpus)], out=str(outs["linux"]), tokenizer=str(GPT2_JSON), format=fmt,
                                workers=2, part_mb=0.2, seq_len=128, progress=False))
    env = _not_linux_env(tmp_path)
    p = _cli(["-m", "pretok_lib.cli", "tokenize", str(corpus), "--out", str(outs["not-linux"]), "--tokenizer",
              str(GPT2_JSON), "--format", fmt, "--workers", "2", "--part-mb", "0.2", "--seq-len", "128",
              "--no-progress"], env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert _cli(["-m", "pretok_lib.cli", "verify", str(outs["not-linux"])], env).returncode == 0
    files = {name: {f.name: f.read_bytes() for f in sorted(out.iterdir()) if f.is_file() and f.name != "manifest.json"}
             for name, out in outs.items()}
    assert files["linux"] == files["not-linux"] and len(files["linux"]) >= 2
    manifest = json.loads((outs["not-linux"] / "manifest.json").read_text())
    assert manifest["environment"]["cpus"] == os.cpu_count()
    assert manifest["run"]["worker_peak_rss_mb"] > 20   # ru_maxrss, where /proc/self/status is not there


def test_training_off_linux_runs_and_records_its_environment(tmp_path):
    data, tok = tiny_memmap(tmp_path)
    runs = tmp_path / "runs"
    p = _cli(["-m", "pretok_lib.train", f"run.dir={runs}", "run.id=r", "model.hidden_size=32", "model.num_layers=1",
              "model.num_heads=2", "model.num_kv_heads=1", "data.kind=pretok-memmap", f"data.path={data}",
              f"data.tokenizer={tok}", "data.seq_len=32", "data.micro_batch=2", "train.steps=2",
              "train.warmup_steps=1", "train.precision=auto", "log.tensorboard=false", "checkpoint.every=0"],
             _not_linux_env(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    run = json.loads((runs / "r" / "run.json").read_text())
    assert run["status"] == "completed" and run["cpus"] == os.cpu_count()


def test_placing_syncs_without_fdatasync(tmp_path, monkeypatch):
    """Where the OS has fsync only (macOS), a placement told to sync the `.bin` calls it, on the target file."""
    synced = []
    monkeypatch.delattr(os, "fdatasync", raising=False)
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    (tmp_path / "p.bin").write_bytes(b"z" * 10)
    (tmp_path / "p.lens").write_bytes(b"\x0a\0\0\0")
    for name in ("data.bin", "data.lens"):
        (tmp_path / name).write_bytes(b"")
    memmap_place.place_part(memmap_place.Placement(0, str(tmp_path / "p"), (
        (".bin", str(tmp_path / "data.bin"), 0, 10), (".lens", str(tmp_path / "data.lens"), 0, 4)), sync=True))
    assert synced == [str(tmp_path / "data.bin")] and (tmp_path / "data.bin").read_bytes() == b"z" * 10
    assert not (tmp_path / "p.bin").exists() and (tmp_path / "data.lens").read_bytes() == b"\x0a\0\0\0"
