"""Weighted mixtures (docs/MIXTURES.md): the blend tracks the weights at every prefix and is Megatron's rule; each
dataset's samples come in its own order, wrapping (`epoch`) or ending the epoch (`stop`); sharding, workers,
resume and elastic resume give the identical sample stream; mismatched datasets and loader states are refused."""

from __future__ import annotations

import json
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pretok_lib.data import MixtureSource, ShardedBatches, make_loader, make_source, open_mixture
from pretok_lib.data.blend import PERIOD_MAX, Blend, greedy_sources, rational_weights
from pretok_lib.errors import PretokError
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import CL100K_JSON
from .helpers import content, flatten_steps, run

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SEQ, SEED = 48, 3


# ------------------------------------------------------------------ the blend


def _reference(p: list[int], Q: int, n: int) -> np.ndarray:
    """The greedy rule straight from its definition, over n samples (no period, no tables)."""
    c, out = [0] * len(p), []
    for i in range(n):
        errors = [Fraction(pj, Q) * (i + 1) - cj for pj, cj in zip(p, c)]
        j = errors.index(max(errors))
        c[j] += 1
        out.append(j)
    return np.array(out)


weights_st = st.lists(st.one_of(st.floats(1e-3, 1e3), st.integers(1, 50), st.sampled_from([0.1, 0.25, 0.3, 0.7])),
                      min_size=1, max_size=7)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(weights_st, st.integers(1, 3000), st.integers(0, 10**9))
@example([50.0, 50.0, 0.001], 1, 0)  # refused (found by a run whose other tests changed hypothesis's draws)
def test_blend_tracks_the_weights_at_every_prefix(weights, n, start):
    exact = [Fraction(repr(float(w))) for w in weights]
    total = sum(exact)
    try:
        b = Blend(weights)
    except ValueError as e:  # refused only for a weight too small to get one sample in the longest period
        assert "below 1/" in str(e), e
        assert min(exact) / total < Fraction(1, PERIOD_MAX), weights
        return
    for pj, w in zip(b.p, exact):  # the realised weights: as written, or within one rounding step of them
        assert abs(Fraction(pj, b.Q) - w / total) <= Fraction(1, PERIOD_MAX)
    src, rank = b.locate_many(0, n)
    assert src.tolist() == _reference(b.p, b.Q, n).tolist()  # the periodic tables are the greedy rule itself
    counts = np.zeros((n + 1, b.k), dtype=np.int64)
    counts[1:] = np.cumsum(np.eye(b.k, dtype=np.int64)[src], axis=0)
    target = np.outer(np.arange(n + 1), b.p)  # Q · w_j · n, exactly
    ahead = (counts * b.Q - target) / b.Q
    assert ahead.max() < 1  # no dataset is ever a whole sample ahead of its share
    assert -ahead.min() < max(1, b.k - 1)  # nor behind by more than the others are ahead
    assert rank.tolist() == [int(counts[i, j]) for i, j in enumerate(src)]  # rank = its samples before
    # any position, however far into the stream, in O(1): the same as counting from 0
    for pos in (start, start + 1, start + b.Q):
        j, g = b.locate(pos)
        assert b.counts(pos)[j] == g and b.position_of(j, g) == pos and b.counts(pos + 1)[j] == g + 1


def test_rational_weights():
    assert rational_weights([0.3, 0.7]) == ([3, 7], 10)
    assert rational_weights([1, 1, 2]) == ([1, 1, 2], 4)
    assert rational_weights([5.0]) == ([1], 1)
    assert rational_weights([1 / 3, 2 / 3]) == ([1, 2], 3)  # 0.333…3 / 0.999…9 is 1/3 exactly
    p, Q = rational_weights([0.123456789, 0.5])
    assert Q == PERIOD_MAX and sum(p) == Q and abs(p[0] / Q - 0.123456789 / 0.623456789) <= 1 / Q
    for bad in ([], [0.5, 0], [1, -1], [float("nan")], [1.0, 1e-9]):
        with pytest.raises(ValueError):
            rational_weights(bad)


