"""pretok_lib/sources/remote.py without a network: `gs://` and `hf://` inputs served by fsspec memory filesystems
registered under those protocols (the layer's URL, listing, identity and reading logic; gcsfs / huggingface_hub
do the real requests), `file://` through fsspec's local filesystem, error classification and one-line messages,
counted retries, credential refusal and scrubbing. The real-server tests are in tests/remote/."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from pretok_lib.sources import remote
from pretok_lib.sources import remote_file
from pretok_lib.engine.run import _check_unchanged
from pretok_lib.errors import PretokError
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.sources import SourceOptions, expand_inputs, plan_units, read_unit

from ..conftest import GPT2_JSON, PYDOCS_JSONL, SHAKESPEARE


class _Bucketed(MemoryFileSystem):
    """A memory filesystem that names objects as gcsfs / HfFileSystem do: `bucket/key`, URLs `proto://bucket/key`;
    each object's info carries a store version (generation / blob id), bumped on every write."""

    store: dict = {}
    pseudo_dirs = [""]
    writes = [0]

    @classmethod
    def _strip_protocol(cls, path):
        for p in (cls.protocol,) if isinstance(cls.protocol, str) else cls.protocol:
            if path.startswith(p + "://"):
                path = path[len(p) + 3 :]
        return MemoryFileSystem._strip_protocol(path)

    def unstrip_protocol(self, name: str) -> str:
        proto = self.protocol if isinstance(self.protocol, str) else self.protocol[0]
        return f"{proto}://{name.lstrip('/')}"

    def pipe_file(self, path, value, **kw):
        self.writes[0] += 1
        super().pipe_file(path, value, **kw)
        self.store[self._strip_protocol(path)].generation = self.writes[0]

    def _versioned(self, info: dict) -> dict:
        f = self.store.get(self._strip_protocol(info["name"]))
        return {**info, self.version_key: str(getattr(f, "generation", 0))} if f is not None else info

    def info(self, path, **kw):
        return self._versioned(super().info(path, **kw))

    def glob(self, path, **kw):
        out = super().glob(path, **kw)
        return {k: self._versioned(v) for k, v in out.items()} if isinstance(out, dict) else out


class FakeGCS(_Bucketed):
    protocol = ("gs", "gcs")
    store, pseudo_dirs, version_key = {}, [""], "generation"


class FakeHF(_Bucketed):
    protocol = "hf"
    store, pseudo_dirs, version_key = {}, [""], "blob_id"


@pytest.fixture
def stores(monkeypatch):
    """gs:// and hf:// served from memory in this process (workers=0 runs only)."""
    for proto, cls in (("gs", FakeGCS), ("gcs", FakeGCS), ("hf", FakeHF)):
        monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, proto, cls)
    FakeGCS.store.clear()
    FakeHF.store.clear()
    remote._filesystem.cache_clear()
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    yield
    remote._filesystem.cache_clear()
    FakeGCS.clear_instance_cache()
    FakeHF.clear_instance_cache()


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("small")
    lines = PYDOCS_JSONL.read_bytes().splitlines(keepends=True)[:40]
    (d / "docs.jsonl").write_bytes(b"".join(lines))
    pq.write_table(pa.table({"text": [json.loads(x)["text"] for x in lines]}), d / "docs.parquet",
                   row_group_size=8)
    (d / "a.txt").write_bytes(SHAKESPEARE.read_bytes()[:50_000])
    return d


def _tokenize(inputs: list[str], out: Path, fmt: str = "memmap") -> tuple[dict, dict]:
    m = run_tokenize(TokenizeConfig(inputs=inputs, out=str(out), tokenizer=str(GPT2_JSON), format=fmt, workers=0,
                                    part_mb=0.05, progress=False))
    return m, {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "manifest.json"}


@pytest.mark.parametrize("prefix", ["gs://bkt/corpus", "hf://datasets/org/name/data"])
def test_gs_and_hf_urls_equal_local(stores, small, tmp_path, prefix):
    fs, _ = remote.filesystem(prefix + "/x")
    for name in ("docs.jsonl", "docs.parquet", "a.txt"):
        fs.pipe_file(f"{prefix}/{name}", (small / name).read_bytes())
    fs.pipe_file(f"{prefix}/sub/ignored.txt", b"not matched by a one-level glob")
    _, ref = _tokenize([str(small / n) for n in ("a.txt", "docs.jsonl", "docs.parquet")], tmp_path / "local")
    m, got = _tokenize([f"{prefix}/*"], tmp_path / "remote")
    assert got == ref
    assert [i["path"] for i in m["inputs"]] == [f"{prefix}/{n}" for n in ("a.txt", "docs.jsonl", "docs.parquet")]
    key = "generation" if prefix.startswith("gs") else "blob_id"
    assert all(i["version"][key] and i["checksum"] is None for i in m["inputs"])


