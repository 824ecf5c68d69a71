"""`pretok tokenize` from s3:// on a real S3-compatible server (moto's standalone server): the same bytes as from
the local files for every input kind and format, crash-safe resume, a replaced object refused, transient faults
retried (and counted) with the result unchanged, permanent ones one line naming the URL, and no credential in
any output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import GPT2_JSON, ROOT, one_line
from .conftest import BUCKET, KEY_ID, SECRET, run_cli, tokenize_args
from .faulty_proxy import FaultyProxy, every


def data_files(out: Path) -> dict[str, bytes]:
    """The output's data files (not its manifest or run state)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != "manifest.json"}


def local_reference(inputs: list[str], out: Path, fmt: str = "memmap") -> dict[str, bytes]:
    run_tokenize(TokenizeConfig(inputs=inputs, out=str(out), tokenizer=str(GPT2_JSON), format=fmt, workers=0,
                                part_mb=0.3, progress=False))
    return data_files(out)


def assert_no_secret(out: Path, *texts: str) -> None:
    """Neither the secret key nor its id in any file of the output (manifest, run state, data) or in `texts`."""
    for marker in (SECRET, KEY_ID):
        for p in out.rglob("*"):
            if p.is_file():
                assert marker.encode() not in p.read_bytes(), f"{marker} written to {p}"
        for t in texts:
            assert marker not in t


def one_line_error(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode == 1, (p.returncode, p.stderr)
    line = one_line(p.stderr, *needles)
    assert SECRET not in p.stderr and KEY_ID not in p.stderr and "Traceback" not in p.stderr
    return line


@pytest.mark.parametrize("fmt,names", [("memmap", ["*"]), ("padded", ["docs.parquet", "*.jsonl.zst"]),
                                       ("token-list", ["docs.jsonl.gz", "*.txt"])])
def test_s3_equals_local(s3_server, bucket, local_corpus, tmp_path, fmt, names):
    """Every input kind (parquet, jsonl, .jsonl.gz, .jsonl.zst, txt), globs, three formats, 2 workers: the output
    bytes from s3:// equal those from the same local files; the manifest records each URL, size and ETag."""
    ref = local_reference([str(local_corpus / n) for n in names], tmp_path / "local", fmt)
    out = tmp_path / "s3"
    p = run_cli(*tokenize_args([f"{bucket}/{n}" for n in names], out, "--format", fmt, "--workers", "2"),
                env=s3_server.env())
    assert data_files(out) == ref
    m = json.loads((out / "manifest.json").read_text())
    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert [i["path"] for i in m["inputs"]] == [f"s3://{BUCKET}/c/{Path(i['path']).name}" for i in local["inputs"]]
    assert [i["size"] for i in m["inputs"]] == [i["size"] for i in local["inputs"]]
    assert all(i["version"]["etag"].strip('"') and i["version"]["last_modified"] for i in m["inputs"])
    assert m["counts"] == local["counts"] and m["run"]["remote_retries"] == 0
    assert_no_secret(out, p.stdout, p.stderr)
    if fmt == "memmap":  # verify re-tokenizes a sample read back from the s3:// sources
        v = run_cli("verify", out, env=s3_server.env())
        assert "64 identical ids" in v.stdout, v.stdout


def test_faults_are_retried_counted_and_change_nothing(s3_server, bucket, local_corpus, tmp_path):
    """A proxy in front of the server answers 503 SlowDown to every 4th request and resets the connection on
    2 of every 7 (listing, footers, ranges, in the main process and the workers): the run retries each (with
    backoff), counts each in the manifest, and the bytes equal the local run's. (A reset of a reused keep-alive
    connection is retried once by aiohttp itself, uncounted.)"""
    names = ["docs.parquet", "docs.jsonl", "*.txt"]
    ref = local_reference([str(local_corpus / n) for n in names], tmp_path / "local")
    slow, reset = every(4, "503", 6), every(7, "reset", 4, burst=2)
    proxy = FaultyProxy(("127.0.0.1", s3_server.port), lambda n, m, p: slow(n, m, p) or reset(n, m, p))
    try:
        out = tmp_path / "s3"
        p = run_cli(*tokenize_args([f"{bucket}/{n}" for n in names], out, "--workers", "2"),
                    env=s3_server.env(proxy.url))
        by_mode = dict(proxy.by_mode)
    finally:
        proxy.close()
    assert by_mode == {"503": 6, "reset": 4}
    assert data_files(out) == ref
    counted = json.loads((out / "manifest.json").read_text())["run"]["remote_retries"]
    # every 503 reaches pretok (counted once each); a reset may be absorbed by aiohttp's one silent retry of a
    # reused connection (two workers' requests interleave, so which are is not fixed)
    assert 6 <= counted <= 10
    assert_no_secret(out, p.stdout, p.stderr)


def test_kill9_and_resume_is_byte_identical(s3_server, bucket, local_corpus, tmp_path):
    """A run reading from a slow store is killed (-9, the whole process group) after some parts committed; the
    same command resumes and the result equals the local run's."""
    ref = local_reference([str(local_corpus / "docs.jsonl")], tmp_path / "local")
    proxy = FaultyProxy(("127.0.0.1", s3_server.port), lambda n, m, p: "slow" if m == "GET" else None, delay=0.3)
    out = tmp_path / "s3"
    args = tokenize_args(f"{bucket}/docs.jsonl", out, "--workers", "1")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **s3_server.env(proxy.url))
    try:
        proc = subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", *map(str, args)], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.time() + 180
            while len(list((out / ".pretok" / "parts").glob("*.json"))) < 2:
                assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        proxy.close()
    assert not (out / "manifest.json").exists()
    run_cli(*tokenize_args(f"{bucket}/docs.jsonl", out, "--workers", "2"), env=s3_server.env())
    assert data_files(out) == ref


