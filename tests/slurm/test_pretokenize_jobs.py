"""slurm/pretokenize.sh on a real SLURM: a 2-task job array + a dependent merge make the same dataset as one
`pretok tokenize` process (memmap and token-list); resubmitting skips finished shards; one lost shard is
redone by resubmitting its array task alone."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pretok_lib.launch import slurm
from pretok_lib.formats.manifest import read_manifest
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import GPT2_JSON, PYDOCS_JSONL
from ..engine.test_pretokenize import data_files, stored_docs
from .helpers import SLURM, job_logs, run_script, scontrol_job, wait_ok

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

PART_MB = "0.1"  # ~10 units over 2 shards


@pytest.fixture(scope="module")
def work(tmp_path_factory, shared_data) -> Path:
    d = tmp_path_factory.mktemp("pretok-jobs")
    with PYDOCS_JSONL.open() as src, (d / "docs.jsonl").open("w") as dst:
        for _, line in zip(range(60), src):
            dst.write(line)
    return d


def tokenize_args(fmt: str) -> list[str]:
    return ["docs.jsonl", "--tokenizer", str(GPT2_JSON), "--format", fmt, "--part-mb", PART_MB, "--seq-len", "128"]


def reference(work: Path, fmt: str) -> Path:
    out = work / f"single-{fmt}"
    run_tokenize(TokenizeConfig(inputs=[str(work / "docs.jsonl")], out=str(out), tokenizer=str(GPT2_JSON),
                                format=fmt, seq_len=128, part_mb=float(PART_MB), workers=0, progress=False))
    return out


def shard_manifests(root: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in sorted(root.glob("shard-*/manifest.json"))}


def test_array_and_merge_equal_one_process_and_resubmission_skips(slurm_cluster, work):
    jobs = {}
    for fmt in ("memmap", "token-list"):
        out = run_script(SLURM / "pretokenize.sh", "2", f"out-{fmt}", *tokenize_args(fmt), cwd=work)
        jobs[fmt] = out.split()
    refs = {fmt: reference(work, fmt) for fmt in jobs}  # while the jobs run
    wait_ok([j for ids in jobs.values() for j in ids], work)
    for fmt, ref in refs.items():
        merged = work / f"out-{fmt}"
        assert data_files(merged) == data_files(ref), fmt
        a, b = stored_docs(merged), stored_docs(ref)
        assert len(a) == len(b) == read_manifest(ref)["counts"]["documents"] > 0
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        m = read_manifest(merged)
        assert m["counts"]["tokens"] == read_manifest(ref)["counts"]["tokens"]
        assert len(m["run"]["merged_from"]) == 2
        assert len(scontrol_job(jobs[fmt][0])) == 2  # two array tasks

    # Resubmitting the whole run: both shards and the merge are found complete and left alone.
    root = work / "out-memmap.shards"
    before, merged_before = shard_manifests(root), (work / "out-memmap" / "manifest.json").stat().st_mtime_ns
    assert len(before) == 2
    array, merge = run_script(SLURM / "pretokenize.sh", "2", "out-memmap", *tokenize_args("memmap"), cwd=work).split()
    wait_ok([array, merge], work)
    assert shard_manifests(root) == before
    assert (work / "out-memmap" / "manifest.json").stat().st_mtime_ns == merged_before
    logs = [(work / f"slurm-pretok-tokenize-{array}_{i}.out").read_text() for i in (0, 1)]
    assert all("already complete and verified: skipping" in t for t in logs), job_logs(work)
    assert "nothing to merge" in (work / f"slurm-pretok-merge-{merge}.out").read_text()

    # A lost shard: resubmit only its array task; the merge then rebuilds the same dataset.
    shutil.rmtree(root / "shard-00001")
    array, merge = run_script(SLURM / "pretokenize.sh", "--tasks", "1", "2", "out-memmap", *tokenize_args("memmap"),
                              cwd=work).split()
    wait_ok([array, merge], work)
    recs = scontrol_job(array)
    assert [r.get("ArrayTaskId") for r in recs] == ["1"]
    after = shard_manifests(root)
    assert after["shard-00000"] == before["shard-00000"] and after["shard-00001"] != before["shard-00001"]
    assert data_files(work / "out-memmap") == data_files(refs["memmap"])
    assert json.loads((work / "out-memmap" / "manifest.json").read_text())["counts"]["documents"] == \
        read_manifest(refs["memmap"])["counts"]["documents"]


def test_failed_task_fails_the_array_and_the_merge_never_runs(slurm_cluster, work):
    array, merge = run_script(SLURM / "pretokenize.sh", "2", "out-bad", "missing.jsonl", "--tokenizer",
                              str(GPT2_JSON), cwd=work).split()
    states = slurm.wait([array, merge], timeout=120)
    assert states == {array: "FAILED", merge: slurm.NEVER}, job_logs(work)
    subprocess.run(["scancel", merge], check=True)
    log = (work / f"slurm-pretok-tokenize-{array}_0.out").read_text()
    assert "pretok: error:" in log and "missing.jsonl" in log
    assert not (work / "out-bad").exists()
