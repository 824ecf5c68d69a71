"""`pretok verify` / `pretok inspect` on damaged outputs: one line naming the file, exit 1; no rate printed from
a time too short to measure."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main
from pretok_lib.engine.verify import format_inspect, inspect, verify

from ..conftest import GPT2_JSON, WIKI_EN
from .test_faults_tokenize import cli, one_line


def _tokenize(tmp_path, docs, fmt: str):
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs}), corpus, row_group_size=100)
    out = tmp_path / fmt
    assert main(["tokenize", str(corpus), "--out", str(out), "--tokenizer", str(GPT2_JSON), "--format", fmt,
                 "--part-mb", "0.05", "--workers", "0", "--no-progress"]) == 0
    return out


@pytest.mark.parametrize("fmt", ["token-list", "padded"])
def test_damaged_parquet_page_header(tmp_path, capsys, fmt):
    """The first page header of the column inspect reads (input_ids / attention_mask) overwritten: inspect and
    verify each print one line naming the part, exit 1."""
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:200]
    out = _tokenize(tmp_path, docs, fmt)
    part = sorted(out.glob("part-*.parquet"))[0]
    column = pq.ParquetFile(part).metadata.row_group(0).column(1 if fmt == "padded" else 0)
    at = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(part.read_bytes())
    data[at : at + 20] = b"\xff" * 20
    part.write_bytes(bytes(data))
    rc, err = cli(capsys, "inspect", out)
    assert rc == 1
    one_line(err, str(part))
    rc, err = cli(capsys, "verify", out, "--sample", "64")
    assert rc == 1
    one_line(err, str(part), "checksum differs")


def test_damaged_memmap_index_in_inspect(tmp_path, capsys):
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:50]
    out = _tokenize(tmp_path, docs, "memmap")
    idx = out / "data.idx"
    data = bytearray(idx.read_bytes())
    data[40] ^= 0x80  # the first document's length
    idx.write_bytes(bytes(data))
    rc, err = cli(capsys, "verify", out)
    assert rc == 1
    one_line(err, str(idx))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0.0, 0.999))
def test_a_damaged_memmap_byte_is_named_by_its_part_everywhere_it_is_checked(memmap_parts, capsys, where):
    """One byte of `data.bin` changed anywhere: `pretok verify` names the part that holds it and its first byte
    (the tree checksum's leaf), the loader's check on open and `pretok merge` refuse the file, each in one line."""
    from pretok_lib.data.verify_open import verify_files
    from pretok_lib.engine.merge import merge_shards
    from pretok_lib.errors import PretokError
    from pretok_lib.formats.manifest import read_manifest

    out, pristine = memmap_parts
    m = read_manifest(out)
    at = int(where * len(pristine))
    sizes = [n for n, _ in m["files"][0]["leaves"]]
    assert len(sizes) == len(m["parts"]) >= 3
    holder = next(k for k in range(len(sizes)) if sum(sizes[:k]) <= at < sum(sizes[: k + 1]))
    damaged = bytearray(pristine)
    damaged[at] ^= 0x5A
    (out / "data.bin").write_bytes(bytes(damaged))
    try:
        rc, err = cli(capsys, "verify", out, "--sample", "0")
        assert rc == 1
        one_line(err, str(out / "data.bin"), f"the bytes of {m['parts'][holder]['part']} (from byte "
                 f"{sum(sizes[:holder])}) are corrupted")
        with pytest.raises(PretokError, match="checksum differs"):
            verify_files(out, m)
        with pytest.raises(PretokError, match="checksum differs"):
            merge_shards([out], out.parent / f"merged-{at}")
    finally:
        (out / "data.bin").write_bytes(pristine)


@pytest.fixture(scope="module")
def memmap_parts(tmp_path_factory):
    """A memmap output of several parts (its data.bin's checksum a tree over them), and its data.bin's bytes."""
    base = tmp_path_factory.mktemp("tree")
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:300]
    out = _tokenize(base, docs, "memmap")
    (out / ".pretok").mkdir(exist_ok=True)  # the stamp of a check on open goes here: never one of a damaged file
    return out, (out / "data.bin").read_bytes()


def test_no_rate_from_a_time_too_short_to_measure(tmp_path):
    out = _tokenize(tmp_path, ["one short document"], "memmap")
    report = inspect(out)
    run = report["manifest"]["run"]
    text = format_inspect(report)
    if run["tokenize_seconds"] < 0.1:
        assert "MB/s" not in text and "too short to time" in text
    report["manifest"]["run"] = dict(run, tokenize_seconds=0.0)
    assert "MB/s" not in format_inspect(report)
    report["manifest"]["run"] = dict(run, tokenize_seconds=2.0)
    assert "MB/s" in format_inspect(report)


@pytest.fixture(scope="module")
def jsonl_output(tmp_path_factory):
    """A token-list output of a small JSONL input, and the input's bytes."""
    base = tmp_path_factory.mktemp("verify-source")
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:40]
    inp = base / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = base / "out"
    assert main(["tokenize", str(inp), "--out", str(out), "--tokenizer", str(GPT2_JSON), "--format", "token-list",
                 "--part-mb", "0.01", "--workers", "0", "--no-progress"]) == 0
    return out, inp.read_bytes()


def _changed_source(data: bytes, how: str, fraction: float) -> bytes:
    at = int(len(data) * fraction)
    if how == "prefix":  # cut at a line end: every line left parses, every sampled document found matches
        return data[: data.rfind(b"\n", 0, max(at, 1)) + 1]
    if how == "cut":
        return data[:at]
    if how == "rewrite":  # the same size, one character changed
        i = data.find(b"e", at)
        i = i if i >= 0 else data.find(b"e")
        return data[:i] + b"a" + data[i + 1 :]
    if how == "append":
        return data + b'{"text": "one more"}\n'
    return data


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=st.sampled_from(["prefix", "cut", "rewrite", "append", "same"]), fraction=st.floats(0.0, 0.99),
       sample=st.integers(1, 64))
def test_verify_source_must_be_the_recorded_input(jsonl_output, tmp_path_factory, how, fraction, sample):
    """`verify --source` passed a prefix of the input or a copy cut in place: it compared only the sampled
    documents it found. Now a source whose size or checksum is not the recorded input's is a problem naming it;
    an identical copy (another path and mtime) passes."""
    out, data = jsonl_output
    src = tmp_path_factory.mktemp("src") / "copy.jsonl"
    src.write_bytes(_changed_source(data, how, fraction))
    rep = verify(out, sources=[str(src)], sample=sample)
    if src.read_bytes() == data:
        assert rep.ok, rep.problems
    else:
        assert not rep.ok and len(rep.problems) == 1 and rep.problems[0].startswith(f"{src}: source"), rep.problems
