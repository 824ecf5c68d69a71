"""Real OS faults on the output side of `pretok tokenize` / `pretok merge` (no mocks; needs root for mounts).

Each case asserts the contract: one clean stderr line `pretok: error: <path>: <problem>` (or the signal's line),
the contract's exit code, no manifest.json (or a valid one), and that rerunning the same command once the fault
is gone produces the bytes of an uninterrupted run. Faults: disk full (a small tmpfs, at sizes reaching the
part writers, the memmap append, the index and the manifest), a read-only file system (bind mount), an --out that
is a regular file / FIFO / dangling symlink, two concurrent writers (plain and --overwrite), SIGKILL and SIGTERM
at seeded random moments, and bad SLURM array variables.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.cli import main
from pretok_lib.engine.merge import MERGING
from pretok_lib.formats.manifest import read_manifest

from ..conftest import GPT2_JSON, PYDOCS_JSONL, ROOT, WIKI_EN, needs_root
from ..conftest import one_line as any_line
from .signal_at import HANG, after_parts, signal_when
from .test_pretokenize import data_files

ENOSPC_TEXT = "No space left on device"
EROFS_TEXT = "Read-only file system"


# ---------------------------------------------------------------- helpers


@contextmanager
def tmpfs(path: Path, size: int):
    """A tmpfs of `size` bytes at `path` (unmounted afterwards, whatever happens)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def resize(path: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


@contextmanager
def read_only(src: Path, dst: Path):
    """`src` seen read-only at `dst` (a bind mount), unmounted afterwards."""
    dst.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(src), str(dst)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(dst)], check=True)
        yield dst
    finally:
        subprocess.run(["umount", "-l", str(dst)], check=True)


