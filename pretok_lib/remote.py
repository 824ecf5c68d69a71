"""Inputs given as URLs (`s3://`, `gs://`, `hf://`, `https://`, ...) through fsspec; local paths never come here.

A thin layer under `sources`: listing (globs, sorted, so every process plans the same units), each object's
size and version identity (ETag / version id / generation / last-modified) for the manifest and change
detection, and a seekable reader that fetches exactly the byte ranges asked for (parquet: footer, then column
chunks; JSONL: newline-aligned ranges), one request per read. Every request is retried on transient errors
(connection reset, timeouts, 5xx / SlowDown / 429) with exponential backoff and counted (`retries()`); a
permanent error (403, 404, a missing bucket) is one line naming the URL. The libraries' own retries are turned
off where they can be (s3fs, botocore), so each retry is counted here once.

Credentials come from each filesystem's standard places (environment, ~/.aws, fsspec config, HF token...);
URLs carrying them (user:password@, signed query strings) are refused, and error text is scrubbed of the
secret values found in the environment, so none reaches a manifest, a log or an error message.
"""

from __future__ import annotations

import bisect
import functools
import io
import os
import random
import re
import time
from datetime import datetime, timezone
from typing import Callable, TypeVar

from .errors import PretokError

T = TypeVar("T")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SIGNED_QUERY = re.compile(r"[?&](x-amz-|x-goog-|signature|sig=|token|key=|credential|access_token)", re.I)
ATTEMPTS = 8  # tries per request (first + retries)
BACKOFF_S, BACKOFF_MAX_S = 0.2, 10.0
TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
                   "ThrottlingException", "TooManyRequests", "RequestLimitExceeded", "500", "502", "503", "504"}
_TRANSIENT_NAMES = ("Connection", "Timeout", "Disconnected", "Payload", "IncompleteRead", "ResponseParserError",
                    "ProtocolError", "ReadError", "RemoteProtocolError")
_SECRET_ENV = re.compile(r"(SECRET|TOKEN|PASSWORD|CREDENTIAL|ACCESS_KEY|API_KEY|PRIVATE)", re.I)
_retries = [0]  # transient errors retried by this process
# (size, version identity) of each object as listed for planning, by URL: a reader opened on one of them asks
# no HEAD of its own, and reads it pinned to that version (S3: If-Match on the listed ETag)
_listed: dict[str, tuple[int, tuple]] = {}
LIST_THREADS = 16  # objects HEADed (or globs listed) at a time
SPAN_BYTES, GAP_BYTES = 8 << 20, 1 << 20  # `RemoteFile.expect`: ranges joined into one request (memory bound)


def is_url(spec: str | os.PathLike) -> bool:
    """A URL of an fsspec filesystem (`file://` too: fsspec's local filesystem); a plain path is not one."""
    return isinstance(spec, str) and _SCHEME.match(spec) is not None


def retries() -> int:
    """Transient errors retried in this process (less those `take_retries` handed to a part's record)."""
    return _retries[0]


def take_retries(mark: int) -> int:
    """The retries since `retries()` returned `mark`, moved out of this process's count (into a part's record,
    so that the run's total counts each once, whether the part was made inline or by a worker)."""
    n = max(0, _retries[0] - mark)
    _retries[0] -= n
    return n


def scrub(text: str) -> str:
    """`text` without the values of secret-looking environment variables (keys, tokens, passwords)."""
    for k, v in os.environ.items():
        if v and len(v) >= 4 and _SECRET_ENV.search(k) and v in text:
            text = text.replace(v, "***")
    return text


def check_url(url: str) -> None:
    """Refuse a URL that carries credentials: they would be recorded in the manifest and printed in errors."""
    rest = url.split("://", 1)[1]
    if "@" in rest.split("/", 1)[0]:
        raise PretokError("a URL must not carry credentials (user:password@); use the filesystem's standard "
                          "places (environment, config files)", _SCHEME.match(url).group(0) + "...")
    if _SIGNED_QUERY.search(url):
        raise PretokError("a signed URL (credentials in its query string) would be recorded in the manifest; "
                          "use the filesystem's standard credentials instead", url.split("?", 1)[0] + "?...")


# ---------------------------------------------------------------- errors: transient or permanent, one line


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _status(x: BaseException) -> tuple[str | None, int | None]:
    """(error code, HTTP status) of a botocore / aiohttp / requests / httpx error, where it says."""
    resp = getattr(x, "response", None)
    if isinstance(resp, dict):  # botocore ClientError
        return resp.get("Error", {}).get("Code"), resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    status = getattr(resp, "status_code", None) or getattr(x, "status", None) or getattr(x, "code", None)
    return None, status if isinstance(status, int) and 100 <= status < 600 else None


