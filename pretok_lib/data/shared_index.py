"""Per-document arrays (document lengths and starts, the epoch's order, the packing ends: 8 bytes a document each)
held once per rank and shared with its DataLoader workers, instead of one copy per worker.

- Forked workers (Linux up to Python 3.13) share the parent's pages: the loader builds the epoch's index in the
  main process before it starts them (`StatefulLoader`, through a source's `prepare(epoch)`).
- Workers started by spawn or forkserver (macOS; Linux from Python 3.14) receive the dataset pickled. A large
  array is pickled as a torch tensor in shared memory, which torch's multiprocessing reducers pass as a handle:
  the workers map the one copy. It is made once per array and reused for every worker and epoch.
- Where shared memory has no room (a container's 64 MB /dev/shm) or does not exist, arrays are pickled by value,
  as before: correct, only larger.
"""

from __future__ import annotations

import os
import weakref

import numpy as np
import torch

MIN_BYTES = 1 << 20  # smaller arrays travel by value: a shared segment costs a file descriptor in every worker
SHM_DIR = "/dev/shm"  # where torch's shared memory lives on Linux; its free space is checked before use
MAX_SHARED = 64  # shared arrays per process at most: each holds a file descriptor in every worker (a mixture of
                 # hundreds of datasets would otherwise approach `ulimit -n`); beyond it, arrays travel by value
_SHARED: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(array) -> (the array, its shared copy)


def _room(nbytes: int) -> bool:
    """Shared memory has room for `nbytes` twice over (a tmpfs overfilled kills the writer with SIGBUS)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= 2 * nbytes


def shared(a) -> torch.Tensor | None:
    """A torch tensor in shared memory holding numpy array `a` (made once per array, while the array lives), or
    None: `a` is smaller than MIN_BYTES, not a plain numeric array, MAX_SHARED arrays are shared already, or
    shared memory has no room."""
    if not isinstance(a, np.ndarray) or a.nbytes < MIN_BYTES or a.dtype.hasobject:
        return None
    hit = _SHARED.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    if len(_SHARED) >= MAX_SHARED or not _room(a.nbytes):
        return None
    try:
        dtype = torch.from_numpy(a[:0].copy()).dtype  # (an empty writable copy: `a` may be read-only)
        t = torch.empty(a.shape, dtype=dtype).share_memory_()
    except (RuntimeError, TypeError, ValueError):  # no shared memory here, a dtype or byte order torch lacks: by value
        return None
    t.numpy()[...] = a
    key = id(a)
    _SHARED[key] = (weakref.ref(a, lambda _ref, k=key: _SHARED.pop(k, None)), t)
    return t


def shareable(a):
    """What to pickle for `a`: its shared tensor (`shared`) where there is one, else `a` itself (by value)."""
    t = shared(a)
    return a if t is None else t


def unshared(v):
    """The numpy array of a value `shareable` returned (a view of the shared tensor, which it keeps alive)."""
    return v.numpy() if isinstance(v, torch.Tensor) else v


def share_state(state: dict, names: tuple[str, ...]) -> dict:
    """`state` (a __getstate__ dict) with its arrays `names` made shareable."""
    return {k: shareable(v) if k in names else v for k, v in state.items()}


def unshare_state(state: dict, names: tuple[str, ...]) -> dict:
    return {k: unshared(v) if k in names else v for k, v in state.items()}
