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
MANIFEST_VERSION = 3  # the version written; see docs/FORMATS.md "Manifest" for what each changed
READABLE_MANIFEST_VERSIONS = (1, 2, 3)  # see docs/FORMATS.md "Versions"
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


def _why_no_manifest(out_dir: Path) -> str:
    """What a path without a manifest is: missing, a file, an unfinished output, or some other directory."""
    if not out_dir.exists():
        return "no such directory"
    if not out_dir.is_dir():
        return "a file, not a pretok output (give the directory that holds manifest.json)"
    if (out_dir / ".pretok").is_dir():
        return "no manifest.json (not a finished pretok output: interrupted run? rerun the same command)"
    return "no manifest.json (not a pretok output)"


def read_manifest(out_dir: str | os.PathLike, expect_format: str | None = None) -> dict:
    """Read and validate a manifest: parses, self-checksum matches (no hand edits), known versions, sizes match.
    Its `policy` is returned as `format_policy` states it (fields another format's bytes do not depend on are
    left out), whatever manifest version recorded it."""
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        raise PretokError(_why_no_manifest(Path(out_dir)), out_dir)
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
    check_fields(data, path)
    check_sizes(out_dir, data)
    data["policy"] = format_policy(fmt, data["policy"])
    return data


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _id(v) -> bool:
    return v is None or _count(v)


def data_file_name(name: object) -> bool:
    """A data file's `path` as a manifest may list it: a plain file name in the output directory (no directory
    part, no `..`, not absolute, not the manifest itself): readers and `pretok merge` never leave the output."""
    return (isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name
            and "\\" not in name and "\0" not in name)


def check_fields(data: dict, path: Path) -> None:
    """The fields readers use have the documented types: `files` (plain names in the output, each once; memmap:
    data.bin and data.idx), `counts`, `tokenizer`, `dtype` (uint16 only for vocabs up to 65,536), the policy's ids.
    One line naming the manifest for the first that does not (a manifest of another writer, or of no version)."""
    def bad(what: str) -> PretokError:
        return PretokError(f"{what} (not a valid pretok manifest; see docs/FORMATS.md)", path)

    files = data["files"]
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise bad("files is not a list of objects")
    seen: set[str] = set()
    for f in files:
        name = f.get("path")
        if not data_file_name(name):
            raise bad(f"files lists {name!r}, not a file name in the output directory")
        if name in seen:
            raise bad(f"files lists {name} twice")
        seen.add(name)
        if not _count(f.get("size")):
            raise bad(f"files: {name} has no size in bytes")
    fmt = data["format"]
    if fmt == "memmap" and sorted(seen) != ["data.bin", "data.idx"]:
        raise bad(f"files of a memmap output are data.bin and data.idx, not {', '.join(sorted(seen)) or 'none'}")
    if fmt != "memmap" and any(not n.endswith(".parquet") for n in seen):
        raise bad(f"files of a {fmt} output are .parquet parts, not {next(n for n in sorted(seen) if not n.endswith('.parquet'))}")
    parts = data.get("parts", [])
    if not isinstance(parts, list) or not all(isinstance(q, dict) and isinstance(q.get("files", []), list)
                                              and set(q.get("files", [])) <= seen for q in parts):
        raise bad("parts lists a file that files does not")  # verify reads a part's documents through these
    counts, tok, pol = data["counts"], data["tokenizer"], data["policy"]
    if not isinstance(counts, dict) or not all(_count(counts.get(k)) for k in ("documents", "tokens")):
        raise bad("counts.documents / counts.tokens missing or not counts")
    if fmt != "memmap" and counts["documents"] and not seen:
        raise bad(f"files lists no part, counts.documents is {counts['documents']}")
    if not isinstance(tok, dict) or not (_count(tok.get("vocab_size")) and tok["vocab_size"] > 0
                                         and isinstance(tok.get("fingerprint"), str)):
        raise bad("tokenizer.vocab_size / tokenizer.fingerprint missing or invalid")
    if data["dtype"] not in ("uint16", "int32") or pol.get("dtype", data["dtype"]) != data["dtype"]:
        raise bad(f"dtype {data['dtype']!r} (policy.dtype {pol.get('dtype')!r}): expected uint16 or int32, the same in both")
    if data["dtype"] == "uint16" and tok["vocab_size"] > 1 << 16:
        raise bad(f"dtype uint16 cannot hold the ids of a vocab of {tok['vocab_size']:,} (ids above 65,535 would "
                  "have wrapped around)")
    keys = ("bos_id", "eos_id") + (("pad_id", "seq_len", "row_length") if fmt == "padded" else ())
    for k in keys:
        if k not in pol or not _id(pol[k]) or (k in ("seq_len", "row_length", "pad_id") and pol[k] is None):
            raise bad(f"policy.{k} missing or invalid ({pol.get(k)!r})")


def check_sizes(out_dir: str | os.PathLike, manifest: dict) -> None:
    """Every listed file exists with its recorded size (cheap; checksums are `pretok verify`)."""
    for f in manifest["files"]:
        p = Path(out_dir) / f["path"]
        if not p.exists():
            raise PretokError("missing data file listed in manifest.json", p)
        if p.stat().st_size != f["size"]:
            raise PretokError(f"size {p.stat().st_size} bytes, manifest.json says {f['size']} (truncated or edited)", p)

