"""The output directory of `pretok tokenize` / `pretok merge`: its lock, its checks, resume state, deletion.

The lock is a file *beside* the output, `<parent>/.<name>.lock` (flock, else lockf), taken before anything under the
output is read or changed and held until the run ends. Being outside the directory, it outlives `--overwrite`'s
replacement of the directory, so two writers never interleave (a lock inside the directory would be deleted with
it). A second writer gets one line and exit 1. The holder removes the file when it ends, however it ends (an
error, Ctrl-C, SIGTERM), while it still holds the lock; a taker checks that the file it locked is still the one
at the path (else it was removed under it, and it starts over), so removal never lets two writers in. A lock file
left by a killed run (SIGKILL, a node lost) is locked by nobody: the next run takes it over and says so.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ..atomic import atomic_write_json
from ..errors import PretokError, os_error
from ..formats.manifest import format_policy
from ..sources import Unit
from .parts import STATE, PartRecord, part_name


def resolve_output(out: str | os.PathLike) -> Path:
    """The real path of an output dir; refuses what cannot be one: an existing non-directory (a regular file, a
    FIFO, a device...) and a dangling symbolic link."""
    path = Path(out)
    if path.is_symlink() and not path.exists():
        raise PretokError(f"is a dangling symbolic link (to {os.readlink(path)}); remove it or choose another --out",
                          path)
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:  # e.g. a parent that is a regular file (ENOTDIR), a symlink loop, no permission
        raise os_error(e, path) from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "not a regular file"
        raise PretokError(f"exists and is {kind}, not a directory; choose another --out", path)
    return Path(os.path.realpath(path))


def lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold the output's lock (beside it) for the block, and remove the lock file when the block ends (any way
    but SIGKILL); a second holder gets one line. `out` as `resolve_output` returns it. On a read-only file
    system a *finished* output is still readable without the lock."""
    lock = lock_path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = _take_lock(lock, out)
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and (out / "manifest.json").is_file():
            yield  # nothing will be written; a rerun of a finished output is a no-op
            return
        raise os_error(e, lock if e.filename is None else None, "cannot create the output's lock file") from None
    try:
        yield
    finally:
        try:
            if _is_at(fd, lock):  # still ours (held): remove it before letting go
                lock.unlink()
        except OSError:
            pass  # a lock file that cannot be removed is taken over by the next run
        finally:
            os.close(fd)


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is the file now at `path` (not removed or replaced since it was opened)."""
    try:
        st, now = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


def _take_lock(lock: Path, out: Path) -> int:
    """Open and lock `lock`, record this process in it; the fd. Starts over when the file was removed or
    replaced between opening and locking it (its holder ended meanwhile). A lock file that already held a
    holder's record and is locked by nobody was left by a killed run: taken over with one line."""
    for _ in range(1000):
        try:
            fd, created = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(lock, os.O_RDWR), False
            except FileNotFoundError:
                continue  # removed by its holder in between
        try:
            locked = lock_or_say_why_not(fd, lock, out)
            if locked and not _is_at(fd, lock):
                os.close(fd)
                continue
            left = b"" if created else os.pread(fd, 256, 0).strip()
            _record_holder(fd)
        except BaseException:
            os.close(fd)
            raise
        if locked and left:
            print(f"pretok: note: {lock}: took over a stale lock left by a run that was killed "
                  f"({left.decode(errors='replace')}); its output is resumed or replaced as usual",
                  file=sys.stderr, flush=True)
        return fd
    raise PretokError("the lock file keeps being replaced while this run takes it; is something else deleting it?",
                      lock)


