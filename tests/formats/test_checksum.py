"""checksum: XXH3-128 values for data files; older sha256 entries still verify."""

from __future__ import annotations

import hashlib

import pytest
import xxhash

from pretok_lib.formats import checksum


def test_file_checksum_is_xxh3_128_and_streams_in_chunks(tmp_path):
    data = bytes(range(256)) * 40_000  # ~10 MB: several chunks
    path = tmp_path / "f"
    path.write_bytes(data)
    value = checksum.of_file(path, chunk=1 << 20)
    assert value == "xxh3_128:" + xxhash.xxh3_128(data).hexdigest() and len(value.split(":")[1]) == 32
    h = checksum.hasher()
    h.update(data[:123])
    h.update(data[123:])
    assert checksum.value(h) == value and checksum.matches(path, value)
    path.write_bytes(data[:-1] + b"\x00")
    assert not checksum.matches(path, value)


def test_older_sha256_entries_still_verify(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"tokens")
    legacy = {"path": "f", "size": 6, "sha256": "sha256:" + hashlib.sha256(b"tokens").hexdigest()}
    assert checksum.recorded(legacy) == legacy["sha256"] and checksum.matches(path, checksum.recorded(legacy))
    assert checksum.recorded({"checksum": "xxh3_128:00", "sha256": "sha256:11"}) == "xxh3_128:00"
    with pytest.raises(ValueError, match="unknown checksum algorithm 'md5'"):
        checksum.matches(path, "md5:abc")
