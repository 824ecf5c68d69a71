"""The engine on real corpora: formats agree, round-trip, worker-count independence, resume after kill -9, shards."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers
import xxhash

from pretok_lib.engine.merge import merge_shards
from pretok_lib.engine.outdir import prepare_output, remove_output
from pretok_lib.engine.verify import format_inspect, inspect, verify
from pretok_lib.errors import PretokError
from pretok_lib.formats import parquet as pqf
from pretok_lib.formats.manifest import read_manifest
from pretok_lib.formats.memmap import MemmapDataset
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import GPT2_JSON, PYDOCS_JSONL, ROOT, WIKI_EN, WIKITEXT_VALID
from .signal_at import after_parts, signal_when

GPT2_EOT = 50256


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pretok_lib.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Real documents as parquet: the python docs (long, markup-heavy) then wikipedia summaries (short)."""
    docs = [json.loads(line)["text"] for line in PYDOCS_JSONL.open()][:200]
    docs += [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:3000]
    path = tmp_path_factory.mktemp("corpus") / "corpus.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=400)
    return path


def tok(corpus: Path, out: Path, fmt: str = "memmap", **kw) -> dict:
    cfg = TokenizeConfig(inputs=[str(corpus)], out=str(out), tokenizer=str(GPT2_JSON), format=fmt,
                         progress=False, **{"workers": 0, "part_mb": 1.0, "batch_mb": 0.25, **kw})
    return run_tokenize(cfg)


def data_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != "manifest.json"}


def tree_root(ranges: list[bytes]) -> str:
    """XXH3-128 over each range's 8-byte little-endian size and 16-byte XXH3-128 digest (docs/FORMATS.md), written
    here from the contract, not with the code under test."""
    return xxhash.xxh3_128(b"".join(len(r).to_bytes(8, "little") + xxhash.xxh3_128(r).digest()
                                    for r in ranges)).hexdigest()


def input_tree(data: bytes) -> str:
    """An input's recorded checksum: the tree over its 64 MiB blocks (an empty file: one empty block)."""
    block = 64 << 20
    return "xxh3_128-blocks:" + tree_root([data[i : i + block] for i in range(0, len(data), block)] or [b""])


def file_checksums(out: Path) -> dict[str, str]:
    """The manifest's checksum of every data file, asserted equal to the file's actual XXH3-128 (a memmap .bin:
    the tree over the byte ranges of its parts, in the manifest's order)."""
    m = read_manifest(out)
    recorded = {f["path"]: f["checksum"] for f in m["files"]}
    for f in m["files"]:
        data = (out / f["path"]).read_bytes()
        if f["checksum"].startswith("xxh3_128-parts:"):
            sizes = [p["tokens"] * np.dtype(m["dtype"]).itemsize for p in m["parts"]]
            assert [n for n, _ in f["leaves"]] == sizes and sum(sizes) == len(data), f["path"]
            cuts = np.cumsum([0, *sizes]).tolist()
            assert f["checksum"] == "xxh3_128-parts:" + tree_root([data[a:b] for a, b in zip(cuts, cuts[1:])])
        else:
            assert f["checksum"] == "xxh3_128:" + xxhash.xxh3_128(data).hexdigest(), f["path"]
    return recorded


def stored_docs(out: Path) -> list[np.ndarray]:
    m = read_manifest(out)
    if m["format"] == "memmap":
        ds = MemmapDataset(out / "data")
        return [np.asarray(ds[i]) for i in range(len(ds))]
    return [d for f in m["files"] for d in pqf.iter_documents(out / f["path"])]


@pytest.fixture(scope="module")
def three_formats(corpus, tmp_path_factory):
    base = tmp_path_factory.mktemp("fmt")
    return {fmt: (base / fmt, tok(corpus, base / fmt, fmt, seq_len=256)) for fmt in ("memmap", "token-list", "padded")}


