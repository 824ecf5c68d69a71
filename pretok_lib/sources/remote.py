"""Inputs given as URLs (`s3://`, `gs://`, `hf://`, `https://`, ...) through fsspec; local paths never come here.

A thin layer under `sources`: listing (globs, sorted, so every process plans the same units), each object's
size and version identity (ETag / version id / generation / last-modified) for the manifest and change
detection; the reader of byte ranges is `remote_file.py` (parquet: the footer, then a unit's column chunks;
JSONL: newline-aligned ranges). Every request is retried on transient errors
(connection reset, timeouts, 5xx / SlowDown / 429) with exponential backoff and counted (`retries()`); a
permanent error (403, 404, a missing bucket) is one line naming the URL. The libraries' own retries are turned
off where they can be (s3fs, botocore), so each retry is counted here once.

Credentials come from each filesystem's standard places (environment, ~/.aws, fsspec config, HF token...);
URLs carrying them (user:password@, signed query strings) are refused, and error text is scrubbed of the
secret values found in the environment, so none reaches a manifest, a log or an error message.
"""

from __future__ import annotations

import functools
import os
import random
import re
import time
from datetime import datetime, timezone
from typing import Callable, TypeVar

from ..errors import PretokError

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
_listed: dict[str, tuple[int, tuple]] = {}  # (remote_file.py)
LIST_THREADS = 16  # objects HEADed (or globs listed) at a time


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


def warm_filesystems(protocols: tuple[str, ...]) -> None:
    """Make this process's filesystems of `protocols` and their clients now (a worker, while the main process
    plans: its first unit then starts reading at once); a failure is left to the first real request to report."""
    for p in protocols:
        try:
            fs = _filesystem(p, os.getpid())
            if type(fs).__name__ == "S3FileSystem":
                fs.connect()  # the botocore client: its service model loaded, ~0.2 s
        except Exception:
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


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def _expand_one(spec: str, as_glob: bool) -> list[tuple[str, int, tuple]] | None:
    """The objects `spec` names as a glob, or as one object (None if there is no such object and it has glob
    characters: then it is a glob)."""
    fs, path = filesystem(spec)
    if as_glob:
        infos = call(spec, lambda: fs.glob(path, detail=True), "cannot list")
        found = [i for i in infos.values() if i.get("type", "file") == "file"]
        if not found:
            raise PretokError("no input matches this pattern", spec)
    else:
        try:
            info = call(spec, lambda: fs.info(path))
        except PretokError:
            if _has_magic(path):
                return None
            raise
        if info.get("type") == "directory":
            if _has_magic(path):
                return None
            raise PretokError("is a directory (a prefix); give a glob such as URL/*.parquet", spec)
        found = [info]
    out = sorted((fs.unstrip_protocol(i["name"]), int(i.get("size") or 0), identity(i)) for i in found)
    _listed.update((url, (size, ident)) for url, size, ident in out)
    return out


def expand_all(specs: list[str]) -> list[list[tuple[str, int, tuple]]]:
    """`expand` of each spec, in order, `LIST_THREADS` at a time (one round trip each would add up over thousands
    of inputs); the first failing spec in order raises. An object whose name holds glob characters (`[`, `?`,
    `*`) is that object, not a pattern. Listing caches are dropped first, and every spec is asked as one object
    (HEAD) before any glob is listed, so each one's identity comes from its HEAD, never from a listing another
    spec left in the cache: every process gets the same identities whatever the timing."""
    for spec in specs:
        filesystem(spec)[0].invalidate_cache()
    out: list = [None] * len(specs)

    def one(i: int, as_glob: bool):
        try:
            return _expand_one(specs[i], as_glob)
        except Exception as e:  # raised below, the first in order
            return e

    for as_glob in (False, True):
        todo = [i for i in range(len(specs)) if out[i] is None]
        for i, found in zip(todo, _map(lambda i: one(i, as_glob), todo)):
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
