"""The study on the researcher's own data (issue 36): the corpus read as `pretok tokenize` reads it (text column,
separator, globs), documents held out for validation and never trained on, any tokenizer kind (the baselines that
need a HF tokenizer.json skipped with the reason in the findings)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.errors import PretokError
from pretok_lib.study import steps
from pretok_lib.study.split import doc_hash, heldout_count, iter_documents, split_corpus

_DOC = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=30)


def _texts(path: str) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(path).column("text").to_pylist()


def _write(tmp: Path, docs: list[str], kind: str) -> list[str]:
    """`docs` as one input of `kind` (jsonl with the text under `extract`, or parquet); the inputs list."""
    if kind == "jsonl":
        p = tmp / "in.jsonl"
        p.write_text("".join(json.dumps({"extract": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = tmp / "in.parquet"
        pq.write_table(pa.table({"extract": docs}), p)
    return [str(p)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(_DOC, min_size=2, max_size=60).filter(lambda d: len(set(d)) > 1),
       dup=st.integers(0, 5), fraction=st.sampled_from([0.01, 0.02, 0.3, 0.5]), kind=st.sampled_from(["jsonl",
                                                                                                      "parquet"]))
def test_the_split_holds_documents_out_and_never_puts_one_on_both_sides(tmp_path_factory, docs, dup, fraction,
                                                                        kind) -> None:
    """Any documents (duplicates included): every one is on exactly one side, none on both (a duplicate goes with
    its twin), at least `heldout_count` held out, and the split does not depend on the input order."""
    docs = docs + docs[:dup]
    tmp = tmp_path_factory.mktemp("split")
    s = split_corpus(_write(tmp, docs, kind), tmp / "out", fraction, text_column="extract")
    train, held = _texts(s.train), _texts(s.heldout)
    assert not set(train) & set(held)
    assert sorted(train + held) == sorted(docs)
    assert (s.train_docs, s.heldout_docs) == (len(train), len(held))
    assert held and train   # at least k held out, unless that would take the last text left for training
    assert len(held) >= heldout_count(len(docs), fraction) or len(set(train)) == 1
    rev = tmp_path_factory.mktemp("rev")
    r = split_corpus(_write(rev, docs[::-1], kind), rev / "out", fraction, text_column="extract")
    assert sorted(_texts(r.heldout)) == sorted(held)


def test_a_text_file_is_split_by_the_separator_and_one_document_is_refused(tmp_path: Path) -> None:
    """`--set separator=...` reaches the study's reader (a .txt was one document); one document cannot be split
    into training and validation: one line saying how to split it."""
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(f"chapter {i} " * 20 for i in range(10)))
    s = split_corpus([str(tmp_path / "*.txt")], tmp_path / "out", 0.1, separator=r"\n\n+")
    assert s.train_docs + s.heldout_docs == 10 and s.heldout_docs >= 1
    with pytest.raises(PretokError, match="1 document.*separator") as e:
        split_corpus([str(book)], tmp_path / "one", 0.1)
    assert "\n" not in str(e.value)


def test_the_split_is_reused_and_remade_when_its_inputs_change(tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(20)))
    a = split_corpus([str(src)], tmp_path / "out", 0.1)
    stamp = Path(a.train).stat().st_mtime_ns
    assert split_corpus([str(src)], tmp_path / "out", 0.1) == a and Path(a.train).stat().st_mtime_ns == stamp
    src.write_text("".join(json.dumps({"text": f"other {i}"}) + "\n" for i in range(30)))
    b = split_corpus([str(src)], tmp_path / "out", 0.1)
    assert b.train_docs + b.heldout_docs == 30 and all(t.startswith("other") for t in _texts(b.train))


def test_heldout_count_is_a_fraction_with_a_floor_never_more_than_half() -> None:
    assert heldout_count(10_000, 0.02) == 200
    assert heldout_count(1_000, 0.02) == 64
    assert heldout_count(100, 0.02) == 50 and heldout_count(3, 0.02) == 1
    with pytest.raises(PretokError, match="1 document"):
        heldout_count(1, 0.02)


def test_study_runs_validate_on_held_out_documents_never_on_training_data(tmp_path: Path, shared_data: Path,
                                                                          capsys) -> None:
    """Notebook 01's steps on a text corpus split by a separator, with a SentencePiece tokenizer and EOS: the
    held-out datasets hold none of the training documents (token sequences compared); every run's eval.path and
    eval.own_path are those held-out datasets (before: eval.path was the training memmap); the tokenize benchmark
    skips the baselines that need a HF tokenizer.json, says why in its JSON and in the findings, and prints none of
    pretok's own targets."""
    from pretok_lib.formats.memmap import MemmapDataset
    from pretok_lib.study.measured import measured_findings

    corpus = tmp_path / "speeches.txt"
    corpus.write_text((shared_data / "corpora/tinyshakespeare/input.txt").read_text()[:120_000])
    paths = steps.study_paths(tmp_path / "study")
    sp = str(shared_data / "tokenizers/mistral/tokenizer.model.v3")
    src = steps.prepare_corpus(paths, str(corpus), 1.0, sp, 1024, "text", r"\n\n+", 0.05)
    index = steps.pretokenize_all(paths, src["corpus"], src["tokenizer"], 32, ["none"], 1, echo=None,
                                  heldout=src["heldout"], eos="yes")
    over = steps.run_overrides(index)
    assert over["eval.path"] == index["eval"]["pretok-memmap"] != index["paths"]["pretok-memmap"]
    assert steps.own_eval_overrides(index, "padded")["eval.own_path"] == index["eval"]["pretok-padded"]

    def docs(path: str) -> set[tuple[int, ...]]:
        ds = MemmapDataset(Path(path) / "data")
        ends = np.cumsum(np.asarray(ds.lengths, np.int64))
        tokens = np.asarray(ds.tokens)
        return {tuple(tokens[e - n:e]) for e, n in zip(ends, np.asarray(ds.lengths))}

    train, held = docs(index["paths"]["pretok-memmap"]), docs(index["eval"]["pretok-memmap"])
    assert held and train and not train & held
    assert all(d[-1] == 2 for d in held)   # eos=yes reached the engine (Mistral's </s> is id 2)

    capsys.readouterr()
    bench = steps.bench_tokenize(paths, index, workers=1, loop_mb=0.05, repeat=1)
    out = capsys.readouterr().out
    assert "[FAIL]" not in out and "[PASS]" not in out and "sentencepiece" in out
    assert "HF fast tokenizer" in json.loads((paths.bench / "tokenize.json").read_text())["skipped"]["loop"]
    iso = next(f for f in measured_findings([], bench) if f["id"] == "tokenization.isolated")
    assert iso["value"] is None and "sentencepiece" in iso["reason"]


