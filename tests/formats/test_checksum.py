"""checksum: XXH3-128 values for data files, hash trees over parts and input blocks; older sha256 entries still verify."""

from __future__ import annotations

import hashlib
from unittest import mock

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _root(ranges: list[bytes]) -> str:
    """The tree of docs/FORMATS.md written from the contract: XXH3-128 over (8-byte LE size, 16-byte digest)."""
    return xxhash.xxh3_128(b"".join(len(r).to_bytes(8, "little") + xxhash.xxh3_128(r).digest()
                                    for r in ranges)).hexdigest()


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=8), flip=st.integers(0, 599))
def test_a_parts_tree_checks_each_leaf_and_names_the_damaged_one(tmp_path_factory, data, cuts, flip):
    """Any cut of a file into leaves (empty ones included): the recorded value is the contract's root, the file
    matches; a byte changed anywhere is reported in the leaf that holds it; leaves that do not give the root, or a
    file of another size, are refused."""
    path = tmp_path_factory.mktemp("tree") / "data.bin"
    path.write_bytes(data)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    ranges = [data[a:b] for a, b in zip(bounds, bounds[1:])] or [b""]
    leaves = [[len(r), checksum.leaf_of(r)] for r in ranges]
    value = checksum.tree_value(leaves)
    assert value == "xxh3_128-parts:" + _root(ranges)
    assert checksum.matches(path, value, leaves) and checksum.entry_matches(path, {"checksum": value, "leaves": leaves})
    assert checksum.damaged_leaf(path, value, leaves[:-1] + [[leaves[-1][0], "0" * 32]]) == -1  # leaves edited
    if data:
        at = flip % len(data)
        path.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
        holder = next(k for k, (a, b) in enumerate(zip(bounds, bounds[1:])) if a <= at < b)
        assert checksum.damaged_leaf(path, value, leaves) == holder and not checksum.matches(path, value, leaves)
    path.write_bytes(data + b"\0")
    assert checksum.damaged_leaf(path, value, leaves) == -1
    with pytest.raises(ValueError, match="needs its recorded leaves"):
        checksum.of_file(path, checksum.PARTS)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4), block=st.integers(1, 16))
def test_an_inputs_blocks_tree_covers_every_file_of_a_directory_in_order(tmp_path_factory, sizes, block):
    """Inputs are hashed as fixed blocks (here `block` bytes) so workers can hash them apart; a directory's files
    in sorted order, an empty file as one empty block; the value is the contract's root over all blocks."""
    root = tmp_path_factory.mktemp("blocks")
    files = []
    for k, n in enumerate(sizes):
        data = bytes((k * 7 + i) % 251 for i in range(n))
        (root / f"f{k}.arrow").write_bytes(data)
        files.append(data)
    ranges = [r for d in files for r in ([d[i : i + block] for i in range(0, len(d), block)] or [b""])]
    with mock.patch.object(checksum, "BLOCK_BYTES", block):
        whole, first = checksum.of_file(root, checksum.BLOCKS), checksum.of_file(root / "f0.arrow", checksum.BLOCKS)
    assert whole == "xxh3_128-blocks:" + _root(ranges)
    assert first == "xxh3_128-blocks:" + _root(
        [files[0][i : i + block] for i in range(0, len(files[0]), block)] or [b""])
