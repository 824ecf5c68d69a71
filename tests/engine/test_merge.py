"""`pretok merge` refuses damaged shards (a byte-flip generator over every file it reads) and outputs that are,
lie inside or contain a shard; it checks the data as it copies it."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.cli import main
from pretok_lib.formats.manifest import read_manifest

from ..conftest import GPT2_JSON, WIKI_EN
from .test_faults_tokenize import cli, one_line
from .test_pretokenize import data_files


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, list[Path]]:
    """Two shards per format of a small real corpus (two parts each)."""
    base = tmp_path_factory.mktemp("merge-shards")
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:400]
    corpus = base / "c.parquet"
    pq.write_table(pa.table({"text": docs}), corpus, row_group_size=100)
    out = {}
    for fmt in ("memmap", "token-list"):
        out[fmt] = [base / f"{fmt}-{i}" for i in range(2)]
        for i, d in enumerate(out[fmt]):
            assert main(["tokenize", str(corpus), "--out", str(d), "--tokenizer", str(GPT2_JSON), "--format", fmt,
                         "--part-mb", "0.05", "--workers", "0", "--no-progress", "--num-shards", "2",
                         "--shard-index", str(i)]) == 0
    return out


def _copy(dirs: list[Path], dst: Path) -> list[Path]:
    return [Path(shutil.copytree(d, dst / d.name)) for d in dirs]


@pytest.mark.parametrize("fmt", ["memmap", "token-list"])
def test_byte_flips_in_shards_are_refused(shards, tmp_path, capsys, fmt):
    """Seeded: one flipped bit anywhere in a shard's data files or manifest → merge exits 1 with one line naming
    that file, no manifest. (A flip in the manifest's JSON whitespace that leaves its content equal is harmless
    and merges.)"""
    rng = random.Random({"memmap": 14, "token-list": 6}[fmt])
    cases = 20
    for k in range(cases):
        work = tmp_path / f"case{k}"
        dirs = _copy(shards[fmt], work)
        shard = rng.choice(dirs)
        victims = [shard / f["path"] for f in read_manifest(shard)["files"]] + [shard / "manifest.json"]
        victim = victims[k % len(victims)]
        data = bytearray(victim.read_bytes())
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        victim.write_bytes(bytes(data))
        harmless = False
        if victim.name == "manifest.json":
            try:
                harmless = json.loads(bytes(data)) == json.loads((shards[fmt][dirs.index(shard)] / victim.name)
                                                                   .read_bytes())
            except ValueError:
                pass
        out = work / "merged"
        rc, err = cli(capsys, "merge", *dirs, "--out", out)
        if harmless:
            assert rc == 0, err
            continue
        assert rc == 1, f"flip at {pos} of {victim} was merged"
        one_line(err, str(victim))
        assert not (out / "manifest.json").exists()
        assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")] if out.exists() else True


def test_clean_merge_after_refusal_gives_the_shards_bytes(shards, tmp_path, capsys):
    """The checks pass untouched shards (the hashes computed while copying equal the recorded ones)."""
    for fmt, dirs in shards.items():
        rc, err = cli(capsys, "merge", *dirs, "--out", tmp_path / fmt)
        assert rc == 0, err
        m = read_manifest(tmp_path / fmt)
        assert m["counts"]["documents"] == sum(read_manifest(d)["counts"]["documents"] for d in dirs)
        assert not (tmp_path / fmt / ".pretok").exists()


def test_output_that_is_inside_or_contains_a_shard_is_refused(shards, tmp_path, capsys):
    dirs = _copy(shards["token-list"], tmp_path / "shards")
    before = {d: data_files(d) for d in dirs}
    link = tmp_path / "link"
    link.symlink_to(dirs[0])
    for out, how in ((dirs[0], "is shard"), (dirs[0] / "sub", "is inside shard"), (tmp_path / "shards", "contains"),
                     (link, "is shard")):
        rc, err = cli(capsys, "merge", *dirs, "--out", out, "--overwrite")
        assert rc == 1
        one_line(err, how, "would destroy an input")
    assert {d: data_files(d) for d in dirs} == before
    for d in dirs:
        read_manifest(d)
