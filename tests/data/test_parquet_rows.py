"""The bounded parquet readers (`PaddedRows`, `TokenListPacked` over `parquet_rows.ParquetRows`): the same sample
stream as the in-RAM readers they replaced (`data/inram.py`) and as the memmap path on the same tokens, for random
datasets cut into many row groups and parts, with a cache far smaller than the data; token-list files without
the footer lengths (older files) read the same; the block order is a deterministic permutation touching a
window of row groups at a time; resume mid-epoch is exact in both orders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pretok_lib.data import make_loader, make_source
from pretok_lib.data.collate import collate
from pretok_lib.data.inram import InRamPaddedRows, InRamTokenList
from pretok_lib.data.loader import ShardedBatches
from pretok_lib.data.order import block_permutation, epoch_permutation
from pretok_lib.errors import PretokError
from pretok_lib.formats import parquet as pqf
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from .helpers import GPT2, content

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
WORDS = "the of a to in is was for on that by with as at from alpha beta gamma delta zeta <|endoftext|> é 日本".split()


def random_text(path, seed: int, docs: int) -> None:
    rng = np.random.default_rng(seed)
    lens = rng.choice([1, 3, 20, 90, 400], size=docs, p=[0.2, 0.2, 0.3, 0.2, 0.1])
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS, n))}) + "\n" for n in lens))


def tokenize(text, out, fmt: str, seq_len: int = 40, **kw) -> None:
    run_tokenize(TokenizeConfig(inputs=[str(text)], out=str(out), tokenizer=GPT2, format=fmt, seq_len=seq_len,
                                workers=0, progress=False, part_mb=0.01, batch_mb=0.003, **kw))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Two random corpora, each pretokenized into padded / token-list / memmap with row groups of ~300 token
    slots (many row groups in several parts); padded and token-list also as written before footers held lengths."""
    base, out = tmp_path_factory.mktemp("pqrows"), []
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(pqf, "ROW_GROUP_TOKENS", 300)
        for seed in range(2):
            text = base / f"c{seed}.jsonl"
            random_text(text, seed, 150 + 100 * seed)
            dirs = {fmt: base / f"{seed}-{fmt}" for fmt in ("padded", "token-list", "memmap")}
            for fmt, d in dirs.items():
                tokenize(text, d, fmt)
            mp.setattr(pqf.ParquetPartWriter, "record_doc_lengths", False)
            for fmt in ("padded", "token-list"):
                dirs[f"{fmt}-old"] = base / f"{seed}-{fmt}-old"
                tokenize(text, dirs[f"{fmt}-old"], fmt)
            mp.setattr(pqf.ParquetPartWriter, "record_doc_lengths", True)
            out.append(dirs)
    finally:
        mp.undo()
    return out


def stream(src, epochs=(0, 1)) -> list[tuple]:
    out = []
    for e in epochs:
        for k in range(src.num_samples):
            s = src.sample(e, k)
            out.append((tuple(s.tokens.tolist()), None if s.mask is None else tuple(s.mask.tolist()),
                        None if s.starts is None else tuple(s.starts.tolist())))
    return out


@pytest.mark.parametrize("i", range(2))
@pytest.mark.parametrize("seq_len,seed,shuffle", [(7, 0, True), (40, 3, True), (16, 1, False)])
def test_same_stream_as_in_ram_readers_and_memmap(datasets, i, seq_len, seed, shuffle):
    d, kw = datasets[i], dict(seed=seed, shuffle=shuffle)
    want = stream(InRamPaddedRows(d["padded"], seq_len, **kw))
    for name in ("padded", "padded-old"):  # masks from the footer's row lengths / decoded
        pad = make_source("pretok-padded", d[name], seq_len, cache_mb=0, order="exact", **kw)
        assert pad.rows.group_rows.size > 10 and len(pad.rows.files) > 1  # many row groups, several parts
        assert pad.rows.mask_from_lengths == [name == "padded"] * len(pad.rows.files)
        assert stream(pad) == want, name
    want = stream(InRamTokenList(d["token-list"], seq_len, **kw))
    assert want == stream(make_source("pretok-memmap", d["memmap"], seq_len, **kw))
    for name in ("token-list", "token-list-old"):
        tl = make_source("pretok-token-list", d[name], seq_len, cache_mb=0, order="exact", **kw)
        assert tl.rows.group_rows.size > 10
        assert stream(tl) == want, name
        assert len(tl.rows._cache) <= tl.rows.min_groups == 2  # cache_mb=0: only the minimum is kept


