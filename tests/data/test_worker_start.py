"""DataLoader workers started by spawn or forkserver (macOS's default; Linux's from Python 3.14) receive the dataset
pickled: every path serves the stream it serves in-process, and a memmap dataset travels as its paths, never as
its tokens, so the worker memory bound holds whatever the dataset's size."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import pytest

from pretok_lib.data import make_loader, open_mixture
from pretok_lib.errors import PretokError
from pretok_lib.formats.memmap import MemmapDataset

from .helpers import KINDS, content, dataset, run


@pytest.fixture
def start_method(request):
    """The global start method DataLoader workers use (torch takes Python's default), restored afterwards."""
    before = mp.get_start_method()
    mp.set_start_method(request.param, force=True)
    yield request.param
    mp.set_start_method(before, force=True)


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