def test_formats_hold_the_same_token_stream(three_formats):
    mem = stored_docs(three_formats["memmap"][0])
    lst = stored_docs(three_formats["token-list"][0])
    pad = stored_docs(three_formats["padded"][0])
    assert len(mem) == len(lst) == len(pad) == three_formats["memmap"][1]["counts"]["documents"] == 3200
    for a, b, c in zip(mem, lst, pad):
        assert np.array_equal(a, b)
        assert np.array_equal(a[:257], c)
    m = three_formats["padded"][1]
    assert m["counts"]["truncated"] == sum(max(0, len(a) - 257) for a in mem) > 0
    assert m["counts"]["padding"] == sum(max(0, 257 - len(a)) for a in mem)
    assert three_formats["memmap"][1]["counts"]["tokens"] == sum(len(a) for a in mem)


def test_round_trip_equals_tokenizer_decode(corpus, three_formats):
    ref = tokenizers.Tokenizer.from_file(str(GPT2_JSON))
    ref.encode_special_tokens = True
    texts = pq.read_table(corpus).column("text").to_pylist()
    docs = stored_docs(three_formats["memmap"][0])
    for text, ids in zip(texts, docs):
        assert ids[0] == GPT2_EOT  # BOS policy: GPT-2 defines <|endoftext|> as BOS
        expect = ref.encode(text, add_special_tokens=False).ids
        assert ids[1:].tolist() == expect
        assert ref.decode(ids[1:].tolist()) == ref.decode(expect) == text


def test_manifest_records_everything(three_formats, corpus):
    m = three_formats["padded"][1]
    assert m["format"] == "padded" and m["format_version"] == 1 and m["dtype"] == "uint16"
    assert m["tokenizer"]["fingerprint"].startswith("sha256:") and m["tokenizer"]["vocab_size"] == 50257
    assert m["tokenizer"]["backend"]["backend"] == "fastokens"
    assert m["policy"]["bos_id"] == GPT2_EOT and m["policy"]["eos_id"] is None
    assert m["inputs"][0]["checksum"] == input_tree(corpus.read_bytes())
    assert m["inputs"][0]["size"] == corpus.stat().st_size
    assert m["compression"] == "zstd:3" and m["command"] and m["created"]
    assert file_checksums(three_formats["padded"][0])
    assert verify(three_formats["padded"][0], sample=20).ok
    run = m["run"]  # where the wall time went, shown by `pretok inspect`
    parts = [run[k] for k in ("startup_seconds", "tokenize_seconds", "finish_seconds")]
    assert all(x >= 0 for x in parts) and sum(parts) <= run["wall_seconds"] + 0.01 and run["tokenize_seconds"] > 0
    shown = format_inspect(inspect(three_formats["padded"][0])).splitlines()[-1]
    assert shown.startswith("run ") and f"tokenizing {run['tokenize_seconds']:.2f} s" in shown


def test_workers_do_not_change_bytes(corpus, tmp_path):
    for fmt in ("memmap", "token-list"):
        tok(corpus, tmp_path / f"{fmt}1", fmt, workers=1)
        m = tok(corpus, tmp_path / f"{fmt}2", fmt, workers=2)
        a, b = data_files(tmp_path / f"{fmt}1"), data_files(tmp_path / f"{fmt}2")
        assert a == b and len(a) >= 2
        checked = m["tokenizer"]["backend"]  # checked by a worker's encoder against the reference in this process
        assert checked["backend"] == "fastokens" and checked["checked_docs"] > 10 and checked["checked_tokens"] > 0


@pytest.mark.parametrize("keep", [{"PRETOK_KEEP_PARTS": "0"}, {"PRETOK_KEEP_MB": "0", "PRETOK_KEEP_PARTS": "1"},
                                  {"PRETOK_KEEP_PART_MB": "0"}])
def test_keep_limits_do_not_change_bytes(corpus, tmp_path, monkeypatch, keep):
    """3 workers on ~30 parts, each worker waiting for a part's placement before its next task (no part kept, or
    one part of no bytes), or every part spilled to its files and placed by any worker: the bytes of 0 workers."""
    small = tmp_path / "small-row-groups.parquet"  # units are whole row groups: ~30 of them
    pq.write_table(pq.read_table(corpus), small, row_group_size=40)
    ref = tok(small, tmp_path / "ref", part_mb=0.05)
    for k, v in keep.items():
        monkeypatch.setenv(k, v)
    m = tok(small, tmp_path / "out", workers=3, part_mb=0.05)
    assert data_files(tmp_path / "out") == data_files(tmp_path / "ref") and m["counts"] == ref["counts"]
    assert len(m["parts"]) >= 24 and m["run"]["workers_started"] == 3