def _megatron_blend(p: list[int], Q: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import helpers_cpp  # the compiled helper megatron-core ships
    src, rank = np.zeros(n, dtype=np.int16), np.zeros(n, dtype=np.int64)
    helpers_cpp.build_blending_indices(src, rank, np.array(p, dtype=np.float64) / Q, len(p), n, False)
    return src, rank


def _worst(src: np.ndarray, p: list[int], Q: int) -> float:
    counts = np.zeros((len(src) + 1, len(p)))
    counts[1:] = np.cumsum(np.eye(len(p))[src], axis=0)
    return float(np.abs(counts - np.outer(np.arange(len(src) + 1), np.array(p) / Q)).max())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8), st.integers(1, 4000))
def test_same_rule_as_megatron_build_blending_indices(weights, n):
    """Megatron compares w_j·max(i, 1) - c_j (the share of the samples before i); ours w_j·(i + 1) - c_j (of
    the samples up to i). With Megatron's target our kernel gives its assignment sample for sample (dyadic
    weights: the doubles are exact); with ours no prefix is further from the weights than Megatron's."""
    p = [max(1, round(w / sum(weights) * PERIOD_MAX)) for w in weights]
    p[int(np.argmax(p))] += PERIOD_MAX - sum(p)
    src, rank = _megatron_blend(p, PERIOD_MAX, n)
    assert greedy_sources(p, PERIOD_MAX, n, megatron=True).tolist() == src.tolist()
    ours = greedy_sources(p, PERIOD_MAX, n)
    assert np.bincount(ours, minlength=len(p)).sum() == n
    assert _worst(ours, p, PERIOD_MAX) <= _worst(src, p, PERIOD_MAX) + 1e-12


# ------------------------------------------------------------------ the mixture source


def _src(corpus, fmt="memmap", seq=SEQ, seed=SEED, shuffle=True):
    return make_source(f"pretok-{fmt}", corpus.dirs[f"pretok-{fmt}"], seq, seed=seed, shuffle=shuffle)


def _streams(mix: MixtureSource, epochs: int) -> list[list]:
    """Each dataset's samples in the order the mixture serves them, over `epochs` mixture epochs."""
    out = [[] for _ in mix.sources]
    for e in range(epochs):
        for k in range(mix.num_samples):
            s = mix.sample(e, k)
            out[s.origin].append(s.tokens.tolist())
    return out


def _own(src, epochs: int, count: int) -> list:
    """The first `count` samples of a source's own order, epoch after epoch."""
    return [src.sample(e, i).tokens.tolist() for e in range(epochs) for i in range(src.num_samples)][:count]


