"""scripts/engine_stages.py: a worker's path timed stage by stage in one process, and the bound it puts on wN /
ceiling (encoding's share of the sum)."""

from __future__ import annotations

import json
import os
import re
import statistics
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
    share = float(re.search(r"^encode / total: ([\d.]+) \[", proc.stdout, re.M).group(1))
    bound = float(re.search(r"encoding alone / total\): ([\d.]+) \[", proc.stdout).group(1))
    assert 0 < share < 1 and bound > 0  # alone vs the stages: two timings of ms each here, so no order asserted
    assert list(tmp_path.iterdir()) == [corpus]  # its part and data files were removed


@pytest.mark.parametrize("groups,max_mb", [(1, None), (7, None), (7, 100.0), (40, 0.05), (40, 0.2), (41, 0.013)])
def test_stage_sample_takes_every_kth_row_group_of_the_whole_file(tmp_path, groups, max_mb):
    """`--mb`/the bench's `--stages-mb`: the row groups timed are spread over the whole file (every k-th), about
    `max_bytes` of it, never none."""
    from pretok_lib.bench.stages import sampled_row_groups

    docs = [("document %d " % i) * 50 for i in range(groups * 10)]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs}), corpus, row_group_size=10)
    meta = pq.ParquetFile(corpus).metadata
    assert meta.num_row_groups == groups
    size = sum(meta.row_group(i).total_byte_size for i in range(groups))
    max_bytes = None if max_mb is None else int(max_mb * 1e6)
    picked = list(sampled_row_groups(meta, max_bytes))
    assert picked[0] == 0 and picked == sorted(set(picked)) and all(0 <= g < groups for g in picked)
    if max_bytes is None or max_bytes >= size:
        assert picked == list(range(groups))
    else:
        step = picked[1] - picked[0] if len(picked) > 1 else groups
        assert all(b - a == step for a, b in zip(picked, picked[1:])) and picked[-1] + step >= groups
        per_group = size / groups
        assert len(picked) * per_group <= max_bytes + per_group  # about max_bytes, spread over the file
        assert picked[-1] >= groups - step  # reaching the file's end


def test_bounds_of_every_format_in_one_process(tmp_path):
    """`bench.stages.bounds` (what `pretok bench tokenize` runs in a child): every format's stages, total and bound,
    with each round kept."""
    from pretok_lib.bench.stages import STAGES, bounds

    docs = [json.loads(line)["text"] for line in PYDOCS_JSONL.open()][:80]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs}), corpus, row_group_size=20)
    out = bounds(str(corpus), str(GPT2_JSON), "fastokens", list(STAGES), 2, 100_000, str(tmp_path), None, cpu=None)
    assert set(out) == set(STAGES)
    for fmt, b in out.items():
        assert len(b["rounds"]) == 2 and list(b["stages"]) == list(STAGES[fmt])
        assert all(v >= 0 for r in b["rounds"] for v in r.values()) and b["stages"]["encode"] > 0
        assert b["total"] == pytest.approx(statistics.median(sum(r.values()) for r in b["rounds"]))
        assert b["alone"] > 0 and all(set(r) == set(STAGES[fmt]) for r in b["rounds"])
        for key in ("bound", "encode_share"):
            lo, hi = b[key]["interval"]
            assert 0 < lo <= b[key]["median"] <= hi and b[key]["n"] == 2
        assert b["encode_share"]["median"] == pytest.approx(
            statistics.median(r["encode"] / sum(r.values()) for r in b["rounds"]))
    # every format's bound divides the same encoding-alone time (one pass a round) by its own total
    alone = {fmt: b["alone"] for fmt, b in out.items()}
    assert len(set(alone.values())) == 1
    assert list(tmp_path.iterdir()) == [corpus]


def test_the_bench_times_stages_of_parquet_corpora_only(tmp_path, capsys):
    """`pretok bench tokenize --corpus x.jsonl`: the stages time the Parquet reader, so a JSONL corpus gets a line
    saying they were not timed (no bound, no crash in the child), and its targets carry no bound note."""
    from pretok_lib.bench.tokenize import TokenizeBench, _stage_bounds
    from pretok_lib.bench.tokenize_report import bound_note

    cfg = TokenizeBench(workdir=str(tmp_path))
    assert _stage_bounds(cfg, str(tmp_path / "c.jsonl"), str(GPT2_JSON), {}, "fastokens") is None
    assert "stages: not timed (c.jsonl is not Parquet)" in capsys.readouterr().out
    assert bound_note(None) == ""
