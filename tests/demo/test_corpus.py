"""The embedded default corpus (real Python source from this install) and its byte-level BPE tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from pretok_lib.demo.corpus import (METADATA_KEY, CorpusInfo, build_corpus, default_corpus_and_tokenizer,
                                    installed_packages, iter_source_files, read_corpus_info, train_default_tokenizer)
from pretok_lib.errors import PretokError

ROOT = Path(__file__).resolve().parents[2]
SMALL = "pluggy"  # a small pure-Python package every test install has (pytest depends on it)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> CorpusInfo:
    return build_corpus(tmp_path_factory.mktemp("c") / "sub" / "corpus.parquet", max_mb=3, row_group_mb=0.5)


@pytest.fixture(scope="module")
def tok_dir(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    train_default_tokenizer(corpus.path, out, vocab_size=1000, max_train_mb=2)
    return out


def _texts(path) -> list[str]:
    return pq.read_table(path, columns=["text"]).column("text").to_pylist()


def test_corpus_is_real_python_with_metadata_columns(corpus):
    table = pq.read_table(corpus.path)
    assert table.column_names == ["text", "source", "path"]
    assert table.num_rows == corpus.documents > 100
    assert set(table.column("source").to_pylist()) == {"stdlib"} and corpus.packages == ["stdlib"]
    assert corpus.repeats == 1 and corpus.to_dict()["documents"] == corpus.documents
    paths = table.column("path").to_pylist()
    assert all(p.endswith(".py") and not p.startswith("/") for p in paths) and len(set(paths)) == len(paths)
    texts = table.column("text").to_pylist()
    ok = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for text, path in zip(texts, paths):
            try:
                compile(text, path, "exec", dont_inherit=True)
                ok += 1
            except SyntaxError:
                pass
    assert ok >= 0.95 * len(texts)
    assert sum("def " in t or "import " in t for t in texts) >= 0.9 * len(texts)
    assert read_corpus_info(corpus.path) == corpus


def test_size_cap_is_tight_and_streamed_in_row_groups(corpus):
    texts = _texts(corpus.path)
    assert corpus.text_bytes == sum(len(t.encode()) for t in texts) <= 3e6
    # the next non-empty UTF-8 source file is the one that would have crossed the cap
    valid = (p.read_bytes() for _, _, p in iter_source_files([]))
    sizes = [len(b) for b in valid if b and _utf8(b)]
    assert corpus.text_bytes + sizes[corpus.documents] > 3e6
    meta = pq.ParquetFile(corpus.path).metadata
    assert meta.num_row_groups >= 5
    assert json.loads(pq.read_schema(corpus.path).metadata[b"pretok_corpus_params"])["max_mb"] == 3


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_build_is_deterministic_and_atomic(corpus, tmp_path):
    again = build_corpus(tmp_path / "again.parquet", max_mb=3, row_group_mb=0.5)
    assert Path(again.path).read_bytes() == Path(corpus.path).read_bytes() and again.sha256 == corpus.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.parquet"]  # no temp file left behind


def test_at_least_one_document(tmp_path):
    info = build_corpus(tmp_path / "one.parquet", max_mb=1e-6)
    assert info.documents == 1 and info.text_bytes > 1


def test_default_packages_follow_stdlib(tmp_path):
    stdlib_mb = sum(p.stat().st_size for _, _, p in iter_source_files([])) / 1e6  # ~31.5 MB on CPython 3.11
    info = build_corpus(tmp_path / "big.parquet", max_mb=stdlib_mb + 3)
    assert info.packages[0] == "stdlib" and info.packages[1] == "numpy" and info.repeats == 1
    sources = pq.read_table(info.path, columns=["source"]).column("source").to_pylist()
    assert sources.index("numpy") == sources.count("stdlib")  # stdlib first, then numpy, never interleaved


def test_repeats_when_sources_are_short(tmp_path):
    one = build_corpus(tmp_path / "one.parquet", max_mb=10, packages=[SMALL], include_stdlib=False, extend=False)
    assert one.packages == [SMALL] and one.repeats > 1
    table = pq.read_table(one.path)
    paths, texts = table.column("path").to_pylist(), table.column("text").to_pylist()
    n = paths.index(f"{paths[0]}#epoch2")
    assert paths[n:2 * n] == [f"{p}#epoch2" for p in paths[:n]] and texts[n:2 * n] == texts[:n]
    assert len(set(paths)) == len(paths) and one.text_bytes <= 10e6
    assert read_corpus_info(one.path).repeats == one.repeats


def test_extends_with_installed_packages_by_name(tmp_path):
    size = sum(p.stat().st_size for _, _, p in iter_source_files([SMALL], include_stdlib=False))
    info = build_corpus(tmp_path / "x.parquet", max_mb=size / 1e6 + 2, packages=[SMALL], include_stdlib=False)
    assert info.packages[0] == SMALL and len(info.packages) > 1 and info.repeats == 1
    order = [p for p in installed_packages() if p != SMALL]
    assert info.packages[1:] == order[: len(info.packages) - 1]


def test_errors(tmp_path):
    with pytest.raises(PretokError, match="unknown package 'no_such_pkg_xyz' \\(not importable\\)"):
        build_corpus(tmp_path / "a.parquet", max_mb=1, packages=["no_such_pkg_xyz"])
    for bad in (0, -1):
        with pytest.raises(PretokError, match="max_mb"):
            build_corpus(tmp_path / "b.parquet", max_mb=bad)
    with pytest.raises(PretokError, match="unknown package"):
        iter_source_files(["no_such_pkg_xyz"])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PretokError, match="not found"):
        train_default_tokenizer(tmp_path / "missing.parquet", tmp_path / "tok")


def test_tokenizer_roundtrip_vocab_and_specials(corpus, tok_dir):
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == 1000
    assert tok.token_to_id("<|endoftext|>") == 0 and tok.token_to_id("<|pad|>") == 1
    texts = _texts(corpus.path)
    for text in texts[::10] + ["héllo wörld ✓ 日本語\n\t  x", " leading space"]:
        assert tok.decode(tok.encode(text).ids) == text
    assert len(tok.encode(texts[0]).ids) < len(texts[0].encode()) / 2  # it actually learned merges
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["bos_token"] == config["eos_token"] == "<|endoftext|>" and config["pad_token"] == "<|pad|>"
    record = json.loads((tok_dir / "pretok_default.json").read_text())
    assert record["corpus_sha256"] == corpus.sha256 and record["vocab_size"] == 1000
    assert 0 < record["train_bytes"] <= 2e6


def test_tokenizer_is_deterministic_across_processes(corpus, tok_dir, tmp_path):
    again = train_default_tokenizer(corpus.path, tmp_path / "a", vocab_size=1000, max_train_mb=2)
    expected = (tok_dir / "tokenizer.json").read_bytes()
    assert again.read_bytes() == expected
    code = ("import sys; from pretok_lib.demo.corpus import train_default_tokenizer as t; "
            "t(sys.argv[1], sys.argv[2], vocab_size=1000, max_train_mb=2)")
    subprocess.run([sys.executable, "-c", code, corpus.path, str(tmp_path / "b")], check=True, cwd=ROOT)
    assert (tmp_path / "b" / "tokenizer.json").read_bytes() == expected


def test_tokenizer_loads_in_transformers(tok_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    assert tok.eos_token_id == tok.bos_token_id == 0 and tok.pad_token_id == 1
    assert tok.decode(tok("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"


def test_default_corpus_and_tokenizer_is_idempotent(tmp_path):
    info, tok = default_corpus_and_tokenizer(tmp_path / "cache", max_mb=1, vocab_size=600)
    assert tok == tmp_path / "cache" / "tokenizer" / "tokenizer.json" and info.documents > 0
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*") if p.is_file()}
    info2, tok2 = default_corpus_and_tokenizer(tmp_path / "cache", max_mb=1, vocab_size=600)
    assert info2 == info and tok2 == tok
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # nothing rebuilt
    (tok.parent / "pretok_default.json").unlink()  # an incomplete tokenizer dir is retrained
    default_corpus_and_tokenizer(tmp_path / "cache", max_mb=1, vocab_size=600)
    assert (tok.parent / "pretok_default.json").is_file()
    assert Tokenizer.from_file(str(tok)).get_vocab_size() == 600


def _writer_failing(after: int, error: OSError):
    """A ParquetWriter whose `after`-th write_table (0: its opening) raises `error`, as pyarrow does on a full disk
    or a path it cannot open (an OSError naming no file)."""
    import pyarrow.parquet as real

    class Writer(real.ParquetWriter):
        def __init__(self, *a, **kw):
            self.calls = 0
            if after == 0:
                raise error
            super().__init__(*a, **kw)

        def write_table(self, *a, **kw):
            self.calls += 1
            if self.calls >= after:
                raise error
            return super().write_table(*a, **kw)

    return Writer


@pytest.mark.parametrize("fault", ["directory", "under-a-file", "cannot-open", "disk-full-1", "disk-full-3"])
def test_a_bad_out_or_a_full_disk_is_one_line_naming_the_output_and_leaves_nothing(tmp_path, monkeypatch, fault):
    """`pretok corpus --out X` where X is a directory, lies under a file, cannot be opened or fills the disk: one
    line naming X (pyarrow's errors named no file: "pretok: error: No space left on device"), no temp file."""
    import errno

    from pretok_lib.cli import main

    out = tmp_path / "c.parquet"
    if fault == "directory":
        out.mkdir()
    elif fault == "under-a-file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "c.parquet"
    else:
        after = 0 if fault == "cannot-open" else int(fault[-1])
        err = OSError(errno.EACCES if after == 0 else errno.ENOSPC, "IOError: failed")
        monkeypatch.setattr("pyarrow.parquet.ParquetWriter", _writer_failing(after, err))
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(PretokError) as e:
        build_corpus(out, max_mb=2, row_group_mb=0.2)
    named = str(e.value).split(": ", 1)[0]    # the output, or the file in its way
    assert (named == str(out) or out.is_relative_to(named)) and "\n" not in str(e.value), str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if fault != "disk-full-3":  # (the command's 2 MB row groups make one write)
        assert main(["corpus", "--out", str(out), "--max-mb", "2"]) == 1


@settings(max_examples=15, deadline=None)
@given(content=st.one_of(st.binary(max_size=64), st.sampled_from(["parquet", "parquet-odd-meta", "link"])))
def test_an_existing_file_that_is_not_a_corpus_is_not_replaced(tmp_path_factory, content):
    """build_corpus replaced whatever file was at `out` (`pretok corpus --out data.parquet` destroyed the data).
    Now only a corpus it wrote is replaced; anything else (any bytes, another parquet file, parquet with odd
    pretok metadata, a dangling link) is refused in one line and left as it was."""
    import os

    import pyarrow as pa

    out = tmp_path_factory.mktemp("existing") / "corpus.parquet"
    if content == "parquet":
        pq.write_table(pa.table({"text": ["mine"]}), out)
    elif content == "parquet-odd-meta":
        pq.write_table(pa.table({"text": ["mine"]}).replace_schema_metadata({METADATA_KEY: b"[1]"}), out)
    elif content == "link":
        out.symlink_to(out.with_name("gone"))
    else:
        out.write_bytes(content)
    before = os.readlink(out) if out.is_symlink() else out.read_bytes()
    with pytest.raises(PretokError, match="is not a pretok default corpus"):
        build_corpus(out, max_mb=1e-6)
    assert (os.readlink(out) if out.is_symlink() else out.read_bytes()) == before


def test_a_corpus_it_wrote_is_replaced(tmp_path):
    """A corpus build_corpus wrote is replaced; so is anything at a cache path whose caller says `replace`."""
    out = tmp_path / "c.parquet"
    build_corpus(out, max_mb=1e-6)
    assert build_corpus(out, max_mb=2e-6).documents >= 1
    out.write_bytes(b"a damaged cached corpus")
    assert read_corpus_info(build_corpus(out, max_mb=1e-6, replace=True).path).documents >= 1


class _Stop(KeyboardInterrupt):
    """A stop signal's exception (SIGTERM becomes one in `pretok`), raised at an injected point."""


STOP_POINTS = ["writer-created", "write_table", "add_key_value_metadata", "close", "_sha256", "os.replace"]


@pytest.mark.parametrize("point", STOP_POINTS)
def test_a_stop_anywhere_in_the_write_path_leaves_no_temp_file_and_no_torn_output(tmp_path, monkeypatch, point):
    """CI once found `.c.parquet.tmp-PID` left after a SIGTERM: the signal landed in the ParquetWriter's constructor,
    after it made the file and before the `try` that removes it. Each call of the write path is stopped in turn
    (after its effect: the file made, the bytes written, the rename done): the directory then holds nothing, or the
    whole output when the rename had happened, never a temp file."""
    import pyarrow.parquet as pq_mod

    import pretok_lib.demo.corpus as corpus_mod

    real_writer, real_replace, real_sha = pq_mod.ParquetWriter, corpus_mod.os.replace, corpus_mod._sha256

    def after(fn, name):
        def wrapped(*a, **kw):
            out = fn(*a, **kw)
            if name == point:
                raise _Stop(name)
            return out
        return wrapped

    class Writer(real_writer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if point == "writer-created":
                raise _Stop(point)

    for method in ("write_table", "add_key_value_metadata", "close"):
        setattr(Writer, method, after(getattr(real_writer, method), method))
    monkeypatch.setattr(pq_mod, "ParquetWriter", Writer)
    monkeypatch.setattr(corpus_mod.os, "replace", after(real_replace, "os.replace"))
    monkeypatch.setattr(corpus_mod, "_sha256", after(real_sha, "_sha256"))
    out = tmp_path / "c.parquet"
    with pytest.raises(_Stop):
        build_corpus(out, max_mb=0.5, row_group_mb=0.1)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["c.parquet"] if point == "os.replace" else []), left
    if left:
        assert read_corpus_info(out).documents > 0