def test_epoch_policy_wraps_each_dataset_into_its_next_permutation(wiki, pydocs):
    a, b = _src(wiki), _src(pydocs, "token-list")  # token lists and memmap: both packed, they mix
    mix = MixtureSource([a, b], [0.8, 0.2], "epoch")
    assert mix.num_samples == a.num_samples + b.num_samples
    streams = _streams(mix, 2)
    for src, got in zip((a, b), streams):
        epochs = -(-len(got) // src.num_samples)
        assert got == _own(src, epochs, len(got))  # its own order, wrapping into its next epoch's permutation
    assert len(streams[0]) > a.num_samples  # 0.8 of the stream: wiki wraps within the first mixture epoch
    assert [len(s) for s in streams] == Blend([0.8, 0.2]).counts(2 * mix.num_samples)


def test_stop_policy_ends_the_epoch_when_a_dataset_runs_out(wiki, pydocs):
    a, b = _src(wiki), _src(pydocs)
    mix = MixtureSource([a, b], [0.5, 0.5], "stop")
    counts = Blend([0.5, 0.5]).counts(mix.num_samples)
    assert max(c - s.num_samples for c, s in zip(counts, (a, b))) == 0  # one is used up exactly, none over
    for e in range(2):  # every mixture epoch restarts each dataset in its epoch e permutation
        seen = [[], []]
        for k in range(mix.num_samples):
            s = mix.sample(e, k)
            seen[s.origin].append(s.tokens.tolist())
        for src, got in zip((a, b), seen):
            assert got == [src.sample(e, i).tokens.tolist() for i in range(len(got))]


def _mixture(wiki, pydocs, exhausted="epoch", weights=(0.7, 0.3), seed=SEED):
    return open_mixture([(wiki.dirs["pretok-memmap"], weights[0]), (pydocs.dirs["pretok-memmap"], weights[1])],
                        SEQ, seed=seed, exhausted=exhausted)


@pytest.mark.parametrize("exhausted", ["epoch", "stop"])
def test_sharding_and_workers_give_the_single_process_stream(wiki, pydocs, exhausted):
    mix = _mixture(wiki, pydocs, exhausted)
    one = flatten_steps([run(ShardedBatches(mix, 6, 0, 1))[1]])
    for world, mb, workers in ((2, 3, 0), (3, 2, 2)):
        per_rank = [run(ShardedBatches(mix, mb, r, world), workers)[1] for r in range(world)]
        assert flatten_steps(per_rank) == one
    batch = run(ShardedBatches(mix, 6, 0, 1), limit=1)[1][0]
    assert batch["origin"].tolist() == [mix.locate(0, k)[0] for k in range(6)]


def _state(loader) -> dict:
    return json.loads(json.dumps(loader.state_dict()))  # what a checkpoint stores


@pytest.mark.parametrize("exhausted", ["epoch", "stop"])
def test_resume_and_elastic_resume_mid_mixture_continue_the_stream(wiki, pydocs, exhausted):
    """Rank 1 of 2 resumes exactly; 3 ranks of micro-batch 2 resuming 2 ranks' state read the same global
    stream; across the mixture epoch boundary too."""
    full = [content(b) for b in run(ShardedBatches(_mixture(wiki, pydocs, exhausted), 3, 1, 2))[1]]
    k = len(full) // 2
    loader, _ = run(ShardedBatches(_mixture(wiki, pydocs, exhausted), 3, 1, 2), limit=k)
    state = _state(loader)
    resumed = make_loader(ShardedBatches(_mixture(wiki, pydocs, exhausted), 3, 1, 2), num_workers=2)
    resumed.load_state_dict(state)
    assert [content(b) for b in resumed] == full[k:]
    # elastic: the global stream after k global batches of 6, read by 3 ranks of 2, and into the next epoch
    ref = flatten_steps([run(ShardedBatches(_mixture(wiki, pydocs, exhausted), 6, 0, 1))[1]])
    tail = []
    for r in range(3):
        ld = make_loader(ShardedBatches(_mixture(wiki, pydocs, exhausted), 2, r, 3))
        ld.load_state_dict(state)
        tail.append(list(ld))
    assert flatten_steps(tail) == ref[k * 6: k * 6 + len(flatten_steps(tail))]
    assert len(flatten_steps(tail)) >= len(ref) - k * 6 - 6
    # a position in the second mixture epoch: O(1) to restore, the samples of that epoch
    later = make_loader(ShardedBatches(_mixture(wiki, pydocs, exhausted), 6, 0, 1))
    later.load_state_dict({**state, "position": {"epoch": 1, "consumed": 12, "cursor": None}})
    mix = _mixture(wiki, pydocs, exhausted)
    assert flatten_steps([run(None, loader=later, limit=2)[1]]) == \
        [tuple(mix.sample(1, i).tokens[:-1].tolist()) for i in range(12, 24)]


def test_a_loader_state_of_another_mixture_or_dataset_is_refused(wiki, pydocs):
    loader, _ = run(ShardedBatches(_mixture(wiki, pydocs), 3, 0, 1), limit=2)
    state = _state(loader)
    for other in (_mixture(wiki, pydocs, weights=(0.6, 0.4)), _mixture(wiki, pydocs, "stop"),
                  _src(wiki)):
        with pytest.raises(PretokError, match="another data order") as e:
            make_loader(ShardedBatches(other, 3, 0, 1)).load_state_dict(state)
        assert "\n" not in str(e.value)
    same = make_loader(ShardedBatches(_mixture(wiki, pydocs), 3, 0, 1))
    same.load_state_dict(state)  # the same mixture (weights written differently: same rational weights)
    same2 = make_loader(ShardedBatches(_mixture(wiki, pydocs, weights=(7, 3)), 3, 0, 1))
    same2.load_state_dict(state)


@pytest.fixture(scope="module")
def cl100k_memmap(wiki, tmp_path_factory):
    out = tmp_path_factory.mktemp("cl100k") / "memmap"
    run_tokenize(TokenizeConfig(inputs=[str(wiki.text)], out=str(out), tokenizer=str(CL100K_JSON),
                                format="memmap", workers=0, progress=False))
    return out


def test_mismatched_tokenizer_or_format_family_is_one_line_naming_the_manifest(wiki, pydocs, cl100k_memmap):
    with pytest.raises(PretokError) as e:
        open_mixture([(wiki.dirs["pretok-memmap"], 1), (cl100k_memmap, 1)], SEQ)
    msg = str(e.value)
    assert msg.startswith(f"{cl100k_memmap}/manifest.json: ") and "one tokenizer" in msg and "\n" not in msg
    with pytest.raises(PretokError) as e:
        open_mixture([(wiki.dirs["pretok-memmap"], 1), (pydocs.dirs["pretok-padded"], 1)], SEQ)
    msg = str(e.value)
    assert msg.startswith(f"{pydocs.dirs['pretok-padded']}/manifest.json: ") and "padded" in msg
    assert "\n" not in msg
    # padded with padded mixes (one family)
    mix = open_mixture([(wiki.dirs["pretok-padded"], 1), (pydocs.dirs["pretok-padded"], 1)], SEQ)
    batch = run(ShardedBatches(mix, 4, 0, 1), limit=1)[1][0]
    assert "attention_mask" in batch and len(batch["origin"]) == 4
    with pytest.raises(PretokError, match="weight"):
        open_mixture([(wiki.dirs["pretok-memmap"], 1), (pydocs.dirs["pretok-memmap"], 0)], SEQ)


class _Numbered:
    """A stand-in source of `n` samples whose sample (epoch, i) is the tokens [id, epoch, i]."""

    window, seed, shuffle, m = 3, 0, True, {"manifest_sha256": None}

    def __init__(self, ident: int, n: int):
        self.ident, self.num_samples, self.path = ident, n, f"numbered-{ident}"

    def sample(self, epoch: int, i: int):
        from pretok_lib.data.packing import Sample

        assert 0 <= i < self.num_samples
        return Sample(np.array([self.ident, epoch, i]))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 40), st.floats(0.05, 5)), min_size=1, max_size=5),
       st.sampled_from(["epoch", "stop"]))
