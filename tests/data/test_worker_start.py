"""DataLoader workers started by spawn or forkserver (macOS's default; Linux's from Python 3.14) receive the dataset
pickled: every path serves the stream it serves in-process, and a memmap dataset travels as its paths, never as
its tokens, so the worker memory bound holds whatever the dataset's size. The per-document arrays (lengths,
starts, the epoch's order and packing ends) are built once per rank and shared with its workers: forked ones
inherit them, spawned ones map them from shared memory (`shared_index.py`)."""

from __future__ import annotations

import io
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from pretok_lib.data import ShardedBatches, make_loader, open_mixture
from pretok_lib.data import shared_index
from pretok_lib.errors import PretokError
from pretok_lib.formats.memmap import MemmapDataset

from .helpers import KINDS, PRETOK_KINDS, content, dataset, run


def _stream(ds_factory, workers: int, limit: int = 12) -> list[dict]:
    return [content(b) for b in run(ds_factory(), num_workers=workers, limit=limit)[1]]


@pytest.mark.parametrize("start_method", ["spawn"], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
def test_spawned_workers_serve_the_in_process_stream(wiki, kind, start_method):
    factory = lambda: dataset(wiki, kind, 64, micro_batch=4)  # noqa: E731
    assert _stream(factory, 2) == _stream(factory, 0)


@pytest.mark.parametrize("start_method", ["forkserver"], indirect=True)
def test_forkserver_workers_serve_a_mixture_and_resume(wiki, pydocs, start_method):
    from pretok_lib.data import ShardedBatches

    factory = lambda: ShardedBatches(open_mixture([(wiki.dirs["pretok-memmap"], 1),  # noqa: E731
                                                   (pydocs.dirs["pretok-token-list"], 1)], 64), 4)
    whole = _stream(factory, 0, limit=10)
    assert _stream(factory, 2, limit=10) == whole
    loader, first = run(factory(), num_workers=2, limit=4)
    resumed = make_loader(factory(), num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    rest = [content(b) for b in run(None, loader=resumed, limit=6)[1]]
    assert [content(b) for b in first] + rest == whole


def test_a_memmap_dataset_pickles_as_paths_whatever_its_size(wiki, pydocs):
    sizes = {}
    for corpus in (wiki, pydocs):
        ds = dataset(corpus, "pretok-memmap", 64, micro_batch=4)
        sizes[corpus.name] = (len(pickle.dumps(ds)), os.path.getsize(corpus.dirs["pretok-memmap"] / "data.bin"))
        again = pickle.loads(pickle.dumps(ds))
        assert _stream(lambda: again, 0, 6) == _stream(lambda: ds, 0, 6)
    (small, small_bin), (large, large_bin) = sorted(sizes.values(), key=lambda s: s[1])
    assert large_bin > 4 * small_bin and large < 1.2 * small + 1024 and large < 16_384, sizes


def test_a_memmap_file_changed_after_opening_is_refused_where_it_is_mapped_again(wiki, tmp_path):
    import shutil

    for name in ("data.bin", "data.idx"):
        copy = tmp_path / name.replace(".", "-")
        shutil.copytree(wiki.dirs["pretok-memmap"], copy)
        ds = MemmapDataset(copy / "data")
        state = pickle.dumps(ds)
        os.utime(copy / name, ns=(0, os.stat(copy / name).st_mtime_ns + 10**9))  # rewritten (same bytes, newer)
        with pytest.raises(PretokError, match=f"{name}: changed since the dataset was opened"):
            pickle.loads(state)


def _index_arrays(source) -> list[np.ndarray]:
    """The epoch's per-document arrays a pretokenized source holds once built (None where not built yet)."""
    if hasattr(source, "_perm"):  # padded rows: the order of rows
        return [source._perm[1]] if source._perm is not None else None
    if source._index is None:
        return None
    index = source._index[1]
    return [index.order, index.ends, index.lengths]


class Probe(ShardedBatches):
    """Says, in each worker, whether the epoch's index was already there when the worker started (built by the
    main process, not by the worker) and whether its arrays are in shared memory (every dataset's, in a mixture)."""

    def __iter__(self):
        sources = getattr(self.source, "sources", [self.source])
        each = [_index_arrays(s) for s in sources]
        arrays = None if any(a is None for a in each) else [a for arrs in each for a in arrs]
        flags = {"prebuilt": int(arrays is not None),
                 "shared": int(arrays is not None and all(isinstance(a.base, torch.Tensor) and a.base.is_shared()
                                                          for a in arrays))}
        for batch in super().__iter__():
            yield dict(batch, **flags)


@pytest.mark.parametrize("start_method", ["fork", "spawn"], indirect=True)
@pytest.mark.parametrize("kind", PRETOK_KINDS)
def test_the_epoch_index_is_built_once_and_shared_by_the_workers(wiki, kind, start_method, monkeypatch):
    """Built in the main process before the workers start (so forked workers share its pages), and sent to
    spawned workers through shared memory (every array counts as large here): the same stream either way."""
    monkeypatch.setattr(shared_index, "MIN_BYTES", 0)
    whole = _stream(lambda: dataset(wiki, kind, 64, micro_batch=4), 0)
    got = [content(b) for b in run(Probe(dataset(wiki, kind, 64).source, 4, 0, 1), num_workers=2, limit=12)[1]]
    assert [{k: v for k, v in b.items() if k not in ("prebuilt", "shared")} for b in got] == whole
    assert {b["prebuilt"] for b in got} == {1}
    assert {b["shared"] for b in got} == ({1} if start_method == "spawn" else {0})


@pytest.mark.parametrize("start_method", ["fork", "spawn"], indirect=True)
@pytest.mark.parametrize("exhausted", ["epoch", "stop"])
def test_a_mixtures_datasets_are_indexed_before_the_workers_start(wiki, pydocs, start_method, exhausted,
                                                                monkeypatch):
    """Every dataset of a mixture, at the epoch it is in where the mixture epoch begins (epoch 1 here: the
    `epoch` policy has wrapped the smaller dataset by then)."""
    from pretok_lib.data.order import Position

    monkeypatch.setattr(shared_index, "MIN_BYTES", 0)

    def mixture(probe=ShardedBatches, **kw):
        src = open_mixture([(wiki.dirs["pretok-token-list"], 3), (pydocs.dirs["pretok-memmap"], 1)], 64,
                           exhausted=exhausted)
        ds = probe(src, 4, 0, 1, **kw)
        ds.position = Position(1, 0, None)
        return ds

    whole = [content(b) for b in run(mixture(), num_workers=0, limit=8)[1]]
    got = [content(b) for b in run(mixture(Probe), num_workers=2, limit=8)[1]]
    assert [{k: v for k, v in b.items() if k not in ("prebuilt", "shared")} for b in got] == whole
    assert {(b["prebuilt"], b["shared"]) for b in got} == {(1, int(start_method == "spawn"))}


@pytest.mark.parametrize("start_method", ["spawn"], indirect=True)
def test_without_room_in_shared_memory_the_arrays_travel_by_value(wiki, start_method, monkeypatch, tmp_path):
    """A container's small /dev/shm (or none): nothing is put there; spawned workers get copies, same stream."""
    monkeypatch.setattr(shared_index, "MIN_BYTES", 0)
    monkeypatch.setattr(shared_index, "SHM_DIR", str(tmp_path / "no-shm"))
    for kind in PRETOK_KINDS:
        whole = _stream(lambda: dataset(wiki, kind, 64, micro_batch=4), 0)
        got = [content(b) for b in run(Probe(dataset(wiki, kind, 64).source, 4, 0, 1), num_workers=2, limit=12)[1]]
        assert [{k: v for k, v in b.items() if k not in ("prebuilt", "shared")} for b in got] == whole, kind
        assert {(b["prebuilt"], b["shared"]) for b in got} == {(1, 0)}, kind


@pytest.mark.parametrize("kind", PRETOK_KINDS)
def test_a_workers_pickle_does_not_grow_with_the_documents(wiki, pydocs, kind, monkeypatch):
    """What a spawned worker receives (torch's ForkingPickler) once the epoch's index is built: handles to the
    shared arrays, a few KB whatever the number of documents."""
    monkeypatch.setattr(shared_index, "MIN_BYTES", 0)
    sizes = {}
    for corpus in (wiki, pydocs):
        ds = dataset(corpus, kind, 64, micro_batch=4)
        ds.source.prepare(0)
        buf = io.BytesIO()
        ForkingPickler(buf).dump(ds)
        docs = ds.source.rows.num_rows if hasattr(ds.source, "rows") else len(ds.source.doc_lengths)
        sizes[corpus.name] = (len(buf.getvalue()), docs)
        assert _stream(lambda: ForkingPickler.loads(buf.getvalue()), 0, 6) == _stream(lambda: ds, 0, 6)
    (small, few), (large, many) = sorted(sizes.values(), key=lambda s: s[1])
    assert many > 2 * few and large < small + 1024 and large < 16_384, sizes


def test_shared_arrays_are_made_once_per_array_and_bounded_in_number(monkeypatch):
    a = np.arange(300_000, dtype=np.int64)
    t = shared_index.shared(a)
    assert t is not None and t.is_shared() and shared_index.shared(a) is t
    assert np.array_equal(shared_index.unshared(t), a)
    assert shared_index.shared(a[:10]) is None  # below MIN_BYTES: by value
    assert shared_index.shareable(a[:10]) is not None and np.array_equal(shared_index.unshared(a[:10]), a[:10])
    # each shared array is a file descriptor in every worker: past MAX_SHARED, arrays travel by value
    monkeypatch.setattr(shared_index, "MAX_SHARED", len(shared_index._SHARED))
    b = a + 1
    assert shared_index.shared(b) is None and shared_index.shared(a) is t
    assert shared_index.shareable(b) is b
    del t, a
    import gc

    gc.collect()
    assert shared_index.shared(b) is not None  # a freed array's slot is taken again


@pytest.mark.parametrize("dtype", [">i8", "datetime64[s]", "U2", object])
def test_arrays_torch_cannot_hold_travel_by_value(dtype):
    a = np.zeros(1 << 18, dtype=dtype)  # >= MIN_BYTES
    assert shared_index.shared(a) is None and shared_index.shareable(a) is a