def test_replaced_object_is_refused(s3_server, bucket, local_corpus, tmp_path):
    """An object replaced (new ETag) after a run: the rerun into the same output is refused in one line, as for a
    changed local file; --overwrite tokenizes the new version."""
    c = s3_server.client()
    c.upload_file(str(local_corpus / "a.txt"), BUCKET, "replace/a.txt")
    out = tmp_path / "out"
    run_cli(*tokenize_args(f"s3://{BUCKET}/replace/*.txt", out, "--workers", "0"), env=s3_server.env())
    c.put_object(Bucket=BUCKET, Key="replace/a.txt", Body=(local_corpus / "b.txt").read_bytes())
    p = run_cli(*tokenize_args(f"s3://{BUCKET}/replace/*.txt", out, "--workers", "0"), env=s3_server.env(),
                check=False)
    one_line_error(p, str(out), "different config", "inputs")
    run_cli(*tokenize_args(f"s3://{BUCKET}/replace/*.txt", out, "--workers", "0", "--overwrite"),
            env=s3_server.env())
    ref = local_reference([str(local_corpus / "b.txt")], tmp_path / "local")
    assert data_files(out) == ref


@pytest.mark.parametrize("url,needles", [
    ("s3://corpora/c/missing.parquet", ["s3://corpora/c/missing.parquet", "not found", "no such object"]),
    ("s3://no-such-bucket/x.jsonl", ["s3://no-such-bucket/x.jsonl", "not found", "no such bucket"]),
    ("s3://corpora/c/*.nothing", ["s3://corpora/c/*.nothing", "no input matches"]),
])
def test_permanent_errors_are_one_line(s3_server, bucket, tmp_path, url, needles):
    p = run_cli(*tokenize_args(url, tmp_path / "o", "--workers", "0"), env=s3_server.env(), check=False)
    one_line_error(p, *needles)


def test_access_denied_is_one_line_naming_the_url(s3_server, bucket, tmp_path):
    """A store answering 403 (a bucket policy, wrong credentials) to every request: one line naming the URL,
    without the credentials, at once (a 403 is not retried)."""
    proxy = FaultyProxy(("127.0.0.1", s3_server.port), lambda n, m, p: "403")
    try:
        p = run_cli(*tokenize_args(f"{bucket}/docs.parquet", tmp_path / "o", "--workers", "0"),
                    env=s3_server.env(proxy.url), check=False)
        assert proxy.faults == 1
    finally:
        proxy.close()
    one_line_error(p, f"{bucket}/docs.parquet", "access denied", "403")


def test_url_output_is_refused(s3_server, bucket, tmp_path):
    p = run_cli(*tokenize_args(f"{bucket}/a.txt", "s3://corpora/out", "--workers", "0"), env=s3_server.env(),
                check=False)
    one_line_error(p, "s3://corpora/out", "POSIX")