def test_layouts_the_page_reader_declines_are_read_through_pyarrow(datasets, monkeypatch):
    """When `parquet_pages.leaf_values` declines a layout (None), the row groups are read with pyarrow: the same
    stream (token lists with their offsets checked against the known lengths)."""
    import pretok_lib.data.parquet_rows as pr

    d, kw = datasets[0], dict(seed=2, shuffle=True)
    want_pad = stream(InRamPaddedRows(d["padded"], 16, **kw), epochs=(0,))
    want_tl = stream(InRamTokenList(d["token-list"], 16, **kw), epochs=(0,))
    monkeypatch.setattr(pr, "leaf_values", lambda *a: None)
    for name in ("padded", "padded-old"):
        assert stream(make_source("pretok-padded", d[name], 16, cache_mb=0, order="exact", **kw), (0,)) == want_pad
    for name in ("token-list", "token-list-old"):
        src = make_source("pretok-token-list", d[name], 16, cache_mb=0, order="exact", **kw)
        assert stream(src, (0,)) == want_tl
    src.rows.lengths[3] += 1  # lengths that disagree with the file's offsets
    src.rows._cache.clear()
    with pytest.raises(PretokError, match="document lengths differ"):
        stream(src, (0,))


def test_footer_lengths_are_written_and_checked(datasets, tmp_path):
    d = datasets[0]
    import pyarrow.parquet as pq

    for part in sorted(d["token-list"].glob("*.parquet")):
        meta = pq.read_metadata(part)
        lens = pqf.doc_lengths_of(meta, part)
        col = pq.read_table(part).column("input_ids").combine_chunks()
        assert np.array_equal(lens, np.diff(col.offsets.to_numpy()))
    for part in sorted(d["token-list-old"].glob("*.parquet")):
        assert pqf.doc_lengths_of(pq.read_metadata(part), part) is None
    for part in sorted(d["padded"].glob("*.parquet")):
        lens = pqf.doc_lengths_of(pq.read_metadata(part), part, pqf.ROW_LENGTHS_KEY)
        mask = pq.read_table(part).column("attention_mask").combine_chunks().flatten().to_numpy()
        assert np.array_equal(lens, mask.reshape(len(lens), -1).sum(axis=1))
    for part in sorted(d["padded-old"].glob("*.parquet")):
        assert pqf.doc_lengths_of(pq.read_metadata(part), part, pqf.ROW_LENGTHS_KEY) is None


@pytest.mark.parametrize("block", [1, 3, 1000])
def test_block_order_is_a_deterministic_windowed_permutation(block):
    rng = np.random.default_rng(block)
    counts = rng.integers(0, 9, size=40)
    firsts = np.concatenate([[0], np.cumsum(counts)])
    group_of = np.repeat(np.arange(len(counts)), counts)
    for seed, epoch in [(0, 0), (0, 1), (5, 0)]:
        p = block_permutation(counts, seed, epoch, True, block)
        assert np.array_equal(p, block_permutation(counts, seed, epoch, True, block))
        assert sorted(p.tolist()) == list(range(firsts[-1]))
        # consecutive windows: the rows of `block` row groups (in the seeded group order) at a time
        gperm = np.random.default_rng([seed, epoch, 1]).permutation(len(counts))
        pos = 0
        for w in range(0, len(gperm), block):
            n = int(counts[gperm[w : w + block]].sum())
            assert set(group_of[p[pos : pos + n]].tolist()) <= set(gperm[w : w + block].tolist())
            pos += n
    assert not np.array_equal(block_permutation(counts, 0, 0, True, block), block_permutation(counts, 0, 1, True, block))
    # at most `block` row groups: one window, exactly the exact order
    few = counts[: min(block, len(counts))]
    assert np.array_equal(block_permutation(few, 3, 2, True, block), epoch_permutation(int(few.sum()), 3, 2, True))
    assert np.array_equal(block_permutation(counts, 0, 0, False, block), np.arange(firsts[-1]))


