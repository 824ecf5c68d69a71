"""The inputs as given (files, globs, URLs, HF dataset directories) and the options documents are read with."""

from __future__ import annotations

import glob
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import PretokError
from .remote import expand_all as expand_urls
from .remote import is_url

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True)
class InputFile:
    """One input as given: a file, or an HF dataset directory."""

    path: str
    kind: str  # parquet | jsonl | jsonl.gz | jsonl.zst | txt | hf-disk
    size: int
    mtime_ns: int
    version: tuple[tuple[str, str], ...] = ()  # a URL's version identity in its store (ETag, version id, ...)
    inode: int = 0  # a local input's inode and device, as planned (checked during the run, not recorded)
    device: int = 0

    def stamp(self) -> "Stamp":
        """The local input's identity as planned, for `check_stamps`."""
        return (self.path, self.kind, self.size, self.mtime_ns, self.inode, self.device)

    def record(self) -> dict:
        """The input as the manifest (and the output's config, for change detection) records it."""
        if is_url(self.path):
            return {"path": self.path, "kind": self.kind, "size": self.size, "version": dict(self.version)}
        return {"path": self.path, "kind": self.kind, "size": self.size, "mtime_ns": self.mtime_ns}


Stamp = tuple  # a local input's (path, kind, size, mtime_ns, inode, device)


def _identity(path: str, kind: str) -> tuple[int, int, int, int]:
    """(size, mtime_ns, inode, device) of a local input now; an HF dataset directory's size is its Arrow files'."""
    st = os.stat(path)
    size = st.st_size if kind != "hf-disk" else sum(f.stat().st_size for f in Path(path).glob("*.arrow"))
    return size, st.st_mtime_ns, st.st_ino, st.st_dev


def check_stamps(stamps: Sequence[Stamp]) -> None:
    """Refuse, naming the file, a local input whose size, mtime, inode or device is not the planned one: it was
    changed, cut, replaced or removed while the run read it (checked before and after each part, and before the
    manifest). Restoring it (same size and mtime) and rerunning the same command resumes."""
    for path, kind, *planned in stamps:
        try:
            now = _identity(path, kind)
        except OSError as e:
            now = None
            why = "is gone" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror})"
        if now is None or list(now) != planned:
            if now is not None:
                why = f"is now {_describe(now)}"
            raise PretokError(f"changed while this run read it: planned from {_describe(planned)}, it {why}; "
                              "restore it and rerun the same command to resume, or rerun with --overwrite", path)


def _describe(identity: Sequence[int]) -> str:
    size, mtime_ns, inode, device = identity
    return f"{size} bytes, mtime_ns {mtime_ns}, inode {inode} on device {device}"


@dataclass(frozen=True)
class Unit:
    """A deterministic slice of the input, tokenized into one numbered output part."""

    index: int
    kind: str
    paths: tuple[str, ...]
    start: int = 0  # row (parquet row group, hf row) or byte offset
    stop: int = 0
    est_bytes: int = 0


@dataclass(frozen=True)
class SourceOptions:
    """How documents are read from the inputs."""

    text_column: str = "text"
    separator: str | None = None  # txt: a Python `re.split` pattern; None = one document per file
    bad_docs: str = "skip"  # skip (and count) | fail
    part_bytes: int = 64 << 20
    batch_bytes: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("part_bytes", "batch_bytes"):  # a read of 0 bytes is an end of file: documents lost
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise PretokError(f"{name} must be a whole number >= 1 (got {getattr(self, name)!r})")
        if self.bad_docs not in ("skip", "fail"):
            raise PretokError(f"bad_docs must be skip or fail (got {self.bad_docs!r})")


@dataclass
class DocBatch:
    """A batch of documents in input order, with counts of what was skipped."""

    texts: list[str]
    text_bytes: int
    skipped: dict[str, int] = field(default_factory=dict)


def _inside(path: str, output: str | os.PathLike) -> bool:
    """Whether `path` is the output directory or lies inside it (`pretok tokenize 'data/*' --out data/tok`: the
    rerun's glob would take the output for an input)."""
    real, out = os.path.realpath(path), os.path.realpath(output)
    return real == out or real.startswith(out.rstrip(os.sep) + os.sep)


def _kind_of(path: Path) -> str:
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_info.json").exists():
            return "hf-disk"
        if (path / "dataset_dict.json").exists():
            raise PretokError("is a DatasetDict: pass one split's directory (e.g. DIR/train)", path)
        raise PretokError("is a directory but not an HF dataset saved with save_to_disk", path)
    return _kind_of_name(path.name, path)


def _kind_of_name(name: str, path: str | Path) -> str:
    name = name.lower()
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    for comp in (".gz", ".zst"):
        if name.endswith(comp) and name[: -len(comp)].endswith(JSONL_SUFFIXES):
            return "jsonl" + comp
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(TEXT_SUFFIXES):
        return "txt"
    raise PretokError("unknown input type (expected .parquet, .jsonl[.gz|.zst], .txt, or an HF dataset dir)", path)


def expand_inputs(inputs: Sequence[str], output: str | os.PathLike | None = None) -> list[InputFile]:
    """Expand globs and check every input exists; order is as given, globs sorted. An input that exists as
    named is taken as it is, even with glob characters in its name; a glob never matches `output` (the run's
    output directory) or anything in it."""
    files: list[InputFile] = []
    urls = [s for s in inputs if is_url(s)]
    listed = dict(zip(urls, expand_urls(urls))) if urls else {}  # in flight together
    for spec in inputs:
        if is_url(spec):
            files += [InputFile(url, _kind_of_name(url.rsplit("/", 1)[-1], url), size, 0, version)
                      for url, size, version in listed[spec]]
            continue
        # A path that exists is that path, even with glob characters in its name (`shard[1].jsonl`).
        is_glob = glob.has_magic(spec) and not os.path.lexists(spec)
        matches = sorted(glob.glob(spec)) if is_glob else [spec]
        if is_glob and output is not None:  # a glob never takes the run's own output for an input
            matches = [m for m in matches if not _inside(m, output)]
        if not matches:
            raise PretokError("no input matches this pattern", spec)
        for m in matches:
            p = Path(m)
            try:
                st = p.stat()
            except OSError as e:
                why = "no such file or directory" if not p.is_symlink() else "a symlink to a missing file"
                raise PretokError(why if isinstance(e, FileNotFoundError) else e.strerror or str(e), p) from None
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise PretokError("not a regular file (a FIFO, socket or device); give a file or a directory", p)
            kind = _kind_of(p)
            size = st.st_size if kind != "hf-disk" else sum(f.stat().st_size for f in p.glob("*.arrow"))
            if kind != "hf-disk" and not os.access(p, os.R_OK):
                raise PretokError("permission denied", p)
            files.append(InputFile(str(p), kind, size, st.st_mtime_ns, inode=st.st_ino, device=st.st_dev))
    if not files:
        raise PretokError("no inputs given")
    return files


def compile_separator(pattern: str) -> "re.Pattern":
    """The `--separator` regex, refused in one line when invalid or when it matches the empty string (which would
    split between every character)."""
    try:
        sep = re.compile(pattern)
    except re.error as e:
        raise PretokError(f"invalid --separator regex {pattern!r}: {e}") from None
    if sep.fullmatch(""):
        raise PretokError(f"--separator {pattern!r} matches the empty string; use e.g. '\\n\\n+'")
    return sep