def test_drawn_keep_limits_and_worker_counts_finish_with_the_same_bytes(corpus, tmp_path):
    """Workers report their placements with their next message, or on their own before they wait: a run that missed
    one would wait for it for ever. Drawn worker counts, keep limits and unit sizes (parts kept, waited for, spilled
    to their files and placed by any worker, mixed in one run): every run ends, within a time limit, with the bytes
    of 0 workers."""
    import random

    small = tmp_path / "small-row-groups.parquet"
    pq.write_table(pq.read_table(corpus), small, row_group_size=40)
    draw, refs = random.Random(37), {}
    for k in range(5):
        part_mb = draw.choice([0.02, 0.05, 0.2])
        if part_mb not in refs:
            tok(small, tmp_path / f"ref-{part_mb}", part_mb=part_mb)
            refs[part_mb] = data_files(tmp_path / f"ref-{part_mb}")
        env = {"PRETOK_KEEP_PARTS": str(draw.choice([0, 1, 2, 32])), "PRETOK_KEEP_MB": str(draw.choice([0, 1, 64])),
               "PRETOK_KEEP_PART_MB": str(draw.choice([0, 0, 1, 64]))}
        workers = draw.choice([1, 2, 3, 4])
        r = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "tokenize", str(small), "--out",
                            str(tmp_path / f"o{k}"), "--tokenizer", str(GPT2_JSON), "--workers", str(workers),
                            "--part-mb", str(part_mb), "--batch-mb", "0.25", "--no-progress"], capture_output=True,
                           text=True, timeout=180, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1",
                                                                      PYTHONPATH=str(ROOT), **env))
        assert r.returncode == 0, (env, workers, r.stderr[-2000:])
        assert data_files(tmp_path / f"o{k}") == refs[part_mb], (env, workers, part_mb)


def test_rerun_is_noop_and_other_config_refused(corpus, tmp_path):
    out = tmp_path / "o"
    m1 = tok(corpus, out)
    assert tok(corpus, out)["created"] == m1["created"]  # already complete
    assert tok(corpus, out, seq_len=128)["created"] == m1["created"]  # memmap bytes do not depend on --seq-len
    r = run_cli("tokenize", str(corpus), "--out", str(out), "--tokenizer", str(GPT2_JSON), "--eos", "yes",
                "--no-progress", "--part-mb", "1")
    assert r.returncode != 0 and "different config" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    m2 = tok(corpus, out, eos="yes", overwrite=True)
    assert m2["policy"]["eos_id"] == GPT2_EOT


@pytest.mark.parametrize("fmt,kw", [("memmap", {}), ("padded", {"seq_len": 64, "compression": "zstd:5"}),
                                    ("token-list", {"num_shards": 3, "shard_index": 1, "batch_mb": 0.1234567}),
                                    ("memmap", {"eos": "yes", "text_column": "text", "part_mb": 0.7})])
def test_run_state_deleted_after_the_manifest_keeps_the_output_complete(corpus, tmp_path, fmt, kw):
    """docs/FORMATS.md: `.pretok/` is safe to delete once manifest.json exists. The same command then refused the
    output as "not a pretok output"; now the manifest stands for the run state: the same config finds the output
    complete (nothing rewritten), another is refused naming what differs. The manifest holds the whole key."""
    from pretok_lib.engine.outdir import comparable_key, key_of_manifest

    out = tmp_path / "o"
    m1 = tok(corpus, out, fmt, **kw)
    key = json.loads((out / ".pretok" / "config.json").read_text())
    assert key_of_manifest(read_manifest(out)) == comparable_key(key)
    before = data_files(out)
    shutil.rmtree(out / ".pretok")
    assert tok(corpus, out, fmt, **kw)["created"] == m1["created"]
    assert data_files(out) == before
    shutil.rmtree(out / ".pretok")
    with pytest.raises(PretokError, match=r"different config \(differs in: policy.bos_id\)"):
        tok(corpus, out, fmt, **{**kw, "bos": "no"})
    assert data_files(out) == before


