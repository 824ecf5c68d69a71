"""The pure order logic (`pretok_lib.data.order`), property-tested: the global order is a (seed, epoch)
permutation cut into global batches; ranks take contiguous slices of each global batch, DataLoader workers take
steps round-robin; together they cover the consumed-onward prefix of full global batches exactly once; the
position is resumable on any world size."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.data.order import (
    Position,
    Shard,
    epoch_permutation,
    my_steps,
    steps_left,
)

worlds = st.integers(1, 8)
workers = st.integers(1, 4)  # DataLoader num_workers 0..4 (0 behaves as one worker)
micro = st.integers(1, 8)
sizes = st.integers(0, 2000)


def slices(n: int, pos: Position, world: int, nworkers: int, mb: int) -> dict:
    """{(rank, worker): [(step, first, last), ...]} for every reader."""
    return {(r, w): list(my_steps(n, pos, Shard(r, world, w, nworkers, mb)))
            for r in range(world) for w in range(nworkers)}


def round_robin(per_worker: list[list]) -> list:
    """How PyTorch's DataLoader interleaves an IterableDataset's workers: w0, w1, ..., skipping exhausted ones."""
    its, out = [iter(x) for x in per_worker], []
    alive = list(range(len(its)))
    while alive:
        for w in list(alive):
            try:
                out.append(next(its[w]))
            except StopIteration:
                alive.remove(w)
    return out


@st.composite
def setups(draw):
    world, nw, mb, n = draw(worlds), draw(workers), draw(micro), draw(sizes)
    gb = world * mb
    consumed = gb * draw(st.integers(0, n // gb + 1))  # any multiple of the global batch, even past the end
    return n, Position(draw(st.integers(0, 5)), consumed), world, nw, mb


@settings(max_examples=600, deadline=None)
@given(setups())
def test_union_of_all_readers_is_the_full_batches_after_consumed_exactly_once(setup):
    n, pos, world, nw, mb = setup
    gb = world * mb
    S = max(0, (n - pos.consumed) // gb)
    assert steps_left(n, pos, gb) == S
    got = slices(n, pos, world, nw, mb)
    positions = Counter(k for sl in got.values() for _, a, b in sl for k in range(a, b))
    # exactly the first S global batches after `consumed`, each position once: no duplicate, no gap
    assert positions == Counter(range(pos.consumed, pos.consumed + S * gb))
    # the dropped remainder is smaller than one global batch (or nothing is left at all)
    assert n - pos.consumed - S * gb < gb or S == 0 and pos.consumed >= n
    for (r, w), sl in got.items():
        for step, a, b in sl:
            assert b - a == mb  # every micro-batch is full
            assert a == pos.consumed + step * gb + r * mb  # rank r: the r-th contiguous slice of the global batch
            assert b <= n


@settings(max_examples=600, deadline=None)
@given(setups())
def test_every_rank_has_the_same_steps_and_workers_take_them_round_robin(setup):
    n, pos, world, nw, mb = setup
    S = max(0, (n - pos.consumed) // (world * mb))
    got = slices(n, pos, world, nw, mb)
    for r in range(world):
        per_worker = [[step for step, _, _ in got[r, w]] for w in range(nw)]
        for w, steps in enumerate(per_worker):
            assert steps == list(range(w, S, nw))  # worker w: steps w, w+W, ... in increasing order
        flat = [s for steps in per_worker for s in steps]
        assert len(flat) == len(set(flat)) == S  # workers are disjoint and together do every step
        assert round_robin(per_worker) == list(range(S))  # the DataLoader yields them in step order
    # the same number of batches on every rank
    assert len({sum(len(got[r, w]) for w in range(nw)) for r in range(world)}) == 1


@settings(max_examples=300, deadline=None)
@given(sizes, st.integers(0, 2**32 - 1), st.integers(0, 50), worlds, micro, worlds, micro, st.data())
def test_elastic_resume_continues_the_same_global_order(n, seed, epoch, w1, mb1, w2, mb2, data):
    """Run `k` steps on (w1, mb1), save the position, resume on (w2, mb2): the samples taken after the switch
    are the global order from exactly where the first run stopped, and nothing is repeated or skipped."""
    perm = epoch_permutation(n, seed, epoch, True)
    gb1, gb2 = w1 * mb1, w2 * mb2
    k = data.draw(st.integers(0, n // gb1))
    first = [list(my_steps(n, Position(epoch, 0), Shard(r, w1, 0, 1, mb1)))[:k] for r in range(w1)]
    before = [int(perm[j]) for step in range(k) for r in range(w1) for j in range(*first[r][step][1:])]
    saved = Position(epoch, k * gb1)
    state = json.loads(json.dumps(saved.to_dict()))  # what a checkpoint stores
    resumed = Position.from_dict(state)
    assert resumed == saved
    per_rank = [list(my_steps(n, resumed, Shard(r, w2, 0, 1, mb2))) for r in range(w2)]
    after = [int(perm[j]) for step in range(len(per_rank[0])) for r in range(w2)
             for j in range(per_rank[r][step][1], per_rank[r][step][2])]
    S2 = (n - k * gb1) // gb2
    assert before == perm[: k * gb1].tolist()
    assert after == perm[k * gb1 : k * gb1 + S2 * gb2].tolist()
    assert len(set(before + after)) == len(before) + len(after)


@settings(max_examples=200, deadline=None)
@given(sizes, st.integers(0, 2**32 - 1), st.integers(0, 1000))
def test_epoch_permutation_is_a_seeded_permutation(n, seed, epoch):
    p = epoch_permutation(n, seed, epoch, True)
    assert p.dtype == np.int64 and sorted(p.tolist()) == list(range(n))
    assert np.array_equal(p, epoch_permutation(n, seed, epoch, True))  # deterministic
    assert np.array_equal(p, np.random.default_rng([seed, epoch]).permutation(n))  # the documented contract
    assert epoch_permutation(n, seed, epoch, False).tolist() == list(range(n))  # no shuffle: identity
    if n >= 20:  # other epochs and seeds give other orders (collision odds ~1/20!)
        assert not np.array_equal(p, epoch_permutation(n, seed, epoch + 1, True))
        assert not np.array_equal(p, epoch_permutation(n, seed + 1, epoch, True))


@given(st.integers(0, 100), st.integers(0, 10**6),
       st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)))
def test_position_round_trips_through_json(epoch, consumed, cursor):
    p = Position(epoch, consumed, cursor)
    q = Position.from_dict(json.loads(json.dumps(p.to_dict())))
    assert q == p and (q.cursor is None or isinstance(q.cursor, tuple))


def test_small_example_by_hand():
    """10 samples, world 2, micro-batch 2 (global batch 4), 2 workers: 2 full steps, 2 samples dropped."""
    got = slices(10, Position(), 2, 2, 2)
    assert got == {(0, 0): [(0, 0, 2)], (0, 1): [(1, 4, 6)], (1, 0): [(0, 2, 4)], (1, 1): [(1, 6, 8)]}
    assert slices(10, Position(0, 4), 2, 1, 2) == {(0, 0): [(0, 4, 6)], (1, 0): [(0, 6, 8)]}
    assert slices(10, Position(0, 8), 2, 1, 2) == {(0, 0): [], (1, 0): []}