@pytest.mark.parametrize("kind,fmt", [("pretok-padded", "padded"), ("pretok-token-list", "token-list")])
def test_block_order_reads_each_row_group_about_once_per_epoch(datasets, kind, fmt):
    d = datasets[1]
    blk = make_source(kind, d[fmt], 7, order="block", block_groups=4, cache_mb=0)
    ex = make_source(kind, d[fmt], 7, cache_mb=0, order="exact")
    groups = blk.rows.group_rows.size
    blk.ahead = None  # the order's own locality; the read-ahead thread's timing is checked below
    got = stream(blk, epochs=(0,))
    assert sorted(got) == sorted(stream(ex, epochs=(0,))) if kind == "pretok-padded" else len(got) == len(stream(ex, (0,)))
    assert blk.rows.decoded <= groups + 8  # a window's groups stay cached (+ neighbours of packed windows)
    ahead = make_source(kind, d[fmt], 7, order="block", block_groups=4, cache_mb=0)
    assert stream(ahead, epochs=(0,)) == got and ahead.rows.decoded <= 2 * groups + 8  # however the thread runs
    assert ex.rows.decoded > 3 * groups  # the exact order thrashes a cache this small


@pytest.mark.parametrize("block", [2, 3, 4])
@pytest.mark.parametrize("kind,fmt", [("pretok-token-list", "token-list"), ("pretok-padded", "padded")])
def test_the_read_ahead_never_evicts_the_window_it_read_ahead(datasets, kind, fmt, block):
    """With the cache at its floor (two windows and one group), reading a window bumped its groups past the next
    window's, read ahead but not yet touched, so the read-ahead after it evicted exactly those: 66-95 decodes of 62
    row groups an epoch, by the thread's timing. Through the loader (batches), as training reads. The padded batch
    path read without bumping a hit, so a window decoded early could be evicted while still read (24 decodes of
    15 groups once, under the full suite's load): every read path now makes what it reads the newest."""
    from pretok_lib.data import ShardedBatches, make_loader

    for d in datasets:
        src = make_source(kind, d[fmt], 7, seed=2, order="block", block_groups=block, cache_mb=0)
        assert len(src.rows.group_rows) > 3 * block
        for _ in make_loader(ShardedBatches(src, 4, 0, 1)):
            pass
        assert src.rows.decoded <= len(src.rows.group_rows) + 2, (src.rows.decoded, len(src.rows.group_rows))


@pytest.mark.parametrize("name", ["padded", "padded-old", "mixed"])
@pytest.mark.parametrize("order,block", [("block", 1), ("block", 3), ("exact", 16)])
def test_padded_batches_gathered_at_once_equal_the_collated_samples(datasets, name, order, block):
    """`PaddedRows.batch` (what the loader asks for) is `collate` of `sample` for every k, with masks from the
    footer's row lengths, decoded (older files) or both in one batch (parts of either kind merged); batches
    of 5 rows cross windows of 1 or 3 row groups and parts."""
    src = make_source("pretok-padded", datasets[1]["padded-old" if name == "padded-old" else "padded"], 9,
                      seed=4, order=order, block_groups=block, cache_mb=0)
    if name == "mixed":  # the first part as if written before footers held row lengths
        src.rows.mask_from_lengths[0] = False
    kinds, group = set(), src.rows.group  # the row groups the batches read: masks decoded (2-d) or lengths (1-d)
    src.rows.group = lambda g: (lambda e: (kinds.add(e[1].ndim), e)[1])(group(g))
    for epoch in (0, 1):
        for first in range(0, src.num_samples - 5, 5):
            got = src.batch(epoch, first, first + 5)
            want = collate([src.sample(epoch, k) for k in range(first, first + 5)])
            assert list(got) == list(want)
            for key, v in want.items():
                assert (v.tolist() if isinstance(v, torch.Tensor) else v) == \
                    (got[key].tolist() if isinstance(got[key], torch.Tensor) else got[key]), (epoch, first, key)
    assert kinds == {"padded": {1}, "padded-old": {2}, "mixed": {1, 2}}[name]


