"""Atomic checkpoints (temp dir + rename, newest K kept) holding everything an exact resume needs.

    checkpoints/step_00000100/ model.pt  optim.pt  state.pt
state.pt: step, wall time, scheduler, gradient scaler, RNG states (python, numpy, torch CPU and CUDA), the
data loader's position (global, so valid for another world size) and cumulative counters. checksums.json:
the XXH3 of each file, hashed while writing and checked before loading: a damaged newest checkpoint is skipped
for the previous intact one (one warning line), and none intact is one clear error. Rank 0 writes; every rank
reads the same files on resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from ..errors import PretokError
from ..formats import checksum

STEP_DIR = re.compile(r"^step_(\d{8})$")
FILES = ("model.pt", "optim.pt", "state.pt")
CHECKSUMS = "checksums.json"
STATE_KEYS = ("scheduler", "scaler", "loader", "progress", "rng")
# Set in state.pt by every checkpoint written with checksums.json: such a checkpoint without one lost it (damage),
# unlike one written before checksums existed (loaded unverified, with a warning).
CHECKSUMMED = "checksummed"


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def names_path(path: Path):
    """An OSError raised inside (a failed write, which names no file) names `path`."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


class _Hashing:
    """A binary file that hashes what is written to it (torch.save writes sequentially)."""

    def __init__(self, fh):
        self.fh, self.h = fh, checksum.hasher()
        self.error: OSError | None = None     # torch.save hides a failed write under a RuntimeError

    def write(self, b) -> int:
        self.h.update(b)
        try:
            return self.fh.write(b)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.fh.flush()


def save(ckpt_dir: Path, step: int, model: torch.nn.Module, optimizer, state: dict, keep: int) -> Path:
    """Write checkpoint `step` under a temp name (files, then their checksums), fsync, rename; then drop all
    but the newest `keep` (`stale_checkpoints`). On an error (disk full) the temp dir is removed and the older checkpoints stay."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:08d}"
    tmp = ckpt_dir / f".tmp-step_{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        sums = {}
        for name, obj in zip(FILES, (model.state_dict(), optimizer.state_dict(),
                                     dict(state, step=step, rng=rng_state(), **{CHECKSUMMED: True}))):
            with names_path(tmp / name), open(tmp / name, "wb") as fh:
                out = _Hashing(fh)
                try:
                    torch.save(obj, out)
                except RuntimeError:
                    if out.error is None:
                        raise
                    raise out.error from None
                fh.flush()
                os.fsync(fh.fileno())
            sums[name] = checksum.value(out.h)
        with names_path(tmp / CHECKSUMS), open(tmp / CHECKSUMS, "w") as fh:
            fh.write(json.dumps(sums, indent=1) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if final.exists():      # a damaged checkpoint of this step that a resume skipped
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ckpt_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in stale_checkpoints(list_checkpoints(ckpt_dir), step, keep):
        shutil.rmtree(old, ignore_errors=True)
    return final


def stale_checkpoints(found: list[Path], step: int, keep: int) -> list[Path]:
    """What a save at `step` makes stale: the checkpoints before the newest `keep` up to `step`, and any after
    `step` (an abandoned future: a resume skipped them as damaged). Counting those by step number deleted the
    checkpoint just written and kept the damaged one."""
    def step_of(p: Path) -> int:
        return int(STEP_DIR.match(p.name).group(1))

    upto = [p for p in found if step_of(p) <= step]
    return upto[:-keep] + [p for p in found if step_of(p) > step]


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Every checkpoint directory (`step_N`), oldest first, intact or not: only `save` makes one, by renaming a
    complete temp dir, so a file missing from one is damage for `damage` to report, never a reason to pass over it
    in silence (a resume then restarted the run from step 0, an export took an older step). Temp dirs of an
    interrupted save are ignored."""
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if STEP_DIR.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def damage(path: Path) -> str | None:
    """Why checkpoint `path` cannot be trusted (a file missing, unreadable or not matching its checksum), or
    None when every file matches. A checkpoint written before checksums existed has no checksums.json: None (told
    by its state.pt from one that lost its checksums.json, which is damaged)."""
    for name in FILES:
        if not (path / name).is_file():
            return f"{name} is missing"
    try:
        sums = json.loads((path / CHECKSUMS).read_text())
    except FileNotFoundError:
        return _lost_checksums(path)
    except (OSError, ValueError) as e:
        return f"{CHECKSUMS} unreadable ({_first_line(e)})"
    if not isinstance(sums, dict):
        return f"{CHECKSUMS} is not a mapping"
    for name in FILES:
        want = sums.get(name)
        if not isinstance(want, str) or want.split(":", 1)[0] != checksum.ALGORITHM:
            return f"{CHECKSUMS} has no valid checksum of {name}"
        try:
            if not checksum.matches(path / name, want):
                return f"{name} does not match its checksum"
        except OSError as e:
            return f"{name}: {e.strerror or _first_line(e)}"
    return None


def _lost_checksums(path: Path) -> str | None:
    """For a checkpoint without checksums.json: why it is damaged if its state.pt says it was written with one
    (the file was lost), else None (written before checksums existed)."""
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - whatever a damaged pickle raises
        return f"state.pt unreadable ({_first_line(e)})"
    if isinstance(state, dict) and state.get(CHECKSUMMED):
        return f"{CHECKSUMS} is missing"
    return None


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def load(path: Path, model: torch.nn.Module, optimizer, map_location) -> dict:
    """Restore model and optimizer in place from checkpoint `path` (checksums checked first); return the state
    dict (RNG not yet applied: see set_rng_state). A damaged checkpoint is a PretokError."""
    problem = damage(path)
    if problem:
        raise PretokError(f"damaged checkpoint: {problem}", path)
    try:
        model.load_state_dict(torch.load(path / "model.pt", map_location=map_location, weights_only=True))
        optimizer.load_state_dict(torch.load(path / "optim.pt", map_location=map_location, weights_only=True))
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - whatever a damaged pickle raises: one clean line
        raise PretokError(f"cannot resume from this checkpoint: {_first_line(e)}", path) from None
    if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS):
        raise PretokError("cannot resume from this checkpoint: state.pt lacks the run state", path)
    return state


def load_newest(ckpt_dir: Path, model: torch.nn.Module, optimizer, map_location,
                warn=lambda msg: None) -> tuple[Path, dict] | None:
    """Load the newest intact checkpoint: a damaged one is skipped (`warn` gets one line) for the one before;
    None when there is none at all; a PretokError when every one is damaged."""
    found = list_checkpoints(ckpt_dir)
    problems = []
    for path in reversed(found):
        try:
            state = load(path, model, optimizer, map_location)
            if not (path / CHECKSUMS).exists():
                warn(f"warning: {path} has no {CHECKSUMS} (written by an older pretok): loaded unverified")
            return path, state
        except PretokError as e:
            problems.append(str(e))
            older = "the previous one" if path != found[0] else "no older one left"
            warn(f"warning: skipping {e} ({older})")
    if problems:
        raise PretokError(f"no intact checkpoint to resume from ({len(problems)} damaged; newest: {problems[0]}); "
                          f"delete {ckpt_dir} to start over", ckpt_dir)
    return None
