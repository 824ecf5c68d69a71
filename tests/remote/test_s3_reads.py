"""How objects are read from a real S3 server (moto's), in this process: no HEAD per opened unit (the planned
listing is used) and every read pinned to the listed ETag, so an object replaced after planning fails its next
read in one line."""

from __future__ import annotations

import pytest

from pretok_lib.errors import PretokError

from .conftest import BUCKET


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    from s3fs import S3FileSystem

    from pretok_lib.sources import remote

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    fresh = lambda: (remote._filesystem.cache_clear(), S3FileSystem.clear_instance_cache())  # noqa: E731
    fresh()  # a filesystem made now reads the endpoint set above
    yield
    fresh()


def test_units_are_read_without_a_head_pinned_to_the_listed_etag(s3_server, bucket, s3_env, local_corpus,
                                                                  monkeypatch):
    from s3fs import S3FileSystem

    from pretok_lib.sources import SourceOptions, expand_inputs, plan_units, read_unit

    c = s3_server.client()
    for name in ("docs.jsonl", "docs.parquet", "docs.jsonl.zst"):
        c.upload_file(str(local_corpus / name), BUCKET, f"pin/{name}")
    opts = SourceOptions(part_bytes=300_000)
    local = plan_units(expand_inputs([str(local_corpus / n) for n in ("docs.jsonl", "docs.jsonl.zst", "docs.parquet")]),
                       opts)
    units = plan_units(expand_inputs([f"s3://{BUCKET}/pin/*"]), opts)  # listed: .jsonl, .jsonl.zst, .parquet
    heads = []
    real_info = S3FileSystem._info

    async def info(self, path, *a, **k):
        heads.append(path)
        return await real_info(self, path, *a, **k)

    monkeypatch.setattr(S3FileSystem, "_info", info)
    texts = lambda us: [t for u in us for b in read_unit(u, opts) for t in b.texts]  # noqa: E731
    assert len(units) == len(local) > 3 and texts(units) == texts(local)
    assert heads == []
    c.put_object(Bucket=BUCKET, Key="pin/docs.jsonl", Body=b'{"text": "replaced"}\n' * 100_000)
    with pytest.raises(PretokError) as e:
        list(read_unit(units[1], opts))
    assert str(e.value).startswith(f"s3://{BUCKET}/pin/docs.jsonl: cannot read: changed while it was being read")


def test_an_object_named_with_glob_characters_is_that_object(s3_server, bucket, s3_env):
    """As locally: `s3://.../shard[1].jsonl` is that object even beside a `shard1.jsonl` it matches as a pattern,
    and a glob still lists both."""
    from pretok_lib.sources import expand_inputs

    client = s3_server.client()
    for key in ("odd/shard[1].jsonl", "odd/shard1.jsonl"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b'{"text": "x"}\n')
    base = f"s3://{BUCKET}/odd"
    assert [f.path for f in expand_inputs([f"{base}/shard[1].jsonl"])] == [f"{base}/shard[1].jsonl"]
    assert [f.path for f in expand_inputs([f"{base}/shard*.jsonl"])] == [f"{base}/shard1.jsonl",
                                                                          f"{base}/shard[1].jsonl"]
    with pytest.raises(PretokError, match="no input matches"):
        expand_inputs([f"{base}/none[1].jsonl"])
