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


SETTINGS = [("--part-mb", "0.03", "0.05", "part_bytes"), ("--batch-mb", "0.01", "0.02", "batch_bytes"),
            ("--text-column", "text", "body", "text_column"), ("--separator", None, r"\n\n+", "separator"),
            ("--bad-docs", "skip", "fail", "bad_docs")]


@pytest.fixture(scope="module")
def planning_corpus(tmp_path_factory) -> Path:
    """The same documents under two column names, so that --text-column can differ and both shards still read."""
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:300]
    path = tmp_path_factory.mktemp("plan") / "c.parquet"
    pq.write_table(pa.table({"text": docs, "body": docs}), path, row_group_size=50)
    return path


@pytest.mark.parametrize("flag,a,b,field", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_shards_planned_or_read_with_other_settings_are_refused(planning_corpus, tmp_path, capsys, flag, a, b, field):
    """Shards made with different --part-mb merged with rc 0 and `verify` passing, reading some documents twice
    (316 of 300) or never; --text-column merged too. Every setting that plans or reads the input must agree."""
    dirs = [tmp_path / f"s{i}" for i in range(2)]
    for i, (d, value) in enumerate(zip(dirs, (a, b))):
        args = ["tokenize", str(planning_corpus), "--out", str(d), "--tokenizer", str(GPT2_JSON), "--workers", "0",
                "--no-progress", "--num-shards", "2", "--shard-index", str(i), "--part-mb", "0.04"]
        if value is not None:
            args += [flag, value]
        assert main(args) == 0
    rc, err = cli(capsys, "merge", *dirs, "--out", tmp_path / "m")
    assert rc == 1
    one_line(err, f".{field} differs", "cannot merge")
    assert not (tmp_path / "m" / "manifest.json").exists()


def test_shards_of_another_version_of_an_input_are_refused(planning_corpus, tmp_path, capsys):
    """Same path and size, other bytes (an input rewritten between two array tasks): JSONL units follow the
    newlines of the bytes, so the shards' parts would not meet."""
    src = tmp_path / "c.jsonl"
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:300]
    dirs = [tmp_path / f"s{i}" for i in range(2)]
    for i, d in enumerate(dirs):
        src.write_text("".join(json.dumps({"text": t.upper() if i else t}) + "\n" for t in docs))
        assert main(["tokenize", str(src), "--out", str(d), "--tokenizer", str(GPT2_JSON), "--workers", "0",
                     "--no-progress", "--num-shards", "2", "--shard-index", str(i), "--part-mb", "0.04"]) == 0
    rc, err = cli(capsys, "merge", *dirs, "--out", tmp_path / "m")
    assert rc == 1
    one_line(err, "different inputs", "cannot merge")


def test_verify_finds_parts_that_do_not_read_on(shards, tmp_path):
    """A dataset whose parts overlap or leave a gap in their input (as a merge of differently planned shards did)
    fails `verify`, even with its manifest's own checksum intact."""
    from pretok_lib.engine.verify import verify
    from pretok_lib.formats.manifest import write_manifest

    merged = tmp_path / "m"
    assert main(["merge", *map(str, shards["token-list"]), "--out", str(merged)]) == 0
    assert verify(merged, sample=0).ok
    m = read_manifest(merged)
    m["parts"][2]["unit"]["start"] -= 10
    m.pop("manifest_sha256", None)
    write_manifest(merged, m)
    report = verify(merged, sample=0)
    assert not report.ok and any("part before it ended" in p for p in report.problems), report.problems