@pytest.mark.parametrize("name,kind", [("gpt2/tokenizer.json", None), ("mistral/tokenizer.model.v3", "sentencepiece"),
                                       ("tiktoken/cl100k_base.tiktoken", "tiktoken"),
                                       ("mistral/tekken_240718.json", "tekken")])
def test_the_hf_baselines_run_with_a_tokenizer_json_and_are_skipped_with_the_reason_otherwise(
        shared_data: Path, name: str, kind: str | None) -> None:
    why = steps.hf_baselines_skipped(str(shared_data / "tokenizers" / name))
    assert why is None if kind is None else (kind in why and "tokenizer.json" in why)


def test_an_index_without_held_out_data_is_refused_not_validated_on_training_data() -> None:
    """A datasets.json of before the split: its runs would validate on their training data; refused, naming the
    notebook to rerun."""
    old = {"tokenizer": "t.json", "seq_len": 64, "corpus": "c.parquet",
           "paths": {"pretok-memmap": "/d/memmap", "pretok-padded": "/d/padded-zstd3"}}
    with pytest.raises(PretokError, match="rerun notebook 01_pretokenize"):
        steps.run_overrides(old)
    with pytest.raises(PretokError, match="held-out"):
        steps.own_eval_overrides(old, "padded")


@pytest.mark.parametrize("values", [{"text_column": "extract"}, {"separator": r"\n\n+"},
                                    {"bos": "no", "eos": "yes", "heldout": 0.05},
                                    {"corpus": ["a/*.jsonl", "b.txt"]}])
def test_the_study_takes_what_pretok_tokenize_takes_about_the_data(tmp_path: Path, values: dict) -> None:
    """`--set text_column=extract` / `--set separator=...` gave "no study notebook has parameter(s)": notebook 01
    takes them (and BOS/EOS, the held-out fraction, several inputs), and gets them."""
    from pretok_lib.study import run_study

    got: dict[str, dict] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("pretok_lib.study.run.execute", lambda name, out, params, *a, **kw: got.setdefault(name, params)
                   and 1.0)
        mp.setattr("pretok_lib.study.run.write_report", lambda *a, **kw: {})
        mp.setattr("pretok_lib.analysis.report.ensure_kernel", lambda kernel: kernel)
        run_study("smoke", out=tmp_path / "s", parameters=values, notebooks=["01"], stream=False, echo=None,
                  publish=None)
    for k, v in values.items():
        assert (got["01_pretokenize"][k] == v if k != "corpus"
                else [Path(p).is_absolute() for p in got["01_pretokenize"][k]] == [True, True])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["chapter one", "Chapter two\n", "", "x"]), min_size=2, max_size=8))