def cli(capsys, *args: str) -> tuple[int, str]:
    """`pretok ARGS` in this process (its real error boundary); returns (exit code, stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


one_line = partial(any_line, prefix="pretok: ")  # one `pretok: ` line of any kind (error, note, SIGTERM)


def no_manifest_or_valid(out: Path) -> None:
    if (out / "manifest.json").exists():
        read_manifest(out)


def popen(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **kw.pop("env", {}))
    return subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", *map(str, args)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


PAGE = 4096


def usage(out: Path) -> int:
    """What the files under `out` take on a tmpfs (whole pages)."""
    return sum(-(-p.stat().st_size // PAGE) * PAGE for p in out.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """~1 MB of real text (python docs, then wikipedia summaries) in row groups of 100 docs: ~10 parts."""
    docs = [json.loads(line)["text"] for line in PYDOCS_JSONL.open()][:60]
    docs += [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:1200]
    path = tmp_path_factory.mktemp("fault-corpus") / "corpus.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=100)
    return path


def tok_args(corpus: Path, out: Path, fmt: str, workers: int = 0) -> list[str]:
    return ["tokenize", str(corpus), "--out", str(out), "--tokenizer", str(GPT2_JSON), "--format", fmt,
            "--part-mb", "0.1", "--batch-mb", "0.05", "--workers", str(workers), "--no-progress"]


@pytest.fixture(scope="module")
def refs(corpus, tmp_path_factory) -> dict[str, Path]:
    """Uninterrupted reference outputs, per format."""
    base = tmp_path_factory.mktemp("fault-refs")
    out = {}
    for fmt in ("memmap", "token-list"):
        assert main(tok_args(corpus, base / fmt, fmt)) == 0
        out[fmt] = base / fmt
    return out


@pytest.fixture(scope="module")
def shard_dirs(corpus, tmp_path_factory) -> dict[str, list[Path]]:
    """Two shards of the corpus, per format."""
    base = tmp_path_factory.mktemp("fault-shards")
    out = {}
    for fmt in ("memmap", "token-list"):
        out[fmt] = [base / f"{fmt}-{i}" for i in range(2)]
        for i, d in enumerate(out[fmt]):
            assert main(tok_args(corpus, d, fmt) + ["--num-shards", "2", "--shard-index", str(i)]) == 0
    return out


def same_as_ref(out: Path, ref: Path) -> None:
    assert data_files(out) == data_files(ref)
    assert read_manifest(out)["files"] == read_manifest(ref)["files"]


# ---------------------------------------------------------------- disk full


def _phase(line: str) -> str:
    """Where a disk-full error hit, from the path its line names."""
    if "/.pretok/parts/part-" in line or "/part-" in line:
        return "part"
    if "data.bin.tmp" in line or "placed.jsonl" in line or "data.lens" in line:
        return "append"
    if "data.idx" in line or "finishing" in line:
        return "index"
    if "manifest.json" in line:
        return "manifest"
    return "other: " + line


@needs_root
@pytest.mark.parametrize("fmt", ["memmap", "memmap-spilled", "token-list"])
def test_disk_full_at_many_sizes_then_rerun_after_freeing_space(corpus, refs, tmp_path, capsys, monkeypatch, fmt):
    """A generator of tmpfs sizes from a fraction of the output up to just short of it: every run that does not
    fit fails with one line naming the file and "No space left on device", exit 1, no manifest; after the tmpfs
    is enlarged the same command completes with the reference bytes. The sizes reach the part writers, the
    memmap append and the manifest write. Memmap parts are kept in memory and written straight into `data.bin`;
    "memmap-spilled" makes every one spill to its part files first (PRETOK_KEEP_PART_MB=0), as a part over the
    limit does, and gives the same bytes."""
    if fmt == "memmap-spilled":
        monkeypatch.setenv("PRETOK_KEEP_PART_MB", "0")
        fmt = "memmap"
    spilled = os.environ.get("PRETOK_KEEP_PART_MB") == "0"
    ref = refs[fmt]
    need = usage(ref)  # in tmpfs pages
    sizes = [need // 4, need * 7 // 8, need - PAGE]  # in the parts; late parts / the append; the manifest
    hit = set()
    for i, size in enumerate(sizes):
        mnt = tmp_path / f"m{i}"
        with tmpfs(mnt, size):
            out = mnt / "out"
            rc, err = cli(capsys, *tok_args(corpus, out, fmt))
            if rc != 0:
                line = one_line(err, ENOSPC_TEXT, "pretok: error: /")
                assert rc == 1
                assert not (out / "manifest.json").exists()
                hit.add(_phase(line))
                resize(mnt, 64 << 20)
                rc, err = cli(capsys, *tok_args(corpus, out, fmt))
                assert rc == 0, err
            same_as_ref(out, ref)
    want = {"part", "manifest"} if fmt != "memmap" else {"part", "append"} if spilled else {"append"}
    assert want <= hit, hit
    assert not [h for h in hit if h.startswith("other")], hit


def test_memmap_finish_cut_short_resumes_without_retokenizing(refs, corpus, tmp_path, capsys):
    """What a fault in the memmap finish leaves (after the `.bin` rename, before the index or the manifest is
    written: a memmap part's files are gone once appended, so a static tmpfs size cannot reach it): the rerun takes
    the `.bin` back (same inode: its parts are checked against their hashes, not tokenized again)."""
    out = tmp_path / "out"
    shutil.copytree(refs["memmap"], out)
    (out / "manifest.json").unlink()
    (out / "data.idx").unlink()
    inode = (out / "data.bin").stat().st_ino
    rc, err = cli(capsys, *tok_args(corpus, out, "memmap"))
    assert rc == 0, err
    assert (out / "data.bin").stat().st_ino == inode
    same_as_ref(out, refs["memmap"])


@needs_root
def test_disk_full_in_worker_processes(corpus, refs, tmp_path):
    """--workers 2: the part writers run in worker processes; the error still arrives as one line."""
    mnt = tmp_path / "m"
    with tmpfs(mnt, usage(refs["token-list"]) // 3):
        out = mnt / "out"
        p = popen(*tok_args(corpus, out, "token-list", workers=2))
        err = p.communicate(timeout=120)[1]
        assert p.returncode == 1
        assert _phase(one_line(err, ENOSPC_TEXT, "pretok: error: /")) == "part"
        assert not (out / "manifest.json").exists()
        resize(mnt, 64 << 20)
        p = popen(*tok_args(corpus, out, "token-list", workers=2))
        assert p.communicate(timeout=120)[1] == "" and p.returncode == 0
        same_as_ref(out, refs["token-list"])


@needs_root
def test_disk_full_in_merge(shard_dirs, refs, tmp_path, capsys):
    shards = shard_dirs["memmap"]
    mnt = tmp_path / "m"
    with tmpfs(mnt, usage(refs["memmap"]) // 2):
        out = mnt / "merged"
        rc, err = cli(capsys, "merge", *shards, "--out", out)
        assert rc == 1
        one_line(err, ENOSPC_TEXT, str(out))
        assert not (out / "manifest.json").exists()
        resize(mnt, 64 << 20)
        rc, err = cli(capsys, "merge", *shards, "--out", out)  # the interrupted merge is started over
        assert rc == 0, err
        same_as_ref(out, refs["memmap"])


# ---------------------------------------------------------------- read-only file system, bad --out


@needs_root
def test_read_only_file_system(corpus, refs, tmp_path, capsys):
    """--out under a read-only mount: one line "Read-only file system", exit 1; a finished output there is
    still a no-op rerun; writable again, the same command completes."""
    base = tmp_path / "base"
    (base / "empty").mkdir(parents=True)
    assert main(tok_args(corpus, base / "done", "memmap")) == 0
    with read_only(base, tmp_path / "ro") as ro:
        for out in (ro / "new", ro / "new" / "deeper", ro / "empty"):
            rc, err = cli(capsys, *tok_args(corpus, out, "memmap"))
            assert rc == 1
            one_line(err, EROFS_TEXT, str(ro))
        rc, err = cli(capsys, *tok_args(corpus, ro / "done", "memmap"))
        assert rc == 0, err
    rc, err = cli(capsys, *tok_args(corpus, base / "empty", "memmap"))
    assert rc == 0, err
    same_as_ref(base / "empty", refs["memmap"])


@pytest.mark.parametrize("kind", ["file", "fifo", "dangling-symlink"])
def test_out_that_cannot_be_a_directory(corpus, refs, tmp_path, capsys, kind):
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("my notes")
    elif kind == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to(tmp_path / "nowhere")
    rc, err = cli(capsys, *tok_args(corpus, out, "memmap"))
    assert rc == 1
    one_line(err, str(out), {"file": "a regular file", "fifo": "a FIFO", "dangling-symlink": "dangling"}[kind])
    if kind == "file":
        assert out.read_text() == "my notes"
    rc, err = cli(capsys, "merge", refs["memmap"], "--out", out)
    assert rc == 1
    one_line(err, str(out))
    out.unlink()
    rc, err = cli(capsys, *tok_args(corpus, out, "memmap"))
    assert rc == 0, err
    same_as_ref(out, refs["memmap"])


def test_bad_slurm_array_variables(corpus, tmp_path, capsys, monkeypatch):
    for name, value in (("SLURM_ARRAY_TASK_ID", "abc"), ("SLURM_ARRAY_TASK_COUNT", "4x"),
                        ("SLURM_ARRAY_TASK_MIN", "")):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
        monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
        monkeypatch.setenv(name, value)
        rc, err = cli(capsys, *tok_args(corpus, tmp_path / "o", "memmap"))
        assert rc == 1
        one_line(err, name, "not an integer")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- concurrency and signals


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_concurrent_writers(corpus, refs, tmp_path, overwrite):
    """Two processes started together into one --out: each completes (exit 0) or is refused with one line
    naming the lock (exit 1); never a traceback or a torn output; the result has the reference bytes."""
    extra = ["--overwrite"] if overwrite else []
    for trial in range(2):
        out = tmp_path / f"out{trial}"
        if trial and overwrite:  # the second trial replaces a finished output of another config
            assert main(tok_args(corpus, out, "memmap") + ["--eos", "yes"]) == 0
        procs = [popen(*tok_args(corpus, out, "memmap"), *extra) for _ in range(2)]
        results = [(p.communicate(timeout=120)[1], p.returncode) for p in procs]
        for err, rc in results:
            if rc != 0:
                assert rc == 1
                one_line(err, "another pretok process is writing into this output", str(out))
            else:
                assert err == ""
        assert 0 in [rc for _, rc in results], results
        same_as_ref(out, refs["memmap"])
        assert not (out / ".pretok" / "lock").exists() and not (tmp_path / f".out{trial}.lock").exists()


LOCK_REFUSALS = [errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL]


def _refuse(err: int):
    def refuse(*a):
        raise OSError(err, os.strerror(err))
    return refuse


@pytest.mark.parametrize("refusal", LOCK_REFUSALS)
def test_a_file_system_without_flock_locks_with_record_locks(corpus, refs, tmp_path, monkeypatch, capsys, refusal):
    """flock refused (Lustre without the flock mount option, some NFS/FUSE): POSIX record locks keep out a second
    writer; the run itself completes silently with the reference bytes."""
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _refuse(refusal))
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_CREAT | os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(60)", str(tmp_path / ".out.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, err = cli(capsys, *tok_args(corpus, out, "memmap"))
        assert rc == 1
        one_line(err, "another pretok process is writing into this output", str(out))
    finally:
        holder.kill()
        holder.wait()
    assert cli(capsys, *tok_args(corpus, out, "memmap")) == (0, "")
    same_as_ref(out, refs["memmap"])


def test_a_file_system_without_any_lock_writes_and_says_so(corpus, refs, tmp_path, monkeypatch, capsys):
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _refuse(errno.ENOSYS))
    monkeypatch.setattr(fcntl, "lockf", _refuse(errno.ENOLCK))
    out = tmp_path / "out"
    rc, err = cli(capsys, *tok_args(corpus, out, "memmap"))
    assert rc == 0
    one_line(err, "cannot lock", prefix="pretok: warning: ")
    same_as_ref(out, refs["memmap"])


def test_a_lock_failing_otherwise_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _refuse(errno.EIO))
    rc, err = cli(capsys, *tok_args(corpus, tmp_path / "out", "memmap"))
    assert rc == 1
    one_line(err, "cannot lock the output", os.strerror(errno.EIO), ".out.lock")
    assert not (tmp_path / "out").exists()


def _signal_at(args: list[str], sig: int, delay: float) -> tuple[int, str]:
    p = popen(*args)
    time.sleep(delay)
    p.send_signal(sig)
    err = p.communicate(timeout=120)[1]
    return p.returncode, err


def _check_signalled(rc: int, err: str, sig: int, out: Path) -> bool:
    """The contract for a signal: SIGKILL → killed, nothing printed; SIGTERM → one line, exit 143, except in the
    interpreter's start-up before `main` runs, where the default action kills the process before it has written
    anything. True if the signal landed while the command was working."""
    if rc == 0:
        return False
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        return True
    if rc == -signal.SIGTERM:  # still starting up
        assert err == "" and not out.exists(), (err, sorted(out.rglob("*")) if out.exists() else None)
        return False
    assert rc == 143, err
    one_line(err, "terminated by SIGTERM", "rerun the same command")
    return True


def test_signals_at_random_moments_tokenize(corpus, refs, tmp_path, capsys):
    """SIGKILL / SIGTERM at random moments of a run (its state just made, or k parts committed): whatever the
    moment, the output is absent, incomplete (no manifest) or valid, and the same command resumes to the same bytes.
    The moments are the run's own progress, so every signal lands mid-run under any load."""
    rng = random.Random(1234)
    parts = len(read_manifest(refs["memmap"])["parts"])
    assert parts >= 3, parts
    landed = 0
    for i, sig in enumerate([signal.SIGKILL, signal.SIGTERM] * 3):
        out = tmp_path / f"k{i}"
        p = popen(*tok_args(corpus, out, "memmap", workers=2))
        hit = signal_when(p, after_parts(out, rng.randrange(0, parts - 1)), sig)
        err = p.communicate(timeout=HANG)[1]
        landed += _check_signalled(p.returncode, err, sig, out) and hit
        no_manifest_or_valid(out)
        rc, err = cli(capsys, *tok_args(corpus, out, "memmap"))  # resumed inline (same bytes for any --workers)
        assert rc == 0, err
        same_as_ref(out, refs["memmap"])
    assert landed >= 5, landed   # a moment before the last part cannot be missed (the SIGSTOP holds it there)


@pytest.mark.parametrize("fmt", ["memmap", "token-list"])
def test_signals_at_random_moments_merge(shard_dirs, refs, tmp_path, capsys, fmt):
    """SIGKILL / SIGTERM during a merge: at the moment it marks its output (`.pretok/merging`, before any data is
    placed), or at a random time of a calibration run: output absent, resumable, or complete and valid."""
    shards = shard_dirs[fmt]
    t0 = time.time()
    p = popen("merge", *shards, "--out", tmp_path / "timing")
    assert p.communicate(timeout=HANG)[1] == "" and p.returncode == 0
    took = time.time() - t0
    rng = random.Random(99)
    landed = 0
    for i, sig in enumerate([signal.SIGKILL, signal.SIGTERM] * 2):
        out = tmp_path / f"m{i}"
        if i < 2:   # the progress moment: always lands
            p = popen("merge", *shards, "--out", out)
            signal_when(p, lambda: (out / MERGING).exists(), sig)
            rc, err = p.wait(timeout=HANG), p.communicate()[1]
        else:       # a random time: wherever it lands (or after the end)
            rc, err = _signal_at(["merge", *shards, "--out", out], sig, rng.uniform(0.3, 1.0) * took)
        landed += _check_signalled(rc, err, sig, out)
        no_manifest_or_valid(out)
        rc, err = cli(capsys, "merge", *shards, "--out", out)
        if (out / "manifest.json").exists() and rc:  # it had finished: a rerun is refused, the output stands
            one_line(err, "exists and is not empty")
        else:
            assert rc == 0, err
        same_as_ref(out, refs[fmt])
    assert landed >= 2, landed


def test_sigterm_in_start_up(shard_dirs, refs, tmp_path, capsys):
    """SIGTERM in the first moments of a command (interpreter start-up, imports, argument parsing, planning):
    killed before it wrote anything, or one line and exit 143, or done; the rerun gives the reference bytes."""
    shards = shard_dirs["memmap"]
    t = time.time()
    p = popen("merge", *shards, "--out", tmp_path / "timing")
    err = p.communicate(timeout=120)[1]
    took = time.time() - t  # the whole command on this machine now (a loaded machine starts slowly)
    assert p.returncode == 0, err
    outcomes, i = [], 0
    # fixed early moments, then spread over the command's measured time until two kinds of outcome were seen
    delays = [0.0, 0.02, 0.05] + [took * f for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.15, 0.35)]
    while i < len(delays) and (i < 8 or len(set(outcomes)) < 2):
        out = tmp_path / f"s{i}"
        rc, err = _signal_at(["merge", *shards, "--out", out], signal.SIGTERM, delays[i])
        _check_signalled(rc, err, signal.SIGTERM, out)
        outcomes.append(rc)
        no_manifest_or_valid(out)
        rc, err = cli(capsys, "merge", *shards, "--out", out)
        assert rc == 0 or (out / "manifest.json").exists(), err
        same_as_ref(out, refs["memmap"])
        i += 1
    assert set(outcomes) <= {-signal.SIGTERM, 143, 0} and len(set(outcomes)) >= 2, (took, delays, outcomes)
