"""Bad input to the data paths: a clear PretokError naming the offending file, never a traceback from numpy,
pyarrow or the DataLoader: wrong format, wrong tokenizer, a seq_len the padded file cannot hold, truncated or
corrupted files, an edited manifest, an unknown data path."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pretok_lib.data import make_dataset, make_loader
from pretok_lib.errors import PretokError
from pretok_lib.formats.manifest import write_manifest

from ..conftest import CL100K_JSON, GPT2_JSON
from .helpers import PAD_SEQ_LEN

PRETOK = ("pretok-padded", "pretok-token-list", "pretok-memmap")


def open_and_read(kind, path, seq_len=32, **kw):
    """Open a data path and read one batch (some checks happen on first use)."""
    ds = make_dataset(kind, path, seq_len, micro_batch=2, rank=0, world=1, **kw)
    return next(iter(make_loader(ds)))


def fails(match: str, where: Path, kind, path, **kw) -> PretokError:
    with pytest.raises(PretokError, match=match) as e:
        open_and_read(kind, path, **kw)
    assert str(where) in str(e.value), str(e.value)
    return e.value


@pytest.fixture
def copy_of(wiki, tmp_path):
    def copy(kind: str) -> Path:
        dst = tmp_path / kind
        shutil.copytree(wiki.dirs[kind], dst)
        return dst

    return copy


@pytest.mark.parametrize("kind", PRETOK)
@pytest.mark.parametrize("other", PRETOK)
def test_format_mismatch(wiki, kind, other):
    if kind == other:
        assert open_and_read(kind, wiki.dirs[other])["input_ids"].shape == (2, 32)
        return
    fmt = other.removeprefix("pretok-")
    fails(f"holds format '{fmt}', expected '{kind.removeprefix('pretok-')}'", wiki.dirs[other] / "manifest.json",
          kind, wiki.dirs[other])


@pytest.mark.parametrize("kind", PRETOK)
def test_tokenizer_mismatch(wiki, kind):
    fails("not the requested tokenizer", wiki.dirs[kind] / "manifest.json", kind, wiki.dirs[kind],
          tokenizer=str(CL100K_JSON))
    assert open_and_read(kind, wiki.dirs[kind], tokenizer=str(GPT2_JSON))["input_ids"].shape == (2, 32)


def test_seq_len_larger_than_padded_rows(wiki):
    d = wiki.dirs["pretok-padded"]
    e = fails(f"seq_len 256 needs rows of 257 tokens; this file holds {PAD_SEQ_LEN + 1}", d, "pretok-padded", d,
              seq_len=256)
    assert f"--seq-len {PAD_SEQ_LEN}" in str(e)
    assert open_and_read("pretok-padded", d, seq_len=PAD_SEQ_LEN)["input_ids"].shape == (2, PAD_SEQ_LEN)
    fails("seq_len 129 needs rows of 130", d, "pretok-padded", d, seq_len=PAD_SEQ_LEN + 1)


@pytest.mark.parametrize("name", ["data.bin", "data.idx"])
def test_truncated_memmap(copy_of, name):
    d = copy_of("pretok-memmap")
    f = d / name
    f.write_bytes(f.read_bytes()[:-6])
    fails("truncated", f, "pretok-memmap", d)


@pytest.mark.parametrize("kind", ["pretok-padded", "pretok-token-list"])
def test_truncated_parquet(copy_of, kind):
    d = copy_of(kind)
    (part,) = sorted(d.glob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-100])
    fails("truncated", part, kind, d)


@pytest.mark.parametrize("kind", ["pretok-padded", "pretok-token-list"])
@pytest.mark.parametrize("where", [0.5, 0.02])
def test_corrupted_parquet_same_size(copy_of, kind, where):
    """Flipped bytes inside the data pages (size unchanged). At 2% of the file the zstd page still decodes,
    into wrong tokens: only the manifest's checksum can tell."""
    d = copy_of(kind)
    (part,) = sorted(d.glob("*.parquet"))
    raw = bytearray(part.read_bytes())
    i = int(len(raw) * where)
    raw[i : i + 4] = bytes(b ^ 0xFF for b in raw[i : i + 4])
    part.write_bytes(bytes(raw))
    fails("checksum differs from manifest.json", part, kind, d)


