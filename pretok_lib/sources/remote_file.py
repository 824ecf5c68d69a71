"""Reading a remote object (`RemoteFile`): range requests through fsspec, each retried and counted by
`remote.call`; a parquet unit's column chunks joined into one request, sequential reads prefetched one range
ahead, S3 objects listed at planning opened without a HEAD and pinned to the listed ETag."""

from __future__ import annotations

import bisect
import io

from .remote import _listed, call, filesystem, is_url

SPAN_BYTES, GAP_BYTES = 8 << 20, 1 << 20  # `RemoteFile.expect`: ranges joined into one request (memory bound)


class RemoteFile(io.RawIOBase):
    """A seekable, read-only object: each `read` is one range request (retried), never past `end` (if given:
    the object reads as ending there); a read that starts a range announced by `expect` fetches the whole range
    (up to `SPAN_BYTES`) and serves the reads that follow from it. Wrap it in `io.BufferedReader` for line
    reading. An S3 object listed in this process is opened without a HEAD, pinned to its listed ETag.
    `prefetch`: from the second read on (a reader that stops after one range, a sample, costs no extra request),
    the next range of the same length is fetched in a thread while the caller works on this one (sequential
    reading: a JSONL unit, a compressed file); one range ahead at most."""

    def __init__(self, url: str, end: int | None = None, prefetch: bool = False):
        super().__init__()
        self.url, self.pos, self.prefetch = url, 0, prefetch
        self._spans: list[tuple[int, int]] = []
        self._block, self._block_at = b"", 0
        self._pool, self._ahead, self._reads = None, None, 0  # prefetching thread; ((at, length), future); reads
        fs, path = filesystem(url)
        self._f = call(url, lambda: _open(fs, path, url))
        self.size = self._f.size if end is None else min(end, self._f.size)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _range(self, n: int) -> bytes:
        if n <= 0:
            return b""
        at = self.pos - self._block_at
        if 0 <= at and at + n <= len(self._block):  # within what the last request fetched
            return self._block[at : at + n]
        i = bisect.bisect_right(self._spans, (self.pos, float("inf"))) - 1
        span_end = self._spans[i][1] if i >= 0 and self._spans[i][0] <= self.pos < self._spans[i][1] else 0
        want = min(max(n, span_end - self.pos), self.size - self.pos)
        data = self._get(self.pos, want)
        self._block, self._block_at = (data, self.pos) if len(data) > n else (b"", 0)
        return data[:n]

    def _fetch(self, at: int, n: int) -> bytes:
        def fetch() -> bytes:
            self._f.seek(at)
            return self._f.read(n)

        return call(self.url, fetch)

    def _get(self, at: int, n: int) -> bytes:
        """Bytes [at, at + n) or more: the prefetched range if it starts there and is as long, else fetched now;
        then the next range prefetched. One request at a time uses the file object (a prefetch in flight is
        waited for)."""
        ahead, self._ahead = self._ahead, None
        data = None
        if ahead is not None:
            if ahead[0][0] == at and ahead[0][1] >= n:
                data = ahead[1].result()  # its error, if it failed, is this read's
            else:
                ahead[1].exception()  # wait for it; a range not wanted after all
        if data is None:
            data = self._fetch(at, n)
        nxt, self._reads = at + len(data), self._reads + 1
        if self.prefetch and self._reads > 1 and len(data) >= n and nxt < self.size:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(1, thread_name_prefix="pretok-prefetch")
            m = min(len(data), self.size - nxt)
            self._ahead = ((nxt, m), self._pool.submit(self._fetch, nxt, m))
        return data

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, max(0, self.size - self.pos))
        data = self._range(n)
        self.pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def expect(self, ranges: list[tuple[int, int]]) -> None:
        """Byte ranges [a, b) about to be read, in any order: those less than `GAP_BYTES` apart are joined into
        spans of at most `SPAN_BYTES`, each fetched in one request when a read starts it (parquet: a unit's
        column chunks, consecutive in the file, one request instead of one per row group)."""
        spans: list[list[int]] = []
        for a, b in sorted(ranges):
            if spans and a - spans[-1][1] < GAP_BYTES and b - spans[-1][0] <= SPAN_BYTES:
                spans[-1][1] = max(spans[-1][1], b)
            else:
                spans.append([a, b])
        self._spans = [(a, b) for a, b in spans]

    def close(self) -> None:
        if not self.closed:
            if self._pool is not None:
                self._pool.shutdown(wait=True)  # a prefetch in flight ends before the file object closes
            self._f.close()
            self._block, self._ahead = b"", None
        super().close()


def _open(fs, path: str, url: str):
    """fsspec's file object of `path`, without the HEAD s3fs makes when opening, if the object was listed: read
    pinned to the listed ETag (a replaced object fails its next read: 412, "changed while it was being read")."""
    size, ident = _listed.get(url, (None, ()))
    etag = dict(ident).get("etag")
    if size is None or etag is None or type(fs).__name__ != "S3FileSystem" or getattr(fs, "version_aware", False):
        return fs.open(path, "rb", cache_type="none", block_size=1 << 20)
    f = fs.open(path, "rb", cache_type="none", block_size=1 << 20, size=size)
    f.details = {"name": path, "size": size, "type": "file", "ETag": etag}
    if not fs.local_expiry_check:
        f.read_kw = {**f.read_kw, "IfMatch": etag}
    return f


def open_input(path: str, buffer_bytes: int = 8 << 20, end: int | None = None,
               prefetch: bool = False) -> io.BufferedReader:
    """A local file (`open(path, "rb")`, exactly as before) or a remote object read through range requests of
    `buffer_bytes`, none past `end` (a remote unit's last byte: nothing beyond it is fetched); `prefetch`: the
    next range is fetched while this one is worked on (sequential reading, one more buffer in memory)."""
    if not is_url(path):
        return open(path, "rb")
    return io.BufferedReader(RemoteFile(path, end, prefetch), buffer_bytes)


def read_bytes(path: str) -> bytes:
    """A whole input file (a text document)."""
    if not is_url(path):
        with open(path, "rb") as fh:
            return fh.read()
    with RemoteFile(path) as f:
        return f.read()
