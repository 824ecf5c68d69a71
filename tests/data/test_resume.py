"""Resume for every data path: state_dict() after k batches, a NEW dataset + loader, load_state_dict(), and the
rest equals the uninterrupted run batch for batch (also through DataLoader workers and across epochs); elastic
resume on another world size / micro-batch continues the same global order; resuming is O(1): it neither
re-reads nor re-tokenizes what was consumed."""

from __future__ import annotations

import json

import pytest

from pretok_lib.data import KINDS, make_loader
from pretok_lib.data.order import Position

from .helpers import (
    content,
    dataset,
    flatten_steps,
    ref_order,
    ref_rows,
    rows,
    run,
    sharded,
    texts,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SEQ, MB, WORLD, RANK, SEED = 48, 3, 2, 1, 4


def make(corpus, kind, **kw):
    """A fresh dataset of rank 1 of 2 (micro-batch 3): nothing shared with the run that saved the state."""
    return dataset(corpus, kind, SEQ, micro_batch=MB, rank=RANK, world=WORLD, seed=SEED, doc_aware=True, **kw)


def checkpoint(loader) -> dict:
    state = json.loads(json.dumps(loader.state_dict()))  # a checkpoint stores plain JSON-able values
    return state


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_resume_mid_epoch_yields_exactly_the_uninterrupted_tail(wiki, kind, num_workers):
    full = [content(b) for b in run(make(wiki, kind), num_workers)[1]]
    assert len(full) > 10
    for k in ((1, 7, len(full) - 1, len(full)) if num_workers == 0 else (5, len(full) - 2)):
        loader, head = run(make(wiki, kind), num_workers, limit=k)
        state = checkpoint(loader)
        assert state["position"]["epoch"] == 0 and state["position"]["consumed"] == k * MB * WORLD
        assert (state["position"]["cursor"] is not None) == (kind == "padding-free")
        resumed = make_loader(make(wiki, kind), num_workers=num_workers)
        resumed.load_state_dict(state)
        tail = list(resumed)
        assert [content(b) for b in head] == full[:k]
        assert [content(b) for b in tail] == full[k:]  # exactly what the uninterrupted run yielded next
        assert [b["step"] for b in tail] == list(range(len(full) - k))  # in order, also through workers
        assert resumed.position == Position(1, 0)  # the epoch ended: the next one starts at 0


@pytest.mark.parametrize("kind", KINDS)
def test_resume_in_a_later_epoch(wiki, kind):
    loader = make_loader(make(wiki, kind))
    epoch0 = [content(b) for b in loader]
    state = checkpoint(loader)
    assert state["position"] == {"epoch": 1, "consumed": 0, "cursor": None}
    fresh = make_loader(make(wiki, kind))
    fresh.load_state_dict(state)
    epoch1 = list(fresh)
    assert {b["epoch"] for b in epoch1} == {1} and len(epoch1) == len(epoch0)
    assert [content(b) for b in epoch1] != epoch0  # shuffled again, differently
    # a checkpoint in the middle of epoch 1: the tail of epoch 1
    loader = make_loader(make(wiki, kind))
    loader.load_state_dict(state)
    _, head = run(None, loader=loader, limit=4)
    mid = checkpoint(loader)
    assert mid["position"]["epoch"] == 1 and mid["position"]["consumed"] == 4 * MB * WORLD
    again = make_loader(make(wiki, kind))
    again.load_state_dict(mid)
    assert [content(b) for b in head + list(again)] == [content(b) for b in epoch1]


@pytest.mark.parametrize("kind", KINDS)
def test_elastic_resume_keeps_the_global_order(wiki, kind):
    """world 2 x micro-batch 2 for 5 steps, then world 1 (micro-batch 4 or 2), 4 (micro-batch 2 or 1) or 3."""
    seq, k, seed = 40, 5, 6
    expect = ref_rows(wiki, kind, seq, seed=seed)  # the uninterrupted global order of the epoch
    first = [run(sharded(wiki, kind, seq, 2, r, 2, seed=seed), limit=k) for r in range(2)]
    states = [checkpoint(loader) for loader, _ in first]
    assert states[0]["position"] == states[1]["position"]  # every rank saves the same global position
    consumed = k * 4
    assert flatten_steps([b for _, b in first]) == expect[:consumed]
    for world, mb in [(1, 4), (1, 2), (4, 2), (4, 1), (3, 2)]:
        tails = []
        for r in range(world):
            loader = make_loader(sharded(wiki, kind, seq, mb, r, world, seed=seed))
            loader.load_state_dict(states[r % 2])
            tails.append(list(loader))
        S = (len(expect) - consumed) // (world * mb)
        assert S > 0 and flatten_steps(tails) == expect[consumed : consumed + S * world * mb], (world, mb)


def test_streaming_resume_tokenizes_nothing_already_consumed(wiki, monkeypatch):
    """padding-free resumes from its (document, token offset) cursor: no consumed document is tokenized again
    except the one the cursor is inside (at most one)."""
    ds = dataset(wiki, "padding-free", 32, micro_batch=4, rank=0, world=1, seed=2)
    full = [content(b) for b in run(ds)[1]]
    loader, _ = run(dataset(wiki, "padding-free", 32, micro_batch=4, rank=0, world=1, seed=2), limit=40)
    state = checkpoint(loader)
    doc_pos, _offset = state["position"]["cursor"]
    assert doc_pos > 40  # 40 batches x 4 windows x 33 tokens: far into the stream
    all_texts = texts(wiki.text)
    order = ref_order(len(all_texts), 2, 0, True)
    position_of = {all_texts[int(d)]: p for p, d in enumerate(order)}
    assert len(position_of) == len(all_texts)
    new = dataset(wiki, "padding-free", 32, micro_batch=4, rank=0, world=1, seed=2)
    encoded: list[int] = []
    real = new.source.encode

    def spy(batch_texts):
        encoded.extend(position_of[t] for t in batch_texts)
        return real(batch_texts)

    monkeypatch.setattr(new.source, "encode", spy)
    resumed = make_loader(new)
    resumed.load_state_dict(state)
    it = iter(resumed)
    assert content(next(it)) == full[40]
    assert encoded[0] == doc_pos and encoded == list(range(doc_pos, doc_pos + len(encoded)))
    assert len(encoded) <= 4 * 33 // 10 + 2  # only the documents this batch needs


@pytest.mark.parametrize("kind", ("padded", "pretok-padded", "pretok-token-list", "pretok-memmap"))
def test_map_resume_fetches_only_the_next_samples(wiki, kind, monkeypatch):
    full = [content(b) for b in run(make(wiki, kind))[1]]
    loader, _ = run(make(wiki, kind), limit=9)
    state = checkpoint(loader)
    new = make(wiki, kind)
    fetched: list[tuple[int, int]] = []
    if hasattr(new.source, "batch"):  # a source that gathers a whole batch at once (padded parquet rows)
        real_batch = new.source.batch
        monkeypatch.setattr(new.source, "batch",
                            lambda e, a, b: (fetched.extend((e, k) for k in range(a, b)), real_batch(e, a, b))[1])
    else:
        real = new.source.sample
        monkeypatch.setattr(new.source, "sample", lambda e, k: (fetched.append((e, k)), real(e, k))[1])
    if kind == "padded":  # the baseline tokenizes exactly the samples it serves
        calls = []
        real_encode = new.source.encode
        monkeypatch.setattr(new.source, "encode", lambda t: (calls.append(len(t)), real_encode(t))[1])
    resumed = make_loader(new)
    resumed.load_state_dict(state)
    it = iter(resumed)
    assert content(next(it)) == full[9]
    c = 9 * MB * WORLD
    assert fetched == [(0, c + RANK * MB + j) for j in range(MB)]  # rank 1's slice of the 10th global batch
    if kind == "padded":
        assert calls == [1] * MB
    assert content(next(it)) == full[10]
    assert len(fetched) == 2 * MB


def test_state_before_any_batch_and_rows_identity(wiki):
    loader = make_loader(make(wiki, "pretok-memmap"))
    assert loader.state_dict()["position"] == {"epoch": 0, "consumed": 0, "cursor": None}
    assert loader.state_dict()["global_batch"] == MB * WORLD
    first = next(iter(loader))
    assert rows(first) == ref_rows(wiki, "pretok-memmap", SEQ, seed=SEED)[RANK * MB : RANK * MB + MB]