def test_shards_merge_to_the_unsharded_bytes(corpus, tmp_path):
    for fmt in ("memmap", "padded"):
        whole = tmp_path / f"whole-{fmt}"
        tok(corpus, whole, fmt)
        shards = [tmp_path / f"{fmt}-s{i}" for i in range(3)]
        for i, d in enumerate(shards):
            tok(corpus, d, fmt, num_shards=3, shard_index=i)
        with pytest.raises(Exception, match="missing shards"):
            merge_shards(shards[:2], tmp_path / f"bad-{fmt}")
        merged = merge_shards(shards[::-1], tmp_path / f"merged-{fmt}")
        assert data_files(tmp_path / f"merged-{fmt}") == data_files(whole)
        assert merged["counts"]["documents"] == read_manifest(whole)["counts"]["documents"]
        assert verify(tmp_path / f"merged-{fmt}", sample=10).ok


def test_output_left_by_a_kill_before_its_config_is_taken_over(tmp_path):
    """A run killed between creating its state dir and writing its config leaves only scaffolding: not refused.
    A kill in the middle of deleting an output leaves nothing under --out and the leftover is removed later."""
    key = {"format": "memmap"}
    out = tmp_path / "o"
    (out / ".pretok" / "parts").mkdir(parents=True)
    (out / ".pretok" / "lock").touch()
    (out / ".pretok" / "config.json.tmp").write_text('{"form')
    complete = prepare_output(out, key, overwrite=False)
    assert not complete and json.loads((out / ".pretok" / "config.json").read_text()) == key
    foreign = tmp_path / "f"
    (foreign / ".pretok" / "parts").mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="is not a pretok output"):
        prepare_output(foreign, key, overwrite=False)
    aside = tmp_path / ".o.removing"
    aside.mkdir()
    (aside / "part-00000.parquet").write_bytes(b"x")  # what a kill during remove_output leaves
    assert not prepare_output(out, key, overwrite=False)
    assert not aside.exists() and (out / ".pretok" / "config.json").exists()
    remove_output(out)
    assert not out.exists() and not aside.exists()


def test_slurm_array_variables_choose_the_shard(corpus, tmp_path):
    env = {"SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from pretok_lib.cli import build_parser, tokenize_config

        a = build_parser().parse_args(["tokenize", str(corpus), "--out", str(tmp_path), "--tokenizer", "x"])
        cfg = tokenize_config(a)
        assert (cfg.num_shards, cfg.shard_index) == (2, 1)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["token-list", "memmap"])
