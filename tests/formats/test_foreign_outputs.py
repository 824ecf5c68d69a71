"""Outputs that another writer, a copy tool or a rewrite could produce, re-sealed (data file checksums and the
manifest's self-checksum recomputed, as a writer following docs/FORMATS.md would): every opener (the loaders,
`pretok inspect`, `pretok verify`, `pretok merge`) serves the same tokens as the original, or refuses in one
line naming the file — never a wrong token, never a traceback. Also: the memmap layout read by a reader written
from docs/FORMATS.md alone."""

from __future__ import annotations

import json
import shutil
import struct
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main
from pretok_lib.data import make_source
from pretok_lib.errors import PretokError
from pretok_lib.formats import checksum
from pretok_lib.formats.manifest import read_manifest, write_manifest

from ..conftest import GPT2_JSON, TEKKEN, WIKI_EN
from ..conftest import one_line as any_line

SEQ_LEN = 16


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, shared_data) -> dict[str, Path]:
    """GPT-2 (uint16) padded / token-list / memmap and tekken (131k vocab: int32) memmap and token-list outputs of
    80 real documents, in parts of several row groups."""
    base = tmp_path_factory.mktemp("foreign")
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:80]
    corpus = base / "c.parquet"
    pq.write_table(pa.table({"text": docs}), corpus, row_group_size=20)
    out = {}
    for tok, path in (("gpt2", GPT2_JSON), ("tekken", TEKKEN)):
        for fmt in ("padded", "token-list", "memmap") if tok == "gpt2" else ("token-list", "memmap"):
            d = base / f"{tok}-{fmt}"
            assert main(["tokenize", str(corpus), "--out", str(d), "--tokenizer", str(path), "--format", fmt,
                         "--seq-len", "64", "--part-mb", "0.02", "--workers", "0", "--no-progress"]) == 0
            out[f"{tok}-{fmt}"] = d
    return out


def reseal(d: Path, edit=None) -> dict:
    """Recompute every listed file's size and checksum and the manifest's self-checksum (after `edit(manifest)`)."""
    m = json.loads((d / "manifest.json").read_text())
    for f in m["files"]:
        p = d / f["path"]
        if p.is_file():
            f["size"], f["checksum"] = p.stat().st_size, checksum.of_file(p)
    if edit is not None:
        edit(m)
    write_manifest(d, m)
    return m


def copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".pretok"))
    return dst


def samples(d: Path, kind: str) -> list:
    src = make_source(kind, d, SEQ_LEN, shuffle=True, cache_mb=0) if kind != "pretok-memmap" else \
        make_source(kind, d, SEQ_LEN, shuffle=True)
    out = []
    for k in range(src.num_samples):
        s = src.sample(0, k)
        out.append((s.tokens.tolist(), None if s.mask is None else s.mask.tolist()))
    return out


one_line = partial(any_line, prefix="")  # one line: an exception's text or a command's stderr


