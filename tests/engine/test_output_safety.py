"""What `tokenize`/`merge` may delete: never an input, never an entry pretok did not write (generated layouts).

An `--out` that is, contains or lies inside an input is refused before anything is touched; `--overwrite` removes
only a pretok output (manifest, `.pretok`, parts, the memmap pair and their temp names) and refuses, naming it, a
directory holding anything else. Each example snapshots every file (inputs and entries outside the output too) and
checks that a refusal left all of them as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main
from pretok_lib.engine.outdir import OWNED
from pretok_lib.formats.manifest import read_manifest

from ..conftest import GPT2_JSON, WIKI_EN
from .test_faults_tokenize import cli, one_line

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under `root` (symbolic links not followed): a file's bytes, a link's target, a dir's name."""
    out: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dirpath, n)
            key = str(p.relative_to(root))
            out[key] = ("->", os.readlink(p)) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def write_jsonl(path: Path, n: int = 30) -> Path:
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:n]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def tok_args(inp: Path | str, out: Path, *extra: str) -> list[str]:
    return ["tokenize", str(inp), "--out", str(out), "--tokenizer", str(GPT2_JSON), "--format", "token-list",
            "--part-mb", "0.005", "--workers", "0", "--no-progress", *extra]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A finished output and two finished shards of a small JSONL input (copied by each example)."""
    base = tmp_path_factory.mktemp("made")
    inp = write_jsonl(base / "in.jsonl")
    assert main(tok_args(inp, base / "out")) == 0
    for i in range(2):
        assert main(tok_args(inp, base / f"shard{i}", "--num-shards", "2", "--shard-index", str(i))) == 0
    return {"input": inp, "out": base / "out", "shard0": base / "shard0", "shard1": base / "shard1"}


SEGMENT = st.sampled_from(["sub", "a", "data", ".pretok", "part-000001", "x y"])


@SETTINGS
@given(how=st.sampled_from(["contains", "is", "inside"]), depth=st.integers(0, 2), segs=st.lists(SEGMENT, max_size=3),
       name=st.sampled_from(["in.jsonl", "manifest.json", "notes.txt"]), via_link=st.booleans(),
       overwrite=st.booleans(), finished=st.booleans())
def test_an_out_overlapping_an_input_is_refused_untouched(made, capsys, how, depth, segs, name, via_link, overwrite,
                                                          finished):
    """`tokenize DIR/sub/in.jsonl --out DIR --overwrite` deleted the input, then failed with a traceback. Now an
    `--out` that contains an input file, is an input (an HF dataset directory) or lies inside one is refused in
    one line, whatever the nesting, links and `--overwrite`, and no file changes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root / "out"
        if finished:  # a pretok output already there (its manifest.json may itself be named as the input)
            shutil.copytree(made["out"], out)
        sub = Path(*segs[:depth]) if segs[:depth] else Path()
        if how == "contains":
            inp = out / sub / name
            if not inp.exists():
                write_jsonl(inp)
            target = out
        else:  # an HF dataset directory (saved without rows) as the input
            inp = root / "ds"
            inp.mkdir()
            (inp / "state.json").write_text('{"_data_files": []}')
            (inp / "dataset_info.json").write_text("{}")
            target = inp if how == "is" else inp / sub / "tok"
            target.mkdir(parents=True, exist_ok=True)
        if via_link:
            (root / "link").symlink_to(target)
            target = root / "link"
        before = snapshot(root)
        rc, err = cli(capsys, *tok_args(inp, target, *(["--overwrite"] if overwrite else [])))
        assert rc == 1
        one_line(err, "would destroy an input", str(inp))
        assert snapshot(root) == before


FOREIGN = st.sampled_from(["notes.txt", ".git", "data.bin.bak", "manifest.json.old", "part-1.parquet", "data.idx",
                           "part-000009.parquet", "train.py", "a b", ".pretok2", "data.lens"])


@SETTINGS
@given(command=st.sampled_from(["tokenize", "merge"]), finished=st.booleans(),
       entries=st.lists(st.tuples(FOREIGN, st.sampled_from(["file", "dir", "link"])), max_size=3,
                        unique_by=lambda e: e[0]))
def test_overwrite_removes_only_what_pretok_wrote(made, capsys, command, finished, entries):
    """`--out ~ --overwrite` renamed the whole directory aside and deleted it. Now `--overwrite` replaces a pretok
    output (finished or interrupted), and refuses, before deleting anything and naming the first such entry, a
    directory that holds anything pretok did not write: another file, a directory, a link to a file outside (even
    under a name pretok uses, such as `data.idx`)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root / "out"
        outside = root / "elsewhere.txt"
        outside.write_text("keep me")
        if finished:
            shutil.copytree(made["out"], out)
        else:  # what an interrupted run leaves: state and a temp name
            (out / ".pretok" / "parts").mkdir(parents=True)
            (out / "part-000000.parquet.tmp").write_bytes(b"half")
        placed = []
        for name, kind in entries:
            p = out / name
            if p.exists() or p.is_symlink():
                continue
            if kind == "file":
                p.write_text("mine")
            elif kind == "dir":
                p.mkdir()
                (p / "kept").write_text("mine")
            else:
                p.symlink_to(outside)
            if not (kind == "file" and OWNED.fullmatch(name)):  # a plain file under a name pretok writes is its
                placed.append(name)
        before = snapshot(root)
        if command == "tokenize":
            args = tok_args(made["input"], out, "--overwrite")
        else:
            args = ["merge", str(made["shard0"]), str(made["shard1"]), "--out", str(out), "--overwrite"]
        rc, err = cli(capsys, *args)
        if placed:
            assert rc == 1
            one_line(err, str(out), f"holds {sorted(placed)[0]!r}", "pretok did not write")
            assert snapshot(root) == before
        else:
            assert rc == 0, err
            assert read_manifest(out)["counts"]["documents"] == 30
            assert outside.read_text() == "keep me"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(["part-notes.tmp", "part-1.parquet", "part-x", "part-000001.json",
                                       "part-00001.parquet.tmp", "part-.tmp"]), min_size=1, max_size=3, unique=True))
def test_a_resume_deletes_only_its_own_leftovers(made, capsys, names):
    """A resume deleted every `part-*` entry of --out that was a temp name or not a committed part's, whatever
    its name (`part-notes.tmp` of the user included). Now only names pretok writes are cleaned up."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        shutil.copytree(made["out"], out)
        (out / "manifest.json").unlink()  # an interrupted run: the state is there, the manifest not yet
        for n in names:
            (out / n).write_text("mine")
        rc, err = cli(capsys, *tok_args(made["input"], out))
        assert rc == 0, err
        assert all((out / n).read_text() == "mine" for n in names)
