"""Bad input: each case gives one clear line naming the file and the problem, a non-zero exit, no manifest."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.engine.verify import verify
from pretok_lib.errors import PretokError
from pretok_lib.formats.manifest import read_manifest
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from .conftest import CL100K_JSON, GPT2_JSON, PYDOCS_JSONL
from .engine.test_pretokenize import run_cli, stored_docs


def tok(inputs, out: Path, **kw) -> dict:
    cfg = TokenizeConfig(inputs=[str(i) for i in inputs], out=str(out), tokenizer=str(kw.pop("tokenizer", GPT2_JSON)),
                         progress=False, **{"workers": 0, **kw})
    return run_tokenize(cfg)


def fails(args: list[str], *needles: str) -> str:
    """Run the CLI; it must exit non-zero with exactly one stderr line containing every needle."""
    r = run_cli(*args)
    assert r.returncode != 0, r.stdout
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def docs() -> list[str]:
    return [json.loads(line)["text"] for line in PYDOCS_JSONL.open()][:20]


def write_parquet(path: Path, texts) -> Path:
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), path)
    return path


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.parquet"
    fails(["tokenize", str(missing), "--out", str(tmp_path / "o"), "--tokenizer", str(GPT2_JSON)],
          str(missing), "no such file")
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_corrupt_parquet(tmp_path, docs):
    p = write_parquet(tmp_path / "c.parquet", docs)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    fails(["tokenize", str(p), "--out", str(tmp_path / "o"), "--tokenizer", str(GPT2_JSON)],
          str(p), "not a readable parquet")
    garbage = tmp_path / "g.parquet"
    garbage.write_bytes(b"PAR1" + b"\x00" * 100)
    fails(["tokenize", str(garbage), "--out", str(tmp_path / "o2"), "--tokenizer", str(GPT2_JSON)], str(garbage))


def test_corrupt_data_page_fails_without_manifest(tmp_path, docs):
    """Garbage inside a compressed data page (footer intact) is found while reading: one line, no manifest."""
    p = tmp_path / "pages.parquet"
    pq.write_table(pa.table({"text": docs}), p, compression="zstd")
    raw = bytearray(p.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 64] = b"\xff" * 64
    p.write_bytes(bytes(raw))
    fails(["tokenize", str(p), "--out", str(tmp_path / "o"), "--tokenizer", str(GPT2_JSON), "--workers", "1"],
          str(p), "corrupt parquet data")
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_missing_text_column(tmp_path, docs):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": docs}), p)
    fails(["tokenize", str(p), "--out", str(tmp_path / "o"), "--tokenizer", str(GPT2_JSON)],
          str(p), "no column 'text'", "body")
    p2 = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": list(range(5))}), p2)
    fails(["tokenize", str(p2), "--out", str(tmp_path / "o2"), "--tokenizer", str(GPT2_JSON)], str(p2), "int64")


def test_null_and_empty_documents_skip_or_fail(tmp_path, docs):
    p = write_parquet(tmp_path / "nulls.parquet", [docs[0], None, "", docs[1], None])
    m = tok([p], tmp_path / "skip", max_bad_fraction=0.6)
    assert m["counts"]["documents"] == 2 and m["counts"]["skipped"] == {"null": 2, "empty": 1}
    fails(["tokenize", str(p), "--out", str(tmp_path / "fail"), "--tokenizer", str(GPT2_JSON),
           "--bad-docs", "fail"], str(p), "null")
    assert not (tmp_path / "fail" / "manifest.json").exists()


def test_jsonl_nonstring_invalid_utf8_and_invalid_json(tmp_path, docs):
    p = tmp_path / "bad.jsonl"
    with p.open("wb") as fh:
        fh.write(json.dumps({"text": docs[0]}).encode() + b"\n")
        fh.write(b'{"text": 42}\n')
        fh.write(b'{"text": "caf\xe9 latin-1"}\n')  # invalid UTF-8
        fh.write(b'{"text": "unterminated\n')
        fh.write(json.dumps({"text": docs[1]}).encode() + b"\n")
    m = tok([p], tmp_path / "skip", max_bad_fraction=0.6)
    assert m["counts"]["documents"] == 2
    assert m["counts"]["skipped"] == {"nonstring": 1, "invalid": 2}
    line = fails(["tokenize", str(p), "--out", str(tmp_path / "f"), "--tokenizer", str(GPT2_JSON), "--bad-docs",
                  "fail"], str(p), "not a string")
    assert "byte" in line


def test_invalid_utf8_in_text_file(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes("déjà vu\n".encode("latin-1"))
    fails(["tokenize", str(p), "--out", str(tmp_path / "f"), "--tokenizer", str(GPT2_JSON), "--bad-docs", "fail"],
          str(p), "invalid UTF-8")
    ok = tmp_path / "ok.txt"
    ok.write_text("fine text\n")
    m = tok([p, ok], tmp_path / "skip", max_bad_fraction=0.5)
    assert m["counts"]["documents"] == 1 and m["counts"]["skipped"] == {"invalid": 1}


def test_compressed_jsonl(tmp_path, docs):
    import zstandard

    raw = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    gz, zst = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.zst"
    gz.write_bytes(gzip.compress(raw))
    zst.write_bytes(zstandard.ZstdCompressor().compress(raw))
    m = tok([gz, zst], tmp_path / "o")
    assert m["counts"]["documents"] == 2 * len(docs)
    got = stored_docs(tmp_path / "o")
    assert all(np.array_equal(a, b) for a, b in zip(got[: len(docs)], got[len(docs) :]))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(raw)[:-20])
    fails(["tokenize", str(broken), "--out", str(tmp_path / "b"), "--tokenizer", str(GPT2_JSON)], str(broken))


def test_single_huge_document(tmp_path, docs):
    """A 50 MB document is tokenized whole (memmap) and truncated (padded), with exact counts."""
    base = "\n\n".join(docs)
    huge = (base * (50_000_000 // len(base) + 1))[:50_000_000]
    p = write_parquet(tmp_path / "huge.parquet", [docs[2], huge, docs[3]])
    m = tok([p], tmp_path / "mem", workers=1)
    ds = stored_docs(tmp_path / "mem")
    assert m["counts"]["documents"] == 3 and len(ds[1]) > 5_000_000
    pad = tok([p], tmp_path / "pad", format="padded", seq_len=128)
    assert pad["counts"]["truncated"] == len(ds[1]) - 129 + max(0, len(ds[0]) - 129) + max(0, len(ds[2]) - 129)


def test_uint16_with_large_vocab_refused(tmp_path, docs):
    p = write_parquet(tmp_path / "d.parquet", docs[:2])
    fails(["tokenize", str(p), "--out", str(tmp_path / "o"), "--tokenizer", str(CL100K_JSON), "--dtype", "uint16"],
          "uint16", "100277")
    m = tok([p], tmp_path / "auto", tokenizer=CL100K_JSON)
    assert m["dtype"] == "int32"


def test_output_dir_not_ours(tmp_path, docs):
    p = write_parquet(tmp_path / "d.parquet", docs[:2])
    out = tmp_path / "busy"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    fails(["tokenize", str(p), "--out", str(out), "--tokenizer", str(GPT2_JSON)], str(out), "not empty")
    assert (out / "precious.txt").exists()


@pytest.fixture
def finished(tmp_path, docs) -> Path:
    p = write_parquet(tmp_path / "d.parquet", docs)
    out = tmp_path / "mem"
    tok([p], out)
    return out


def test_truncated_bin_detected_on_open(finished):
    b = finished / "data.bin"
    b.write_bytes(b.read_bytes()[:-2])
    with pytest.raises(PretokError, match="data.bin"):
        read_manifest(finished)
    fails(["inspect", str(finished)], "data.bin")


def test_edited_idx_detected(finished):
    idx = finished / "data.idx"
    raw = bytearray(idx.read_bytes())
    raw[9 + 8 + 1 + 8 + 8] ^= 0x01  # first sequence length
    idx.write_bytes(bytes(raw))
    line = fails(["verify", str(finished)], "data.idx")
    assert "checksum" in line or "length" in line


def test_edited_manifest_detected(finished):
    mf = finished / "manifest.json"
    m = json.loads(mf.read_text())
    m["counts"]["tokens"] += 1
    mf.write_text(json.dumps(m))
    fails(["inspect", str(finished)], "manifest.json", "edited")
    mf.write_text("{not json")
    fails(["inspect", str(finished)], "manifest.json", "corrupt JSON")


def test_verify_detects_a_modified_source(tmp_path, docs):
    p = write_parquet(tmp_path / "d.parquet", docs)
    out = tmp_path / "mem"
    tok([p], out)
    moved = tmp_path / "moved.parquet"
    shutil.copy(p, moved)
    assert verify(out, sources=[str(moved)], sample=5).ok
    write_parquet(moved, [d + " changed" for d in docs])
    rep = verify(out, sources=[str(moved)], sample=5)
    assert not rep.ok and rep.problems[0].startswith(f"{moved}: source")  # not the recorded input's size/checksum


def test_dead_worker_fails_the_run_instead_of_hanging(tmp_path, shared_data):
    """multiprocessing.Pool replaces a dead worker and loses its task; the engine must notice and stop. Here every
    spawned process dies as it starts (a sitecustomize exits any interpreter started by multiprocessing)."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, sys\nif '--multiprocessing-fork' in sys.argv:\n"
                                           "    os._exit(3)\n")
    out = tmp_path / "out"
    script = (f"from pretok_lib.pretokenize import TokenizeConfig, run_tokenize\n"
              f"run_tokenize(TokenizeConfig(inputs=[{str(PYDOCS_JSONL)!r}], out={str(out)!r}, "
              f"tokenizer={str(GPT2_JSON)!r}, format='memmap', workers=2, progress=False))\n")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root,
                       env=dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{root}"))
    assert p.returncode != 0 and "a tokenizer worker process died" in p.stderr and "exit code 3" in p.stderr
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("victim,workers", [("worker", 2), ("worker", 18), ("group", 18)])
def test_killed_worker_fails_the_run_and_the_rerun_completes(tmp_path, shared_data, victim, workers):
    """A worker killed mid-run (as the OOM killer would) fails the run with one clear line at once, not a hang;
    rerunning the same command resumes and gives the bytes of an uninterrupted run on 2 workers. With more workers
    than the zygote forks itself (zygote.FORK_FANOUT), group processes fork them: a worker or a group killed
    fails the run the same way."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from .conftest import ROOT
    from .engine.test_pretokenize import data_files

    from pretok_lib.engine.zygote import FORK_FANOUT

    args = ["tokenize", str(PYDOCS_JSONL), "--tokenizer", str(GPT2_JSON), "--format", "memmap", "--part-mb", "0.1",
            "--batch-mb", "0.02", "--no-progress", "--out"]
    out, ref = tmp_path / "out", tmp_path / "ref"
    assert run_cli(*args[:-1], "--workers", "2", "--out", str(ref)).returncode == 0
    args = [*args[:-1], "--workers", str(workers), "--out"]
    p = subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", *args, str(out)], stderr=subprocess.PIPE, text=True,
                         cwd=ROOT)
    deadline, victims = time.time() + 60, []
    while time.time() < deadline and not victims:
        zygotes = [c for c in psutil.Process(p.pid).children() if c.children()]
        if zygotes and any((out / ".pretok" / "parts").glob("*.json")):
            tree = zygotes[0].children(recursive=True)
            groups = [c for c in tree if c.children()]
            if len(tree) - len(groups) == workers:  # every worker forked
                assert (workers > FORK_FANOUT) == bool(groups), tree
                victims = groups if victim == "group" else [c for c in tree if c not in groups]
        time.sleep(0.005)
    assert victims, "the run should still be going when its first part is committed"
    victims[0].send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=300)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert p.returncode != 0 and len(lines) == 1, err
    assert "a tokenizer worker process died (killed by signal 9" in lines[0]
    assert not (out / "manifest.json").exists()
    assert run_cli(*args, str(out)).returncode == 0
    assert data_files(out) == data_files(ref)


BAD_SETTINGS = [("batch_mb", v) for v in (0, 1e-9, -1, float("nan"), float("inf"), "1")] + \
    [("part_mb", v) for v in (0, -0.5, float("nan"), float("inf"))] + \
    [("workers", v) for v in (-1, 1.5, True)] + [("seq_len", v) for v in (0, -3, 2.5)] + \
    [("num_shards", 0), ("shard_index", -1), ("shard_index", 1), ("max_bad_fraction", 1.5),
     ("max_bad_fraction", float("nan")), ("compression", "zstd:99"), ("compression", "gzip:10"),
     ("compression", "snappy:1"), ("compression", "lzma"), ("format", "csv"), ("dtype", "int8"), ("eos", "auto"),
     ("bos", "true"), ("bad_docs", "warn")]


@pytest.mark.parametrize("name,value", BAD_SETTINGS, ids=lambda v: str(v))
def test_a_setting_the_run_cannot_honour_is_refused_before_any_output(tmp_path, name, value):
    """`--batch-mb 0` read 0 bytes, took that for the end of every text file and lost all its documents (rc 0);
    nan / inf / negative values gave tracebacks or were accepted. Every setting is checked first, in one line
    naming its option, and nothing is written."""
    txt = tmp_path / "s.txt"
    txt.write_text("\n\n".join(f"doc {i} " + "word " * 50 for i in range(30)))
    with pytest.raises(PretokError) as e:
        tok([txt], tmp_path / "out", separator=r"\n\n+", **{"format": "padded" if name == "compression" else "memmap",
                                                             name: value})
    assert "\n" not in str(e.value)
    assert name.replace("_", "-") in str(e.value) or name == "compression" and "compression" in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["PRETOK_KEEP_PART_MB", "PRETOK_KEEP_PARTS", "PRETOK_KEEP_MB"])
@pytest.mark.parametrize("value", ["-1", "1.5", "64MB", ""])
def test_a_bad_memory_limit_in_the_environment_is_refused_before_any_output(tmp_path, monkeypatch, name, value):
    """The limits on what a worker keeps in memory (`engine.parts.KEEP_DEFAULTS`) are read from the environment:
    a value that is not a whole number >= 0 is one line naming the variable, before anything is written (not a
    worker process failing mid-run)."""
    txt = tmp_path / "s.txt"
    txt.write_text("doc " + "word " * 50)
    monkeypatch.setenv(name, value)
    with pytest.raises(PretokError) as e:
        tok([txt], tmp_path / "out", workers=2)
    assert "\n" not in str(e.value) and f"{name}={value!r}" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_the_smallest_settings_still_read_every_document(tmp_path):
    """The edge of what is allowed: one byte per read and per part still gives every document, as the default."""
    txt = tmp_path / "s.txt"
    txt.write_text("\n\n".join(f"doc {i} " + "word " * 5 for i in range(12)))
    small = tok([txt], tmp_path / "small", separator=r"\n\n+", batch_mb=1e-6, part_mb=1e-6)
    default = tok([txt], tmp_path / "default", separator=r"\n\n+")
    assert small["counts"]["documents"] == default["counts"]["documents"] == 12
    assert [d.tolist() for d in stored_docs(tmp_path / "small")] == [d.tolist() for d in stored_docs(tmp_path / "default")]


@pytest.mark.parametrize("option", ["tokenize --batch-mb nan", "tokenize --part-mb inf", "tokenize --workers -1",
                                    "corpus --max-mb inf"])
def test_bad_numbers_on_the_command_line_are_one_line(tmp_path, option):
    command, flag, value = option.split()
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a document"}\n')
    out = tmp_path / "out"
    args = {"tokenize": [str(src), "--out", str(out), "--tokenizer", str(GPT2_JSON)], "corpus": ["--out", str(out)]}
    fails([command, *args[command], flag, value], flag)
    assert not out.exists()


def _empty_inputs(d: Path) -> dict[str, list[Path]]:
    """Inputs that hold no document, one of each kind (and a glob over several)."""
    import zstandard

    (d / "e.jsonl").write_bytes(b"")
    (d / "blank.jsonl").write_bytes(b"\n\n  \n")
    (d / "e.jsonl.gz").write_bytes(gzip.compress(b""))
    (d / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b""))
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), d / "zero.parquet")
    (d / "e.txt").write_bytes(b"")
    (d / "seps.txt").write_bytes(b"\n\n\n\n")
    import datasets

    datasets.Dataset.from_dict({"text": []}).save_to_disk(str(d / "hf"))
    (d / "glob").mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (d / "glob" / name).write_bytes(b"")
    return {"e.jsonl": [d / "e.jsonl"], "blank.jsonl": [d / "blank.jsonl"], "e.jsonl.gz": [d / "e.jsonl.gz"],
            "e.jsonl.zst": [d / "e.jsonl.zst"], "zero.parquet": [d / "zero.parquet"], "e.txt": [d / "e.txt"],
            "seps.txt": [d / "seps.txt"], "hf": [d / "hf"], "glob": [d / "glob" / "*.jsonl"],
            "several": [d / "e.jsonl", d / "zero.parquet"]}


EMPTY = ["e.jsonl", "blank.jsonl", "e.jsonl.gz", "e.jsonl.zst", "zero.parquet", "e.txt", "hf", "glob", "several"]


# A file of newlines read whole (no separator) is one whitespace document, so "seps.txt" only with a separator.
@pytest.mark.parametrize("name,separator", [(n, None) for n in EMPTY] + [(n, r"\n\n+") for n in EMPTY + ["seps.txt"]])
def test_an_input_without_documents_fails_without_an_output(tmp_path, name, separator):
    """An empty JSONL or a zero-row parquet gave a complete, empty dataset (rc 0) where an empty text file failed:
    every input kind that holds no document fails in one line, and no manifest is written."""
    inputs = _empty_inputs(tmp_path)[name]
    with pytest.raises(PretokError, match="no document could be read") as e:
        tok(inputs, tmp_path / "out", separator=separator)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_too_many_skipped_documents_name_the_file_holding_most(tmp_path):
    """With several inputs the error named no file; it names the one holding the most skipped documents."""
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": f"fine {i}"}) + "\n" for i in range(40)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": None if i % 2 else f"half {i}"}) + "\n" for i in range(40)))
    with pytest.raises(PretokError, match="more than --max-bad-fraction") as e:
        tok([good, bad], tmp_path / "out")
    assert str(e.value).startswith(f"{bad}: "), str(e.value)


def test_an_output_inside_the_input_glob_is_not_an_input(tmp_path):
    """`pretok tokenize 'corpus/*' --out corpus/tok`: the rerun's glob took the output for an input ("is a directory
    but not an HF dataset"), so the finished or interrupted run could not be run again."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.jsonl").write_text("".join(json.dumps({"text": f"doc {i} {j}"}) + "\n" for j in range(5)))
    first = tok([corpus / "*"], corpus / "tok")
    again = tok([corpus / "*"], corpus / "tok")
    assert again["created"] == first["created"] and first["counts"]["documents"] == 15
    assert [i["path"] for i in first["inputs"]] == [str(corpus / f"{i}.jsonl") for i in range(3)]
