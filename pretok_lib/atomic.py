"""Atomic file writes: a reader sees the old file or the whole new one, never a half-written one (manifests, part
records, run.json, configs, verdicts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import os_error


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
