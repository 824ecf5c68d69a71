"""`read_manifest` refuses, in one line naming manifest.json, a sealed manifest (self-checksum right: another
writer's, or of no pretok version) whose fields readers rely on are unusable: `files` paths that leave the output
directory or repeat, sizes that are no byte counts, a memmap without exactly data.bin + data.idx, counts or
tokenizer fields missing, a uint16 dtype for a vocab whose ids do not fit. Every manifest pretok writes (v1
fixtures, current outputs) still reads."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.errors import PretokError
from pretok_lib.formats.manifest import read_manifest, write_manifest

FIXTURES = Path(__file__).parent / "fixtures" / "manifest_v1"


def base(fmt: str) -> dict:
    """A minimal manifest of `fmt` in the documented shape."""
    files = ([{"path": "data.bin", "size": 4}, {"path": "data.idx", "size": 4}] if fmt == "memmap"
             else [{"path": "part-000000.parquet", "size": 4}, {"path": "part-000001.parquet", "size": 4}])
    policy = {"bos_id": 1, "eos_id": None, "pad_id": 0, "dtype": "uint16", "truncation": "right",
              "special_tokens_in_text": "ordinary", "bad_docs": "skip"}
    if fmt == "padded":
        policy.update(seq_len=8, row_length=9)
    return {"manifest_version": 2, "format": fmt, "format_version": 1, "dtype": "uint16", "policy": policy,
            "tokenizer": {"spec": "t.json", "kind": "hf-json", "fingerprint": "sha256:00", "vocab_size": 50257},
            "counts": {"documents": 2, "tokens": 4}, "files": files, "inputs": [], "tool": {"version": "0"},
            "created": "now", "command": []}


def seal(tmp: Path, m: dict) -> Path:
    d = tmp / "out"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for f in m["files"]:
        name = f.get("path") if isinstance(f, dict) else None
        if isinstance(name, str) and "/" not in name and name not in ("", ".", "..", "manifest.json"):
            (d / name).write_bytes(b"abcd")
    write_manifest(d, m)
    return d


BAD_NAMES = ["../x.parquet", "/etc/x.parquet", "sub/part-000000.parquet", "..", ".", "", "manifest.json", None, 3,
             "a\\b.parquet"]


@st.composite
def broken(draw) -> tuple[dict, str]:
    """(a manifest with one unusable field, what the error must say)."""
    fmt = draw(st.sampled_from(["padded", "token-list", "memmap"]))
    m = base(fmt)
    kind = draw(st.sampled_from(["name", "twice", "size", "memmap set", "counts", "vocab", "dtype", "uint16 vocab",
                                 "policy", "no parts", "part file"]))
    f = m["files"]
    if kind == "part file":  # a part record naming a file the manifest does not list (verify reads through it)
        m["parts"] = [{"files": [draw(st.sampled_from(["../x.parquet", "/etc/passwd", "part-000009.parquet"]))]}]
        return m, "parts lists a file that files does not"
    if kind == "name":
        name = draw(st.sampled_from(BAD_NAMES))
        f[draw(st.integers(0, 1))]["path"] = name
        return m, "not a file name in the output directory"
    if kind == "twice":
        f.append(copy.deepcopy(f[draw(st.integers(0, 1))]))
        return m, "twice"
    if kind == "size":
        f[0]["size"] = draw(st.sampled_from([None, -1, "4", 4.0, True]))
        if f[0]["size"] is None:
            del f[0]["size"]
        return m, "has no size in bytes"
    if kind == "memmap set" or kind == "no parts":
        if fmt == "memmap":
            m["files"] = draw(st.sampled_from([f[:1], f[1:], [], f + [{"path": "extra.bin", "size": 4}]]))
            return m, "files of a memmap output are data.bin and data.idx"
        if kind == "no parts":
            m["files"] = []
            return m, "files lists no part"
        f[0]["path"] = "data.bin"
        return m, ".parquet parts"
    if kind == "counts":
        key = draw(st.sampled_from(["documents", "tokens"]))
        m["counts"][key] = draw(st.sampled_from([None, -1, "2", 2.5]))
        return m, "counts.documents / counts.tokens"
    if kind == "vocab":
        m["tokenizer"]["vocab_size"] = draw(st.sampled_from([None, 0, "50257", -5]))
        return m, "tokenizer.vocab_size"
    if kind == "dtype":
        m["dtype"] = m["policy"]["dtype"] = draw(st.sampled_from(["float32", "int64", None, "uint8"]))
        return m, "expected uint16 or int32"
    if kind == "uint16 vocab":
        m["tokenizer"]["vocab_size"] = draw(st.integers(65537, 1 << 20))
        return m, "dtype uint16 cannot hold the ids"
    key = draw(st.sampled_from(["bos_id", "eos_id"] + (["pad_id", "seq_len", "row_length"] if fmt == "padded" else [])))
    m["policy"][key] = draw(st.sampled_from([-1, "1", 1.5]))
    return m, f"policy.{key} missing or invalid"


@settings(max_examples=150, deadline=None)
@given(case=broken())
def test_unusable_fields_are_refused_in_one_line(tmp_path_factory, case):
    m, needle = case
    d = seal(tmp_path_factory.mktemp("m"), m)
    with pytest.raises(PretokError) as e:
        read_manifest(d)
    msg = str(e.value)
    assert "\n" not in msg and str(d / "manifest.json") in msg and needle in msg, msg


@pytest.mark.parametrize("fmt", ["padded", "token-list", "memmap"])
def test_documented_manifests_read(tmp_path, fmt):
    m = base(fmt)
    m["parts"] = [{"files": [] if fmt == "memmap" else [f["path"]]} for f in m["files"]]
    m["tokenizer"]["vocab_size"] = 65536  # uint16 holds ids up to 65,535
    assert read_manifest(seal(tmp_path, m))["counts"]["documents"] == 2
    m["dtype"] = m["policy"]["dtype"] = "int32"
    m["tokenizer"]["vocab_size"] = 131072
    assert read_manifest(seal(tmp_path, m))["dtype"] == "int32"


@pytest.mark.parametrize("shard", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_manifests_of_version_1_still_read(shard):
    m = read_manifest(FIXTURES / shard)
    assert json.loads((FIXTURES / shard / "manifest.json").read_text())["manifest_version"] == 1
    assert m["counts"]["documents"] > 0


@pytest.mark.parametrize("drop", ["tokenizer.backend", "tokenizer.kind", "compression", "counts.skipped", "tool.version",
                                  "run"])
def test_inspect_prints_a_manifest_without_descriptive_fields(tmp_path, drop):
    """Fields that only describe (not define) the output may be absent from another writer's manifest."""
    from pretok_lib.engine.verify import format_inspect

    m = base("token-list")
    m.update(compression="zstd", run={})
    m["tokenizer"]["backend"] = {"backend": "hf"}
    m["counts"]["skipped"] = {}
    section, _, key = drop.partition(".")
    del (m[section] if key else m)[key or section]
    text = format_inspect({"manifest": read_manifest(seal(tmp_path, m)),
                           "stats": {"documents": 2, "tokens": 4, "disk_bytes": 8, "bytes_per_token": 2.0,
                                     "doc_tokens": {"mean": 2.0, "p50": 2.0, "p99": 2.0, "max": 2}}})
    assert text.startswith("format      token-list v1")


@pytest.mark.parametrize("shard", ["memmap-shard-0", "padded-shard-1"])
def test_manifest_sha256_follows_the_documented_recipe(tmp_path, shard):
    """docs/FORMATS.md: sha256 of json.dumps(all other fields, sort_keys=True, separators=(",", ":")), UTF-8."""
    import hashlib

    for path in (FIXTURES / shard / "manifest.json", seal(tmp_path, {**base("memmap"), "note": "é 日本"}) / "manifest.json"):
        data = json.loads(path.read_text())
        body = {k: v for k, v in data.items() if k != "manifest_sha256"}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
        assert data["manifest_sha256"] == "sha256:" + digest
