"""`--seq-len` defines the bytes of `padded` only: reruns, resumes and merges accept another value exactly when the
bytes are identical (compared here, not assumed), and refuse it in one line where they are not; manifests of
version 1, which recorded `seq_len` for every format, still open, merge and verify."""

from __future__ import annotations

import hashlib
import json
import shutil
from functools import partial
from itertools import product
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pretok_lib.engine.merge import merge_shards
from pretok_lib.engine.verify import format_inspect, inspect, verify
from pretok_lib.errors import PretokError
from pretok_lib.formats.manifest import MANIFEST_VERSION, _canonical, read_manifest
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import GPT2_JSON
from .test_pretokenize import data_files

FIXTURES = Path(__file__).parents[1] / "formats" / "fixtures" / "manifest_v1"  # written by pretok at eb5ca8f
INPUT = FIXTURES / "input.jsonl"  # 24 documents of 6..169 tokens, 4 units at part_mb 0.002
FORMATS = ("memmap", "token-list", "padded")
SEQ_LEN_PAIRS = ((16, 16), (16, 512), (2048, 1024))  # equal; truncating vs padding; both past the longest document


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory) -> str:
    """A 300-token BPE trained on INPUT: builds in milliseconds where GPT-2 takes a second (x2 per run)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pretok_lib.demo.corpus import train_default_tokenizer

    d = tmp_path_factory.mktemp("tok")
    pq.write_table(pa.table({"text": [json.loads(line)["text"] for line in INPUT.open()]}), d / "c.parquet")
    return str(train_default_tokenizer(d / "c.parquet", d / "tok", vocab_size=300))


def tok(out: Path, fmt: str, seq_len: int, tokenizer: str = str(GPT2_JSON), **kw) -> dict:
    return run_tokenize(TokenizeConfig(inputs=[str(INPUT)], out=str(out), tokenizer=tokenizer, format=fmt,
                                       seq_len=seq_len, workers=0, progress=False, part_mb=0.002, **kw))


def refused_in_one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "seq_len" in text, text
    return text


def interrupt_after_first_part(out: Path, fmt: str, seq_len: int, monkeypatch, **kw) -> None:
    """A run stopped (as by a crash) after its first part was committed: no manifest, state left to resume."""
    import pretok_lib.engine.workers as workers

    real, calls = workers.process_unit, []

    def crash_on_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated crash")
        return real(*a, **kw)

    monkeypatch.setattr(workers, "process_unit", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        tok(out, fmt, seq_len, **kw)
    monkeypatch.setattr(workers, "process_unit", real)
    assert not (out / "manifest.json").exists() and len(list((out / ".pretok" / "parts").glob("*.json"))) == 1


@pytest.mark.parametrize("fmt,pair", list(product(FORMATS, SEQ_LEN_PAIRS)))
def test_another_seq_len_is_accepted_exactly_when_the_bytes_are_identical(tmp_path, monkeypatch, small_tok, fmt,
                                                                           pair):
    s1, s2 = pair
    run = partial(tok, tokenizer=small_tok)
    first, second = tmp_path / "first", tmp_path / "second"
    m1 = run(first, fmt, s1)
    run(second, fmt, s2)
    same = data_files(first) == data_files(second)
    assert same == (fmt != "padded" or s1 == s2)  # the finding: only padded bytes depend on --seq-len
    assert m1["counts"]["truncated"] == 0 if min(pair) > 1000 or fmt != "padded" else m1["counts"]["truncated"] > 0

    # rerun into the finished output
    if same:
        assert run(first, fmt, s2)["created"] == m1["created"]  # a no-op
    else:
        with pytest.raises(PretokError, match=r"differs in: policy\.row_length, policy\.seq_len") as e:
            run(first, fmt, s2)
        refused_in_one_line(e)

    # resume an interrupted run
    resumed = tmp_path / "resumed"
    interrupt_after_first_part(resumed, fmt, s1, monkeypatch, tokenizer=small_tok)
    if same:
        run(resumed, fmt, s2)
        assert data_files(resumed) == data_files(second) == data_files(first)
    else:
        with pytest.raises(PretokError, match="different config") as e:
            run(resumed, fmt, s2)
        refused_in_one_line(e)

    # merge shards made with either value
    shards = [tmp_path / "s0", tmp_path / "s1"]
    run(shards[0], fmt, s1, num_shards=2, shard_index=0)
    run(shards[1], fmt, s2, num_shards=2, shard_index=1)
    if same:
        merged = merge_shards(shards, tmp_path / "merged")
        assert data_files(tmp_path / "merged") == data_files(first)
        assert merged["policy"] == m1["policy"] and verify(tmp_path / "merged", sample=8).ok
    else:
        with pytest.raises(PretokError, match=r"policy\.row_length differs") as e:
            merge_shards(shards, tmp_path / "merged")
        refused_in_one_line(e)
    assert ("seq_len" in m1["policy"]) == ("row_length" in m1["policy"]) == (fmt == "padded")


@pytest.mark.parametrize("fmt", FORMATS)
def test_inspect_shows_seq_len_for_padded_only(tmp_path, small_tok, fmt):
    tok(tmp_path / "o", fmt, 16, small_tok)
    policy = next(line for line in format_inspect(inspect(tmp_path / "o")).splitlines() if line.startswith("policy"))
    assert ("seq_len=16" in policy and "pad=" in policy) if fmt == "padded" else \
        ("seq_len" not in policy and "pad" not in policy), policy


# ---------------------------------------------------------------- outputs of manifest version 1


def resign(d: Path, m: dict) -> None:
    """Write `m` as d's manifest with its self-checksum, keeping its manifest_version (write_manifest sets today's)."""
    body = {k: v for k, v in m.items() if k != "manifest_sha256"}
    (d / "manifest.json").write_text(json.dumps(body | {
        "manifest_sha256": "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()}))


def v1_copy(tmp_path: Path, name: str) -> Path:
    """A copy of a version-1 fixture output whose tokenizer spec is this machine's GPT-2 (re-signed, still v1)."""
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    m = json.loads((d / "manifest.json").read_text())
    assert m["manifest_version"] == 1 and m["policy"]["seq_len"] == 64 and m["policy"]["row_length"] == 65
    if m["tokenizer"]["spec"] != str(GPT2_JSON):
        resign(d, m | {"tokenizer": m["tokenizer"] | {"spec": str(GPT2_JSON)}})
    return d