def test_file_urls_go_through_fsspec_local(small, tmp_path):
    _, ref = _tokenize([str(small / "docs.parquet")], tmp_path / "local", "token-list")
    m, got = _tokenize([f"file://{small}/docs.parquet"], tmp_path / "url", "token-list")
    assert got == ref and m["inputs"][0]["path"] == f"file://{small}/docs.parquet"
    assert m["inputs"][0]["version"]["last_modified"]


def test_listing_is_sorted_and_change_is_detected(stores, small):
    fs, _ = remote.filesystem("gs://b/x")
    for name in ("z.jsonl", "a.jsonl", "m.jsonl"):
        fs.pipe_file(f"gs://b/{name}", (small / "docs.jsonl").read_bytes())
    planned = expand_inputs(["gs://b/*.jsonl"])
    assert [f.path for f in planned] == ["gs://b/a.jsonl", "gs://b/m.jsonl", "gs://b/z.jsonl"]
    _check_unchanged(["gs://b/*.jsonl"], planned)  # unchanged: passes
    fs.pipe_file("gs://b/m.jsonl", (small / "docs.jsonl").read_bytes())  # same bytes, new generation
    with pytest.raises(PretokError, match=r"gs://b/m.jsonl: changed while it was being read"):
        _check_unchanged(["gs://b/*.jsonl"], planned)


class _Flaky(io.RawIOBase):
    """A file whose reads fail with `exc` the first `n` times."""

    def __init__(self, f, n: int, exc: Exception):
        self.f, self.n, self.exc = f, n, exc
        self.size = f.size

    def seek(self, *a):
        return self.f.seek(*a)

    def read(self, n=-1):
        if self.n:
            self.n -= 1
            raise self.exc
        return self.f.read(n)


def test_transient_read_errors_are_retried_and_counted(stores, small, monkeypatch):
    fs, _ = remote.filesystem("gs://b/x")
    fs.pipe_file("gs://b/docs.parquet", (small / "docs.parquet").read_bytes())
    opts = SourceOptions(part_bytes=20_000)
    units = plan_units(expand_inputs(["gs://b/docs.parquet"]), opts)
    want = [t for u in units for b in read_unit(u, opts) for t in b.texts]
    real_open = FakeGCS._open
    monkeypatch.setattr(FakeGCS, "_open", lambda self, *a, **k: _Flaky(real_open(self, *a, **k), 2,
                                                                        ConnectionResetError(104, "reset")))
    before = remote.retries()
    assert [t for u in units for b in read_unit(u, opts) for t in b.texts] == want
    assert remote.retries() - before == 2 * len(units)  # each unit opens the file once: two resets each


def test_permanent_read_error_inside_pyarrow_is_one_line(stores, small, monkeypatch):
    fs, _ = remote.filesystem("gs://b/x")
    fs.pipe_file("gs://b/docs.parquet", (small / "docs.parquet").read_bytes())
    opts = SourceOptions(part_bytes=20_000)
    units = plan_units(expand_inputs(["gs://b/docs.parquet"]), opts)
    real_open = FakeGCS._open
    monkeypatch.setattr(FakeGCS, "_open", lambda self, *a, **k: _Flaky(real_open(self, *a, **k), 99,
                                                                        PermissionError(13, "Forbidden")))
    with pytest.raises(PretokError) as e:
        list(read_unit(units[0], opts))
    assert str(e.value).startswith("gs://b/docs.parquet: cannot read: access denied")
    assert "\n" not in str(e.value)