def cli(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


def refused_everywhere(capsys, d: Path, kind: str, needle: str, merge: bool = True) -> None:
    """The loader, inspect-or-verify and merge each refuse `d` in one line containing `needle`."""
    with pytest.raises(PretokError) as e:
        samples(d, kind)
    one_line(str(e.value), needle)
    rc, err = cli(capsys, "verify", d, "--sample", "1000")
    assert rc == 1
    one_line(err, needle)
    if merge:
        rc, err = cli(capsys, "merge", d, "--out", d.with_name(d.name + "-merged"))
        assert rc == 1, "merged"
        one_line(err, needle)


# ------------------------------------------------------------------ parquet written by another tool


def rewrite_parts(src: Path, dst: Path, change=lambda t: t, **write_kw) -> Path:
    """Every part read with pyarrow and written again (the footer's length keys dropped, as another tool would)."""
    copy(src, dst)
    for p in sorted(dst.glob("part-*.parquet")):
        t = pq.read_table(p)
        meta = {k: v for k, v in (t.schema.metadata or {}).items() if not k.startswith(b"pretok.")}
        pq.write_table(change(t.replace_schema_metadata(meta)), p, **write_kw)
    reseal(dst)
    return dst


def ids_as(typ_of):
    def change(t: pa.Table) -> pa.Table:
        col = t.column("input_ids").combine_chunks()
        typ = typ_of(col.type)
        return t.set_column(0, pa.field("input_ids", typ), col.cast(typ))
    return change


LAYOUTS = {
    "row groups of 7": (lambda t: t, dict(row_group_size=7)),
    "dictionary": (lambda t: t, dict(use_dictionary=True, row_group_size=50)),
    "gzip, pages v2": (lambda t: t, dict(compression="gzip", data_page_version="2.0")),
    "int64 ids": (ids_as(lambda typ: pa.list_(pa.int64(), typ.list_size) if pa.types.is_fixed_size_list(typ)
                         else pa.list_(pa.int64())), dict(row_group_size=33)),
    "large_list": (ids_as(lambda typ: typ if pa.types.is_fixed_size_list(typ) else pa.large_list(pa.int32())), {}),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", ["gpt2-padded", "gpt2-token-list", "tekken-token-list"])
def test_parquet_of_another_writer_serves_the_same_tokens(outputs, tmp_path, capsys, name, layout):
    src, kind = outputs[name], "pretok-" + name.split("-", 1)[1]
    change, kw = LAYOUTS[layout]
    d = rewrite_parts(src, tmp_path / "d", change, **kw)
    assert samples(d, kind) == samples(src, kind)
    rc, err = cli(capsys, "verify", d, "--sample", "1000")
    assert rc == 0, err


def _with_nulls(where: str):
    def change(t: pa.Table) -> pa.Table:
        col = t.column("input_ids").combine_chunks()
        rows = col.to_pylist()
        if where == "row":
            rows[min(3, len(rows) - 1)] = None
        else:
            rows[min(3, len(rows) - 1)][1] = None
        arr = pa.array(rows, col.type)
        return t.set_column(0, pa.field("input_ids", arr.type), arr)
    return change


def _with_id(value: int):
    def change(t: pa.Table) -> pa.Table:
        col = t.column("input_ids").combine_chunks()
        rows = col.to_pylist()
        rows[len(rows) // 2][0] = value
        typ = pa.list_(pa.int64(), col.type.list_size) if pa.types.is_fixed_size_list(col.type) else \
            pa.list_(pa.int64())
        arr = pa.array(rows, typ)
        return t.set_column(0, pa.field("input_ids", arr.type), arr)
    return change


@pytest.mark.parametrize("bad", ["null row", "null id", "negative id", "id = vocab", "id = -100"])
@pytest.mark.parametrize("name", ["gpt2-padded", "gpt2-token-list"])
def test_parquet_nulls_and_ids_outside_the_vocab_are_refused(outputs, tmp_path, capsys, name, bad):
    """A null read as a number, or an id the tokenizer cannot produce (-100 would even be an ignored label), is a
    one-line error naming the part in the loader and in verify; inspect never prints numbers made of nulls."""
    src, kind = outputs[name], "pretok-" + name.split("-", 1)[1]
    change = {"null row": _with_nulls("row"), "null id": _with_nulls("id"), "negative id": _with_id(-3),
              "id = vocab": _with_id(50257), "id = -100": _with_id(-100)}[bad]
    d = rewrite_parts(src, tmp_path / "d", change)
    needle = "nulls" if bad.startswith("null") else "outside the tokenizer's vocab [0, 50257)"
    refused_everywhere(capsys, d, kind, needle, merge=False)  # merge copies the bytes: its output is refused as well
    rc, err = cli(capsys, "inspect", d)  # inspect reads the lengths (token lists: input_ids; padded: the masks)
    if bad.startswith("null") and name == "gpt2-token-list":
        assert rc == 1
        one_line(err, "nulls")
    else:
        assert rc == 0, err


# ------------------------------------------------------------------ memmap


def read_from_the_doc(prefix: Path) -> list[list[int]]:
    """docs/FORMATS.md's memmap table, implemented with struct alone: every document's tokens."""
    idx = (prefix.parent / (prefix.name + ".idx")).read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack_from("<Q", idx, 9)[0] == 1
    code = idx[17]
    fmt = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 6: "d", 7: "f", 8: "H"}[code]
    S, D = struct.unpack_from("<QQ", idx, 18)
    assert len(idx) == 34 + 12 * S + 8 * D
    lengths = struct.unpack_from(f"<{S}i", idx, 34)
    pointers = struct.unpack_from(f"<{S}q", idx, 34 + 4 * S)
    doc_idx = struct.unpack_from(f"<{D}q", idx, 34 + 12 * S)
    data = (prefix.parent / (prefix.name + ".bin")).read_bytes()
    assert len(data) == sum(lengths) * struct.calcsize(fmt)
    seqs = [list(struct.unpack_from(f"<{n}{fmt}", data, p)) for n, p in zip(lengths, pointers)]
    return [sum(seqs[doc_idx[k] : doc_idx[k + 1]], []) for k in range(D - 1)]


@pytest.mark.parametrize("name", ["gpt2-memmap", "tekken-memmap"])
def test_the_documented_memmap_layout_reads_the_same_documents(outputs, name):
    from pretok_lib.formats.memmap import MemmapDataset

    d = outputs[name]
    docs = read_from_the_doc(d / "data")
    ds = MemmapDataset(d / "data")
    assert ds.dtype == np.dtype("uint16" if name.startswith("gpt2") else "int32")
    assert docs == [ds[i].tolist() for i in range(len(ds))]
    assert len(docs) == read_manifest(d)["counts"]["documents"] == 80


def _permute_pointers(d: Path, rng: np.random.Generator) -> None:
    """Store the middle documents of data.bin in another order, with pointers that follow them (so every check
    but the pointers' agreement with the lengths passes): each document still reads right through its pointer."""
    idx = bytearray((d / "data.idx").read_bytes())
    S = struct.unpack_from("<Q", idx, 18)[0]
    item = 2 if idx[17] == 8 else 4
    lengths = np.frombuffer(bytes(idx), "<i4", S, 34)
    pointers = np.frombuffer(bytes(idx), "<i8", S, 34 + 4 * S)
    data = (d / "data.bin").read_bytes()
    docs = [data[p : p + n * item] for p, n in zip(pointers, lengths)]
    order = [0, *(1 + rng.permutation(S - 2)), S - 1]
    if order == list(range(S)):
        order[1], order[2] = order[2], order[1]
    new, at = {}, 0
    for i in order:
        new[i], at = at, at + len(docs[i])
    struct.pack_into(f"<{S}q", idx, 34 + 4 * S, *[new[i] for i in range(S)])
    (d / "data.idx").write_bytes(bytes(idx))
    (d / "data.bin").write_bytes(b"".join(docs[i] for i in order))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(["gpt2-memmap", "tekken-memmap"]))
def test_memmap_pointers_that_do_not_follow_the_lengths_are_refused(outputs, tmp_path, capsys, seed, name):
    """Readers that follow the pointers (Megatron, verify's sample) and those that derive offsets from the lengths
    (merge, the packed loader) would serve different tokens: the index is refused at open, by every opener."""
    d = copy(outputs[name], tmp_path / f"perm-{seed}")
    docs = read_from_the_doc(outputs[name] / "data")
    _permute_pointers(d, np.random.default_rng(seed))
    reseal(d)
    assert read_from_the_doc(d / "data") == docs  # still a readable Megatron dataset
    refused_everywhere(capsys, d, "pretok-memmap", "sequence pointers inconsistent with sequence lengths")
    rc, err = cli(capsys, "inspect", d)
    assert rc == 1
    one_line(err, "data.idx")


def test_memmap_ids_outside_the_vocab_are_refused(outputs, tmp_path, capsys):
    """uint16 holds ids up to 65,535, GPT-2's vocab ends at 50,256: a larger id is refused, not trained on."""
    d = copy(outputs["gpt2-memmap"], tmp_path / "d")
    raw = bytearray((d / "data.bin").read_bytes())
    struct.pack_into("<H", raw, len(raw) // 2 & ~1, 60000)
    (d / "data.bin").write_bytes(bytes(raw))
    reseal(d)
    refused_everywhere(capsys, d, "pretok-memmap", "token id 60000 outside the tokenizer's vocab [0, 50257)",
                       merge=False)
    src = make_source("pretok-memmap", d, SEQ_LEN, shuffle=False)  # the sequential fast path too
    with pytest.raises(PretokError, match="token id 60000 outside") as e:
        for k in range(src.num_samples):
            src.sample(0, k)
    one_line(str(e.value), str(d / "data.bin"))


# ------------------------------------------------------------------ manifests


def _files_edit(how: str):
    def edit(m: dict) -> None:
        f = m["files"]
        if how == "twice":
            f.append(dict(f[0]))
        elif how == "dotdot":
            f[0]["path"] = f"../{m['_dir']}/{f[0]['path']}"
        elif how == "absolute":
            f[0]["path"] = str(Path(m["_root"]) / f[0]["path"])
        elif how == "none":
            f.clear()
        elif how == "no size":
            del f[0]["size"]
        m.pop("_dir"), m.pop("_root")
    return edit


@pytest.mark.parametrize("how", ["twice", "dotdot", "absolute", "none", "no size"])
@pytest.mark.parametrize("name", ["gpt2-token-list", "gpt2-memmap"])
def test_manifest_files_outside_the_output_or_twice_are_refused(outputs, tmp_path, capsys, name, how):
    """Readers and merge only ever touch the plain file names a manifest lists in its own directory, each once
    (a `..` path would let merge write outside its output; a part listed twice would be served twice)."""
    d = copy(outputs[name], tmp_path / "d")
    edit = _files_edit(how)
    reseal(d, lambda m: (m.update(_dir=d.name, _root=str(d)), edit(m)))
    with pytest.raises(PretokError) as e:
        read_manifest(d)
    one_line(str(e.value), "manifest.json", "not a valid pretok manifest")
    kind = "pretok-" + name.split("-", 1)[1]
    refused_everywhere(capsys, d, kind, "not a valid pretok manifest")
    rc, err = cli(capsys, "inspect", d)
    assert rc == 1
    one_line(err, "not a valid pretok manifest")


@pytest.mark.parametrize("name", ["gpt2-token-list", "gpt2-memmap", "gpt2-padded"])
def test_uint16_data_of_a_vocab_above_65536_is_refused(outputs, tmp_path, capsys, name):
    """Ids above 65,535 would have wrapped around in uint16: such an output (another writer's) is refused."""
    d = copy(outputs[name], tmp_path / "d")
    reseal(d, lambda m: m["tokenizer"].update(vocab_size=131072))
    refused_everywhere(capsys, d, "pretok-" + name.split("-", 1)[1], "dtype uint16 cannot hold the ids")


SCHEMAS = {
    "float ids": lambda t, L: pa.array(t.column("input_ids").combine_chunks().to_pylist(),
                                       pa.list_(pa.float64(), L) if L else pa.list_(pa.float64())),
    "string ids": lambda t, L: pa.array([[str(x) for x in r] for r in t.column("input_ids").to_pylist()],
                                        pa.list_(pa.string(), L) if L else pa.list_(pa.string())),
    "variable padded rows": lambda t, L: pa.array(t.column("input_ids").to_pylist(), pa.list_(pa.int32())),
    "other row length": lambda t, L: pa.array([r[:-1] for r in t.column("input_ids").to_pylist()],
                                              pa.list_(pa.int32(), L - 1)),
}


@pytest.mark.parametrize("name,schema", [("gpt2-padded", s) for s in sorted(SCHEMAS)]
                         + [("gpt2-token-list", s) for s in ("float ids", "string ids")])
def test_parquet_columns_of_another_type_are_refused(outputs, tmp_path, capsys, name, schema):
    """input_ids of floats (pandas with NaN), strings, or padded rows that are not fixed-size lists of the
    recorded row length: refused in one line naming the part by every opener (never cast or cut silently)."""
    fmt = name.split("-", 1)[1]

    def change(t: pa.Table) -> pa.Table:
        typ = t.schema.field("input_ids").type
        arr = SCHEMAS[schema](t, typ.list_size if pa.types.is_fixed_size_list(typ) else None)
        return t.set_column(0, pa.field("input_ids", arr.type), arr)

    d = rewrite_parts(outputs[name], tmp_path / "d", change)
    refused_everywhere(capsys, d, "pretok-" + fmt, "column 'input_ids' is ")
    rc, err = cli(capsys, "inspect", d)
    assert rc == 1
    one_line(err, "column 'input_ids' is ")
