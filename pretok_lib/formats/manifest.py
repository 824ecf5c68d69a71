"""manifest.json: the self-describing, self-checksummed record of one pretokenized output, written last."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from ..errors import PretokError, os_error

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2  # the version written; see docs/FORMATS.md "Manifest" for what each changed
READABLE_MANIFEST_VERSIONS = (1, 2)  # 1: `policy` held seq_len/row_length for every format (ignored unless padded)
FORMAT_VERSIONS = {"padded": 1, "token-list": 1, "memmap": 1}
PADDED_ONLY_POLICY = ("seq_len", "row_length")  # the only policy fields the bytes of no other format depend on
REQUIRED = ("manifest_version", "format", "format_version", "tokenizer", "dtype", "policy", "counts", "files",
            "inputs", "tool", "created", "command")
PACKAGES = ("numpy", "pyarrow", "tokenizers", "fastokens", "tiktoken", "sentencepiece", "mistral-common",
            "transformers", "datasets", "torch")


def format_policy(fmt: str | None, policy: dict) -> dict:
    """The policy fields that define `fmt`'s bytes: `seq_len`/`row_length` only for `padded` (token-list and
    memmap never cut or pad a document). Applied when a policy is made and when one is read, so an output of an
    earlier version that recorded them for every format compares, merges and prints as a current one."""
    if fmt == "padded":
        return dict(policy)
    return {k: v for k, v in policy.items() if k not in PADDED_ONLY_POLICY}


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def atomic_write_text(path: str | os.PathLike, text: str, fsync: bool = True) -> None:
    """Write to a temp name, fsync (unless told not to), rename: readers never see a half-written file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # e.g. disk full: leave no torn temp file behind (it would hold the space)
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):  # a failed write or close names no file: name it
            raise os_error(e, path) from None
        raise


def atomic_write_json(path: str | os.PathLike, data: dict, fsync: bool = True) -> None:
    """`data` as indented JSON, written atomically (see `atomic_write_text`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", fsync)


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


def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def environment() -> dict:
    """Versions and machine facts recorded next to every output."""
    import importlib.metadata  # here, not at import: ~15 ms that every worker would pay

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
            "hostname": socket.gethostname(), "cpus": len(os.sched_getaffinity(0)), "packages": versions,
            "git_commit": _git_commit(),
            "slurm": {k: v for k, v in os.environ.items() if k in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID",
                                                                   "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")}}
