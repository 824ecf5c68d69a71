"""The benchmarks' shared config bridge (`pretok_lib.bench.common`): the CLI and `run(cfg)` see the same settings."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pretok_lib.bench.common import check_targets, from_args, write_json
from pretok_lib.bench.loaders import LoadersBench
from pretok_lib.bench.tokenize import TokenizeBench
from pretok_lib.bench.train import TrainBench
from pretok_lib.cli import build_parser
from pretok_lib.errors import PretokError

BENCHES = {"tokenize": TokenizeBench, "loaders": LoadersBench, "train": TrainBench}


@pytest.mark.parametrize("name", BENCHES)
def test_cli_defaults_are_the_config_defaults(name):
    cls, args = BENCHES[name], build_parser().parse_args(["bench", name])
    assert all(hasattr(args, f.name) for f in dataclasses.fields(cls))  # every field is an option
    assert from_args(cls, args) == cls()


def test_cli_options_reach_the_config():
    argv = ["bench", "tokenize", "--workers", "3", "--skip", "loop", "rss-scan", "--formats", "memmap",
            "--loop-mb", "1.5", "--json", "out.json", "--check"]
    cfg = from_args(TokenizeBench, build_parser().parse_args(argv))
    assert (cfg.workers, cfg.skip, cfg.formats, cfg.loop_mb, cfg.json, cfg.check) == \
        (3, ["loop", "rss-scan"], ["memmap"], 1.5, "out.json", True)
    cfg = from_args(TrainBench, build_parser().parse_args(["bench", "train", "--set", "a=1", "b=2", "--steps", "4"]))
    assert (cfg.set, cfg.steps, cfg.mb) == (["a=1", "b=2"], 4, 5.0)
    assert cfg.record()["set"] == ["a=1", "b=2"] and "fn" not in cfg.record()


def test_results_json_and_the_targets_check(tmp_path):
    write_json(tmp_path / "a" / "r.json", {"x": tmp_path})  # parents made, non-JSON values as strings
    assert json.loads((tmp_path / "a" / "r.json").read_text()) == {"x": str(tmp_path)}
    write_json(None, {"x": 1})  # no path: nothing written
    check_targets(LoadersBench(check=False), failed=True)
    check_targets(LoadersBench(check=True), failed=False)
    with pytest.raises(PretokError, match="targets failed"):
        check_targets(LoadersBench(check=True), failed=True)
