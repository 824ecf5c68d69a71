"""The one error type users see: a clear one-line message naming the file and the problem."""

from __future__ import annotations

import os


class PretokError(Exception):
    """A user-facing error. The CLI prints `pretok: error: <message>` and exits non-zero."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        super().__init__(f"{self.path}: {message}" if self.path else message)
