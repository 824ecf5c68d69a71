"""A real S3-compatible server for the remote-input tests: moto's standalone server on 127.0.0.1 (a free port),
started once per session and stopped by its PID in a finally; a small corpus of every input kind, uploaded
from ../shared/data; the CLI run in subprocesses with credentials in the environment (a marker secret that no
output may contain)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from pretok_lib.launch.procs import stop_tree

from ..conftest import GPT2_JSON, PYDOCS_JSONL, ROOT, SHAKESPEARE, WIKITEXT_VALID

SECRET = "pretok-SECRET-marker-7f3a9c"  # AWS_SECRET_ACCESS_KEY of every run: must appear in no output
KEY_ID = "pretokKEYIDmarker42"
BUCKET = "corpora"
FILES = ("docs.jsonl", "docs.jsonl.gz", "docs.jsonl.zst", "docs.parquet", "a.txt", "b.txt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    port: int

    def env(self, endpoint: str | None = None) -> dict:
        """Credentials and endpoint where botocore looks for them (the standard environment variables)."""
        return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL_S3": endpoint or self.endpoint, "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY_ID,
                            aws_secret_access_key=SECRET, region_name="us-east-1")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield S3Server(endpoint, port)
    finally:
        stop_tree(proc, grace_s=10)


@pytest.fixture(scope="session")
def local_corpus(tmp_path_factory) -> Path:
    """~1.5 MB of python docs as JSONL (plain, .gz, .zst) and parquet (row groups of 40 docs), and two text
    files of 300 KB (shakespeare, wikitext)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    d = tmp_path_factory.mktemp("remote-corpus")
    lines, n = [], 0
    with PYDOCS_JSONL.open("rb") as fh:
        for line in fh:
            lines.append(line)
            n += len(line)
            if n > 1_500_000:
                break
    data = b"".join(lines)
    (d / "docs.jsonl").write_bytes(data)
    (d / "docs.jsonl.gz").write_bytes(gzip.compress(data))
    (d / "docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    texts = [json.loads(x)["text"] for x in lines]
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), d / "docs.parquet", row_group_size=40)
    (d / "a.txt").write_bytes(SHAKESPEARE.read_bytes()[:300_000])
    (d / "b.txt").write_bytes(WIKITEXT_VALID.read_bytes()[:300_000])
    return d


@pytest.fixture(scope="session")
def bucket(s3_server: S3Server, local_corpus: Path) -> str:
    """The corpus uploaded to s3://corpora/c/; returns the URL prefix."""
    c = s3_server.client()
    c.create_bucket(Bucket=BUCKET)
    for name in FILES:
        c.upload_file(str(local_corpus / name), BUCKET, f"c/{name}")
    return f"s3://{BUCKET}/c"


def run_cli(*args, env: dict, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    full = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **env)
    p = subprocess.run([sys.executable, "-m", "pretok_lib.cli", *map(str, args)], env=full, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"pretok {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr[-3000:]}")
    return p


def tokenize_args(inputs, out: Path, *extra) -> list:
    return ["tokenize", *([inputs] if isinstance(inputs, (str, Path)) else inputs), "--out", out,
            "--tokenizer", GPT2_JSON, "--part-mb", "0.3", "--no-progress", *extra]


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst)