@pytest.mark.parametrize("fmt", FORMATS)
def test_version_1_outputs_open_merge_and_verify(tmp_path, fmt):
    shards = [v1_copy(tmp_path, f"{fmt}-shard-{i}") for i in range(2)]
    for d in shards:
        m = read_manifest(d)
        assert ("seq_len" in m["policy"]) == (fmt == "padded")  # recorded by v1 for every format; ignored here
        assert ("seq_len" in format_inspect(inspect(d))) == (fmt == "padded")
        assert verify(d, sources=[str(INPUT)], sample=100).ok
    merge_shards(shards, tmp_path / "merged")
    fresh = tmp_path / "fresh"
    tok(fresh, fmt, 64)  # today's code, same input and settings: the same data as the v1 shards merged
    if fmt == "memmap":
        assert data_files(tmp_path / "merged") == data_files(fresh)
    else:  # today's parquet parts add per-row lengths to the footer (docs/FORMATS.md); the columns are the same
        merged, now = data_files(tmp_path / "merged"), data_files(fresh)
        assert merged.keys() == now.keys()
        for name in merged:
            assert pq.read_table(tmp_path / "merged" / name).equals(pq.read_table(fresh / name)), name
        assert merged == {n: (d / n).read_bytes() for d in shards for n in data_files(d)}  # v1 parts copied as is
    m = read_manifest(tmp_path / "merged")
    assert json.loads((tmp_path / "merged" / "manifest.json").read_text())["manifest_version"] == MANIFEST_VERSION
    assert m["policy"] == read_manifest(fresh)["policy"]
    assert verify(tmp_path / "merged", sources=[str(INPUT)], sample=100).ok


def test_version_1_memmap_shard_merges_with_a_version_2_shard_of_another_seq_len(tmp_path):
    old = v1_copy(tmp_path, "memmap-shard-0")  # seq_len 64 in its policy
    new = tmp_path / "new"
    tok(new, "memmap", 4096, num_shards=2, shard_index=1)
    # the v1 shard lists the input under the path it was made from, the new one under INPUT: the same file
    m_old = json.loads((old / "manifest.json").read_text())
    assert Path(m_old["inputs"][0]["path"]).name == INPUT.name and m_old["inputs"][0]["size"] == INPUT.stat().st_size
    resign(old, m_old | {"inputs": [m_old["inputs"][0] | {"path": str(INPUT)}]})
    merge_shards([old, new], tmp_path / "merged")
    tok(tmp_path / "fresh", "memmap", 2048)
    assert data_files(tmp_path / "merged") == data_files(tmp_path / "fresh")


@pytest.mark.parametrize("fmt", FORMATS)
def test_interrupted_run_of_version_1_resumes_with_another_seq_len(tmp_path, monkeypatch, small_tok, fmt):
    """The run state of a version-1 run recorded seq_len in its policy for every format: read as today's."""
    out, run = tmp_path / "o", partial(tok, tokenizer=small_tok)
    interrupt_after_first_part(out, fmt, 64, monkeypatch, tokenizer=small_tok)
    config = out / ".pretok" / "config.json"
    key = json.loads(config.read_text())
    key["policy"] |= {"seq_len": 64, "row_length": 65}  # as version 1 wrote it
    config.write_text(json.dumps(key))
    if fmt == "padded":
        run(out, fmt, 64)  # the same value resumes
        with pytest.raises(PretokError, match="different config"):
            run(out, fmt, 32)
        return
    run(out, fmt, 1024)
    run(tmp_path / "fresh", fmt, 7)
    assert data_files(out) == data_files(tmp_path / "fresh")
