"""The one error type users see: a clear one-line message naming the file and the problem."""

from __future__ import annotations

import os


class PretokError(Exception):
    """A user-facing error. The CLI prints `pretok: error: <message>` and exits non-zero."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        if path is None:
            message = _unwrapped(message)
        super().__init__(f"{self.path}: {message}" if self.path else message)


def _unwrapped(message: str) -> str:
    """The one line of a PretokError that torch re-raises from a DataLoader worker (or any thread it wraps):
    torch builds the error anew from "Caught PretokError in DataLoader worker process 0.\nOriginal Traceback
    ...\npretok_lib.errors.PretokError: <the line>"; that last line is what the user is to see."""
    if not (message.startswith("Caught ") and "\nOriginal Traceback" in message):
        return message
    caught = message.split(" ", 2)[1]  # the class name torch caught
    for line in reversed(message.rstrip().splitlines()):
        name, sep, rest = line.partition(": ")
        if sep and name.rsplit(".", 1)[-1] == caught:
            return rest
    return message


class NonFiniteLoss(RuntimeError):
    """A training step's loss was NaN or infinite (diverged, or computed wrongly): the run stops, failed, keeping
    its last checkpoint; every rank sees the same all-reduced loss, so all stop at the same step."""


class PretokOSError(PretokError, OSError):
    """An OSError made one line: still an OSError (errno, strerror, filename kept) for callers that handle those
    (training marks its run failed on any OSError of its run directory), printed as `<file>: <errno text>`."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def os_error(e: OSError, path: str | os.PathLike | None = None, doing: str | None = None) -> PretokError:
    """An OSError as one line: the file (the error's own, else `path`), what was being done, and the errno text
    ("No space left on device", "Read-only file system", ...); pyarrow's wordy messages are reduced to that."""
    if isinstance(e, PretokError):  # made one line already, naming its file
        return e
    if e.errno:
        text = os.strerror(e.errno)
    else:
        lines = str(e).strip().splitlines()
        text = lines[0] if lines else type(e).__name__
    if doing:
        text = f"{doing}: {text}"
    where = e.filename if e.filename is not None else path
    if e.filename2 is not None:
        text = f"{text} (-> {os.fspath(e.filename2)})"
    err = PretokOSError(text, where)
    err.errno, err.strerror = e.errno, e.strerror
    err.filename = None if where is None else os.fspath(where)
    return err
