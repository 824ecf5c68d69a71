"""Atomic checkpoints (temp dir + rename, newest K kept) holding everything an exact resume needs.

    checkpoints/step_00000100/ model.pt  optim.pt  state.pt
state.pt: step, wall time, scheduler, gradient scaler, RNG states (python, numpy, torch CPU and CUDA), the
data loader's position (global, so valid for another world size) and cumulative counters. Rank 0 writes;
every rank reads the same files on resume.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from ..errors import PretokError

STEP_DIR = re.compile(r"^step_(\d{8})$")


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


def save(ckpt_dir: Path, step: int, model: torch.nn.Module, optimizer, state: dict, keep: int) -> Path:
    """Write checkpoint `step` under a temp name, fsync, rename; then drop all but the newest `keep`."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:08d}"
    tmp = ckpt_dir / f".tmp-step_{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, obj in (("model.pt", model.state_dict()), ("optim.pt", optimizer.state_dict()),
                      ("state.pt", dict(state, step=step, rng=rng_state()))):
        with open(tmp / name, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_dir)
    for old in list_checkpoints(ckpt_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temp dirs of an interrupted save are ignored)."""
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if p.is_dir() and STEP_DIR.match(p.name)
             and all((p / f).is_file() for f in ("model.pt", "optim.pt", "state.pt"))]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def load(path: Path, model: torch.nn.Module, optimizer, map_location) -> dict:
    """Restore model and optimizer in place; return the state dict (RNG not yet applied: see set_rng_state)."""
    try:
        model.load_state_dict(torch.load(path / "model.pt", map_location=map_location, weights_only=True))
        optimizer.load_state_dict(torch.load(path / "optim.pt", map_location=map_location, weights_only=True))
        return torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except (RuntimeError, OSError, EOFError, KeyError, ValueError) as e:
        raise PretokError(f"cannot resume from this checkpoint: {str(e).splitlines()[0]}", path) from None