def test_slurm_array_tasks_plan_the_same_units(s3_server, bucket):
    """Each task of an array plans from the same (sorted) listing in its own process: same units, and the
    tasks' shards together are the whole plan."""
    code = ("import json, sys; from pretok_lib.sources import *; "
            "f = expand_inputs([sys.argv[1]]); u = plan_units(f, SourceOptions(part_bytes=300_000)); "
            "print(json.dumps([[x.index, x.paths, x.start, x.stop] for x in shard_units(u, 3, int(sys.argv[2]))]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT), **s3_server.env())
    shards = [json.loads(subprocess.run([sys.executable, "-c", code, f"{bucket}/*", str(i)], env=env, cwd=ROOT,
                                        capture_output=True, text=True, check=True).stdout) for i in range(3)]
    every_unit = [u for s in shards for u in s]
    assert [u[0] for u in every_unit] == list(range(len(every_unit))) and all(shards)
    assert sorted({p for u in every_unit for p in u[1]}) == sorted(f"{bucket}/{n}" for n in
                                                                   ("a.txt", "b.txt", "docs.jsonl", "docs.jsonl.gz",
                                                                    "docs.jsonl.zst", "docs.parquet"))


def test_objects_are_read_by_ranges_footer_first(s3_server, bucket, local_corpus, tmp_path):
    """No object is downloaded whole: every GET of an object asks for a byte range of at most 8 MiB; a parquet
    file's first read is its tail (the footer); a JSONL file's bytes are fetched about once by the units (plus
    the planning's line-alignment probes and the 1 MB shape sample)."""
    proxy = FaultyProxy(("127.0.0.1", s3_server.port))
    try:
        run_cli(*tokenize_args([f"{bucket}/docs.parquet", f"{bucket}/docs.jsonl"], tmp_path / "o", "--workers", "1"),
                env=s3_server.env(proxy.url))
        log = list(proxy.log)
    finally:
        proxy.close()
    gets = [(path.split("?")[0], rng) for method, path, rng in log if method == "GET" and "list-type" not in path]
    assert gets and all(rng is not None and rng.startswith("bytes=") for _, rng in gets), gets
    spans = {}
    for path, rng in gets:
        a, b = map(int, rng[len("bytes="):].split("-"))
        assert b - a + 1 <= 8 << 20
        spans.setdefault(path, []).append((a, b))
    size = {n: (local_corpus / n).stat().st_size for n in ("docs.parquet", "docs.jsonl")}
    pq_first = spans[f"/{BUCKET}/c/docs.parquet"][0]
    assert pq_first[1] == size["docs.parquet"] - 1 and pq_first[0] > 0  # the tail: footer first
    fetched = sum(b - a + 1 for a, b in spans[f"/{BUCKET}/c/docs.jsonl"])
    assert fetched <= size["docs.jsonl"] + (1 << 20) + 8 * 65536  # units once, the shape sample, 64 KB probes


def test_connection_resets_reach_the_retry_layer(s3_server, bucket, local_corpus, monkeypatch):
    """In one process (requests in sequence), bursts of two connection resets: aiohttp's own silent retry of a
    reused connection absorbs at most the first of each, so every burst is retried and counted by pretok at least
    once; the documents read equal the local file's."""
    from s3fs import S3FileSystem

    from pretok_lib.sources import remote
    from pretok_lib.sources import SourceOptions, expand_inputs, plan_units, read_unit

    opts = SourceOptions(part_bytes=300_000)
    want = [t for u in plan_units(expand_inputs([str(local_corpus / "docs.jsonl")]), opts) for b in read_unit(u, opts)
            for t in b.texts]
    proxy = FaultyProxy(("127.0.0.1", s3_server.port), every(5, "reset", 6, burst=2))
    for k, v in s3_server.env(proxy.url).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    fresh = lambda: (remote._filesystem.cache_clear(), S3FileSystem.clear_instance_cache())  # noqa: E731
    fresh()  # a filesystem made now reads the endpoint set above
    try:
        before = remote.retries()
        units = plan_units(expand_inputs([f"{bucket}/docs.jsonl"]), opts)
        got = [t for u in units for b in read_unit(u, opts) for t in b.texts]
        counted = remote.retries() - before
        bursts = proxy.by_mode.get("reset", 0) // 2
    finally:
        proxy.close()
        fresh()
    assert got == want and bursts == 3 and bursts <= counted <= 2 * bursts