def test_evicted_buffers_are_reused_only_when_nothing_holds_them(datasets, monkeypatch):
    """An evicted row group's ids buffer is decoded into again (no fresh memory per decode), but never while a
    served sample still views it."""
    import pretok_lib.data.parquet_rows as pr

    reused = []
    real = pr.leaf_values
    monkeypatch.setattr(pr, "leaf_values", lambda *a: (reused.append(a[-1] is not None), real(*a))[1])
    src = make_source("pretok-padded", datasets[1]["padded"], 9, seed=1, order="block", block_groups=1, cache_mb=0)
    src.ahead = None
    held = [src.sample(0, k) for k in (0, 1)]  # views into their row groups' buffers
    kept = [s.tokens.copy() for s in held]
    want = stream(make_source("pretok-padded", datasets[1]["padded"], 9, seed=1, order="exact", cache_mb=0),
                  epochs=(0,))
    assert sorted(stream(src, epochs=(0,))) == sorted(want)  # the whole epoch: every group evicted at least once
    assert sum(reused) > len(reused) // 2 and all(np.array_equal(s.tokens, k) for s, k in zip(held, kept))
    rows = src.rows  # the rule itself: a buffer is kept for reuse only when nothing else holds it or a view
    rows._cache.clear()
    rows._spares = []
    ids = rows.group(0)[0]
    rows._cache.clear()
    view = ids[0]  # a served sample's tokens
    rows._recycle(ids)
    others = [ids]  # the array itself held elsewhere (a batch being gathered)
    del view
    rows._recycle(ids)
    assert rows._spares == []
    del others
    rows._recycle(ids)
    assert len(rows._spares) == 1 and rows._spares[0] is ids.base


@pytest.mark.parametrize("order", ["exact", "block"])
@pytest.mark.parametrize("kind,fmt", [("pretok-padded", "padded"), ("pretok-token-list", "token-list")])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch(datasets, kind, fmt, order, workers):
    def fresh():
        src = make_source(kind, datasets[1][fmt], 9, seed=2, order=order, block_groups=3, cache_mb=0)
        return ShardedBatches(src, 2, rank=1, world=2)

    full = [content(b) for b in make_loader(fresh(), num_workers=workers)]
    k = len(full) // 2
    loader = make_loader(fresh(), num_workers=workers)
    head = [content(b) for _, b in zip(range(k), loader)]  # range first: zip must not pull batch k+1
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["order"] == order
    resumed = make_loader(fresh(), num_workers=workers)
    resumed.load_state_dict(state)
    assert head + [content(b) for b in resumed] == full


def test_order_is_part_of_the_loader_state(datasets):
    d = datasets[0]
    mk = lambda order: make_loader(ShardedBatches(make_source("pretok-token-list", d["token-list"], 9, order=order),
                                                  2, rank=0, world=1))
    state = mk("block").state_dict()
    with pytest.raises(PretokError, match="differs in: order"):
        mk("exact").load_state_dict(state)
    with pytest.raises(PretokError, match="data order 'block' applies to the parquet paths"):
        make_source("pretok-memmap", d["memmap"], 9, order="block")
    with pytest.raises(PretokError, match="unknown data order 'random'"):
        make_source("pretok-padded", d["padded"], 9, order="random")


