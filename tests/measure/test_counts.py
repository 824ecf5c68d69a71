"""measure.counts: a batch's token counts in every layout it understands, torch and numpy alike, checked against a
per-row count on generated batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.errors import PretokError
from pretok_lib.measure import batch_counts

rows_st = st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12)), min_size=1, max_size=6)


def _hf_batch(rows: list[tuple[int, int]], seq: int = 12) -> dict[str, np.ndarray]:
    """Right-padded rows: (length, masked prefix of the labels) each."""
    ids = np.zeros((len(rows), seq), dtype=np.int64)
    mask = np.zeros_like(ids)
    labels = np.full_like(ids, -100)
    for i, (n, m) in enumerate(rows):
        ids[i, :n], mask[i, :n] = 7, 1
        labels[i, min(m, n):n] = 7
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@settings(max_examples=60, deadline=None)
@given(rows=rows_st)
def test_hf_batches_count_like_a_row_by_row_loop(rows):
    b = _hf_batch(rows)
    want_eff = sum(max(0, n - max(m, 1)) for n, m in rows)       # labels 1..n-1 not masked (the model shifts)
    want_masked = sum(min(max(m, 1), n) - 1 for n, m in rows)    # attended labels 1..n-1 that are masked
    for batch in (b, {k: torch.from_numpy(v) for k, v in b.items()}):
        c = batch_counts(batch)
        assert (c.tokens, c.padding, c.samples) == (12 * len(rows), sum(12 - n for n, _ in rows), len(rows))
        assert (c.effective_tokens, c.masked) == (want_eff, want_masked)


@settings(max_examples=40, deadline=None)
@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 9)), ignored=st.integers(0, 9),
       ignore=st.sampled_from([-1, -100]))
def test_nanogpt_pairs_and_plain_arrays(shape, ignored, ignore):
    x = np.ones(shape, dtype=np.int64)
    y = x.copy()
    y[:, :ignored] = ignore
    eff = shape[0] * max(0, shape[1] - ignored)
    for pair in ((x, y), (torch.from_numpy(x), torch.from_numpy(y))):
        c = batch_counts(pair)
        assert (c.tokens, c.effective_tokens, c.masked, c.padding, c.samples) == (
            x.size, eff, x.size - eff, 0, shape[0])
    c = batch_counts(torch.from_numpy(x))
    assert (c.tokens, c.effective_tokens, c.samples) == (x.size, x.size, shape[0])


@pytest.mark.parametrize("batch", [object(), {"text": "no ids"}, 3])
def test_a_batch_it_cannot_count_is_one_clear_error(batch):
    with pytest.raises(PretokError, match="tokens"):
        batch_counts(batch)
