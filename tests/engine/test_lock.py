"""The output's lock file `.NAME.lock` (engine/outdir.py): no lock file is left behind by a run that ends in any
way but SIGKILL (an error raised at any point of the run, Ctrl-C, SIGTERM), and the one a SIGKILL leaves is taken
over by the next run with a one-line note. Removing it never lets two writers in (threads racing for it)."""

from __future__ import annotations

import errno
import signal
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.cli import Terminated, main
from pretok_lib.engine import merge as merge_mod
from pretok_lib.engine import finalize as finalize_mod
from pretok_lib.engine import run as run_mod
from pretok_lib.engine.outdir import lock_path, output_lock
from pretok_lib.errors import PretokError
from pretok_lib.formats.manifest import read_manifest

from ..tokenizer.test_specials import tiny_bpe
from .signal_at import HANG, after_parts, signal_when
from .test_faults_tokenize import one_line, popen


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, tokenizer): 400 short documents in 8 row groups (8 units at --part-mb 0.001), a byte-level BPE."""
    d = tmp_path_factory.mktemp("lock")
    docs = [f"document {i}: " + "lorem ipsum dolor " * (i % 7 + 1) for i in range(400)]
    pq.write_table(pa.table({"text": docs}), d / "c.parquet", row_group_size=50)
    return d / "c.parquet", tiny_bpe(d / "tok" / "tokenizer.json")


def args(small, out: Path, *extra: str) -> list[str]:
    corpus, tok = small
    return ["tokenize", str(corpus), "--out", str(out), "--tokenizer", str(tok), "--format", "memmap",
            "--part-mb", "0.001", "--workers", "0", "--no-progress", *extra]


def _raise(exc: BaseException):
    def boom(*a, **k):
        raise exc
    return boom


# (where in the run, what it raises): the planning, the tokenizer, the output's preparation, the tokenizing,
# the finishing (memmap placement), the manifest's writing (engine/finalize.py)
FAULTS = [("expand_inputs", PretokError("injected", "x")), ("load_tokenizer", OSError(errno.EIO, "injected")),
          ("prepare_output", KeyboardInterrupt()), ("_resume_places", Terminated()),
          ("check_stamps", OSError(errno.ENOSPC, "injected")), ("finalize", PretokError("injected")),
          ("write_manifest", KeyboardInterrupt())]


@pytest.mark.parametrize("name,exc", FAULTS, ids=[f"{n}-{type(e).__name__}" for n, e in FAULTS])
def test_no_lock_is_left_by_a_run_failing_anywhere(small, tmp_path, capsys, monkeypatch, name, exc):
    """A failed tokenize left `.NAME.lock` beside its output; now the lock file is removed however the run
    ends, and the same command then finishes."""
    out = tmp_path / "o"
    monkeypatch.setattr(run_mod if hasattr(run_mod, name) else finalize_mod, name, _raise(exc))
    rc = {KeyboardInterrupt: 130, Terminated: 143}.get(type(exc), 1)
    assert main(args(small, out)) == rc
    assert not lock_path(out).exists()
    monkeypatch.undo()
    capsys.readouterr()
    assert main(args(small, out)) == 0
    assert not lock_path(out).exists() and read_manifest(out)["counts"]["documents"] == 400
    assert "stale" not in capsys.readouterr().err


def test_no_lock_is_left_by_a_failed_or_finished_merge(small, tmp_path, monkeypatch):
    shards = [tmp_path / f"s{i}" for i in range(2)]
    for i, s in enumerate(shards):
        assert main(args(small, s, "--num-shards", "2", "--shard-index", str(i))) == 0
    out = tmp_path / "m"
    monkeypatch.setattr(merge_mod, "build_manifest", _raise(PretokError("injected")))
    assert main(["merge", *map(str, shards), "--out", str(out)]) == 1
    assert not lock_path(out).exists()
    monkeypatch.undo()
    assert main(["merge", *map(str, shards), "--out", str(out), "--overwrite"]) == 0
    assert not lock_path(out).exists() and not any(lock_path(s).exists() for s in shards)


@pytest.mark.parametrize("sig,rc", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_no_lock_is_left_by_a_signalled_run(small, tmp_path, sig, rc):
    """SIGTERM (scancel, a time limit) and SIGINT (Ctrl-C) mid-run: one line, the signal's exit code, no lock."""
    out = tmp_path / "o"
    p = popen(*args(small, out))
    assert signal_when(p, after_parts(out, 1), sig)
    err = p.communicate(timeout=HANG)[1]
    if p.returncode != 0:  # it may have finished in the moment the signal took to land
        assert p.returncode == rc, err
    assert not lock_path(out).exists(), err


def test_a_sigkilled_runs_lock_is_taken_over_with_a_note(small, tmp_path, capsys):
    """SIGKILL runs no cleanup: its lock file stays, naming the killed process; the next run locks it (nobody
    holds it), says in one line that it took over a stale lock, finishes, and removes it."""
    out = tmp_path / "o"
    p = popen(*args(small, out))
    assert signal_when(p, after_parts(out, 1), signal.SIGKILL)
    p.communicate(timeout=HANG)
    assert p.returncode == -signal.SIGKILL
    assert lock_path(out).read_text().startswith(f"pid {p.pid} on ")
    capsys.readouterr()
    assert main(args(small, out)) == 0
    err = capsys.readouterr().err
    one_line(err, "pretok: note:", str(lock_path(out)), "took over a stale lock", f"pid {p.pid}")
    assert not lock_path(out).exists() and read_manifest(out)["counts"]["documents"] == 400


def test_a_held_lock_still_refuses_a_second_writer(small, tmp_path, capsys):
    """The lock a live run holds (here: this process) is not stale: a second writer gets one line, exit 1, and
    the holder's lock file stays until it lets go."""
    out = tmp_path / "o"
    with output_lock(out):
        assert lock_path(out).read_text().startswith("pid ")
        capsys.readouterr()
        assert main(args(small, out)) == 1
        one_line(capsys.readouterr().err, "another pretok process is writing into this output", str(lock_path(out)))
        assert lock_path(out).exists()
    assert not lock_path(out).exists()


def test_removing_the_lock_file_never_lets_two_holders_in(tmp_path):
    """Threads (each its own open file, as processes have) take and release one output's lock in a loop: a taker
    that locked a file its holder had just removed starts over, so at most one holds it at any time."""
    out = tmp_path / "o"
    holders, most, taken, errors = [0], [0], [0], []
    guard = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(150):
                while True:
                    try:
                        with output_lock(out):
                            with guard:
                                holders[0] += 1
                                most[0] = max(most[0], holders[0])
                            with guard:
                                holders[0] -= 1
                                taken[0] += 1
                        break
                    except PretokError as e:
                        assert "another pretok process" in str(e)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert (most[0], taken[0]) == (1, 600)
    assert not lock_path(out).exists()
