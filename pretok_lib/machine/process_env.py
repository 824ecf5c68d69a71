"""Environment variables of this process, set for the duration of a block (read by the processes it starts)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def environ_set(changes: Mapping[str, str]) -> Iterator[None]:
    """Set `changes` in `os.environ` for the block; afterwards each variable is as it was (unset if it was)."""
    old = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