def test_iter_documents_reads_like_pretok_tokenize(tmp_path_factory, parts: list[str]) -> None:
    """The study's reader is the engine's: the same documents, in the same order, as `pretok tokenize` counts."""
    import re

    tmp = tmp_path_factory.mktemp("t")
    (tmp / "a.txt").write_text("\n\n".join(parts))
    want = [d for d in re.split(r"\n\n+", "\n\n".join(parts)) if d.strip()]
    got = list(iter_documents([str(tmp / "a.txt")], separator=r"\n\n+"))
    assert [g.strip() for g in got if g.strip()] == [w.strip() for w in want]


def test_doc_hash_is_stable() -> None:
    """The split must not move between machines or Python runs (no salted hash())."""
    assert doc_hash("hello") == 0xA7B6EDA801E5347D   # blake2b-64 of the UTF-8 text


@pytest.mark.parametrize("stop_at", [1, 2, 3])
def test_a_stop_while_the_split_opens_or_writes_its_files_leaves_none(tmp_path: Path, monkeypatch, stop_at) -> None:
    """A stop signal (KeyboardInterrupt) landing right after the k-th parquet call of the split (a writer made, so
    its file exists; a table written): no temp file and no split file are left, and the next run makes the split."""
    import pyarrow.parquet as pq

    real, calls = pq.ParquetWriter, [0]

    class Writer(real):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            calls[0] += 1
            if calls[0] == stop_at:
                raise KeyboardInterrupt

        def write_table(self, *a, **kw):
            super().write_table(*a, **kw)
            calls[0] += 1
            if calls[0] == stop_at:
                raise KeyboardInterrupt

    src = tmp_path / "book.txt"
    src.write_text("\n\n".join(f"document {i} " * 5 for i in range(200)))
    monkeypatch.setattr(pq, "ParquetWriter", Writer)
    with pytest.raises(KeyboardInterrupt):
        split_corpus([str(src)], tmp_path / "out", 0.1, separator=r"\n\n+")
    assert [p.name for p in (tmp_path / "out").iterdir() if "parquet" in p.name] == []
    monkeypatch.setattr(pq, "ParquetWriter", real)
    assert Path(split_corpus([str(src)], tmp_path / "out", 0.1, separator=r"\n\n+").train).is_file()


def test_the_default_bpe_is_trained_on_the_training_split_only_and_reused(tmp_path: Path) -> None:
    """The study's BPE (no tokenizer given) never saw a held-out document: it is trained on `train.parquet` of the
    split (its record names those bytes), is reused while they are the same, and retrained when they change."""
    import hashlib

    from pretok_lib.demo.corpus import trained_tokenizer
    from pretok_lib.study.datasets import prepare_corpus
    from pretok_lib.study.steps import StudyPaths

    paths = StudyPaths(tmp_path / "s")
    got = prepare_corpus(paths, corpus_mb=1.0, vocab_size=300, heldout=0.1)
    rec = json.loads((Path(got["tokenizer"]).parent / "pretok_default.json").read_text())
    assert rec["corpus"] == "train.parquet" and got["corpus"].endswith("train.parquet")
    assert rec["corpus_sha256"] == hashlib.sha256(Path(got["corpus"]).read_bytes()).hexdigest()
    assert rec["train_documents"] <= got["split"]["train_documents"]
    stamp = Path(got["tokenizer"]).stat().st_mtime_ns
    assert prepare_corpus(paths, corpus_mb=1.0, vocab_size=300, heldout=0.1)["tokenizer"] == got["tokenizer"]
    assert Path(got["tokenizer"]).stat().st_mtime_ns == stamp                       # reused, not retrained
    other = tmp_path / "other.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["some other text " * 20] * 30}), other)
    trained_tokenizer(other, Path(got["tokenizer"]).parent, 300, 1.0)
    assert json.loads((Path(got["tokenizer"]).parent / "pretok_default.json").read_text())["corpus"] == "other.parquet"
