"""Run a generator one item ahead in a thread: its work that releases the GIL (Arrow's decompression and
decoding) overlaps what the consumer does meanwhile (encoding the batch before)."""

from __future__ import annotations

import queue
import threading
from typing import Iterator, TypeVar

from ..machine.cpu_affinity import unpin_this_thread

T = TypeVar("T")
_DONE = object()


def prefetched(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """The items of `items`, in order, produced by a thread at most `depth` items ahead of the consumer (alive at
    once: the consumer's item, `depth` queued and the one the producer is handing over). An exception of the producer is raised here, at its place in the
    sequence. When the consumer stops early (an error, or the generator closed), the producer stops at its next
    item and is joined; `items` is only ever advanced by that one thread."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        unpin_this_thread()  # a pinned worker's reading runs on the other cores while it encodes
        try:
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            put((_DONE, e))
            return
        put((_DONE, None))

    thread = threading.Thread(target=produce, name="pretok-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()
        close = getattr(items, "close", None)
        if close is not None:
            close()
