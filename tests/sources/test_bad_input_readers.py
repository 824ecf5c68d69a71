"""Bad input at the readers (issue 14): a damaged container or a wrong input shape is one error line and no
manifest; a damaged document is skipped and counted alone; too many skips fail the run until allowed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pretok_lib.errors import PretokError
from pretok_lib.sources import SourceOptions, expand_inputs, plan_units, read_unit

from ..conftest import GPT2_JSON, PYDOCS_JSONL, SHAKESPEARE
from ..engine.test_pretokenize import run_cli, stored_docs
from ..test_bad_input import fails, tok


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return [json.loads(line)["text"] for line in PYDOCS_JSONL.open()]


def cli(inp, out: Path, *extra: str) -> list[str]:
    return ["tokenize", *map(str, inp if isinstance(inp, list) else [inp]), "--out", str(out), "--tokenizer",
            str(GPT2_JSON), "--no-progress", *extra]


def jsonl(docs, key: str = "text") -> bytes:
    return "".join(json.dumps({key: d}) + "\n" for d in docs).encode()


def test_truncated_zst_fails_in_the_worker_without_manifest(tmp_path, docs):
    """The issue's case: a .jsonl.zst cut at 60% was read as 110 of 233 documents with exit 0. Its first lines
    pass the planning sample, so the cut is found by the worker reading it: one line, no manifest."""
    z = zstandard.ZstdCompressor().compress(jsonl(docs))
    p = tmp_path / "cut.jsonl.zst"
    p.write_bytes(z[: int(len(z) * 0.6)])
    fails(cli(p, tmp_path / "o", "--workers", "1"), str(p), "truncated compressed file")
    assert not (tmp_path / "o" / "manifest.json").exists()
    two = tmp_path / "frames.jsonl.zst"  # several frames: all read
    two.write_bytes(zstandard.ZstdCompressor().compress(jsonl(docs[:5])) * 2)
    assert tok([two], tmp_path / "f")["counts"]["documents"] == 10


def test_one_bad_byte_skips_one_paragraph(tmp_path):
    """One invalid byte in a text file split by --separator lost the whole file (0 of 2,557 documents)."""
    raw = SHAKESPEARE.read_bytes()
    half = raw.index(b"\n\n", len(raw) // 2) + 5
    p = tmp_path / "one_bad.txt"
    p.write_bytes(raw[:half] + b"\xff" + raw[half:])
    m = tok([p], tmp_path / "o", separator=r"\n\n+")
    n = len([d for d in raw.decode().split("\n\n") if d])
    assert m["counts"]["documents"] == n - 1 and m["counts"]["skipped"] == {"invalid": 1}


def test_wrong_shape_is_an_error_naming_what_was_found(tmp_path, docs):
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"docs": docs[:20]}, indent=2))
    fails(cli(pretty, tmp_path / "a"), str(pretty), "not JSON Lines", "one object per line")
    other = tmp_path / "body.jsonl"
    other.write_bytes(jsonl(docs[:20], "body"))
    fails(cli(other, tmp_path / "b"), str(other), "no key 'text'", "'body'", "--text-column")
    assert not any((tmp_path / d / "manifest.json").exists() for d in "ab")
    assert tok([other], tmp_path / "c", text_column="body")["counts"]["documents"] == 20
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    fails(cli(empty, tmp_path / "d"), "no document could be read")


def test_skip_threshold_fails_then_a_rerun_allowing_it_resumes(tmp_path, docs):
    p = tmp_path / "some_bad.jsonl"
    p.write_bytes(jsonl(docs[:8]) + b'{"text": null}\n{"text": 3}\n{"text": "\\ud800"}\n')
    line = fails(cli(p, tmp_path / "o", "--workers", "1"), str(p), "3 of 11 documents skipped",
                 "invalid: 1 (not UTF-8, a lone surrogate, or a line not a JSON object)",
                 "nonstring: 1 (the text is not a string)",
                 "null: 1 (the text is null)", "--max-bad-fraction", "--bad-docs fail stops at the first")
    assert not (tmp_path / "o" / "manifest.json").exists() and "0.1" in line
    fails(cli(p, tmp_path / "f", "--workers", "1", "--bad-docs", "fail"), str(p), "null 'text'")  # the first, where
    assert "max_bad_fraction" not in (tmp_path / "o" / ".pretok" / "config.json").read_text()
    m = tok([p], tmp_path / "o", max_bad_fraction=0.3)  # resumes the same output: the threshold is no part of it
    assert m["counts"]["documents"] == 8 and m["source"]["max_bad_fraction"] == 0.3
    r = run_cli(*cli(p, tmp_path / "x", "--max-bad-fraction", "2"))  # argparse's usage error
    assert r.returncode == 2 and "--max-bad-fraction: must be between 0 and 1" in r.stderr


def test_every_kind_of_skipped_document_is_explained_in_the_errors():
    from pretok_lib.sources import BAD_DOC_KINDS
    from pretok_lib.sources.input_checks import SKIPPED_MEANS, check_skipped

    assert set(SKIPPED_MEANS) == set(BAD_DOC_KINDS)
    for kind in BAD_DOC_KINDS:
        for docs in (0, 1):
            with pytest.raises(PretokError) as e:
                check_skipped(docs, {kind: 2}, 0.1, "in.jsonl")
            assert f"{kind}: 2 ({SKIPPED_MEANS[kind]})" in str(e.value) and "--bad-docs fail" in str(e.value)


def test_lone_surrogates_are_invalid_documents(tmp_path, docs):
    """A JSON-escaped lone surrogate was a traceback in the tokenizer; encoded surrogate bytes (ED A0 80),
    which json.loads of bytes lets through, too."""
    p = tmp_path / "sur.jsonl"
    p.write_bytes(jsonl(docs[:20]) + b'{"text": "a \\ud800 b"}\n{"text": "\xed\xa0\x80"}\n{"text": "\\ud83d\\ude00"}\n')
    m = tok([p], tmp_path / "o", workers=1)
    assert m["counts"]["documents"] == 21 and m["counts"]["skipped"] == {"invalid": 2}


def test_not_regular_files_and_bad_separator_are_one_line(tmp_path, docs):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    fails(cli(fifo, tmp_path / "a"), str(fifo), "not a regular file")  # was a silent hang
    dangling = tmp_path / "gone.jsonl"
    dangling.symlink_to(tmp_path / "missing.jsonl")
    fails(cli(dangling, tmp_path / "b"), str(dangling), "symlink to a missing file")
    (tmp_path / "dir.jsonl").mkdir()
    fails(cli(tmp_path / "dir.jsonl", tmp_path / "c"), "dir.jsonl", "is a directory")
    txt = tmp_path / "t.txt"
    txt.write_text("a\n\nb")
    fails(cli(txt, tmp_path / "d", "--separator", "("), "invalid --separator regex")
    fails(cli(txt, tmp_path / "e", "--separator", r"\n*"), "matches the empty string")


def test_read_errors_at_the_boundary_are_one_line(tmp_path, docs):
    """An OSError while reading (here: the file gone after planning) is a PretokError naming the file."""
    p = tmp_path / "d.jsonl"
    p.write_bytes(jsonl(docs[:3]))
    opts = SourceOptions()
    units = plan_units(expand_inputs([str(p)]), opts)
    p.unlink()
    with pytest.raises(PretokError, match=r"d.jsonl: cannot read: No such file or directory"):
        list(read_unit(units[0], opts))


@pytest.mark.parametrize("typ", ["large_string", "string_view", "dictionary"])
def test_any_string_column_layout_is_read(tmp_path, docs, typ):
    arr = pa.array(docs[:30], pa.string())
    arr = arr.dictionary_encode() if typ == "dictionary" else arr.cast(getattr(pa, typ)())
    p = tmp_path / f"{typ}.parquet"
    pq.write_table(pa.table({"text": arr}), p)
    ref = tmp_path / "ref.parquet"
    pq.write_table(pa.table({"text": docs[:30]}), ref)
    tok([p], tmp_path / "o")
    tok([ref], tmp_path / "r")
    assert all(np.array_equal(a, b) for a, b in zip(stored_docs(tmp_path / "o"), stored_docs(tmp_path / "r")))


def test_invalid_utf8_in_parquet_skips_that_document(tmp_path, docs):
    binary = pa.array([d.encode() for d in docs[:20]] + [b"caf\xe9"], pa.binary())
    arr = pa.Array.from_buffers(pa.string(), len(binary), binary.buffers())
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": arr}), p)
    m = tok([p], tmp_path / "o")
    assert m["counts"]["documents"] == 20 and m["counts"]["skipped"] == {"invalid": 1}


def test_bom_is_not_text(tmp_path):
    with_bom, without = tmp_path / "a.txt", tmp_path / "b.txt"
    with_bom.write_bytes(b"\xef\xbb\xbfhello world")
    without.write_bytes(b"hello world")
    tok([with_bom], tmp_path / "a")
    tok([without], tmp_path / "b")
    assert [d.tolist() for d in stored_docs(tmp_path / "a")] == [d.tolist() for d in stored_docs(tmp_path / "b")]


def test_damaged_hf_dataset_skips_the_document_or_is_one_line(tmp_path):
    """Invalid UTF-8 inside an HF dataset's Arrow file skips the document holding it (it was a UnicodeDecodeError
    traceback from a worker); a truncated Arrow file is one line."""
    import datasets

    datasets.Dataset.from_dict({"text": [f"doc {i} " * 50 for i in range(500)]}).save_to_disk(tmp_path / "hf")
    arrow = next((tmp_path / "hf").glob("*.arrow"))
    raw = arrow.read_bytes()
    mid = len(raw) // 3
    arrow.write_bytes(raw[:mid] + b"\xff" + raw[mid + 1 :])
    opts = SourceOptions()
    batches = [b for u in plan_units(expand_inputs([str(tmp_path / "hf")]), opts) for b in read_unit(u, opts)]
    assert sum(len(b.texts) for b in batches) == 499 and sum(b.skipped.get("invalid", 0) for b in batches) == 1
    arrow.write_bytes(raw[:mid])
    with pytest.raises(PretokError, match="hf: cannot load HF dataset"):
        plan_units(expand_inputs([str(tmp_path / "hf")]), opts)


def test_wrong_key_with_null_or_unorderable_values_names_the_keys(tmp_path):
    """Records without the text key whose values are null (or any value that does not order): the error names
    the keys found (a Counter updated with the records themselves counted their values and raised TypeError)."""
    from pretok_lib.sources import expand_inputs
    from pretok_lib.sources.input_checks import check_shape

    p = tmp_path / "nulls.jsonl"
    p.write_bytes(b'{"id": null, "meta": null}\n{"id": null, "meta": {"a": 1}}\n')
    with pytest.raises(PretokError, match=r"no key 'text' in any of the first 2 records \(keys found: 'id', 'meta'\)"):
        check_shape(expand_inputs([str(p)]), "text")