def test_any_sizes_and_weights_each_dataset_in_its_own_order(data, exhausted):
    sources = [_Numbered(j, n) for j, (n, _) in enumerate(data)]
    mix = MixtureSource(sources, [w for _, w in data], exhausted)
    blend = Blend([w for _, w in data])
    for e in range(3):
        got = [mix.sample(e, k) for k in range(mix.num_samples)]
        counts = [0] * len(sources)
        for s in got:
            ident, ep, i = s.tokens.tolist()
            assert s.origin == ident
            if exhausted == "stop":  # each dataset from its start in epoch e; none past its end
                assert (ep, i) == (e, counts[ident])
            else:  # its g-th sample overall: epoch g // n, index g % n
                g = blend.counts(e * mix.num_samples)[ident] + counts[ident]
                assert (ep, i) == divmod(g, sources[ident].num_samples)
            counts[ident] += 1
        start = 0 if exhausted == "stop" else e * mix.num_samples  # epoch: the stream goes on
        assert counts == [b - a for a, b in zip(blend.counts(start), blend.counts(start + mix.num_samples))]
    if exhausted == "stop":  # the epoch ends exactly where the next sample would need one a dataset lacks
        nxt, _ = blend.locate(mix.num_samples)
        assert counts[nxt] == sources[nxt].num_samples
        assert all(c <= s.num_samples for c, s in zip(counts, sources))
    else:
        assert mix.num_samples == sum(s.num_samples for s in sources)
