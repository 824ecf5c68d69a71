"""Config: YAML + dotted overrides, type checks, unknown keys, cross-field checks; shipped configs load."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretok_lib.errors import PretokError
from pretok_lib.train.config import load_config, save_config

from ..conftest import ROOT


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("data:\n  path: some/dir\n  seq_len: 128\ntrain:\n  lr: 1\n")
    cfg = load_config(p, ["train.steps=7", "train.precision=fp32", "data.path=[a, b]", "train.target_loss=3.5",
                          "train.min_lr_ratio=1e-2"])
    assert cfg.name == "x" and cfg.data.seq_len == 128 and cfg.train.steps == 7
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)        # int accepted for float
    assert cfg.data.path == ["a", "b"] and cfg.train.target_loss == 3.5 and cfg.train.min_lr_ratio == 0.01
    assert cfg.model.hidden_size == 128                                   # default kept
    save_config(cfg, tmp_path / "resolved.yaml")
    again = load_config(tmp_path / "resolved.yaml")
    assert again.to_dict() == cfg.to_dict()          # the saved config reproduces the run (name included)


@pytest.mark.parametrize("override, message", [
    (["train.stepz=3"], "unknown config key 'train.stepz'"),
    (["modle.hidden_size=3"], "unknown config key 'modle'"),
    (["train.steps=many"], "train.steps: expected int, got str"),
    (["train.steps=3.5"], "train.steps: expected int, got float"),
    (["train.compile=1"], "train.compile: expected bool, got int"),
    (["data.kind=bogus"], "data.kind 'bogus' is not one of"),
    (["data.kind=padded"], "tokenizes on the fly: set data.tokenizer"),
    (["train.precision=fp8"], "train.precision 'fp8'"),
    (["model.num_heads=3"], "must divide by num_heads"),
    (["train.steps=0"], "train.steps must be >= 1"),
    (["train.steps"], "is not of the form section.key=value"),
    (["train=3"], "train: expected a mapping"),
])
def test_bad_config_is_one_clear_line(override, message):
    with pytest.raises(PretokError) as e:
        load_config(None, ["data.path=somewhere", *override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_yaml_names_the_file(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("train: [unclosed\n")
    with pytest.raises(PretokError, match="broken.yaml: not valid YAML"):
        load_config(p)
    with pytest.raises(PretokError, match="missing.yaml: config file not found"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / name, ["data.path=x"])
    assert cfg.name == Path(name).stem
