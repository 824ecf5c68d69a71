"""Placing memmap parts into one Megatron `.bin` (the memmap format's write path), with no per-byte work in the
main process.

A worker keeps each part it tokenized in memory (`parts.HeldPart`, up to 64 MB; a larger one is streamed to
`.pretok/parts/part-N.bin` + `.lens`, not fsynced) with the XXH3-128 of its would-be files. Once every part before
it has a record, a part's sizes fix its offsets in `OUT/data.bin.tmp` and `OUT/.pretok/data.lens`: the main process
hands them out in order (`MemmapAssembler.add`), and the worker holding the part writes it there (`write_held`), or
any worker copies a part's files there (`place_part`: in-kernel copy_file_range at those offsets) and deletes them;
the `.bin` is fdatasynced after every ~64 MB placed. The main process logs each placed part in
`.pretok/placed.jsonl` (offsets, sizes, hashes; flushed at most once a second, not fsynced).
After a kill, every logged part is re-read at its offsets and checked against its hashes (data lost by a power cut
is detected and redone); parts whose own files are intact are placed again, the rest tokenized again. `finish`
fsyncs and renames the `.bin`, then streams the `.idx` from the lengths. The `.bin`'s checksum is the tree of its
parts' hashes (`formats.checksum.PARTS`): nobody hashes the whole file.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_text
from ..errors import PretokError, os_error
from ..formats import checksum
from ..formats import memmap as mm

LOG_EVERY_S = 1.0  # flush the log of placed parts at most once a second (a crash redoes at most ~1 s of placing)
SYNC_EVERY_BYTES = 64 << 20  # a worker fdatasyncs the .bin after placing every ~64 MB


# copy_file_range is Linux's; a filesystem or kernel that refuses it (FUSE, a copy across filesystems on some kernels,
# a seccomp filter) answers with one of these, and the bytes are then copied through a buffer. Any other error
# (ENOSPC, EIO) is the copy's own failure and propagates.
NO_KERNEL_COPY = frozenset({errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM})


def append_bytes(src_fd: int, dst_fd: int, size: int, src: Path) -> None:
    """Copy `size` bytes from `src_fd`'s position to `dst_fd`'s (both advance): in the kernel where it can, else
    through a 1 MiB buffer. A source that ends early is an OSError naming `src`."""
    done, kernel = 0, hasattr(os, "copy_file_range")
    while done < size:
        if kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, size - done)
            except OSError as e:
                if e.errno not in NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
        else:
            view = memoryview(os.read(src_fd, min(size - done, 1 << 20)))
            n = len(view)
            while view:
                view = view[os.write(dst_fd, view):]
        if n == 0:
            raise OSError(f"{src}: short copy")
        done += n


@dataclass(frozen=True)
class Placement:
    """Where one finished part goes: its files' prefix and, for the `.bin` and the `.lens`, the target's path,
    offset and size (picklable: sent to a worker)."""

    index: int  # the unit's
    part: str  # `<dir>/part-N`: the files `part-N.bin` and `part-N.lens`
    targets: tuple[tuple[str, str, int, int], ...]  # (extension, target path, offset, size)
    sync: bool = False  # fdatasync the `.bin` after this part (every ~SYNC_EVERY_BYTES placed)


def place_part(p: Placement) -> None:
    """Copy the part's files into the targets at their offsets (a worker's job), then delete them; with `sync`,
    fdatasync the `.bin` first, so that the final fsync finds little to write or to flush out of the device's cache
    (measured here: 0.42 s → 0.03 s for 450 MB), its CPU in a worker, not the main process. An OSError (disk
    full, also one found by the sync...) becomes one line naming the target."""
    for ext, target, offset, size in p.targets:
        src = Path(p.part + ext)
        try:
            with open(src, "rb") as fh:
                fd = os.open(target, os.O_WRONLY)
                try:
                    os.lseek(fd, offset, os.SEEK_SET)
                    append_bytes(fh.fileno(), fd, size, src)
                    if p.sync and ext == ".bin":
                        getattr(os, "fdatasync", os.fsync)(fd)  # macOS has fsync only
                finally:
                    os.close(fd)
        except OSError as e:
            raise os_error(e, target, "placing parts") from None
    for ext, *_ in p.targets:
        Path(p.part + ext).unlink(missing_ok=True)


def write_held(p: Placement, part) -> None:
    """Write a part kept in memory (`parts.HeldPart`: its worker's job) into the targets at their offsets, with
    `sync` as `place_part`. An OSError (disk full...) becomes one line naming the target."""
    for ext, target, offset, size in p.targets:
        try:
            fd = os.open(target, os.O_WRONLY)
            try:
                at = offset
                for buf in part.buffers(ext):
                    view = memoryview(buf).cast("B")
                    while view:
                        n = os.pwrite(fd, view, at)
                        view, at = view[n:], at + n
                if at - offset != size:
                    raise OSError(errno.EIO, f"part {p.index} holds {at - offset} bytes of {ext}, not {size}")
                if p.sync and ext == ".bin":
                    getattr(os, "fdatasync", os.fsync)(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise os_error(e, target, "placing parts") from None


def range_intact(path: Path, offset: int, size: int, digest: str) -> bool:
    """Whether `size` bytes of `path` from `offset` have the XXH3-128 `digest`."""
    try:
        return checksum.range_leaf(str(path), offset, size)[1] == digest
    except OSError:
        return False


class MemmapAssembler:
    """Hands out the offsets of parts in `unit_order` as their sizes become known, and records which are placed."""

    def __init__(self, out: Path, state: Path, prefix: str, dtype: str, unit_order: list[int]):
        self.out, self.prefix, self.dtype = out, prefix, dtype
        self.itemsize = np.dtype(dtype).itemsize
        self.order, self.position = unit_order, {u: k for k, u in enumerate(unit_order)}
        self.bin_path, self.lens_path = out / f"{prefix}.bin.tmp", state / f"{prefix}.lens"
        self.parts_dir, self.log_path = state / "parts", state / "placed.jsonl"
        self._parts, self._bin, self._lens = str(self.parts_dir), str(self.bin_path), str(self.lens_path)  # per part
        self.records: dict[int, tuple[int, int, list[str]]] = {}  # position → (bin bytes, documents, hashes)
        self.offsets: list[tuple[int, int]] = []  # (bin, lens) offset of each position whose offsets are known
        self.ends = (0, 0)  # where the known prefix ends in both files
        self.placed: dict[int, list] = {}  # position → its log entry
        self.log_lines: list[str] = []
        self.last_log = 0.0
        final = out / f"{prefix}.bin"
        if not self.bin_path.exists() and final.exists():  # a `finish` cut short (disk full writing the index...)
            os.replace(final, self.bin_path)  # after the rename: take the .bin back, its parts are checked
        for path in (self.bin_path, self.lens_path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        self.bin_fd = os.open(self.bin_path, os.O_RDWR)
        self.unsynced = 0  # bytes handed out since the last placement told to sync

    # ------------------------------------------------------------ resume
    def logged(self) -> dict[int, list]:
        """The placements the log records (unit index → entry), up to its first line that is not one: a torn last
        line (a crash), NULs (a power cut before writeback), bytes that are not UTF-8. Each is checked before use
        (`keep_placed`); a part not taken back is tokenized again."""
        got = {}
        try:
            lines = self.log_path.read_bytes().split(b"\n")
        except OSError:
            return got
        for line in lines:
            try:
                entry = json.loads(line.decode())
                got[int(entry[0])] = entry
            except (ValueError, TypeError, IndexError, KeyError, RecursionError):   # UnicodeDecodeError: a ValueError
                break
        return got

    def keep_placed(self, index: int, tokens: int, documents: int, record_hashes: list[str], entry: list) -> bool:
        """Take a logged placement back after a crash if it is the part's record's and its bytes are intact at its
        offsets (re-read)."""
        try:
            _, bin_off, bin_size, lens_off, docs, hashes = entry
        except ValueError:
            return False
        if (hashes, bin_size, docs) != (record_hashes, tokens * self.itemsize, documents) or not (
                range_intact(self.bin_path, bin_off, bin_size, hashes[0])
                and range_intact(self.lens_path, lens_off, 4 * docs, hashes[1])):
            return False
        self.placed[self.position[index]] = entry
        return True

    def restart_log(self) -> None:
        """Rewrite the log with the placements kept (`keep_placed`), before anything new is placed."""
        atomic_write_text(self.log_path, "".join(json.dumps(e) + "\n" for _, e in sorted(self.placed.items())),
                          fsync=False)

    # ------------------------------------------------------------ the run
    def add(self, index: int, tokens: int, documents: int, hashes: list[str]) -> list[Placement]:
        """Take a finished part's sizes; returns the placements now known and not yet done, in order."""
        self.records[self.position[index]] = (tokens * self.itemsize, documents, hashes)
        ready = []
        while len(self.offsets) < len(self.order) and len(self.offsets) in self.records:
            k = len(self.offsets)
            size, docs, _ = self.records[k]
            b, l = self.ends
            self.offsets.append(self.ends)
            self.ends = (b + size, l + 4 * docs)
            if k in self.placed:
                if self.placed[k][1] != b or self.placed[k][3] != l:
                    raise PretokError("a part placed before the crash lies elsewhere than its sizes now say; "
                                      "rerun with --overwrite", self.bin_path)
                continue
            self.unsynced += size
            sync, self.unsynced = (True, 0) if self.unsynced >= SYNC_EVERY_BYTES else (False, self.unsynced)
            ready.append(Placement(self.order[k], f"{self._parts}/part-{self.order[k]:06d}",
                                   ((".bin", self._bin, b, size), (".lens", self._lens, l, 4 * docs)), sync))
        return ready

    def done(self, index: int) -> None:
        """A worker placed unit `index`'s part: log it (flushed at most once a second)."""
        k = self.position[index]
        size, docs, hashes = self.records[k]
        entry = [index, self.offsets[k][0], size, self.offsets[k][1], docs, hashes]
        self.placed[k] = entry
        self.log_lines.append(json.dumps(entry) + "\n")
        if time.monotonic() - self.last_log >= LOG_EVERY_S:
            self.flush_log()

    def flush_log(self) -> None:
        if self.log_lines:
            with open(self.log_path, "a") as fh:
                fh.write("".join(self.log_lines))
            self.log_lines = []
        self.last_log = time.monotonic()

    def finish(self) -> list[dict]:
        """Fsync and rename the .bin, write the index; returns both files' records."""
        assert len(self.placed) == len(self.order), "finish() before every part was placed"
        try:
            return self._finish()
        except OSError as e:
            raise os_error(e, self.out / f"{self.prefix}.idx" if self.bin_fd < 0 else self.bin_path,
                           "finishing the memmap files") from None

    def _finish(self) -> list[dict]:
        self.flush_log()
        os.truncate(self.bin_path, self.ends[0])  # bytes past the end: placed by a run of another plan
        os.truncate(self.lens_path, self.ends[1])
        os.fsync(self.bin_fd)
        os.close(self.bin_fd)
        self.bin_fd = -1
        with open(self.lens_path, "rb+") as fh:
            os.fsync(fh.fileno())
        final_bin = self.out / f"{self.prefix}.bin"
        os.replace(self.bin_path, final_bin)
        idx = mm.write_index(self.lens_path, self.out / f"{self.prefix}.idx", self.dtype)
        leaves = [[self.placed[k][2], self.placed[k][5][0]] for k in range(len(self.order))]
        return [{"path": final_bin.name, "size": self.ends[0], "checksum": checksum.tree_value(leaves),
                 "leaves": leaves}, idx]

    def close(self) -> None:
        """Release the files after a failed run (errors ignored: the run is failing for its own reason)."""
        try:
            self.flush_log()
        except OSError:
            pass
        if self.bin_fd >= 0:
            os.close(self.bin_fd)
            self.bin_fd = -1