def replicate(src, dst, copies: int) -> dict:
    """An output made of `copies` hard links of every part of `src` (its manifest's counts multiplied)."""
    from pretok_lib.formats.manifest import read_manifest, write_manifest

    m = read_manifest(src)
    dst.mkdir()
    files = []
    for c in range(copies):
        for f in m["files"]:
            name = f"part-{len(files):06d}.parquet"
            (dst / name).hardlink_to(src / f["path"])
            files.append({**f, "path": name})
    counts = {**m["counts"], **{k: m["counts"][k] * copies for k in ("documents", "tokens")}}
    write_manifest(dst, {**m, "files": files, "counts": counts, "parts": []})
    return counts


PEAK = """
import sys
from pretok_lib.data import make_source
from pretok_lib.data.inram import InRamTokenList
how, path = sys.argv[1], sys.argv[2]
peak = lambda: int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
open("/proc/self/clear_refs", "w").write("5")  # peak RSS := current (ru_maxrss would include the parent's)
base = peak()
if how == "in-ram":
    src, step = InRamTokenList(path, 128), 10**9
else:
    src = make_source("pretok-token-list", path, 128, order=how, cache_mb=4, block_groups=2)
    step = 7 if how == "block" else 997
for k in range(0, src.num_samples, step):
    src.sample(0, k)
print(peak() - base, getattr(getattr(src, "rows", None), "decoded", 0))
"""


def test_peak_memory_is_bounded_by_the_cache_not_the_dataset(pydocs, tmp_path):
    """Token lists of ~12 MB and ~116 MB of ids, each read in a fresh process with a 4 MB cache (smaller than both): the bounded
    reader's peak RSS growth is the same for both (fixed costs: pyarrow's pools and threads, the cache), where the
    in-RAM reader's grows by more than the extra ids. Memory, not time, is asserted."""
    import subprocess
    import sys

    small, big = (replicate(pydocs.dirs["pretok-token-list"], tmp_path / f"x{n}", n) for n in (30, 300))
    extra = 2 * (big["tokens"] - small["tokens"])
    assert extra > 90e6
    grew = {}
    for how in ("in-ram", "block", "exact"):
        for n in (30, 300):
            out = subprocess.run([sys.executable, "-c", PEAK, how, str(tmp_path / f"x{n}")], capture_output=True,
                                 text=True, timeout=300, check=True)
            grew[how, n] = [int(x) for x in out.stdout.split()]
    assert grew["in-ram", 300][0] - grew["in-ram", 30][0] > extra, grew
    for how in ("block", "exact"):
        assert grew[how, 300][0] - grew[how, 30][0] < 30e6, grew  # not the 104 MB more of ids (in-RAM: +220 MB)
        assert grew[how, 300][0] < 200e6, grew  # fixed costs (pyarrow pools, threads) + 4 MB cache
    assert grew["block", 300][1] > 250, grew  # every part was read: the cache was cycled through, not held


@pytest.mark.parametrize("order", ["exact", "block"])
@pytest.mark.parametrize("kind,fmt", [("pretok-padded", "padded"), ("pretok-token-list", "token-list")])
def test_a_corrupted_part_read_later_is_one_line_naming_it(datasets, tmp_path, kind, fmt, order):
    """Flipped bytes (size unchanged) in the last part: reading on (also through the block order's read-ahead
    thread) stops with the checksum error naming that part, before any of its rows is served."""
    import shutil

    d = tmp_path / fmt
    shutil.copytree(datasets[0][fmt], d)
    last = sorted(d.glob("*.parquet"))[-1]
    raw = bytearray(last.read_bytes())
    raw[len(raw) // 3] ^= 0xFF
    last.write_bytes(bytes(raw))
    src = make_source(kind, d, 7, order=order, block_groups=2, cache_mb=0)
    with pytest.raises(PretokError, match="checksum differs from manifest.json") as e:
        for k in range(src.num_samples):
            src.sample(0, k)
    assert str(last) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PretokError, match="checksum differs"):
        make_source(kind, d, 7, order=order, verify_on_open=True)
