"""The first row group of a worker's next unit, decoded in a thread while the worker still encodes the current one.

Within a unit, row groups are decoded one ahead (`prefetch.py`); the unit's first one was not, so every unit began
with its worker waiting for that decode (~3 ms per 2 MB row group; with one worker and a free core its core stood
idle 18% of the run, measured with `perf sched`). A worker that holds its next task starts that decode here
(`start`); the unit's reader takes it (`take`) by the file's identity, the row group and the text column, so a file
changed in between is read again, never served stale. Local Parquet only, row groups small enough to be read whole;
at most `SLOTS` decoded groups are kept (a slot never taken is dropped with the next ones).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

SLOTS = 2  # the current unit's (until its reader takes it) and the next one's

_lock = threading.Lock()
_slots: OrderedDict[tuple, tuple[threading.Thread, list]] = OrderedDict()


def start(key: tuple, decode: Callable[[], object]) -> None:
    """Run `decode()` in a thread for the reader that will ask for `key`; an error is left for that reader's own
    read to meet and report."""
    box: list = []

    def run() -> None:
        from ..machine.cpu_affinity import unpin_this_thread

        unpin_this_thread()  # as the reader's own read-ahead: beside the pinned worker, on any allowed core
        try:
            box.append(decode())
        except Exception:
            pass

    thread = threading.Thread(target=run, name="pretok-read-ahead", daemon=True)
    with _lock:
        if key in _slots:
            return
        _slots[key] = (thread, box)
        while len(_slots) > SLOTS:
            _slots.popitem(last=False)
    thread.start()


def take(key: tuple) -> object | None:
    """The decoded row group started for `key` (waiting for it to finish), or None: none started, or it failed."""
    with _lock:
        slot = _slots.pop(key, None)
    if slot is None:
        return None
    slot[0].join()
    return slot[1][0] if slot[1] else None


def pending() -> list[tuple]:
    """The keys started and not taken yet (oldest first)."""
    with _lock:
        return list(_slots)