def _record_holder(fd: int) -> None:
    """Write who holds the lock into it (read when a killed run left it behind); best effort."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError:
        pass


# What a file system without locks answers (Lustre mounted without flock/localflock, some FUSE and NFS set-ups).
NO_LOCKS = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK, errno.EINVAL})


def lock_or_say_why_not(fd: int, lock: Path, out: Path, busy: str | None = None) -> bool:
    """flock, else a POSIX record lock (NFS through lockd, Lustre with localflock); where the file system has
    neither, the run goes on unlocked and says so in one line (a second writer would then not be detected):
    False then, True when locked.
    `busy`: the error when another process holds it (default: another pretok process writes into `out`)."""
    busy = PretokError(busy or f"another pretok process is writing into this output (it holds {lock})", out)
    refusals = []
    for take in (lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB),
                 lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)):
        try:
            take()
            return True
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):  # held (lockf may say EACCES)
                raise busy from None
            if e.errno not in NO_LOCKS:
                raise os_error(e, lock, "cannot lock the output") from None
            refusals.append(os.strerror(e.errno))
    print(f"pretok: warning: {lock}: the file system cannot lock ({'; '.join(refusals)}); writing without the "
          f"lock, so make sure no other process writes into {out}", file=sys.stderr, flush=True)
    return False


def _only_scaffolding(out: Path) -> bool:
    """True if `out` holds nothing but what a run killed before writing its config leaves: the state dir with
    an empty parts dir, a lock file (of earlier versions) and perhaps a torn config temp file."""
    state = out / STATE
    if [p.name for p in out.iterdir()] != [STATE] or not state.is_dir():
        return False
    allowed = {"parts", "lock", "config.json.tmp"}
    return all(p.name in allowed for p in state.iterdir()) and not any((state / "parts").glob("*"))


def _aside(out: Path) -> Path:
    return out.with_name(f".{out.name}.removing")


# The entries of an output directory that pretok writes (docs/ENGINE.md, "What --overwrite removes"): the
# manifest, the run state, parquet parts and the memmap pair, each perhaps under its temp name.
OWNED = re.compile(r"(manifest\.json|part-\d{6,}\.parquet|data\.(bin|idx))(\.tmp)?")


def foreign_entries(out: Path) -> list[str]:
    """The names in `out` that pretok did not write (sorted): anything but `OWNED` files and the `.pretok` dir."""
    return sorted(p.name for p in out.iterdir()
                  if not (p.name == STATE and p.is_dir() and not p.is_symlink())
                  and not (OWNED.fullmatch(p.name) and p.is_file() and not p.is_symlink()))


def refuse_overlap(out: Path, paths: Sequence[str | os.PathLike], noun: str) -> None:
    """Refuse an output that is one of `paths` (local inputs or shards), lies inside one or contains one
    (symbolic links resolved): writing or deleting there could destroy an input."""
    for d in paths:
        real = Path(os.path.realpath(d))
        if out == real or real in out.parents or out in real.parents:
            how = "is" if out == real else "is inside" if real in out.parents else "contains"
            raise PretokError(f"{how} {noun} {d}: writing there would destroy an input; choose another --out", out)


def remove_output(out: Path) -> None:
    """Delete an output dir as one step for a reader: renamed aside first, so a kill mid-delete leaves no torn
    output under `out` (a later run finishes deleting the leftover). Call it holding the lock. Refuses, before
    deleting anything, a directory holding an entry pretok did not write (`foreign_entries`), naming it."""
    foreign = foreign_entries(out)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise PretokError(f"holds {foreign[0]!r}{more}, which pretok did not write; --overwrite removes only a "
                          "pretok output: move it away or choose another --out", out)
    aside = _aside(out)
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(out, aside)
    shutil.rmtree(aside)


def config_differences(prev: dict, key: dict) -> list[str]:
    """The fields in which a stored output key differs from a run's (`policy.seq_len`: the policy's own field).
    A key of an earlier version that recorded `seq_len` for every format is read as `format_policy` states it."""
    prev = dict(prev)
    if isinstance(prev.get("policy"), dict):
        prev["policy"] = format_policy(prev.get("format"), prev["policy"])
    diff = []
    for k in sorted(set(prev) | set(key)):
        a, b = prev.get(k), key.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            diff += [f"{k}.{f}" for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)]
        elif a != b:
            diff.append(k)
    return diff


def key_of_manifest(manifest: dict) -> dict:
    """The output key (`.pretok/config.json`'s content) that a finished output's manifest records, so that the
    run state may be deleted once the manifest exists (docs/FORMATS.md) and the same command still finds its
    output complete. It has `batch_bytes` where the key has `batch_mb`: compare it with `comparable_key(key)`."""
    source, shard = manifest["source"], manifest["shard"]
    first, stop = shard["units"]
    return {"format": manifest["format"], "tokenizer_fingerprint": manifest["tokenizer"]["fingerprint"],
            "policy": manifest["policy"], "compression": manifest["compression"],
            "text_column": source["text_column"], "separator": source["separator"],
            "part_bytes": source["part_bytes"], "batch_bytes": source["batch_bytes"],
            "inputs": [{k: v for k, v in i.items() if k != "checksum"} for i in manifest["inputs"]],
            "num_shards": shard["num_shards"], "shard_index": shard["shard_index"], "units": list(range(first, stop))}


def comparable_key(key: dict) -> dict:
    """A run's key with `batch_mb` as the bytes per read it stands for (`TokenizeConfig.source_options`), as a
    manifest records it."""
    out = {k: v for k, v in key.items() if k != "batch_mb"}
    return {**out, "batch_bytes": int(key["batch_mb"] * 1e6)}


def _differences_from_manifest(out: Path, key: dict) -> list[str] | None:
    """How `key` differs from the finished output's manifest; None if there is no readable manifest."""
    from ..formats.manifest import read_manifest

    try:
        recorded = key_of_manifest(read_manifest(out))
    except (PretokError, KeyError, TypeError, ValueError):
        return None
    return config_differences(recorded, comparable_key(key))


def recorded_part_bytes(out: Path) -> int | None:
    """The part size an existing output was planned with (its run state's key, else its manifest), or None (no
    output there, or nothing readable). A run given no `--part-mb` plans with it, so that an output made while
    another default held is resumed, or found complete, as it was planned, not refused."""
    for path, get in ((out / STATE / "config.json", lambda d: d["part_bytes"]),
                      (out / "manifest.json", lambda d: d["source"]["part_bytes"])):
        try:
            value = get(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def prepare_output(out: Path, key: dict, overwrite: bool) -> bool:
    """Create/validate the output dir, holding its lock; returns whether it is complete already. Refuses a
    different config (or a directory that is not a pretok output) unless `overwrite`."""
    state = out / STATE
    try:
        if _aside(out).exists():  # a delete killed midway
            shutil.rmtree(_aside(out))
        if out.exists() and any(out.iterdir()) and not _only_scaffolding(out):
            old = state / "config.json"
            if overwrite:
                remove_output(out)
            elif not old.exists():  # the run state deleted after the manifest (allowed), or not our directory
                diff = _differences_from_manifest(out, key)
                if diff is None:
                    raise PretokError("exists, is not empty and is not a pretok output; use --overwrite or another "
                                      "--out", out)
                if diff:
                    raise PretokError(f"holds output of a different config (differs in: {', '.join(diff)}); "
                                      "use --overwrite or another --out", out)
            else:
                try:
                    prev = json.loads(old.read_text())
                except ValueError:
                    raise PretokError("corrupt run state (not JSON); use --overwrite", old) from None
                diff = config_differences(prev, key)
                if diff:
                    raise PretokError(f"holds output of a different config (differs in: {', '.join(diff)}); "
                                      "use --overwrite or another --out", out)
        (state / "parts").mkdir(parents=True, exist_ok=True)
        if not (state / "config.json").exists():
            atomic_write_json(state / "config.json", key)
    except OSError as e:
        raise os_error(e, out) from None
    return (out / "manifest.json").exists()


def committed_parts(out: Path, units: Sequence[Unit]) -> dict[int, PartRecord]:
    """Records of parts already committed; removes the leftovers of uncommitted ones (temp files, half parts)."""
    parts = out / STATE / "parts"
    done = {}
    for u in units:
        rec = parts / f"{part_name(u.index)}.json"
        if rec.exists():
            try:
                done[u.index] = json.loads(rec.read_text())
            except ValueError:  # torn by a power cut (memmap records are not fsynced): the part is redone
                rec.unlink()
    for p in list(parts.iterdir()) + [p for p in out.glob("part-*") if OWNED.fullmatch(p.name)]:
        stem = p.name.split(".")[0]
        idx = int(stem.split("-")[1]) if stem.startswith("part-") and stem[5:].isdigit() else None
        if p.name.endswith(".tmp") or (idx is not None and idx not in done):
            p.unlink()
    return done
