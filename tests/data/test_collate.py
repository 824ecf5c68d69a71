"""Collate: labels are the inputs shifted by one; -100 exactly on padding targets (padded paths) and on targets
that start a new document (packed paths); the counts equal hand computations; with doc_aware, position_ids
restart at every document start and doc_lens cover the seq_len + 1 window."""

from __future__ import annotations

import numpy as np
import pytest

from pretok_lib.data.collate import collate
from pretok_lib.data.packing import Sample

from .helpers import BOS, PACKED_KINDS, PAD, PADDED_KINDS, ref_docs, run, sharded

B = 50256


def test_padded_by_hand():
    s1 = Sample(np.array([B, 6, 7, PAD, PAD]), mask=np.array([1, 1, 1, 0, 0], bool))
    s2 = Sample(np.array([B, 9, 10, 11, 12]), mask=np.ones(5, bool))
    out = collate([s1, s2], doc_aware=True)
    assert out["input_ids"].tolist() == [[B, 6, 7, PAD], [B, 9, 10, 11]]
    assert out["labels"].tolist() == [[6, 7, -100, -100], [9, 10, 11, 12]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert (out["tokens"], out["padding_tokens"], out["masked_tokens"], out["effective_tokens"]) == (8, 1, 0, 6)
    assert "position_ids" not in out  # a padded row is one document: positions are simply 0..L-1


def test_packed_by_hand():
    # window of 9: [doc a: B 1 2][doc b: B 3 4 5][doc c: B 6]
    s1 = Sample(np.array([B, 1, 2, B, 3, 4, 5, B, 6]), starts=np.array([3, 7]), doc_lens=np.array([3, 4, 2]))
    # a continuing document, then one whose BOS is the very last token (a target only)
    s2 = Sample(np.array([7, 8, 9, 10, 11, 12, 13, 14, B]), starts=np.array([8]), doc_lens=np.array([8, 1]))
    out = collate([s1, s2], doc_aware=True)
    assert out["input_ids"].tolist() == [[B, 1, 2, B, 3, 4, 5, B], [7, 8, 9, 10, 11, 12, 13, 14]]
    assert out["labels"].tolist() == [[1, 2, -100, 3, 4, 5, -100, 6], [8, 9, 10, 11, 12, 13, 14, -100]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7]]
    assert out["doc_lens"] == [[3, 4, 2], [8, 1]]
    assert (out["tokens"], out["padding_tokens"], out["masked_tokens"], out["effective_tokens"]) == (16, 0, 3, 13)
    assert "attention_mask" not in out
    plain = collate([s1, s2])
    assert "position_ids" not in plain and "doc_lens" not in plain
    assert plain["labels"].tolist() == out["labels"].tolist()


def test_bos_only_at_document_starts(corpus):
    """What the real-data checks below rely on: GPT-2's BOS (50256) appears in a document only as its first id."""
    docs = ref_docs(corpus.text)
    assert all(d[0] == BOS and BOS not in d[1:] for d in docs)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_packed_batches_on_real_data(corpus, kind, shuffle):
    seq_len, mb = 50, 4
    batches = run(sharded(corpus, kind, seq_len, mb, 0, 1, doc_aware=True, seed=8, shuffle=shuffle))[1]
    assert len(batches) > 10
    crossings = 0
    for b in batches:
        inputs, labels, pos = b["input_ids"].numpy(), b["labels"].numpy(), b["position_ids"].numpy()
        assert inputs.shape == labels.shape == pos.shape == (mb, seq_len)
        # the full window, rebuilt: every -100 target is a document start (BOS)
        window = np.concatenate([inputs[:, :1], np.where(labels == -100, BOS, labels)], axis=1)
        assert np.array_equal(window[:, :-1], inputs)  # labels are the inputs shifted by one
        assert np.array_equal(labels == -100, window[:, 1:] == BOS)  # -100 exactly where a new document starts
        masked = int((window[:, 1:] == BOS).sum())
        crossings += masked
        assert (b["tokens"], b["padding_tokens"], b["masked_tokens"], b["effective_tokens"]) == \
            (mb * seq_len, 0, masked, mb * seq_len - masked)
        for row, p, lens in zip(window, pos, b["doc_lens"]):
            starts = [j for j in range(1, seq_len + 1) if row[j] == BOS]
            expect_pos, last = [], 0
            for j in range(seq_len):
                last = j if j in starts else last
                expect_pos.append(j - last)
            assert p.tolist() == expect_pos  # positions restart at 0 at every document start
            assert lens == np.diff([0, *starts, seq_len + 1]).tolist() and sum(lens) == seq_len + 1
    assert crossings > (len(batches) if corpus.name == "wiki" else 0)  # the checks above were exercised


@pytest.mark.parametrize("kind", PADDED_KINDS)
def test_padded_batches_on_real_data(corpus, kind):
    seq_len, mb = 64, 4
    W = seq_len + 1
    batches = run(sharded(corpus, kind, seq_len, mb, 0, 1, doc_aware=True, shuffle=False))[1]
    docs = ref_docs(corpus.text)
    assert len(batches) == len(docs) // mb
    padded_rows = 0
    for i, b in enumerate(batches):
        inputs, labels, att = b["input_ids"].numpy(), b["labels"].numpy(), b["attention_mask"].numpy()
        lens = [min(len(d), W) for d in docs[i * mb : (i + 1) * mb]]  # real tokens in each row
        for r, n in enumerate(lens):
            row = np.full(W, PAD)
            row[:n] = docs[i * mb + r][:n]
            assert inputs[r].tolist() == row[:-1].tolist()
            assert labels[r].tolist() == [int(row[j + 1]) if j + 1 < n else -100 for j in range(seq_len)]
            assert att[r].tolist() == [int(j < n) for j in range(seq_len)]
            padded_rows += n < W
        assert b["tokens"] == mb * seq_len and b["masked_tokens"] == 0
        assert b["padding_tokens"] == sum(max(0, seq_len - n) for n in lens)
        assert b["effective_tokens"] == sum(n - 1 for n in lens)
    if corpus.name == "wiki":
        assert padded_rows > 0
