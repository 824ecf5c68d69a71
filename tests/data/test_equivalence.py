"""Equivalence on real corpora: (1) padded == (3) pretok-padded batch for batch; (2) padding-free ==
(4) pretok-token-list == (5) pretok-memmap as token streams (sequential and shuffled, same seed); and all of
them equal an independent reference built here (HF tokenizers + numpy permutation + hand padding/packing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import PYDOCS_JSONL
from .helpers import GPT2, content, dataset, ref_docs, ref_rows, rows, run

SEQ_LENS = (32, 100, 128)


def batches(corpus, kind, seq_len, **kw):
    return run(dataset(corpus, kind, seq_len, micro_batch=4, rank=0, world=1, **kw))[1]


def test_reference_tokenization_matches_the_engine(corpus):
    """The reference documents (tokenized in the test) are what the engine stored: a sanity check of the oracle."""
    from ..engine.test_pretokenize import stored_docs

    stored = stored_docs(corpus.dirs["pretok-memmap"])
    ref = ref_docs(corpus.text)
    assert len(stored) == len(ref) > 0
    assert all(np.array_equal(a, b) for a, b in zip(stored, ref))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_padded_equals_pretok_padded(corpus, seq_len, shuffle):
    kw = {"seed": 3, "shuffle": shuffle}
    a = batches(corpus, "padded", seq_len, **kw)
    b = batches(corpus, "pretok-padded", seq_len, **kw)
    n_docs = len(ref_docs(corpus.text))
    assert len(a) == len(b) == n_docs // 4 > 0
    for x, y in zip(a, b):
        assert content(x) == content(y)
        assert set(x) >= {"input_ids", "labels", "attention_mask", "tokens", "padding_tokens", "masked_tokens",
                          "effective_tokens"}
    expect = ref_rows(corpus, "padded", seq_len, seed=3, shuffle=shuffle)
    assert [r for bt in a for r in rows(bt)] == expect[: len(a) * 4]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_padding_free_equals_token_list_equals_memmap(corpus, seq_len, shuffle):
    kw = {"seed": 3, "shuffle": shuffle, "doc_aware": True}
    pf = batches(corpus, "padding-free", seq_len, **kw)
    tl = batches(corpus, "pretok-token-list", seq_len, **kw)
    mm = batches(corpus, "pretok-memmap", seq_len, **kw)
    expect = ref_rows(corpus, "pretok-token-list", seq_len, seed=3, shuffle=shuffle)
    assert len(pf) == len(tl) == len(mm) == len(expect) // 4 > 10
    for x, y, z in zip(pf, tl, mm):
        assert content(x) == content(y) == content(z)  # ids, labels, position_ids, doc_lens, counts
    assert [r for bt in tl for r in rows(bt)] == expect[: len(tl) * 4]
    if shuffle:  # the documents really were permuted
        assert expect != ref_rows(corpus, "pretok-token-list", seq_len, shuffle=False)


@pytest.fixture(scope="module")
def full_pydocs(tmp_path_factory):
    """The whole python-docs JSONL (497 long documents) given directly to the engine."""
    base = tmp_path_factory.mktemp("full_pydocs")
    for fmt in ("token-list", "memmap"):
        run_tokenize(TokenizeConfig(inputs=[str(PYDOCS_JSONL)], out=str(base / fmt), tokenizer=GPT2, format=fmt,
                                    workers=0, progress=False))
    return base


def test_full_python_docs_jsonl_streams_agree(full_pydocs):
    from .helpers import make_dataset

    def first(kind, path, n, **kw):
        ds = make_dataset(kind, path, 256, micro_batch=8, rank=0, world=1, doc_aware=True, **kw)
        return run(ds, limit=n)[1]

    # shuffled: the on-the-fly stream tokenizes lazily, so compare its first 60 batches (~123k tokens)
    kw = {"seed": 11, "shuffle": True}
    pf = first("padding-free", PYDOCS_JSONL, 60, tokenizer=GPT2, **kw)
    tl = first("pretok-token-list", full_pydocs / "token-list", 60, **kw)
    mm = first("pretok-memmap", full_pydocs / "memmap", 60, **kw)
    assert len(pf) == len(tl) == len(mm) == 60
    for x, y, z in zip(pf, tl, mm):
        assert content(x) == content(y) == content(z)
    # sequential: the memmap fast path (one contiguous slice of the .bin) equals the token lists, whole epoch
    tl = first("pretok-token-list", full_pydocs / "token-list", None, shuffle=False)
    mm = first("pretok-memmap", full_pydocs / "memmap", None, shuffle=False)
    manifest = json.loads((full_pydocs / "memmap" / "manifest.json").read_text())
    assert len(tl) == len(mm) == manifest["counts"]["tokens"] // 257 // 8 > 1000
    for y, z in zip(tl, mm):
        assert content(y) == content(z)