@pytest.mark.parametrize("fmt", ["memmap", "token-list"])
@pytest.mark.parametrize("inputs,num_shards", [(2, 2), (3, 2), (1, 3), (2, 5)])
def test_shards_that_read_different_inputs_merge_into_the_unsharded_bytes(tmp_path, capsys, fmt, inputs, num_shards):
    """A shard hashes only the inputs its units read (the others are recorded without a checksum): shards of
    several inputs, and shards left without any unit (more array tasks than units), still merge, into the bytes
    and the input checksums of the unsharded run."""
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:90]
    srcs = []
    for k in range(inputs):
        srcs.append(tmp_path / f"in{k}.jsonl")
        srcs[-1].write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[k * 30 : (k + 1) * 30]))
    common = ["--tokenizer", str(GPT2_JSON), "--format", fmt, "--workers", "0", "--no-progress"]
    dirs = [tmp_path / f"s{i}" for i in range(num_shards)]
    for i, d in enumerate(dirs):
        assert main(["tokenize", *map(str, srcs), "--out", str(d), *common, "--num-shards", str(num_shards),
                     "--shard-index", str(i)]) == 0
    assert main(["tokenize", *map(str, srcs), "--out", str(tmp_path / "whole"), *common]) == 0
    rc, err = cli(capsys, "merge", *dirs, "--out", tmp_path / "m")
    assert rc == 0, err
    merged, whole = read_manifest(tmp_path / "m"), read_manifest(tmp_path / "whole")
    assert merged["files"] == whole["files"] and merged["counts"] == whole["counts"]
    assert merged["inputs"] == whole["inputs"] and all(i["checksum"] for i in merged["inputs"])


@pytest.mark.parametrize("damage", ["truncated", "extended", "no pretok metadata", "another format"])
def test_resealed_shard_with_an_unreadable_part_is_refused_before_any_output(shards, tmp_path, capsys, damage):
    """A part damaged and its manifest re-sealed (sizes and checksums recomputed: a copy tool's or another writer's
    output) is refused in one line naming it, and no merged output is written that would look complete."""
    from pretok_lib.formats import checksum
    from pretok_lib.formats.manifest import write_manifest

    dirs = _copy(shards["token-list"], tmp_path)
    part = sorted(dirs[1].glob("part-*.parquet"))[0]
    raw = part.read_bytes()
    if damage == "truncated":
        part.write_bytes(raw[:-100])
    elif damage == "extended":
        part.write_bytes(raw + bytes(64))
    elif damage == "no pretok metadata":
        pq.write_table(pq.read_table(part).replace_schema_metadata({}), part)
    else:
        t = pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.uint16(), 3)),
                      "attention_mask": pa.array([[1, 1, 1]], pa.list_(pa.int8(), 3))})
        meta = {"pretok": json.dumps({"format": "padded", "format_version": 1, "dtype": "uint16", "seq_len": 2,
                                      "row_length": 3, "pad_id": 0})}
        pq.write_table(t.replace_schema_metadata(meta), part)
    m = json.loads((dirs[1] / "manifest.json").read_text())
    for f in m["files"]:
        f["size"], f["checksum"] = (dirs[1] / f["path"]).stat().st_size, checksum.of_file(dirs[1] / f["path"])
    write_manifest(dirs[1], m)
    rc, err = cli(capsys, "merge", *dirs, "--out", tmp_path / "m")
    assert rc == 1
    one_line(err, str(part))
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_parts_that_are_symlinks_merge_as_their_files(shards, tmp_path, capsys, how):
    """A shard whose parts are symbolic links (moved to another disk, assembled by links): the merged output holds
    the parts' bytes (linked or copied), never a link that points elsewhere or dangles at another depth."""
    dirs = _copy(shards["token-list"], tmp_path)
    store = tmp_path / "store"
    store.mkdir()
    for part in sorted(dirs[0].glob("part-*.parquet")):
        part.rename(store / part.name)
        part.symlink_to(Path("..") / "store" / part.name if how == "relative" else store / part.name)
    out = tmp_path / "deeper" / "level" / "m"
    rc, err = cli(capsys, "merge", *dirs, "--out", out)
    assert rc == 0, err
    merged = sorted(out.glob("part-*.parquet"))
    assert merged and not any(p.is_symlink() for p in merged)
    assert data_files(out) == {**data_files(store), **data_files(dirs[1])}
    assert main(["verify", str(out), "--sample", "0"]) == 0
