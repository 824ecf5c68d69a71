"""Opt-in check of a pretokenized dataset's data files against its manifest's checksums when it is opened.

Opening a memmap dataset reads only its headers and index, so a flipped byte in `data.bin` (or in the document
index of `data.idx`) would train silently. `verify_files` hashes every data file the manifest lists (XXH3-128,
several GB/s) and raises a one-line PretokError naming the first file that differs. A stamp remembers files
that passed, keyed by each file's size, mtime_ns, ctime_ns, inode and device and by the checksum verified, so a
dataset is checked once per change: `<dataset>/.pretok/verified.json` (written atomically), or, when the dataset
is read-only or has no `.pretok` dir, `$PRETOK_CACHE_DIR` (default: a per-user temp dir) `/verified/`; when
neither can be written the files are simply checked at every open. A change that keeps every stat field (a
bit flipped by the disk itself after the check) is not noticed until the stamp is gone: `pretok verify` always
reads everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..errors import PretokError
from ..formats import checksum

STAMP = "verified.json"
_VERSION = 1


def _identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _stamp_paths(root: Path) -> list[Path]:
    """Where a stamp for `root` may be: in its `.pretok` state dir (if it has one), then in the user cache."""
    cache = Path(os.environ.get("PRETOK_CACHE_DIR") or Path(tempfile.gettempdir()) / f"pretok-{os.getuid()}")
    key = hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:32]
    own = [root / ".pretok" / STAMP] if (root / ".pretok").is_dir() else []
    return own + [cache / "verified" / f"{key}.json"]


def _expected(root: Path, manifest: dict) -> dict[str, str]:
    """relative path -> recorded checksum of every data file, manifest.json's identity included (as "")."""
    files = {f["path"]: checksum.recorded(f) or "" for f in manifest.get("files", [])}
    return {**files, "manifest.json": ""}


def _stamp_ok(stamp: Path, root: Path, expected: dict[str, str]) -> bool:
    try:
        got = json.loads(stamp.read_text())
        files = got["files"]
        return got.get("version") == _VERSION and set(files) == set(expected) and all(
            files[p]["checksum"] == expected[p] and files[p]["identity"] == _identity(root / p) for p in expected)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_stamp(candidates: list[Path], root: Path, expected: dict[str, str], before: dict[str, list[int]]) -> None:
    """Record the files as checked (identities taken before hashing, so a change during the check is not
    stamped) in the first place that can be written; none: nothing recorded."""
    body = json.dumps({"version": _VERSION, "files": {p: {"checksum": expected[p], "identity": before[p]}
                                                      for p in expected}}, indent=1)
    for stamp in candidates:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
            tmp.write_text(body)
            os.replace(tmp, stamp)
            return
        except OSError:
            try:
                tmp.unlink(missing_ok=True)
            except (OSError, UnboundLocalError):
                pass


def stamp_covers(path: str | os.PathLike, manifest: dict) -> bool:
    """Whether a stamp says the dataset's data files passed a check and are unchanged since (no hashing)."""
    root = Path(path)
    expected = _expected(root, manifest)
    return any(_stamp_ok(s, root, expected) for s in _stamp_paths(root))


def verify_files(path: str | os.PathLike, manifest: dict) -> bool:
    """Check every data file of the dataset at `path` against `manifest` unless a stamp says these very files
    passed already. Returns True when the files were hashed now, False when the stamp covered them. Raises a
    one-line PretokError naming a missing file or the first whose checksum differs."""
    root = Path(path)
    expected = _expected(root, manifest)
    candidates = _stamp_paths(root)
    if any(_stamp_ok(s, root, expected) for s in candidates):
        return False
    before, leaves = {}, {f["path"]: f.get("leaves") for f in manifest.get("files", [])}
    for rel, want in expected.items():
        file = root / rel
        try:
            before[rel] = _identity(file)
            if want and not checksum.matches(file, want, leaves.get(rel)):
                raise PretokError("checksum differs from manifest.json (corrupted or modified since it was "
                                  "written); `pretok verify` reports every damaged file", file)
        except ValueError:
            raise PretokError(f"unknown checksum algorithm in manifest.json: {want}", file) from None
        except OSError as e:
            raise PretokError(f"cannot read data file listed in manifest.json: {e.strerror or e}", file) from None
    _write_stamp(candidates, root, expected, before)
    return True
