"""The study's pieces without executing notebooks (tests/notebooks/ executes them): profiles, notebook
selection, grids over the study's datasets, path resolution, and the CLI's parameter checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretok_lib.cli import main as cli_main
from pretok_lib.errors import PretokError
from pretok_lib.study import PROFILES, profile_parameters, resolve, run_study
from pretok_lib.study.profiles import world_sizes
from pretok_lib.study.run import NOTEBOOKS, select
from pretok_lib.study.steps import ROOT, StudyPaths, findings, study_grid

INDEX = {"corpus": "/c.parquet", "tokenizer": "/tok.json", "seq_len": 64,
         "paths": {"padded": "/c.parquet", "padding-free": "/c.parquet", "pretok-padded": "/d/padded-zstd3",
                   "pretok-token-list": "/d/token-list-zstd3", "pretok-memmap": "/d/memmap"}}


def test_profiles_resolve_machine_dependent_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert world_sizes(0) == [1] and world_sizes(1) == [1] and world_sizes(4) == [1, 2, 4]
    assert world_sizes(6) == [1, 2, 4, 6]
    monkeypatch.setattr("pretok_lib.study.profiles.gpu_count", lambda: 4)
    full = profile_parameters("full")
    assert full["sweep_grids"][0]["world"] == [1, 2, 4] and full["sweep_grids"][1]["world"] == [4]
    assert full["train_world"] == 4 and full["workers"] >= 1
    assert PROFILES["full"]["sweep_grids"][0]["world"] == "gpus"  # the table itself is not modified
    quick = profile_parameters("quick", {"corpus_mb": 5.0})
    assert quick["corpus_mb"] == 5.0 and quick["sweep_grids"][0]["world"] == [1, 2]
    with pytest.raises(ValueError, match="unknown study profile"):
        profile_parameters("huge")


def test_select_notebooks() -> None:
    assert select(None) == list(NOTEBOOKS)
    assert select(["05", "01"]) == ["01_pretokenize", "05_analysis"]  # always in study order
    assert select(["03_train"]) == ["03_train"]
    with pytest.raises(PretokError, match="names no single"):
        select(["0"])


def test_study_grid_links_each_data_path_to_its_dataset() -> None:
    grid = study_grid(INDEX, {"data": ["padded", "pretok-memmap"], "world": [1, 2]}, {"train.steps": 5})
    points = grid.points()
    assert [p.run_id for p in points] == ["sweep-padded-w1-s64", "sweep-padded-w2-s64", "sweep-pretok-memmap-w1-s64",
                                          "sweep-pretok-memmap-w2-s64"]
    assert [p.get("data.path") for p in points] == ["/c.parquet"] * 2 + ["/d/memmap"] * 2
    p = points[0]
    assert p.get("data.tokenizer") == "/tok.json" and p.get("eval.path") == "/d/memmap" and p.get("train.steps") == 5
    one = study_grid(INDEX, {}, {"data.kind": "pretok-token-list"}, "train").points()
    assert [(q.run_id, q.get("data.path")) for q in one] == [("train-pretok-token-list-w1-s64", "/d/token-list-zstd3")]


def test_resolve_is_relative_to_the_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve("configs/tiny.yaml") == ROOT / "configs" / "tiny.yaml"
    assert resolve(tmp_path / "x") == tmp_path / "x"
    assert StudyPaths(tmp_path).runs == tmp_path / "runs"


def test_findings_without_results(tmp_path: Path) -> None:
    assert findings([], StudyPaths(tmp_path)) == "No benchmark results or runs yet."


def test_unknown_parameter_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    with pytest.raises(PretokError, match="no study notebook has parameter"):
        run_study("smoke", out=tmp_path / "s", parameters={"no_such": 1}, echo=None)
    assert not (tmp_path / "s" / "notebooks").exists()
    assert cli_main(["study", "--profile", "smoke", "--out", str(tmp_path / "t"), "--set", "nope=1"]) == 1
    assert "no study notebook has parameter(s) nope" in capsys.readouterr().err
