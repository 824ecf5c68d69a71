"""parts: the BOS/EOS policy on a flat batch (both code paths), the memmap part's hashes, and a part kept in memory
(spilled or not) placed as its files would be."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.engine.memmap_place import Placement, place_part, write_held
from pretok_lib.engine.parts import (PART_HASH_KEY, HeldPart, _ChecksummedPart, add_special, keep_limit,
                                     part_files_intact)
from pretok_lib.errors import PretokError


def reference(docs: list[list[int]], bos: int | None, eos: int | None) -> list[list[int]]:
    return [([bos] if bos is not None else []) + d + ([eos] if eos is not None else []) for d in docs]


def flat(docs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.uint64)
    ids = np.array([t for d in docs for t in d], dtype=np.uint32)
    return ids, offsets


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(0, 5), st.integers(500, 2000)), min_size=0, max_size=12),
       bos=st.sampled_from([None, 50256, 1]), eos=st.sampled_from([None, 50256, 2]),
       dtype=st.sampled_from([None, "uint16", "int32", "<u2"]))
def test_add_special_matches_per_document_reference(lengths, bos, eos, dtype):
    """Short documents take the boolean-mask path, long ones the per-document copies; both give the reference."""
    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(3, 50000, n).tolist() for n in lengths]
    ids, offsets = flat(docs)
    out, new_off = add_special(ids, offsets, bos, eos, dtype)
    assert out.dtype == (np.dtype(dtype) if dtype else ids.dtype) and new_off.dtype == np.int64
    got = [out[new_off[i]:new_off[i + 1]].tolist() for i in range(len(docs))]
    assert got == reference(docs, bos, eos)
    assert int(new_off[-1]) == len(out)


@pytest.mark.parametrize("doc_len", [3, 4000])
def test_add_special_both_paths_on_many_documents(doc_len):
    docs = [[7 + (i % 5)] * doc_len for i in range(300)]
    ids, offsets = flat(docs)
    out, new_off = add_special(ids, offsets, 1, 2, "uint16")
    assert np.array_equal(out, np.array([t for d in reference(docs, 1, 2) for t in d], dtype=np.uint16))


def test_checksummed_part_records_the_hashes_of_both_files(tmp_path):
    part = _ChecksummedPart(tmp_path / "p", "uint16")
    a, b = np.arange(10, dtype="<u2"), np.arange(100, 105, dtype="<u2")
    part.add(a, np.array([4, 6]))
    part.add(b, np.array([5]))
    stats = part.close()
    data, lens = (tmp_path / "p.bin").read_bytes(), (tmp_path / "p.lens").read_bytes()
    assert data == a.tobytes() + b.tobytes() and np.frombuffer(lens, "<i4").tolist() == [4, 6, 5]
    assert part.hashes() == [xxhash.xxh3_128_hexdigest(data), xxhash.xxh3_128_hexdigest(lens)]
    assert stats == {"documents": 3, "tokens": 15, "bin_bytes": 30}
    record = {"documents": 3, "tokens": 15, PART_HASH_KEY: part.hashes()}
    assert part_files_intact(tmp_path / "p", record, 2)
    assert not part_files_intact(tmp_path / "p", {**record, "tokens": 14}, 2)  # size differs
    assert not part_files_intact(tmp_path / "p", {**record, PART_HASH_KEY: part.hashes()[0]}, 2)  # a malformed record
    older = {**record, PART_HASH_KEY: [xxhash.xxh3_64_intdigest(data), xxhash.xxh3_64_intdigest(lens)]}
    assert not part_files_intact(tmp_path / "p", older, 2)  # a record of an earlier version (XXH3-64): redone
    (tmp_path / "p.lens").write_bytes(lens[:-4] + b"\x06\x00\x00\x00")  # same size, other bytes
    assert not part_files_intact(tmp_path / "p", record, 2)


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=6), min_size=0, max_size=8),
       limit=st.integers(0, 400), dtype=st.sampled_from(["uint16", "int32"]), offsets=st.tuples(
           st.integers(0, 64), st.integers(0, 64)))
def test_a_kept_part_writes_what_its_files_would_hold_spilled_or_not(tmp_path_factory, chunks, limit, dtype, offsets):
    """Batches of documents (lengths generated) added to a part kept in memory with a generated spill limit: its
    hashes are those of a part streamed to files, and placed at generated offsets, kept (`write_held`) or spilled
    (`place_part` from its files), the targets hold the same bytes as from the streamed part."""
    d = tmp_path_factory.mktemp("held")
    rng = np.random.default_rng(len(chunks) * 1000 + limit)
    ref, held = _ChecksummedPart(d / "ref", dtype), HeldPart(d / "held", dtype, limit=limit)
    for lens in chunks:
        ids = rng.integers(0, 60000, sum(lens)).astype(np.dtype(dtype).newbyteorder("<"))
        ref.add(ids, np.array(lens, dtype=np.int64))
        held.add(ids, np.array(lens, dtype=np.int64))
    ref.close()
    held.close()
    assert held.hashes() == ref.hashes()
    total = sum(sum(lens) * np.dtype(dtype).itemsize + 4 * len(lens) for lens in chunks)  # ids + int32 lengths
    assert (held.spilled is not None) == (total > limit)  # spilled exactly when what it was given passes the limit
    assert (d / "held.bin").exists() == (held.spilled is not None)  # files only once spilled
    want = {ext: (d / f"ref{ext}").read_bytes() for ext in (".bin", ".lens")}
    targets = []
    for ext, off in zip((".bin", ".lens"), offsets):
        path = d / f"target{ext}"
        path.write_bytes(b"\xee" * 200)
        targets.append((ext, str(path), off, len(want[ext])))
    p = Placement(0, str(d / "held"), tuple(targets), sync=True)
    write_held(p, held) if held.spilled is None else place_part(p)
    for ext, path, off, size in targets:
        raw = open(path, "rb").read()
        assert raw[off : off + size] == want[ext]
        assert raw[:off] == b"\xee" * off and set(raw[off + size :]) <= {0xEE}  # nothing written around it
    assert not (d / "held.bin").exists()  # a spilled part's files are deleted once placed


def test_keep_limits_come_from_the_environment_or_fail_in_one_line(monkeypatch):
    assert keep_limit("KEEP_PART_MB") == 64 << 20 and keep_limit("KEEP_PARTS") == 32
    monkeypatch.setenv("PRETOK_KEEP_MB", "3")
    assert keep_limit("KEEP_MB") == 3 << 20
    for bad in ("-1", "1.5", "lots", ""):
        monkeypatch.setenv("PRETOK_KEEP_PARTS", bad)
        with pytest.raises(PretokError, match="PRETOK_KEEP_PARTS=.* is not a whole number >= 0"):
            keep_limit("KEEP_PARTS")


@pytest.mark.parametrize("fmt", ["memmap", "token-list", "padded"])
def test_tokenizing_imports_nothing_heavy(tmp_path, fmt):
    """A run (inline: the workers' own code path) imports neither pandas nor torch/datasets/transformers: `pa.array`
    and `Array.to_numpy` import pandas (0.3-0.6 s per worker process), so the parquet writers build Arrow arrays
    over numpy memory and take row lengths from numpy."""
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pretok_lib.formats import parquet as pqf

    from ..conftest import GPT2_JSON, ROOT

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * (i % 50 + 1) for i in range(3000)]}), corpus)
    code = ("import sys; from pretok_lib.pretokenize import TokenizeConfig, run_tokenize; "
            f"run_tokenize(TokenizeConfig(inputs=[{str(corpus)!r}], out={str(tmp_path / 'out')!r}, "
            f"tokenizer={str(GPT2_JSON)!r}, format={fmt!r}, seq_len=64, workers=0, progress=False)); "
            "print(sorted(m for m in ('pandas', 'torch', 'datasets', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    for part in sorted((tmp_path / "out").rglob("*.parquet")):  # the footer's row lengths, now given from numpy
        key = pqf.DOC_LENGTHS_KEY if fmt == "token-list" else pqf.ROW_LENGTHS_KEY
        recorded = pqf.doc_lengths_of(pq.ParquetFile(part).metadata, part, key)
        assert recorded.tolist() == [len(d) for d in pqf.iter_documents(part)] and len(recorded) > 0


@settings(max_examples=60, deadline=None)
@given(n_files=st.integers(1, 300), picks=st.lists(st.integers(0, 400), min_size=1, max_size=4), seed=st.integers(0, 9))
def test_a_unit_gets_the_stamps_of_its_own_inputs_only(n_files, picks, seed):
    """What the main process sends with each unit: the planned identities of the unit's own local inputs (a path
    listed twice once, a path with no stamp none), looked up by path; the lookup's cache never travels in a pickle."""
    import pickle

    from pretok_lib.engine.parts import Job
    from pretok_lib.sources import SourceOptions, Unit

    stamps = tuple((f"/in/{k:05d}.parquet", 1000 + k, seed) for k in range(n_files))
    job = Job("memmap", {"dtype": "uint16", "bos_id": None, "eos_id": None, "pad_id": None}, "none",
              SourceOptions(), "/out", None, stamps=stamps)
    paths = tuple(f"/in/{k:05d}.parquet" for k in picks)
    unit = Unit(0, "parquet", paths)
    objects, got = job.unit_fields(unit)
    assert objects == ()
    assert got == tuple(s for p in dict.fromkeys(paths) for s in stamps if s[0] == p)
    assert job.stamps_of(unit) == got
    again = pickle.loads(pickle.dumps(job))
    assert "_by_path" not in again.__dict__ and again == job and again.unit_fields(unit) == (objects, got)