@pytest.mark.parametrize("kind", ["pretok-padded", "pretok-token-list"])
@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_a_dataloader_worker_is_still_one_line(copy_of, kind, workers):
    """torch re-raises a worker's exception as type(e)("Caught ... Original Traceback ...", 40 lines): a
    PretokError keeps its one line (the trainer prints it as `pretok: error: ...`)."""
    d = copy_of(kind)
    (part,) = sorted(d.glob("*.parquet"))
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    part.write_bytes(bytes(raw))
    ds = make_dataset(kind, d, 32, micro_batch=2, rank=0, world=1)
    with pytest.raises(PretokError, match="checksum differs from manifest.json") as e:
        next(iter(make_loader(ds, num_workers=workers)))
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{part}: "), str(e.value)


@pytest.mark.parametrize("region", ["pointers", "document_indices", "magic"])
def test_corrupted_memmap_index_same_size(copy_of, region):
    d = copy_of("pretok-memmap")
    idx = d / "data.idx"
    raw = bytearray(idx.read_bytes())
    n = (len(raw) - 34 - 8) // 20  # header 34 bytes; per document: length 4 + pointer 8 + doc index 8; one more index
    at = {"pointers": 34 + 4 * n + 8 * (n // 2), "document_indices": len(raw) - 8 * (n // 2), "magic": 0}[region]
    raw[at : at + 4] = bytes(b ^ 0xFF for b in raw[at : at + 4])
    idx.write_bytes(bytes(raw))
    fails("corrupt|magic", idx, "pretok-memmap", d)


@pytest.mark.parametrize("kind", PRETOK)
def test_hand_edited_manifest(copy_of, kind):
    d = copy_of(kind)
    m = json.loads((d / "manifest.json").read_text())
    m["counts"]["documents"] += 1
    (d / "manifest.json").write_text(json.dumps(m))
    fails("manifest_sha256 does not match", d / "manifest.json", kind, d)


@pytest.mark.parametrize("kind", PRETOK)
def test_manifest_disagreeing_with_the_data(copy_of, kind):
    """A self-consistent manifest (checksum recomputed) claiming one document more than the files hold."""
    d = copy_of(kind)
    m = json.loads((d / "manifest.json").read_text())
    m["counts"]["documents"] += 1
    write_manifest(d, m)
    fails("manifest.json says", d, kind, d)


def test_not_a_pretok_output(tmp_path, wiki):
    fails(re.escape("no manifest.json (not a pretok output)"), tmp_path, "pretok-memmap", tmp_path)
    (tmp_path / "unfinished" / ".pretok").mkdir(parents=True)   # a run's state, no manifest yet: interrupted
    (tmp_path / "data.bin").write_bytes(b"\0" * 8)                # a data file given for its directory
    cases = {wiki.text.parent / "nothing-here": "no such directory", tmp_path / "data.bin": "a file, not a pretok",
             tmp_path / "unfinished": "interrupted run? rerun the same command"}
    for kind in PRETOK:
        for path, why in cases.items():
            with pytest.raises(PretokError, match=re.escape(why)):
                open_and_read(kind, path)


def test_unknown_kind_and_bad_arguments(wiki):
    with pytest.raises(PretokError, match="unknown data path 'memmap'.*pretok-memmap"):
        make_dataset("memmap", wiki.dirs["pretok-memmap"], 32)
    with pytest.raises(PretokError, match="seq_len must be >= 1"):
        make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 0)
    for kind in ("padded", "padding-free"):
        with pytest.raises(PretokError, match="give a tokenizer"):
            make_dataset(kind, wiki.text, 32)


def test_state_of_another_data_order_is_refused(wiki):
    """A loader state records what it is a position in: another seed or sequence length is refused."""
    ds = make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 32, micro_batch=2, rank=0, world=1, seed=1)
    loader = make_loader(ds)
    next(iter(loader))
    state = loader.state_dict()
    other = make_loader(make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 32, micro_batch=2, rank=0,
                                     world=1, seed=2))
    with pytest.raises(PretokError, match="seed"):
        other.load_state_dict(state)
    longer = make_loader(make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 64, micro_batch=4, rank=0,
                                      world=1, seed=1))
    with pytest.raises(PretokError, match="window"):
        longer.load_state_dict(state)
    elastic = make_loader(make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 32, micro_batch=4, rank=0,
                                       world=1, seed=1))
    elastic.load_state_dict(state)  # another global batch is fine (elastic resume)
    assert elastic.position.consumed == 2


def test_rank_without_world_is_refused(wiki):
    with pytest.raises(ValueError, match="both rank and world"):
        make_dataset("pretok-memmap", wiki.dirs["pretok-memmap"], 32, micro_batch=2, rank=1)
