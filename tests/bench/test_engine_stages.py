"""scripts/engine_stages.py: a worker's path timed stage by stage in one process, and the bound it puts on wN /
ceiling (encoding's share of the sum)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ..conftest import GPT2_JSON, PYDOCS_JSONL, ROOT


@pytest.mark.parametrize("fmt,stages", [("memmap", ["hash", "write"]), ("token-list", ["table", "write"]),
                                        ("padded", ["table", "write"])])
def test_the_stages_of_a_worker_sum_to_a_bound_below_one(tmp_path, shared_data, fmt, stages):
    docs = [json.loads(line)["text"] for line in PYDOCS_JSONL.open()][:120]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs}), corpus, row_group_size=40)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "engine_stages.py"), str(corpus), str(GPT2_JSON),
                           "--format", fmt, "--rounds", "2", "--batch-mb", "0.1", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rounds = [line for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2
    per_stage = dict(re.findall(r"^  (\w+)\s+([\d.]+) \[", proc.stdout, re.M))
    assert list(per_stage) == ["read", "str", "encode", "special", *stages, "total"]
    assert float(per_stage["write"]) > 0  # the format's own output stage ran
    assert float(per_stage["encode"]) > 0 and float(per_stage["total"]) >= float(per_stage["encode"])
    bound = float(re.search(r"encode / total\): ([\d.]+) \[", proc.stdout).group(1))
    assert 0 < bound < 1
    assert list(tmp_path.iterdir()) == [corpus]  # its part and data files were removed
