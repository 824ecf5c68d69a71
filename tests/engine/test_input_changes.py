"""A local input changed while `pretok tokenize` reads it: an error naming it, no manifest; resumable once restored.

Fault injection: the input is cut, grown, rewritten, replaced (a new inode with the old size and mtime), touched or
removed just before a generated part reads it, or while the input checksums are read. The run must fail in one line
naming the file with no manifest, and the same command must finish, byte-identical to an undisturbed run, once the
file is restored (same bytes, size and mtime; a new inode, as a copy made with `cp -p` has).
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main
from pretok_lib.engine import parts, run
from pretok_lib.engine import workers as workers_mod

from .signal_at import HANG
from .test_faults_tokenize import cli, one_line
from .test_output_safety import tok_args, write_jsonl
from .test_pretokenize import data_files

CHANGES = ("truncate", "append", "rewrite", "replace", "touch", "remove")


def change(path: Path, how: str, fraction: float) -> None:
    """Change `path` the way a user or another job might while a run reads it."""
    data, st_ = path.read_bytes(), path.stat()
    if how == "truncate":
        os.truncate(path, int(len(data) * fraction))
    elif how == "append":
        with open(path, "ab") as fh:
            fh.write(b'{"text": "one more"}\n')
    elif how == "rewrite":  # same size, other bytes, in place
        path.write_bytes(data.replace(b"e", b"a"))
        os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
    elif how == "replace":  # same bytes, size and mtime: only the inode tells
        tmp = path.with_name("tmp-copy")
        tmp.write_bytes(data)
        os.utime(tmp, ns=(st_.st_atime_ns, st_.st_mtime_ns))
        os.replace(tmp, path)
    elif how == "touch":
        os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
    else:
        path.unlink()


class Reference(dict):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return "<reference input and outputs>"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The input's bytes and mtime, and undisturbed outputs of it per format."""
    base = tmp_path_factory.mktemp("ref")
    inp = write_jsonl(base / "in.jsonl", 40)
    refs = {}
    for fmt in ("memmap", "token-list"):
        args = tok_args(inp, base / fmt)
        args[args.index("token-list")] = fmt
        assert main(args) == 0
        refs[fmt] = data_files(base / fmt)
    return Reference(bytes=inp.read_bytes(), mtime_ns=inp.stat().st_mtime_ns, refs=refs)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(how="remove", at=4, fraction=0.0, fmt="memmap")     # the backend check's read fails first
@example(how="remove", at=3, fraction=0.0, fmt="token-list")  # the input checksum's read fails first
@given(how=st.sampled_from(CHANGES), at=st.integers(0, 4), fraction=st.floats(0.0, 0.95),
       fmt=st.sampled_from(["memmap", "token-list"]))
def test_input_changed_mid_run_fails_naming_it_and_resumes_once_restored(reference, capsys, how, at, fraction, fmt):
    """Cut to 11 of 32 MB mid-run, an input used to give exit 0 and a manifest of a third of its documents; a
    rewrite kept the old checksum. `at`: the unit before which it changes (3: while its checksum is read, 4: while
    the backend check reads its sample: a removal there was reported as "cannot read", not as the change)."""
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out"
        inp.write_bytes(reference["bytes"])
        os.utime(inp, ns=(reference["mtime_ns"], reference["mtime_ns"]))
        args = tok_args(inp, out)
        args[args.index("token-list")] = fmt
        fired = []

        def read_unit(unit, opts):
            if at < 4 and unit.index == at and not fired:
                fired.append(True)
                change(inp, how, fraction)
            return real_read(unit, opts)

        def hash_inputs(blocks):
            if not fired:
                fired.append(True)
                change(inp, how, fraction)
            return real_hash(blocks)

        parts_read = threading.Event()

        def sample_texts(*a, **kw):   # the check's sample is read once every part was: its read fails first
            parts_read.wait(HANG)
            if not fired:
                fired.append(True)
                change(inp, how, fraction)
            return real_sample(*a, **kw)

        def workers_run(*a, **kw):
            try:
                return real_workers_run(*a, **kw)
            finally:
                parts_read.set()

        real_read, real_hash, real_sample = parts.read_unit, workers_mod.hash_blocks, run.sample_texts
        real_workers_run = run.Workers.run
        hasher = hash_inputs if at == 3 else real_hash
        with mock.patch.object(parts, "read_unit", read_unit), mock.patch.object(workers_mod, "hash_blocks", hasher), \
                mock.patch.object(run, "sample_texts", sample_texts if at == 4 else real_sample), \
                mock.patch.object(run.Workers, "run", workers_run):
            rc, err = cli(capsys, *args)
        assert fired and rc == 1, err
        one_line(err, str(inp), "changed while this run read it", "rerun the same command to resume")
        assert not (out / "manifest.json").exists()
        tmp_copy = inp.with_name("restored")  # restored as `cp -p` would: the same bytes and mtime, a new inode
        tmp_copy.write_bytes(reference["bytes"])
        os.utime(tmp_copy, ns=(reference["mtime_ns"], reference["mtime_ns"]))
        os.replace(tmp_copy, inp)
        rc, err = cli(capsys, *args)
        assert rc == 0, err
        assert data_files(out) == reference["refs"][fmt]
