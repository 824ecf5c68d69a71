"""What a finished output says about its document boundaries (engine/boundaries.py): a packed output without a
separator warns once and records `boundaries.separator: null`; a padded output that cut most of its tokens warns
loudly and records `boundaries.truncated_fraction`; a `--num-shards` run names the shards a small input leaves
empty. Exit 0 stays in every case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main
from pretok_lib.engine.boundaries import TRUNCATION_WARN, empty_shards
from pretok_lib.engine.verify import format_inspect, inspect
from pretok_lib.formats.manifest import read_manifest
from pretok_lib.sources import Unit, shard_units

from ..tokenizer.test_specials import tiny_bpe


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    """One token per byte of ASCII text; <s> = 0, </s> = 1."""
    return tiny_bpe(tmp_path_factory.mktemp("btok") / "tokenizer.json")


def run(capsys, inputs: list[Path], out: Path, tok: Path, *extra: str) -> tuple[dict, list[str]]:
    """`pretok tokenize` in this process: (manifest, stderr's warning lines)."""
    capsys.readouterr()
    rc = main(["tokenize", *map(str, inputs), "--out", str(out), "--tokenizer", str(tok), "--workers", "0",
               "--no-progress", *extra])
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("pretok: warning: ") for ln in lines), err
    return read_manifest(out), lines


def jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


@pytest.mark.parametrize("fmt", ["memmap", "token-list", "padded"])
@pytest.mark.parametrize("bos,eos", [("no", "no"), ("yes", "no"), ("no", "yes"), ("yes", "yes"), ("auto", "no")])
def test_packed_output_without_a_separator_warns_once(tok, tmp_path, capsys, fmt, bos, eos):
    """memmap/token-list written with neither BOS nor EOS ran documents together silently; now one line naming the
    output says so and what to pass, and the manifest records `separator: null` (padded: "row", never warned)."""
    docs = jsonl(tmp_path / "d.jsonl", ["first document", "second one", "third"])
    m, lines = run(capsys, [docs], tmp_path / "o", tok, "--format", fmt, "--bos", bos, "--eos", eos, "--seq-len", "64")
    has = [name for name, flag in (("bos", bos != "no"), ("eos", eos == "yes")) if flag]
    want = "row" if fmt == "padded" else ("+".join(has) or None)
    assert m["boundaries"]["separator"] == want
    if want is None:
        assert len(lines) == 1, lines
        assert str(tmp_path / "o") in lines[0] and "no separator" in lines[0] and "--eos yes" in lines[0]
    else:
        assert lines == []
    shown = {ln[:12].strip(): ln[12:] for ln in format_inspect(inspect(tmp_path / "o")).splitlines()}
    assert shown["separator"] == {"row": "none needed: one document a row", None: "NONE: packed documents run "
                                  "together"}.get(want, f"{want} between documents")
    assert shown["specials"] == "bos=0 (added_tokens) eos=1 (added_tokens) in the tokenizer"


def test_inspect_of_an_output_older_than_its_boundaries_and_sources_shows_neither(tok, tmp_path, capsys):
    """Manifests written before `boundaries` and `special_sources` existed still inspect, without those lines."""
    run(capsys, [jsonl(tmp_path / "d.jsonl", ["a b", "c"])], tmp_path / "o", tok, "--format", "memmap")
    report = inspect(tmp_path / "o")
    del report["manifest"]["boundaries"], report["manifest"]["tokenizer"]["special_sources"]
    text = format_inspect(report)
    assert "separator" not in text and "specials" not in text and "policy      bos=0" in text


def test_a_tokenizer_without_bos_and_eos_is_told_where_to_name_them(tmp_path, capsys):
    bare = tiny_bpe(tmp_path / "bare" / "tokenizer.json", specials=("<unk>",))
    docs = jsonl(tmp_path / "d.jsonl", ["a b", "c d"])
    m, lines = run(capsys, [docs], tmp_path / "o", bare, "--format", "memmap")
    assert m["boundaries"] == {"separator": None} and len(lines) == 1
    assert "defines neither BOS nor EOS" in lines[0] and "tokenizer_config.json" in lines[0]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=6), seq_len=st.sampled_from([8, 31, 64, 200]))
def test_padded_output_truncating_most_tokens_warns(tok, tmp_path_factory, capsys, lengths, seq_len):
    """A padded output that cut more than half of its tokens (a .txt book as one document: 99.92%) exited 0
    silently; now one line says how much was lost and what to do, and the manifest records the share."""
    d = tmp_path_factory.mktemp("pad")
    docs = jsonl(d / "d.jsonl", ["x" * n for n in lengths])
    m, lines = run(capsys, [docs], d / "o", tok, "--format", "padded", "--seq-len", str(seq_len), "--bos", "no")
    row = seq_len + 1
    cut = sum(max(n - row, 0) for n in lengths)  # one token a byte; rows hold seq_len + 1 tokens
    share = cut / sum(lengths)
    assert m["counts"]["truncated"] == cut
    assert m["boundaries"] == {"separator": "row", "truncated_fraction": round(share, 6)}
    if share > TRUNCATION_WARN:
        assert len(lines) == 1, lines
        assert f"{cut:,} of {sum(lengths):,} tokens" in lines[0] and "--format memmap" in lines[0]
        assert "--separator" in lines[0] and str(d / "o") in lines[0]
    else:
        assert lines == []


@settings(max_examples=200, deadline=None)
@given(n_units=st.integers(1, 40), num_shards=st.integers(1, 40))
def test_empty_shards_are_exactly_those_without_units(n_units, num_shards):
    units = [Unit(i, "text", (f"f{i}",), 0, 1, 1) for i in range(n_units)]
    empty = empty_shards(units, num_shards)
    assert empty == [i for i in range(num_shards) if not shard_units(units, num_shards, i)]
    assert len(empty) == max(num_shards - n_units, 0)


def test_num_shards_beyond_the_units_names_the_empty_shards(tok, tmp_path, capsys):
    """`--num-shards 8` on an input of 3 units left 5 shards silently empty; now every shard's run names the empty
    ones (the same list), and they are exactly the shards whose manifests hold no document."""
    inputs = [jsonl(tmp_path / f"d{i}.jsonl", [f"doc {i} {j}" for j in range(4)]) for i in range(3)]
    named, empty = set(), set()
    for i in range(8):
        m, lines = run(capsys, inputs, tmp_path / f"s{i}", tok, "--format", "memmap", "--bos", "yes",
                       "--num-shards", "8", "--shard-index", str(i))
        assert len(lines) == 1 and "of 8 are empty" in lines[0], lines
        named.add(lines[0].split("shard(s) ")[1].split(" of 8")[0])
        if m["counts"]["documents"] == 0:
            empty.add(i)
    assert len(named) == 1 and len(empty) == 5
    assert named.pop() == ", ".join(map(str, sorted(empty)))
