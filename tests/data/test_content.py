"""`content.content_fingerprint`: the documents' token ids whatever the format (memmap, token-list, padded rows
without their padding), dtype (uint16, int32) or layout (parquet row groups and parts); any change of an id, a
document boundary or a document count changes it. Generated documents, each written in every layout; and a
mixture refuses the same corpus twice in another format or dtype (it took it: every sample served twice)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.data import ShardedBatches, make_loader, open_mixture
from pretok_lib.data.content import content_fingerprint
from pretok_lib.errors import PretokError
from pretok_lib.formats.memmap import PartWriter
from pretok_lib.formats.memmap_concat import concat_parts
from pretok_lib.formats.parquet import padded_table, schema_for, tokenlist_table
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import GPT2_JSON
from .helpers import run

VOCAB = {"tokenizer": {"vocab_size": 60001}}
docs_st = st.lists(st.lists(st.integers(0, 60000), max_size=12), min_size=1, max_size=20)


def _flat(docs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([t for d in docs for t in d], dtype=np.int64)
    return ids, np.cumsum([0] + [len(d) for d in docs])


def _write(out: Path, docs: list[list[int]], fmt: str, dtype: str, parts: int) -> dict:
    """`docs` as a pretok output of `fmt` in `parts` files; the manifest fields content_fingerprint reads."""
    out.mkdir(parents=True)
    if fmt == "memmap":
        ids, offs = _flat(docs)
        with PartWriter(out / "part", dtype, fsync=False) as w:
            w.add(ids, np.diff(offs))
        concat_parts([out / "part"], out / "data", dtype)
        return {"format": fmt, "files": [{"path": "data.bin"}, {"path": "data.idx"}], **VOCAB}
    files = []
    for k, chunk in enumerate(np.array_split(np.arange(len(docs)), parts)):
        ids, offs = _flat([docs[i] for i in chunk])
        schema = schema_for(fmt, dtype, 15, 0)
        table = tokenlist_table(ids, offs, schema) if fmt == "token-list" else padded_table(ids, offs, schema)[0]
        pq.write_table(table, out / f"part-{k}.parquet", row_group_size=3)
        files.append({"path": f"part-{k}.parquet"})
    return {"format": fmt, "files": files, **VOCAB}


LAYOUTS = [("memmap", "uint16", 1), ("memmap", "int32", 1), ("token-list", "uint16", 1), ("token-list", "int32", 3),
           ("padded", "int32", 2), ("padded", "uint16", 1)]


def _mutations(docs: list[list[int]]) -> list[list[list[int]]]:
    """Other data close to `docs`: an id changed, a boundary moved, a document dropped or added."""
    out = [docs + [[1]], docs[:-1] if len(docs) > 1 else [[7]]]
    flat = [i for i, d in enumerate(docs) if d]
    if flat:
        i = flat[0]
        out.append([*docs[:i], [(docs[i][0] + 1) % 60000, *docs[i][1:]], *docs[i + 1:]])
        if i + 1 < len(docs):
            out.append([*docs[:i], docs[i][:-1], [docs[i][-1], *docs[i + 1]], *docs[i + 2:]])
    return out


@settings(max_examples=25, deadline=None, derandomize=True)
@given(docs_st)
def test_the_same_ids_in_any_layout_have_one_fingerprint_and_other_ids_another(tmp_path_factory, docs):
    base = tmp_path_factory.mktemp("content")
    prints = {(f, d, n): content_fingerprint(base / f"{f}-{d}-{n}", _write(base / f"{f}-{d}-{n}", docs, f, d, n))
              for f, d, n in LAYOUTS}
    assert len(set(prints.values())) == 1, prints
    for k, other in enumerate(_mutations(docs)):
        for f, d, n in (LAYOUTS[0], LAYOUTS[3]):
            out = base / f"m{k}-{f}-{d}"
            assert content_fingerprint(out, _write(out, other, f, d, n)) != prints[LAYOUTS[0]], (docs, other)


@pytest.fixture(scope="module")
def int32_twins(wiki, tmp_path_factory):
    """The wiki corpus tokenized again as int32 memmap and token-list (the fixtures hold uint16)."""
    base = tmp_path_factory.mktemp("int32")
    for fmt in ("memmap", "token-list"):
        run_tokenize(TokenizeConfig(inputs=[str(wiki.text)], out=str(base / fmt), tokenizer=str(GPT2_JSON),
                                    format=fmt, dtype="int32", workers=0, progress=False))
    return base


@pytest.mark.parametrize("twin", ["pretok-token-list", "int32 memmap", "int32 token-list"])
def test_a_mixture_refuses_the_same_corpus_in_another_format_or_dtype(wiki, pydocs, int32_twins, twin):
    again = wiki.dirs[twin] if twin.startswith("pretok-") else int32_twins / twin.split()[1]
    with pytest.raises(PretokError) as e:
        open_mixture([(wiki.dirs["pretok-memmap"], 2), (pydocs.dirs["pretok-memmap"], 1), (again, 1)], 32)
    msg = str(e.value)
    assert msg.startswith(f"{again}/manifest.json: ") and "same data" in msg and "\n" not in msg
    assert str(wiki.dirs["pretok-memmap"]) in msg
    mix = open_mixture([(wiki.dirs["pretok-memmap"], 2), (pydocs.dirs[twin if twin.startswith("pretok-")
                                                                      else "pretok-memmap"], 1)], 32)
    assert next(iter(make_loader(ShardedBatches(mix, 2, 0, 1))))["input_ids"].shape == (2, 32)


def test_a_mixture_resumes_on_its_datasets_tokenized_again_to_the_same_bytes(wiki, pydocs, tmp_path):
    """The loader state named each dataset by its manifest's checksum, which a new tokenization (another
    `created`) changes: the same ids were refused as another data order. Now by data identity."""
    again = tmp_path / "again"
    run_tokenize(TokenizeConfig(inputs=[str(wiki.text)], out=str(again), tokenizer=str(GPT2_JSON),
                                format="memmap", workers=0, progress=False))
    loader, _ = run(ShardedBatches(open_mixture([(wiki.dirs["pretok-memmap"], 3),
                                                       (pydocs.dirs["pretok-memmap"], 7)], 32), 2, 0, 1), limit=3)
    state = loader.state_dict()
    resumed = make_loader(ShardedBatches(open_mixture([(again, 0.3), (pydocs.dirs["pretok-memmap"], 0.7)], 32), 2,
                                         0, 1))
    resumed.load_state_dict(state)
    expected = make_loader(ShardedBatches(open_mixture([(wiki.dirs["pretok-memmap"], 3),
                                                        (pydocs.dirs["pretok-memmap"], 7)], 32), 2, 0, 1))
    expected.load_state_dict(state)
    assert next(iter(resumed))["input_ids"].tolist() == next(iter(expected))["input_ids"].tolist()


def test_a_mixture_state_from_before_data_identities_resumes_on_the_same_outputs_only(wiki, pydocs, tmp_path):
    """States saved before named each dataset by its manifest checksum: still accepted on those very outputs."""
    import json

    from pretok_lib.formats.manifest import read_manifest

    def mixture(first):
        return ShardedBatches(open_mixture([(first, 3), (pydocs.dirs["pretok-memmap"], 7)], 32), 2, 0, 1)

    loader, _ = run(mixture(wiki.dirs["pretok-memmap"]), limit=2)
    state = json.loads(json.dumps(loader.state_dict()))
    for e, path in zip(state["mixture"], (wiki.dirs["pretok-memmap"], pydocs.dirs["pretok-memmap"])):
        del e["data"]
        e["manifest"] = read_manifest(path)["manifest_sha256"]
    make_loader(mixture(wiki.dirs["pretok-memmap"])).load_state_dict(state)
    again = tmp_path / "again"      # the same bytes, another manifest (created): an old state cannot tell
    run_tokenize(TokenizeConfig(inputs=[str(wiki.text)], out=str(again), tokenizer=str(GPT2_JSON),
                                format="memmap", workers=0, progress=False))
    with pytest.raises(PretokError, match="another data order"):
        make_loader(mixture(again)).load_state_dict(state)
