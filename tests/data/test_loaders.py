"""Real loaders for every data path, with explicit rank/world and DataLoader workers: the union over ranks and
workers covers each sample of the epoch's full global batches exactly once; ranks yield equal numbers of batches;
workers' batches come out in step order; the global order is the same for any world size / micro-batch / worker
count (a prefix when the global batch differs) and changes with the epoch and the seed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.data import KINDS, dist_rank_world, make_dataset, make_loader
from pretok_lib.data.order import Position

from .helpers import (
    PAD_SEQ_LEN,
    dataset,
    flatten_steps,
    multiset,
    ref_rows,
    rows,
    run,
    sharded,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def per_rank(corpus, kind, seq_len, world, mb, num_workers=0, fresh=False, **kw):
    """Every rank's batches of one epoch (ranks run one after another; `fresh`: through make_dataset)."""
    make = (lambda r: dataset(corpus, kind, seq_len, micro_batch=mb, rank=r, world=world, **kw)) if fresh else \
        (lambda r: sharded(corpus, kind, seq_len, mb, r, world, **kw))
    return [run(make(r), num_workers)[1] for r in range(world)]


def check_epoch(corpus, kind, seq_len, world, mb, num_workers, seed=0, shuffle=True, fresh=False):
    """Run every rank of one epoch and check coverage, equal counts, step order, and the global order."""
    got = per_rank(corpus, kind, seq_len, world, mb, num_workers, fresh=fresh, seed=seed, shuffle=shuffle)
    expect = ref_rows(corpus, kind, seq_len, seed=seed, shuffle=shuffle)
    gb = world * mb
    S = len(expect) // gb
    assert [len(b) for b in got] == [S] * world  # every rank: the same number of batches, remainder dropped
    for batches in got:
        assert [b["step"] for b in batches] == list(range(S))  # in step order, also through workers
        assert all(b["epoch"] == 0 and b["input_ids"].shape == (mb, seq_len) for b in batches)
    union = [r for batches in got for b in batches for r in rows(b)]
    assert multiset(union) == multiset(expect[: S * gb])  # each sample of the full global batches exactly once
    assert flatten_steps(got) == expect[: S * gb]  # and in the global order, rank r taking the r-th slice
    return got


CASES = [  # (world, micro_batch, num_workers, seq_len); wiki's 240 documents leave a remainder for 14 and 9
    (1, 7, 0, 64),
    (2, 7, 2, 48),
    (3, 3, 0, 96),
    (4, 1, 2, 32),
]


@pytest.mark.parametrize("world,mb,num_workers,seq_len", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_ranks_and_workers_cover_the_epoch_exactly_once(wiki, kind, world, mb, num_workers, seq_len):
    check_epoch(wiki, kind, seq_len, world, mb, num_workers, seed=5, fresh=True)


@pytest.mark.parametrize("kind", KINDS)
def test_long_documents_with_four_workers(pydocs, kind):
    check_epoch(pydocs, kind, 128 if kind in ("padded", "pretok-padded") else 64, 2, 2, 4, seed=1)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), world=st.integers(1, 8), num_workers=st.integers(0, 4), mb=st.integers(1, 8),
       seq_len=st.integers(16, PAD_SEQ_LEN), seed=st.integers(0, 2**16), shuffle=st.booleans())
def test_property_real_loaders(wiki, kind, world, num_workers, mb, seq_len, seed, shuffle):
    if kind == "padding-free":  # every rank and worker tokenizes the whole stream: keep the example cheap
        world, num_workers = min(world, 4), min(num_workers, 2)
    check_epoch(wiki, kind, seq_len, world, mb, num_workers, seed=seed, shuffle=shuffle)


@pytest.mark.parametrize("kind", KINDS)
def test_global_order_is_independent_of_world_size_and_workers(wiki, kind):
    seq_len = 40
    same_gb = [flatten_steps(per_rank(wiki, kind, seq_len, w, mb, nw, seed=9))
               for w, mb, nw in [(1, 8, 0), (2, 4, 0), (4, 2, 0), (2, 4, 2), (8, 1, 0)]]
    assert all(x == same_gb[0] for x in same_gb[1:])
    assert len(same_gb[0]) >= 200
    for w, mb in [(3, 2), (1, 5)]:  # another global batch: a prefix of the same order
        other = flatten_steps(per_rank(wiki, kind, seq_len, w, mb, 0, seed=9))
        n = min(len(other), len(same_gb[0]))
        assert n > 0 and other[:n] == same_gb[0][:n]


@pytest.mark.parametrize("kind", KINDS)
def test_order_depends_on_seed_and_epoch(wiki, kind):
    def epochs(seed, shuffle, n=2):
        loader = make_loader(sharded(wiki, kind, 64, 4, 0, 1, seed=seed, shuffle=shuffle))
        out = []
        for e in range(n):
            batches = list(loader)  # the same loader again: the next epoch
            assert batches and {b["epoch"] for b in batches} == {e}
            assert loader.position == Position(e + 1, 0)
            out.append([r for b in batches for r in rows(b)])
        return out

    e0, e1 = epochs(1, True)
    assert len(e0) == len(e1) > 0
    assert e0 == ref_rows(wiki, kind, 64, seed=1, epoch=0)[: len(e0)]
    assert e1 == ref_rows(wiki, kind, 64, seed=1, epoch=1)[: len(e1)]
    assert e0 != e1
    (f0,) = epochs(2, True, n=1)
    assert f0 != e0 and f0 == ref_rows(wiki, kind, 64, seed=2, epoch=0)[: len(f0)]
    s0, s1 = epochs(1, False)
    assert s0 == s1 == ref_rows(wiki, kind, 64, shuffle=False)[: len(s0)]


@pytest.mark.parametrize("kind", ("padded", "pretok-padded", "pretok-memmap"))
def test_fewer_samples_than_one_global_batch_gives_no_batch_on_any_rank(wiki, kind):
    # wiki has 240 documents: world 4 x micro-batch 64 = 256 per global batch
    for r in range(4):
        loader, batches = run(sharded(wiki, kind, 4000 if kind == "pretok-memmap" else 32, 64, r, 4))
        assert batches == [] and loader.position.epoch == 1


def test_rank_and_world_default_to_torch_distributed_or_single_process(wiki):
    assert dist_rank_world() == (0, 1)
    ds = make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 32)
    assert (ds.rank, ds.world) == (0, 1)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 32, rank=2, world=2)


def test_len_is_the_number_of_batches_left(wiki):
    ds = dataset(wiki, "pretok-token-list", 64, micro_batch=4, rank=1, world=2)
    loader, batches = run(ds)
    assert len(batches) == len(ref_rows(wiki, "pretok-token-list", 64)) // 8
    loader.load_state_dict({"position": {"epoch": 0, "consumed": 8 * 5, "cursor": None}})
    assert len(loader) == len(batches) - 5 == len(list(loader))
