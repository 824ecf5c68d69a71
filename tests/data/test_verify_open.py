"""`verify_on_open`: a flipped byte in data.bin or in data.idx's document index is caught when the dataset is opened
(it trains silently without), once per change of the files (a stamp), also on a read-only dataset."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from pretok_lib.data import make_source
from pretok_lib.data.verify_open import STAMP, _stamp_paths, verify_files
from pretok_lib.errors import PretokError
from pretok_lib.formats.manifest import read_manifest
from pretok_lib.train.config import load_config

from ..conftest import needs_root
from .test_errors import open_and_read


@pytest.fixture
def memmap(wiki, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PRETOK_CACHE_DIR", str(tmp_path / "cache"))
    dst = tmp_path / "memmap"
    shutil.copytree(wiki.dirs["pretok-memmap"], dst)
    return dst


def flip(path: Path, at: int, keep_mtime: bool = False) -> None:
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def opened(path: Path) -> bool:
    """Open with verify_on_open; True when the files were hashed (not covered by a stamp)."""
    return make_source("pretok-memmap", path, 32, verify_on_open=True).verified_now


@pytest.mark.parametrize("seed", range(4))
def test_flipped_token_byte_is_caught_on_open_only_when_asked(memmap, seed):
    size = (memmap / "data.bin").stat().st_size
    flip(memmap / "data.bin", random.Random(seed).randrange(size))
    open_and_read("pretok-memmap", memmap)  # the known limitation: the plain open reads no token data
    with pytest.raises(PretokError, match="checksum differs from manifest.json") as e:
        open_and_read("pretok-memmap", memmap, verify_on_open=True)
    assert str(memmap / "data.bin") in str(e.value) and "\n" not in str(e.value)


def test_flipped_document_index_byte_is_caught(memmap):
    idx = memmap / "data.idx"
    flip(idx, idx.stat().st_size - 5)  # inside the last document index
    with pytest.raises(PretokError, match="checksum differs") as e:
        opened(memmap)
    assert str(idx) in str(e.value)


def test_checked_once_per_change(memmap):
    assert opened(memmap) is True and (memmap / ".pretok" / STAMP).is_file()
    assert opened(memmap) is False  # the stamp covers these very files
    flip(memmap / "data.bin", 100, keep_mtime=True)  # same size and mtime: the inode's ctime still changed
    with pytest.raises(PretokError, match="checksum differs"):
        opened(memmap)
    flip(memmap / "data.bin", 100)  # repaired: checked again, then stamped again
    assert opened(memmap) is True and opened(memmap) is False
    shutil.copytree(memmap, memmap.with_name("copy"), copy_function=shutil.copy2)  # a copy has its own inodes
    assert opened(memmap.with_name("copy")) is True


def test_stamp_of_another_manifest_is_not_trusted(memmap):
    assert opened(memmap) is True
    m = read_manifest(memmap)
    m["files"][0]["checksum"] = "xxh3_128:" + "0" * 32
    with pytest.raises(PretokError, match="checksum differs"):
        verify_files(memmap, m)


@needs_root
def test_read_only_dataset_stamps_in_the_cache_or_rechecks(memmap, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(memmap), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        assert opened(ro) is True and not (ro / ".pretok" / STAMP).exists()
        assert _stamp_paths(ro)[-1].is_file() and opened(ro) is False  # stamped in $PRETOK_CACHE_DIR
        os.environ["PRETOK_CACHE_DIR"] = str(ro / "cache")  # nowhere writable: checked at every open
        assert opened(ro) is True and opened(ro) is True
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_missing_data_file_is_one_line(memmap):
    m = read_manifest(memmap)
    (memmap / "data.bin").unlink()  # gone after the manifest was read
    with pytest.raises(PretokError, match="cannot read data file") as e:
        verify_files(memmap, m)
    assert str(memmap / "data.bin") in str(e.value)


@pytest.mark.parametrize("kind", ["pretok-padded", "pretok-token-list"])
def test_parquet_kinds_check_every_part_when_opened(wiki, tmp_path, kind):
    d = tmp_path / kind
    shutil.copytree(wiki.dirs[kind], d)
    part = d / read_manifest(d)["files"][0]["path"]
    flip(part, part.stat().st_size // 2)
    with pytest.raises(PretokError, match="checksum differs") as e:
        make_source(kind, d, 32, verify_on_open=True)  # no sample read yet
    assert str(part) in str(e.value)


def test_training_config_can_require_it(tmp_path):
    given = ["data.path=somewhere"]
    assert load_config(None, [*given, "data.verify_on_open=true"]).data.verify_on_open is True
    assert load_config(None, given).data.verify_on_open is False
    with pytest.raises(PretokError, match="verify_on_open"):
        load_config(None, [*given, "data.verify_on_open=maybe"])