def is_transient(e: BaseException) -> bool:
    """Worth retrying: a dropped connection, a timeout, a 5xx / 429 / SlowDown answer."""
    for x in _chain(e):
        code, status = _status(x)
        if code is not None or status is not None:
            return code in TRANSIENT_CODES or (status or 0) >= 500 or status == 429
        if isinstance(x, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return False
        if isinstance(x, (ConnectionError, TimeoutError)) or any(n in type(x).__name__ for n in _TRANSIENT_NAMES):
            return True
    return False


def describe(e: BaseException) -> str:
    """One line saying what went wrong, credentials scrubbed."""
    code = status = None
    detail = ""
    for x in _chain(e):
        c, s = _status(x)
        if c or s:
            code, status = c, s
            err = getattr(x, "response", None)
            detail = err.get("Error", {}).get("Message", "") if isinstance(err, dict) else ""
            break
    if not detail:
        lines = str(e).strip().splitlines()
        detail = lines[0] if lines else ""
    label = " ".join(str(v) for v in (status, code) if v) or type(e).__name__
    if type(e).__name__ == "FileExpired" or code == "PreconditionFailed":
        return "changed while it was being read (its ETag no longer matches); rerun with --overwrite"
    if isinstance(e, FileNotFoundError) or status == 404:
        what = "no such bucket" if code == "NoSuchBucket" or "bucket does not exist" in detail.lower() \
            else "no such object"
        return scrub(f"not found ({label}: {what})" if code or status else f"not found ({what})")
    if isinstance(e, PermissionError) or status in (401, 403):
        return scrub(f"access denied ({label}{': ' + detail if detail else ''}); check the credentials "
                     "(environment, ~/.aws, fsspec or hub config)")
    return scrub(f"{label}: {detail}" if detail and detail != label else label)


def call(url: str, fn: Callable[[], T], doing: str = "cannot read") -> T:
    """`fn()`, retried with exponential backoff (and jitter) on transient errors, each counted; a permanent
    error, or a transient one on the last try, becomes one line naming `url`."""
    for attempt in range(ATTEMPTS):
        try:
            return fn()
        except (PretokError, TypeError, AttributeError, NameError, AssertionError):
            raise  # made one line already, or a bug (a traceback)
        except Exception as e:
            if not is_transient(e):
                raise PretokError(f"{doing}: {describe(e)}", url) from None
            if attempt == ATTEMPTS - 1:
                raise PretokError(f"{doing}: {describe(e)} (gave up after {ATTEMPTS} tries)", url) from None
            _retries[0] += 1
            time.sleep(min(BACKOFF_MAX_S, BACKOFF_S * 2 ** attempt) * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- filesystems, listing, identity


def _storage_options(protocol: str) -> dict:
    if protocol in ("s3", "s3a"):  # botocore's own retries off: every retry is ours, counted
        import fsspec.config

        user = fsspec.config.conf.get(protocol, {}).get("config_kwargs", {})
        return {"config_kwargs": {**user, "retries": {"total_max_attempts": 1, "mode": "standard"}}}
    return {}


@functools.lru_cache(maxsize=64)
def _filesystem(protocol: str, pid: int):
    import fsspec

    try:
        fs = fsspec.filesystem(protocol, **_storage_options(protocol))
    except ImportError as e:
        raise PretokError(f"{protocol}:// needs a package that is not installed ({scrub(str(e).splitlines()[0])})")
    except ValueError as e:
        raise PretokError(f"unsupported URL scheme {protocol}:// ({scrub(str(e).splitlines()[0])})") from None
    if hasattr(fs, "retries"):
        fs.retries = 1  # s3fs: its retry loop off too
    return fs


def schemes(specs) -> tuple[str, ...]:
    """The URL schemes among input specs (sorted, once each)."""
    return tuple(sorted({_SCHEME.match(s).group(1).lower() for s in specs if is_url(s)}))


def preload_filesystems(protocols: tuple[str, ...]) -> None:
    """Import the fsspec implementations of `protocols` (before a fork: each worker then starts with them)."""
    import fsspec

    for p in protocols:
        try:
            fsspec.get_filesystem_class(p)
        except Exception:  # reported, in one line, where the inputs are listed
            pass


def filesystem(url: str):
    """(fsspec filesystem, path within it) for a URL."""
    check_url(url)
    protocol = _SCHEME.match(url).group(1).lower()
    fs = _filesystem(protocol, os.getpid())
    return fs, fs._strip_protocol(url)


def _iso(v) -> str:
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).isoformat()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return datetime.fromtimestamp(v, timezone.utc).isoformat()
    return str(v)


_IDENTITY = (("VersionId", "version_id"), ("ETag", "etag"), ("etag", "etag"), ("generation", "generation"),
             ("blob_id", "blob_id"), ("LastModified", "last_modified"), ("Last-Modified", "last_modified"),
             ("updated", "last_modified"), ("mtime", "last_modified"), ("created", "last_modified"))


def identity(info: dict) -> tuple[tuple[str, str], ...]:
    """The store's version identity of an object, from its listing/HEAD info: version id, ETag, generation,
    blob id, LFS sha256, last-modified (whichever the store gives)."""
    out: dict[str, str] = {}
    for key, name in _IDENTITY:
        v = info.get(key)
        if v not in (None, "", "null") and name not in out:
            out[name] = _iso(v) if name == "last_modified" else str(v)
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        out["sha256"] = str(lfs["sha256"])
    return tuple(sorted(out.items()))


def expand(spec: str) -> list[tuple[str, int, tuple]]:
    """(URL, size, identity) of every object a URL names: itself, or a glob's matches sorted by URL (every
    process, e.g. each task of a SLURM array, plans from the same order). Fresh: listing caches are dropped."""
    return expand_all([spec])[0]


def _expand_one(spec: str) -> list[tuple[str, int, tuple]]:
    fs, path = filesystem(spec)
    if any(c in path for c in "*?["):
        infos = call(spec, lambda: fs.glob(path, detail=True), "cannot list")
        found = [i for i in infos.values() if i.get("type", "file") == "file"]
        if not found:
            raise PretokError("no input matches this pattern", spec)
    else:
        info = call(spec, lambda: fs.info(path))
        if info.get("type") == "directory":
            raise PretokError("is a directory (a prefix); give a glob such as URL/*.parquet", spec)
        found = [info]
    out = sorted((fs.unstrip_protocol(i["name"]), int(i.get("size") or 0), identity(i)) for i in found)
    _listed.update((url, (size, ident)) for url, size, ident in out)
    return out


def expand_all(specs: list[str]) -> list[list[tuple[str, int, tuple]]]:
    """`expand` of each spec, in order, `LIST_THREADS` at a time (one round trip each would add up over thousands
    of inputs); the first failing spec in order raises. Listing caches are dropped first, and the single objects
    are asked (HEAD) before any glob is listed, so each one's identity comes from its HEAD, never from a listing
    another spec left in the cache: every process gets the same identities whatever the timing."""
    for spec in specs:
        filesystem(spec)[0].invalidate_cache()
    out: list = [None] * len(specs)

    def one(i: int):
        try:
            return _expand_one(specs[i])
        except Exception as e:  # raised below, the first in order
            return e

    for globs in (False, True):
        todo = [i for i, s in enumerate(specs) if any(c in filesystem(s)[1] for c in "*?[") == globs]
        for i, found in zip(todo, _map(one, todo)):
            out[i] = found
    for found in out:
        if isinstance(found, Exception):
            raise found
    return out


def _map(fn: Callable, items: list) -> list:
    """`[fn(x) for x in items]`, `LIST_THREADS` at a time: requests in flight together instead of one round
    trip each."""
    if len(items) < 2:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(LIST_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


def listed(paths) -> tuple[tuple[str, int, tuple], ...]:
    """(URL, size, identity) of those `paths` that were listed in this process (for a worker: `remember`)."""
    return tuple((p, *_listed[p]) for p in paths if p in _listed)


def remember(objects) -> None:
    """Take (URL, size, identity) of objects listed by another process (the planner's, for a worker)."""
    _listed.update((url, (size, tuple(tuple(kv) for kv in ident))) for url, size, ident in objects)


# ---------------------------------------------------------------- reading


class RemoteFile(io.RawIOBase):
    """A seekable, read-only object: each `read` is one range request (retried), never past `end` (if given:
    the object reads as ending there); a read that starts a range announced by `expect` fetches the whole range
    (up to `SPAN_BYTES`) and serves the reads that follow from it. Wrap it in `io.BufferedReader` for line
    reading. An S3 object listed in this process is opened without a HEAD, pinned to its listed ETag.
    `prefetch`: after each read, the next range of the same length is fetched in a thread while the caller works
    on this one (sequential reading: a JSONL unit, a compressed file); one range ahead at most."""

    def __init__(self, url: str, end: int | None = None, prefetch: bool = False):
        super().__init__()
        self.url, self.pos, self.prefetch = url, 0, prefetch
        self._spans: list[tuple[int, int]] = []
        self._block, self._block_at = b"", 0
        self._pool, self._ahead = None, None  # the prefetching thread; ((offset, length), future) in flight
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
        nxt = at + len(data)
        if self.prefetch and len(data) >= n and nxt < self.size:
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
