"""manifest.json: the self-describing, self-checksummed record of one pretokenized output, written last."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TypedDict

from ..atomic import atomic_write_json
from ..errors import PretokError
from . import checksum

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2  # the version written; see docs/FORMATS.md "Manifest" for what each changed
READABLE_MANIFEST_VERSIONS = (1, 2)  # 1: `policy` held seq_len/row_length for every format (ignored unless padded)
FORMAT_VERSIONS = {"padded": 1, "token-list": 1, "memmap": 1}
PADDED_ONLY_POLICY = ("seq_len", "row_length")  # the only policy fields the bytes of no other format depend on
REQUIRED = ("manifest_version", "format", "format_version", "tokenizer", "dtype", "policy", "counts", "files",
            "inputs", "tool", "created", "command")


class _PolicyFields(TypedDict):
    bos_id: int | None  # added before every document (None: none)
    eos_id: int | None  # added after every document (None: none)
    pad_id: int  # the padded format's filler (the tokenizer's pad, else EOS, else 0)
    dtype: str  # uint16 | int32
    truncation: str
    special_tokens_in_text: str
    bad_docs: str  # skip | fail


class Policy(_PolicyFields, total=False):
    """A manifest's `policy` (JSON): what decides the output's bytes besides the tokenizer and the format."""

    seq_len: int  # padded only (manifest version 1 recorded it for every format)
    row_length: int  # padded only: tokens per row, window(seq_len)


def format_policy(fmt: str | None, policy: dict) -> Policy:
    """The policy fields that define `fmt`'s bytes: `seq_len`/`row_length` only for `padded` (token-list and
    memmap never cut or pad a document). Applied when a policy is made and when one is read, so an output of an
    earlier version that recorded them for every format compares, merges and prints as a current one."""
    if fmt == "padded":
        return Policy(**policy)
    return Policy(**{k: v for k, v in policy.items() if k not in PADDED_ONLY_POLICY})


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def data_identity(manifest: dict) -> str:
    """What an output's data is, not when or how it was made: a hash of its format, dtype and files (path, size,
    checksum). Equal for two byte-identical outputs (the same data tokenized again, or a copy); a manifest whose
    files carry no checksum gives its own `manifest_sha256`."""
    files = [[f["path"], f["size"], checksum.recorded(f)] for f in manifest["files"]]
    if not files or not all(c for _, _, c in files):
        return manifest["manifest_sha256"]
    body = {"format": manifest["format"], "dtype": manifest["dtype"], "files": sorted(files)}
    return "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()


def write_manifest(out_dir: str | os.PathLike, data: dict) -> Path:
    """Write `manifest.json` atomically with a `manifest_sha256` over its own canonical content."""
    body = {k: v for k, v in data.items() if k != "manifest_sha256"}
    body["manifest_version"] = MANIFEST_VERSION
    body["manifest_sha256"] = "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()
    path = Path(out_dir) / MANIFEST
    atomic_write_json(path, body)
    return path


def read_manifest(out_dir: str | os.PathLike, expect_format: str | None = None) -> dict:
    """Read and validate a manifest: parses, self-checksum matches (no hand edits), known versions, sizes match.
    Its `policy` is returned as `format_policy` states it (fields another format's bytes do not depend on are
    left out), whatever manifest version recorded it."""
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        raise PretokError("no manifest.json (not a finished pretok output: interrupted run? rerun the same command)",
                          out_dir)
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise PretokError(f"corrupt JSON ({e})", path) from None
    if not isinstance(data, dict) or any(k not in data for k in REQUIRED):
        missing = [k for k in REQUIRED if not isinstance(data, dict) or k not in data]
        raise PretokError(f"missing fields: {', '.join(missing)}", path)
    body = {k: v for k, v in data.items() if k != "manifest_sha256"}
    if data.get("manifest_sha256") != "sha256:" + hashlib.sha256(_canonical(body)).hexdigest():
        raise PretokError("manifest_sha256 does not match its content (edited or corrupted)", path)
    if data["manifest_version"] not in READABLE_MANIFEST_VERSIONS:
        raise PretokError(f"unsupported manifest_version {data['manifest_version']}", path)
    fmt = data["format"]
    if FORMAT_VERSIONS.get(fmt) != data["format_version"]:
        raise PretokError(f"unsupported format {fmt} version {data['format_version']}", path)
    if expect_format and fmt != expect_format:
        raise PretokError(f"holds format '{fmt}', expected '{expect_format}'", path)
    if not isinstance(data["policy"], dict):
        raise PretokError("policy is not an object", path)
    check_sizes(out_dir, data)
    data["policy"] = format_policy(fmt, data["policy"])
    return data


def check_sizes(out_dir: str | os.PathLike, manifest: dict) -> None:
    """Every listed file exists with its recorded size (cheap; checksums are `pretok verify`)."""
    for f in manifest["files"]:
        p = Path(out_dir) / f["path"]
        if not p.exists():
            raise PretokError("missing data file listed in manifest.json", p)
        if p.stat().st_size != f["size"]:
            raise PretokError(f"size {p.stat().st_size} bytes, manifest.json says {f['size']} (truncated or edited)", p)