def test_gave_up_after_the_last_try(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    calls = []

    def fail():
        calls.append(1)
        raise TimeoutError("timed out")

    gave_up = r"^s3://b/k: cannot read: TimeoutError: timed out \(gave up after 8 tries\)$"
    with pytest.raises(PretokError, match=gave_up):
        remote.call("s3://b/k", fail)
    assert len(calls) == remote.ATTEMPTS


def _client_error(code: str, status: int, message: str = "msg"):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetObject")


def _translated(code: str, status: int, message: str = "msg") -> OSError:
    """As s3fs raises it: an OSError (or FileNotFoundError/PermissionError) caused by botocore's ClientError."""
    from s3fs.errors import translate_boto_error

    return translate_boto_error(_client_error(code, status, message))


@pytest.mark.parametrize("exc,transient", [
    (lambda: _translated("SlowDown", 503, "Please reduce your request rate."), True),
    (lambda: _translated("InternalError", 500), True),
    (lambda: _translated("ServiceUnavailable", 503), True),
    (lambda: _client_error("Throttling", 400), True),
    (lambda: _translated("AccessDenied", 403), False),
    (lambda: _translated("NoSuchKey", 404), False),
    (lambda: _translated("NoSuchBucket", 404), False),
    (lambda: ConnectionResetError(104, "Connection reset by peer"), True),
    (lambda: TimeoutError(), True),
    (lambda: FileNotFoundError("b/k"), False),
    (lambda: PermissionError(13, "denied"), False),
    (lambda: ValueError("bad"), False),
])
def test_transient_or_permanent(exc, transient):
    assert remote.is_transient(exc()) is transient


def test_aiohttp_errors_classified():
    import aiohttp

    assert remote.is_transient(aiohttp.ServerDisconnectedError())
    req = aiohttp.RequestInfo("http://x/", "GET", {}, "http://x/")  # type: ignore[arg-type]
    assert remote.is_transient(aiohttp.ClientResponseError(req, (), status=503))
    assert not remote.is_transient(aiohttp.ClientResponseError(req, (), status=404))


def test_messages_are_one_line_and_scrubbed(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekrit-value-123")
    assert remote.describe(_translated("NoSuchBucket", 404, "The specified bucket does not exist")) == \
        "not found (404 NoSuchBucket: no such bucket)"
    assert remote.describe(_translated("NoSuchKey", 404, "The specified key does not exist.")) == \
        "not found (404 NoSuchKey: no such object)"
    msg = remote.describe(_translated("AccessDenied", 403, "denied for sekrit-value-123"))
    assert msg.startswith("access denied (403 AccessDenied: denied for ***)") and "sekrit" not in msg


@pytest.mark.parametrize("url", ["s3://AKIA:secret@bucket/x.jsonl", "https://user:pw@host/x.jsonl",
                                 "https://host/x.jsonl?X-Amz-Signature=abc&X-Amz-Credential=def"])
def test_urls_with_credentials_are_refused(url):
    with pytest.raises(PretokError) as e:
        expand_inputs([url])
    assert "secret" not in str(e.value) and "pw" not in str(e.value) and "abc" not in str(e.value)


def test_unknown_scheme_and_missing_backend_are_one_line():
    with pytest.raises(PretokError, match="unsupported URL scheme nosuch://"):
        expand_inputs(["nosuch://b/x.jsonl"])


def test_remote_file_reads_ranges_and_stops_at_end(stores):
    fs, _ = remote.filesystem("gs://b/x")
    fs.pipe_file("gs://b/lines.jsonl", b"".join(b'{"text": "%d"}\n' % i for i in range(1000)))
    with remote_file.open_input("gs://b/lines.jsonl", 64, end=30) as fh:
        assert fh.readline() == b'{"text": "0"}\n' and fh.readline() == b'{"text": "1"}\n'
        assert fh.readline() == b'{"'  # nothing past `end` (byte 30)
    f = remote_file.RemoteFile("gs://b/lines.jsonl")
    f.seek(-14, io.SEEK_END)
    assert f.read() == b'{"text": "999"}\n'[-14:] and f.read(5) == b""


def _count_fetches(monkeypatch) -> list[tuple[int, int]]:
    """(offset, length) of every range request `RemoteFile` makes from now on."""
    fetches: list[tuple[int, int]] = []
    real = remote_file.RemoteFile._fetch

    def fetch(self, at, n):
        fetches.append((at, n))
        return real(self, at, n)

    monkeypatch.setattr(remote_file.RemoteFile, "_fetch", fetch)
    return fetches


def test_a_parquet_unit_reads_its_row_groups_in_one_request(stores, small, monkeypatch):
    """The text column chunks of a unit's row groups are consecutive in the file: fetched in one range request
    (plus the footer), not one per row group; the documents equal the local file's."""
    fs, _ = remote.filesystem("gs://b/x")
    fs.pipe_file("gs://b/docs.parquet", (small / "docs.parquet").read_bytes())
    opts = SourceOptions(part_bytes=200_000)
    local = plan_units(expand_inputs([str(small / "docs.parquet")]), opts)
    units = plan_units(expand_inputs(["gs://b/docs.parquet"]), opts)
    assert units[0].stop - units[0].start >= 24  # 3 or more row groups of 8 rows
    fetches = _count_fetches(monkeypatch)
    for lu, u in zip(local, units, strict=True):
        fetches.clear()
        assert [t for b in read_unit(u, opts) for t in b.texts] == [t for b in read_unit(lu, opts) for t in b.texts]
        assert len(fetches) == 2, fetches  # the footer, then the unit's column chunks


def test_remote_file_joins_expected_ranges_up_to_the_span_limit(stores, monkeypatch):
    fs, _ = remote.filesystem("gs://b/x")
    fs.pipe_file("gs://b/blob", bytes(range(256)) * 400)  # 102,400 bytes
    monkeypatch.setattr(remote_file, "SPAN_BYTES", 1000)
    monkeypatch.setattr(remote_file, "GAP_BYTES", 10)
    f = remote_file.RemoteFile("gs://b/blob")
    f.expect([(500, 900), (0, 300), (305, 500), (2000, 2100)])  # 300..305: a gap of 5 bytes is read along
    assert f._spans == [(0, 900), (2000, 2100)]
    f.expect([(0, 600), (600, 1200)])  # together longer than SPAN_BYTES: two requests
    assert f._spans == [(0, 600), (600, 1200)]
    f.expect([(0, 300), (305, 500), (2000, 2100)])
    fetches = _count_fetches(monkeypatch)
    data = bytes(range(256)) * 400
    for a, b in ((0, 300), (305, 500), (2000, 2100), (0, 10)):
        f.seek(a)
        assert f.read(b - a) == data[a:b]
    assert fetches == [(0, 500), (2000, 100), (0, 500)]  # only the last block is kept: the span again


def test_prefetch_reads_the_same_bytes_with_no_extra_request(stores, monkeypatch):
    """Sequential reading with the next range fetched in a thread (from the second read on): the same lines, one
    request per buffer, none past `end`; a transient error of a prefetch is retried (counted), a permanent one
    is the next read's, one line."""
    fs, _ = remote.filesystem("gs://b/x")
    data = b"".join(b'{"text": "%d"}\n' % i for i in range(5000))
    fs.pipe_file("gs://b/lines.jsonl", data)
    end = len(data) - 1000
    fetches = _count_fetches(monkeypatch)
    with remote_file.open_input("gs://b/lines.jsonl", 4096, end=end, prefetch=True) as fh:
        assert b"".join(fh) == data[:end]
    assert sorted(fetches) == [(a, min(4096, end - a)) for a in range(0, end, 4096)]
    real_open = FakeGCS._open
    monkeypatch.setattr(FakeGCS, "_open", lambda self, *a, **k: _Flaky(real_open(self, *a, **k), 2,
                                                                        ConnectionResetError(104, "reset")))
    before = remote.retries()
    with remote_file.open_input("gs://b/lines.jsonl", 4096, prefetch=True) as fh:
        assert b"".join(fh) == data
    assert remote.retries() - before == 2

    class _FailsAfterTwo(_Flaky):  # two reads succeed, every later one (from the first prefetch on) is refused
        def read(self, n=-1):
            self.n += 1
            if self.n > 2:
                raise PermissionError(13, "Forbidden")
            return self.f.read(n)

    monkeypatch.setattr(FakeGCS, "_open", lambda self, *a, **k: _FailsAfterTwo(real_open(self, *a, **k), 0, None))
    with remote_file.open_input("gs://b/lines.jsonl", 4096, prefetch=True) as fh:
        assert fh.read(4096 + 10) == data[: 4096 + 10]  # two ranges read, the third one prefetched: refused
        assert isinstance(fh.raw._ahead[1].exception(), PretokError)
        with pytest.raises(PretokError, match=r"^gs://b/lines.jsonl: cannot read: access denied"):
            b"".join(fh)