def test_kill9_then_resume_is_byte_identical(corpus, tmp_path, fmt):
    """kill -9 at several moments of a real run (at start-up, its state just made, a first part, half the parts,
    all but one), rerun: identical bytes. The moments are the run's own progress (tests/engine/signal_at.py), so
    each kill lands mid-run however loaded the machine."""
    args = [str(corpus), "--tokenizer", str(GPT2_JSON), "--format", fmt, "--part-mb", "0.2",
            "--batch-mb", "0.05", "--workers", "2", "--no-progress"]
    ref = tmp_path / "ref"
    assert run_cli("tokenize", *args, "--out", str(ref)).returncode == 0
    parts = len(read_manifest(ref)["parts"])
    assert parts >= 3, parts
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    interrupted = 0
    for i, moment in enumerate((None, 0, 1, parts // 2, parts - 2)):   # None: at once, in start-up
        out = tmp_path / f"killed{i}"
        p = subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", "tokenize", *args, "--out", str(out)],
                             env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        signal_when(p, (lambda: True) if moment is None else after_parts(out, moment), signal.SIGKILL)
        p.wait(timeout=300)
        interrupted += not (out / "manifest.json").exists()
        r = run_cli("tokenize", *args, "--out", str(out))
        assert r.returncode == 0, r.stderr
        assert data_files(out) == data_files(ref)
        assert file_checksums(out) == file_checksums(ref)
        assert not list((out / ".pretok" / "parts").glob("*.bin")), "appended parts must not linger"
    assert interrupted == 5, "every kill lands before the run's last part"


@pytest.mark.parametrize("fmt", ["memmap", "token-list"])
def test_an_output_planned_under_another_default_is_resumed_or_found_complete_as_planned(corpus, tmp_path, fmt):
    """Default part sizes change between versions (memmap's floor went from 1 MB to 8 MB). The same command with no
    --part-mb then refused an output planned under the old default as "of a different config (part_bytes, units)";
    now it resumes it, or finds it complete, with the part size it was planned with (one a default could have
    chosen: 1-64 MB). A --part-mb given that differs is still refused, as is a recorded size no default chooses,
    and --overwrite plans afresh with today's default."""
    bigger = tmp_path / "corpus3.parquet"  # ~15 MB: several 1.5 MB parts
    pq.write_table(pa.concat_tables([pq.read_table(corpus)] * 3), bigger, row_group_size=400)
    args = [str(bigger), "--tokenizer", str(GPT2_JSON), "--format", fmt, "--batch-mb", "0.05", "--workers", "2",
            "--no-progress"]
    ref = tmp_path / "ref"
    assert run_cli("tokenize", *args, "--part-mb", "1.5", "--out", str(ref)).returncode == 0
    parts = len(read_manifest(ref)["parts"])
    assert parts >= 3, parts
    out = tmp_path / "o"  # interrupted after its first part, then run with no --part-mb: resumed as planned
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", "tokenize", *args, "--part-mb", "1.5", "--out",
                          str(out)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert signal_when(p, after_parts(out, 1), signal.SIGKILL)
    p.wait(timeout=300)
    assert not (out / "manifest.json").exists()
    r = run_cli("tokenize", *args, "--out", str(out))
    assert r.returncode == 0, r.stderr
    m = read_manifest(out)
    assert m["source"]["part_bytes"] == 1_500_000 and len(m["parts"]) == parts
    assert data_files(out) == data_files(ref) and m["counts"] == read_manifest(ref)["counts"]
    for state in ("kept", "deleted"):  # complete: found so, nothing rewritten (also from the manifest alone)
        if state == "deleted":
            shutil.rmtree(out / ".pretok")
        r = run_cli("tokenize", *args, "--out", str(out))
        assert r.returncode == 0 and read_manifest(out)["created"] == m["created"], (state, r.stderr)
    r = run_cli("tokenize", *args, "--part-mb", "3", "--out", str(out))  # another size, given: refused
    assert r.returncode != 0 and "part_bytes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("tokenize", *args, "--overwrite", "--out", str(out))  # afresh: today's default
    assert r.returncode == 0 and read_manifest(out)["source"]["part_bytes"] != 1_500_000
    assert read_manifest(out)["counts"] == m["counts"]
    tiny = tmp_path / "tiny"  # a size no default chooses (a --part-mb given then): not adopted, refused as before
    assert run_cli("tokenize", *args, "--part-mb", "0.2", "--out", str(tiny)).returncode == 0
    r = run_cli("tokenize", *args, "--out", str(tiny))
    assert r.returncode != 0 and "part_bytes" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_text_with_separator_regex(tmp_path):
    """Documents are exactly the non-empty pieces of `re.split(separator, file)`, even across read blocks."""
    pattern = r"(?m)^(?= = [^=].* = $)"  # a wikitext article starts at a ` = Title = ` line (shared README)
    out = tmp_path / "wt"
    run_tokenize(TokenizeConfig(inputs=[str(WIKITEXT_VALID)], out=str(out), tokenizer=str(GPT2_JSON),
                                separator=pattern, workers=0, progress=False, batch_mb=0.05))
    text = WIKITEXT_VALID.read_text()
    expect = [p for p in re.split(pattern, text) if p]
    assert sum(p.startswith(" = ") for p in expect) == 60  # 60 articles, per the shared README
    ref = tokenizers.Tokenizer.from_file(str(GPT2_JSON))
    docs = stored_docs(out)
    assert len(docs) == len(expect)
    assert [ref.decode(d[1:].tolist()) for d in docs] == expect


def _crash_after_three_placed(corpus, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(an uninterrupted memmap output, one whose run crashed after placing 3 parts, each logged at once)."""
    from pretok_lib.engine.memmap_place import MemmapAssembler

    ref, out = tmp_path / "ref", tmp_path / "out"
    tok(corpus, ref, part_mb=0.3)
    real_done = MemmapAssembler.done

    def crashing_done(self, p):
        if len(self.placed) >= 3:
            raise KeyboardInterrupt("simulated crash")
        real_done(self, p)

    monkeypatch.setattr("pretok_lib.engine.memmap_place.LOG_EVERY_S", 0.0)  # log every placement at once
    monkeypatch.setattr(MemmapAssembler, "done", crashing_done)
    with pytest.raises(KeyboardInterrupt):
        tok(corpus, out, part_mb=0.3)
    monkeypatch.setattr(MemmapAssembler, "done", real_done)
    return ref, out


def test_memmap_resume_redoes_parts_damaged_on_disk(corpus, tmp_path, monkeypatch):
    """A crash after 3 placed parts, then one placed part's bytes damaged in `data.bin.tmp` (as a power cut before
    writeback would): the rerun detects it by the part's checksum, tokenizes that part again, keeps the others,
    and the output is identical."""
    from pretok_lib.engine.memmap_place import MemmapAssembler

    ref, out = _crash_after_three_placed(corpus, tmp_path, monkeypatch)
    logged = [json.loads(line) for line in (out / ".pretok" / "placed.jsonl").read_text().splitlines()]
    assert len(logged) == 3 and not (out / "manifest.json").exists()
    index, offset, size = logged[1][:3]
    tmp_bin = out / "data.bin.tmp"
    raw = bytearray(tmp_bin.read_bytes())
    raw[offset : offset + 8] = b"\x00" * 8 if raw[offset : offset + 8] != b"\x00" * 8 else b"\x01" * 8
    tmp_bin.write_bytes(bytes(raw))
    redone = []
    real_add = MemmapAssembler.add
    monkeypatch.setattr(MemmapAssembler, "add", lambda self, i, *a: redone.append(i) or real_add(self, i, *a))
    tok(corpus, out, part_mb=0.3)
    assert data_files(out) == data_files(ref)
    assert file_checksums(out) == file_checksums(ref)
    assert redone.count(index) == 1 and all(redone.count(e[0]) == 1 for e in logged)  # the others kept as placed


_LOG_DAMAGE = {   # what a crash, a power cut or a bad disk may leave in placed.jsonl, after its first line
    "torn": lambda lines: lines[:2] + [lines[2][: len(lines[2]) // 2]],
    "nuls": lambda lines: lines[:1] + [b"\x00" * 64],
    "not utf-8": lambda lines: lines[:1] + [b"\xff\xfe garbage"] + lines[1:],
    "not an entry": lambda lines: lines[:1] + [b'{"0": 1}', b"[]", b"7"] + lines[1:],
}


@pytest.mark.parametrize("damage", sorted(_LOG_DAMAGE))
def test_memmap_resume_over_a_damaged_placement_log(corpus, tmp_path, monkeypatch, damage):
    """The placements logged before the damage are checked and kept, the rest tokenized again: the output is
    identical (before: a byte that is not UTF-8 or a JSON object in the log ended the rerun with a traceback)."""
    ref, out = _crash_after_three_placed(corpus, tmp_path, monkeypatch)
    log = out / ".pretok" / "placed.jsonl"
    lines = log.read_bytes().splitlines()
    assert len(lines) == 3
    log.write_bytes(b"\n".join(_LOG_DAMAGE[damage](lines)) + b"\n")
    tok(corpus, out, part_mb=0.3)
    assert data_files(out) == data_files(ref)
    assert file_checksums(out) == file_checksums(ref)


def test_memmap_resume_checks_unplaced_parts(corpus, tmp_path, monkeypatch):
    """Finished parts are not fsynced: after a crash before they were placed, a part whose bytes were damaged
    and a part whose commit record was torn (as a power cut could leave them) are redone; the output is identical.
    The parts are spilled to their files (PRETOK_KEEP_PART_MB=0), as one over the limit or of an older run is."""
    from pretok_lib.engine.memmap_place import MemmapAssembler

    ref = tmp_path / "ref"
    tok(corpus, ref, part_mb=0.3)
    out = tmp_path / "out"
    monkeypatch.setenv("PRETOK_KEEP_PART_MB", "0")
    real_add = MemmapAssembler.add
    calls = []

    def crash_on_fourth_part(self, *a):
        calls.append(a)
        if len(calls) == 4:
            raise KeyboardInterrupt("simulated crash")
        if len(calls) > 1:  # keep parts 1 and 2 unplaced: hold them back from the assembler
            return []
        return real_add(self, *a)

    monkeypatch.setattr(MemmapAssembler, "add", crash_on_fourth_part)
    with pytest.raises(KeyboardInterrupt):
        tok(corpus, out, part_mb=0.3)
    monkeypatch.setattr(MemmapAssembler, "add", real_add)
    parts = out / ".pretok" / "parts"
    assert {p.name for p in parts.glob("*.bin")} >= {"part-000001.bin", "part-000002.bin"}
    raw = bytearray((parts / "part-000001.bin").read_bytes())
    raw[100:104] = b"\x00\x00\x00\x00" if raw[100:104] != b"\x00\x00\x00\x00" else b"\x01\x00\x01\x00"
    (parts / "part-000001.bin").write_bytes(bytes(raw))
    (parts / "part-000002.json").write_text('{"unit": {"in')
    monkeypatch.delenv("PRETOK_KEEP_PART_MB")
    tok(corpus, out, part_mb=0.3)
    assert data_files(out) == data_files(ref)
    assert file_checksums(out) == file_checksums(ref)


def test_memmap_parts_kept_in_memory_and_lost_in_a_crash_are_tokenized_again(corpus, tmp_path, monkeypatch):
    """A memmap part is kept in its worker's memory until its offsets are known, its record committed first: a
    crash then loses its bytes but not its record. The rerun finds the record without the part's files, drops it
    and tokenizes the unit again (and only the parts not placed); the output is identical."""
    from pretok_lib.engine import memmap_place, parts

    ref = tmp_path / "ref"
    tok(corpus, ref, part_mb=0.3)
    out = tmp_path / "out"
    real_write = memmap_place.write_held
    written = []

    def crash_on_third(p, part):
        if len(written) == 2:
            raise KeyboardInterrupt("simulated crash")
        written.append(p.index)
        real_write(p, part)

    monkeypatch.setattr("pretok_lib.engine.memmap_place.LOG_EVERY_S", 0.0)  # log every placement at once
    monkeypatch.setattr("pretok_lib.engine.workers.write_held", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        tok(corpus, out, part_mb=0.3)
    state = out / ".pretok" / "parts"
    assert {p.name for p in state.glob("*.json")} == {f"part-00000{i}.json" for i in range(3)}  # 3 committed
    assert not list(state.glob("*.bin")) and not list(state.glob("*.tmp"))  # no part files: all kept in memory
    monkeypatch.undo()
    tokenized = []
    real_process = parts.process_unit
    monkeypatch.setattr("pretok_lib.engine.workers.process_unit",
                        lambda unit, *a: tokenized.append(unit.index) or real_process(unit, *a))
    tok(corpus, out, part_mb=0.3)
    assert data_files(out) == data_files(ref)
    assert file_checksums(out) == file_checksums(ref)
    assert tokenized[0] == 2 and written == [0, 1] and 0 not in tokenized and 1 not in tokenized


def test_optimistic_backend_restarts_when_the_check_disagrees(corpus, tmp_path, monkeypatch):
    """Workers start with the fastest candidate; if the check (beside them) picks another backend, the output
    made so far is dropped and the run redone with the checked one."""
    import pretok_lib.engine.run as engine
    from pretok_lib.tokenizer import BackendChoice

    ref = tok(corpus, tmp_path / "ref", workers=2)
    real = engine.select_backend
    calls = []

    def pick_reference(info, sample, force=None, encoders=None):
        calls.append(force)
        if force is None:
            return BackendChoice("hf-tokenizers", "hf-tokenizers", 0, 0, {"fastokens": "rejected for the test"})
        return real(info, sample, force, encoders)

    monkeypatch.setattr(engine, "select_backend", pick_reference)
    m = tok(corpus, tmp_path / "o", workers=2)
    assert calls == [None, "hf-tokenizers"]
    assert m["tokenizer"]["backend"]["backend"] == "hf-tokenizers"
    assert m["tokenizer"]["backend"]["rejected"] == {"fastokens": "rejected for the test"}  # kept over the restart
    assert data_files(tmp_path / "o") == data_files(tmp_path / "ref") and ref["counts"] == m["counts"]
