"""Notebook 05 compares the runs of the study's last sweep, not every `sweep-*` run in runs/: a study run again
with other sweep parameters (another micro-batch, fewer data paths) leaves the earlier runs there under other
ids, and the figures and findings mixed them in as runs of this study."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.study import steps
from pretok_lib.study.findings import study_runs
from pretok_lib.study.results import SWEEP_RECORD, record_sweep, sweep_runs

from ..analysis.helpers import simple_run

INDEX = {"tokenizer": "tok.json", "seq_len": 64, "paths": {k: f"/d/{k}" for k in
                                                          ("padded", "pretok-padded", "pretok-memmap")},
         "eval": {"pretok-memmap": "/h/memmap", "pretok-padded": "/h/padded-zstd3"}}


def _study(tmp_path: Path, ids: list[str]) -> steps.StudyPaths:
    paths = steps.StudyPaths(tmp_path / "study")
    for run_id in ids:
        simple_run(paths.runs, run_id, tokens_per_s=100.0)
    return paths


@settings(max_examples=30, deadline=None)
@given(old=st.sets(st.sampled_from([f"sweep-{i}" for i in range(8)] + ["abl-1", "train-x"]), max_size=6),
       new=st.lists(st.sampled_from([f"sweep-{i}" for i in range(8)]), unique=True, max_size=5))
def test_only_the_last_sweeps_runs_are_compared(tmp_path_factory, old, new):
    paths = _study(tmp_path_factory.mktemp("s"), sorted(old | set(new)))
    everything = {r.run_id for r in sweep_runs(paths, "")}
    assert everything == old | set(new)
    assert {r.run_id for r in sweep_runs(paths)} == {i for i in everything if i.startswith("sweep-")}  # no record
    record_sweep(paths, "sweep", new)
    record_sweep(paths, "abl", ["abl-1"])                                   # another prefix's record
    assert [r.run_id for r in sweep_runs(paths)] == new                     # in the sweep's order, nothing older
    assert [r.run_id for r in study_runs(paths.root, {"sweep_prefix": "sweep"})] == new
    assert {r.run_id for r in sweep_runs(paths, "abl")} == {"abl-1"} & everything
    assert {r.run_id for r in sweep_runs(paths, "")} == everything          # empty prefix: every run


def test_run_study_sweep_records_its_points_before_running(tmp_path, monkeypatch):
    paths = _study(tmp_path, ["sweep-pretok-memmap-w1-mb4", "sweep-padded-w1"])    # an earlier study's runs
    seen = {}

    def fake_run_sweep(config, points, runs, *a, **kw):
        seen["record"] = json.loads((paths.root / SWEEP_RECORD).read_text())
        return [(p, "completed") for p in points]

    monkeypatch.setattr("pretok_lib.launch.sweep.run_sweep", fake_run_sweep)
    grids = [{"data": ["padded", "pretok-memmap"]}, {"data": ["pretok-memmap"], "precision": ["fp32", "bf16"]}]
    results = steps.run_study_sweep(paths, INDEX, "configs/tiny.yaml", grids, {"data.micro_batch": 2})
    ids = [p.run_id for p, _ in results]
    assert seen["record"] == {"sweep": ids} and len(ids) == len(set(ids)) == 4
    assert not {r.run_id for r in sweep_runs(paths)} & {"sweep-pretok-memmap-w1-mb4", "sweep-padded-w1"}


def test_a_damaged_record_is_rewritten(tmp_path):
    paths = _study(tmp_path, ["sweep-a"])
    (paths.root / SWEEP_RECORD).write_text("[not a record")
    assert [r.run_id for r in sweep_runs(paths)] == ["sweep-a"]           # a study from before the record
    record_sweep(paths, "sweep", [])
    assert sweep_runs(paths) == [] and json.loads((paths.root / SWEEP_RECORD).read_text()) == {"sweep": []}


@pytest.mark.parametrize("content", ['["sweep-a"]', "null", '"x"'])
def test_a_record_that_is_not_an_object_counts_as_none(tmp_path, content):
    paths = _study(tmp_path, ["sweep-a", "sweep-b"])
    (paths.root / SWEEP_RECORD).write_text(content)
    assert [r.run_id for r in sweep_runs(paths)] == ["sweep-a", "sweep-b"]
