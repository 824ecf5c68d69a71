"""Throughput of remote inputs: the same corpus read from a local S3 server (moto's standalone server on
127.0.0.1) and from local files, side by side.

    PYTHONPATH=. python scripts/bench_remote.py --dir /tmp/bench-remote [--repeat 2] [--workers 2]

Two measurements, each the best of `--repeat` alternating runs:
  read      `read_unit` over every planned unit in one process (text MB/s): the I/O path alone (range requests,
            parsing), no tokenizer;
  tokenize  `pretok tokenize` end to end (gpt2, memmap, `--workers`), wall time, outputs checked identical;
            also the CPU time of the run's processes plus the server's (moto shares the machine's cores): on a
            machine busy with other work, CPU time varies far less than wall time.
The corpus: the python docs JSONL (11 MB) as .jsonl, .jsonl.zst and a parquet file of row groups of 200
documents, and the two wikipedia summary files as text. Needs `moto[server]` and `s3fs` (the `test` and `remote`
extras).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PRETOK_SHARED_DATA", ROOT.parent / "shared" / "data"))
PYDOCS = SHARED / "corpora" / "python-docs" / "python-3.11-docs-rst.jsonl"
TOKENIZER = SHARED / "tokenizers" / "gpt2" / "tokenizer.json"
TEXTS = [SHARED / "corpora" / "wikitext-2" / "valid.txt", SHARED / "corpora" / "wikitext-2" / "test.txt"]


def build_corpus(d: Path, copies: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    d.mkdir(parents=True, exist_ok=True)
    data = PYDOCS.read_bytes()
    texts = [json.loads(line)["text"] for line in data.splitlines() if line.strip()]
    names = []
    for i in range(copies):
        (d / f"docs-{i}.jsonl").write_bytes(data)
        (d / f"docs-{i}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
        pq.write_table(pa.table({"text": texts}), d / f"docs-{i}.parquet", row_group_size=200)
        names += [f"docs-{i}.jsonl", f"docs-{i}.jsonl.zst", f"docs-{i}.parquet"]
    for t in TEXTS:
        (d / t.name).write_bytes(t.read_bytes())
    return names + [t.name for t in TEXTS]


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("moto server did not start")


def read_all(inputs: list[str]) -> tuple[float, int]:
    """Seconds to read every unit's documents (in a fresh process: no warm filesystem objects), text bytes."""
    code = ("import sys, time, json; from pretok_lib.sources import *; from pretok_lib.sources import read_unit; "
            "t = time.perf_counter(); f = expand_inputs(sys.argv[1:]); "
            "o = SourceOptions(part_bytes=4_000_000); n = 0\n"
            "for u in plan_units(f, o):\n"
            "    for b in read_unit(u, o): n += b.text_bytes\n"
            "print(json.dumps([time.perf_counter() - t, n]))")
    out = subprocess.run([sys.executable, "-c", code, *inputs], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT).stdout
    s, n = json.loads(out)
    return s, n


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of this process's ended children and their descendants (the CLI, its zygote and workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tokenize(inputs: list[str], out: Path, workers: int) -> tuple[float, float, float, float, float]:
    """(wall seconds, start-up seconds, text MB/s while tokenizing, worker peak RSS MB, CPU seconds of the run's
    processes) of one run."""
    cpu = children_cpu()
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pretok_lib.cli", "tokenize", *inputs, "--out", str(out), "--tokenizer",
                    str(TOKENIZER), "--workers", str(workers), "--no-progress", "--overwrite"],
                   check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"),
                   cwd=ROOT)
    wall = time.perf_counter() - t
    m = json.loads((out / "manifest.json").read_text())
    rate = m["counts"]["input_bytes"] / 1e6 / max(m["run"]["tokenize_seconds"], 1e-9)
    return wall, m["run"]["startup_seconds"], rate, m["run"]["worker_peak_rss_mb"], children_cpu() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench-remote"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--copies", type=int, default=2, help="copies of the 11 MB python docs in each form")
    ap.add_argument("--glob", action="store_true",
                    help="name the inputs by one glob (one listing) instead of one path / URL per file")
    a = ap.parse_args()
    names = build_corpus(a.dir / "corpus", a.copies)
    proc, endpoint = start_server()
    try:
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL_S3=endpoint, AWS_EC2_METADATA_DISABLED="true")
        import boto3

        c = boto3.client("s3", endpoint_url=endpoint)
        c.create_bucket(Bucket="bench")
        for n in names:
            c.upload_file(str(a.dir / "corpus" / n), "bench", f"corpus/{n}")
        local = [str(a.dir / "corpus" / n) for n in names]
        s3 = [f"s3://bench/corpus/{n}" for n in names]
        if a.glob:  # as a corpus is usually named: both sides expand it to the same sorted list of files
            assert sorted(p.name for p in (a.dir / "corpus").iterdir()) == sorted(names), "corpus dir holds more"
            local, s3 = [str(a.dir / "corpus" / "*")], ["s3://bench/corpus/*"]
        size = sum((a.dir / "corpus" / n).stat().st_size for n in names)
        print(f"corpus: {len(names)} files, {size / 1e6:.1f} MB on disk; server {endpoint} (moto); "
              f"{os.cpu_count()} CPUs")
        reads = {"local": [], "s3": []}
        toks = {"local": [], "s3": []}
        for _ in range(a.repeat):
            for name, inputs in (("local", local), ("s3", s3)):
                reads[name].append(read_all(inputs))
        server_cpu = []  # the server's CPU seconds during each s3 run (it shares the machine's cores)
        for _ in range(a.repeat):
            for name, inputs in (("local", local), ("s3", s3)):
                before = cpu_seconds(proc.pid)
                toks[name].append(tokenize(inputs, a.dir / f"out-{name}", a.workers))
                if name == "s3":
                    server_cpu.append(cpu_seconds(proc.pid) - before)
        same = (a.dir / "out-local" / "data.bin").read_bytes() == (a.dir / "out-s3" / "data.bin").read_bytes()
        (rl, nl), (rs, ns) = min(reads["local"]), min(reads["s3"])
        tl, ts = min(toks["local"]), min(toks["s3"])
        rate_l, rate_s = max(x[2] for x in toks["local"]), max(x[2] for x in toks["s3"])
        print(f"{'':10} {'local':>12} {'s3 (moto)':>12} {'s3/local':>9}")
        print(f"{'read':10} {nl / rl / 1e6:>9.1f} MB/s {ns / rs / 1e6:>9.1f} MB/s {rl / rs:>8.2f}x   "
              f"(text {nl / 1e6:.1f} MB, read_unit in one process)")
        print(f"{'tokenize':10} {rate_l:>9.1f} MB/s {rate_s:>9.1f} MB/s {rate_s / rate_l:>8.2f}x   "
              f"(pretok tokenize, gpt2, memmap, {a.workers} workers: text MB/s while tokenizing)")
        print(f"{'  wall':10} {tl[0]:>10.2f} s {ts[0]:>10.2f} s {tl[0] / ts[0]:>8.2f}x   "
              f"(whole run; start-up {tl[1]:.2f} s vs {ts[1]:.2f} s; outputs identical: {same})")
        rss_l, rss_s = max(x[3] for x in toks["local"]), max(x[3] for x in toks["s3"])
        print(f"{'  RSS':10} {rss_l:>10.0f} MB {rss_s:>9.0f} MB {rss_s / rss_l:>8.2f}x   (worker peak RSS)")
        cpu_l = min(x[4] for x in toks["local"])
        cpu_s = min(x[4] + c for x, c in zip(toks["s3"], server_cpu))
        print(f"{'  CPU':10} {cpu_l:>9.2f} s {cpu_s:>10.2f} s {cpu_l / cpu_s:>8.2f}x   (CPU time of the run's processes, "
              f"with the server's {min(server_cpu):.2f} s: what a machine busy with other work measures best)")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


if __name__ == "__main__":
    main()
