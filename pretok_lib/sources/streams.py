"""Lines of JSONL inputs, plain or compressed, with damage to a compressed container turned into one error.

A compressed file is one container: a truncated or corrupted `.gz`/`.zst` is an error for the whole file (its
documents cannot be trusted or counted), while damage inside one line of a plain file only loses that line. The
zstd reader checks that the file ends at a frame end: `zstandard`'s stream reader stops silently at a cut.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from typing import BinaryIO, Iterator

from ..errors import PretokError
from .remote import is_url
from .remote_file import open_input

READ_BYTES = 1 << 16  # compressed bytes fed per step: bounds the output of one decompress call


class ZstdTruncated(EOFError):
    """The file ended inside a zstd frame."""


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of every frame of a `.zst` file, in order; raises `ZstdTruncated` when the file
    ends inside a frame (a cut file), `zstandard.ZstdError` on corrupt data."""

    def __init__(self, fh: BinaryIO):
        import zstandard

        self._fh, self._new = fh, zstandard.ZstdDecompressor().decompressobj
        self._obj, self._fed = self._new(), False  # _fed: the current frame has input but no end yet
        self._buf, self._pos, self._done = b"", 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._pos >= len(self._buf):
            if self._done:
                return 0
            chunk = self._fh.read(READ_BYTES)
            if not chunk:
                if self._fed:
                    raise ZstdTruncated("the file ends inside a zstd frame (truncated?)")
                self._done = True
                return 0
            self._buf, self._pos = self._feed(chunk), 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def _feed(self, data: bytes) -> bytes:
        out = []
        while data:
            out.append(self._obj.decompress(data))
            self._fed = True
            if not self._obj.eof:
                break
            data, self._obj, self._fed = self._obj.unused_data, self._new(), False
        return b"".join(out)

    def close(self) -> None:
        self._fh.close()
        super().close()


class _GzipOf(gzip.GzipFile):
    """gzip over a file object it owns (closes it too)."""

    def close(self) -> None:
        fh = self.fileobj
        try:
            super().close()
        finally:
            if fh is not None:
                fh.close()


def _open_compressed(path: str, kind: str, buffer_bytes: int = 8 << 20, prefetch: bool = False) -> io.RawIOBase:
    if kind == "jsonl.gz":
        return _GzipOf(fileobj=open_input(path, buffer_bytes, prefetch=prefetch), mode="rb") if is_url(path) \
            else gzip.open(path, "rb")
    return ZstdFrames(open_input(path, buffer_bytes, prefetch=prefetch))


def _damage(e: BaseException) -> str | None:
    """What a decompression exception says about the container, or None if it is not one of those."""
    if isinstance(e, (EOFError, ZstdTruncated)):
        return f"truncated compressed file ({e})"
    if isinstance(e, (gzip.BadGzipFile, zlib.error)):
        return f"corrupt compressed stream ({type(e).__name__}: {e})"
    if type(e).__name__ == "ZstdError":
        return f"corrupt compressed stream (ZstdError: {e})"
    return None


def jsonl_lines(path: str, kind: str, start: int = 0, stop: int = 0) -> Iterator[tuple[bytes, int]]:
    """(line, byte offset) of a JSONL file: bytes [start, stop) of a plain one, every line of a compressed one
    (offsets in the decompressed stream). A damaged compressed file raises `PretokError`."""
    if kind == "jsonl":
        buf = min(8 << 20, max(1 << 16, stop - start))  # a unit: 1 request per 8 MB, the next one prefetched
        with open_input(path, buf, end=stop, prefetch=stop - start > buf) as fh:
            fh.seek(start)
            pos = start
            while pos < stop:
                line = fh.readline()
                if not line:
                    break
                yield line, pos
                pos += len(line)
        return
    # stop: a sample's (read no further than needed); else the whole file, the next range prefetched
    raw = _open_compressed(path, kind, min(8 << 20, max(1 << 16, stop)) if stop else 8 << 20, prefetch=not stop)
    try:
        pos = 0
        for line in io.BufferedReader(raw, 1 << 20):
            yield line, pos
            pos += len(line)
    except Exception as e:
        why = _damage(e)
        if why is None:
            raise
        raise PretokError(why, path) from None
    finally:
        raw.close()


def without_bom(line: bytes, pos: int) -> bytes:
    """The line without the UTF-8 BOM a file may start with."""
    return line[3:] if pos == 0 and line.startswith(b"\xef\xbb\xbf") else line


def parse_jsonl_line(line: bytes, pos: int) -> tuple[object, str | None]:
    """A JSONL line (BOM removed) → (record, None), or (None, why) when the line is not UTF-8 JSON. Strict UTF-8:
    json.loads of bytes would let encoded surrogates through."""
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {pos + e.start}"
    try:
        return json.loads(s), None
    except ValueError as e:
        return None, f"invalid JSON ({e})"
    except RecursionError:
        return None, "invalid JSON (nested too deeply)"
