"""Config: YAML + dotted overrides, type checks, unknown keys, cross-field checks; shipped configs load."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    (["data.order=random"], "data.order 'random' is not exact or block"),
    (["data.order=block"], "applies to the parquet paths"),  # the default kind is pretok-memmap
    (["data.kind=pretok-padded", "data.block_groups=0"], "data.block_groups must be >= 1"),
    # the second held-out split (eval.own_*) is checked as eval.kind / eval.path are
    (["eval.path=v", "eval.own_path=p", "eval.own_kind=bogus"], "eval.own_kind 'bogus' is not one of"),
    (["eval.path=v", "eval.own_path=p", "eval.own_kind=padded"], "eval.own_kind 'padded' tokenizes on the fly"),
    (["eval.path=v", "eval.kind=padding-free"], "eval.kind 'padding-free' tokenizes on the fly"),
    (["eval.own_path=p"], "eval.own_path is set but eval.path is empty"),
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


def _numeric_fields() -> dict[str, type]:
    """Every number-typed config key (optional ones included) -> int or float."""
    import dataclasses
    import typing

    from pretok_lib.train.config import Config

    out = {}

    def walk(cls, prefix):
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
                continue
            if typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
                walk(typing.get_args(tp)[0], f"{prefix}{f.name}.")   # data.mixture: data.mixture.weight
                continue
            args = set(typing.get_args(tp)) - {type(None)} or {tp}
            if args <= {int, float} and bool not in args:
                out[prefix + f.name] = float if float in args else int
    walk(Config, "")
    return out


def test_every_number_has_limits():
    from pretok_lib.train.config import LIMITS

    assert set(_numeric_fields()) == set(LIMITS)


def _yaml_number(v) -> str:
    if isinstance(v, float) and v != v:
        return ".nan"
    if isinstance(v, float) and abs(v) == float("inf"):
        return "-.inf" if v < 0 else ".inf"
    return repr(v)


@st.composite
def _invalid(draw):
    """(key, a value of the key's type outside its limits, or not finite)."""
    from pretok_lib.train.config import LIMITS

    fields = _numeric_fields()
    key = draw(st.sampled_from(sorted(fields)))
    lim = LIMITS[key]
    options = []
    if lim.lo is not None:
        options.append("below")
    if lim.hi is not None:
        options.append("above")
    if fields[key] is float:
        options.append("not finite")
    how = draw(st.sampled_from(options))
    if how == "not finite":
        return key, draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    if fields[key] is int:
        if how == "below":
            return key, draw(st.integers(max_value=int(lim.lo) - 1 if not lim.lo_open else int(lim.lo)))
        return key, draw(st.integers(min_value=int(lim.hi) + 1 if not lim.hi_open else int(lim.hi)))
    if how == "below":
        v = draw(st.floats(max_value=lim.lo, exclude_max=not lim.lo_open, allow_nan=False, allow_infinity=False))
    else:
        v = draw(st.floats(min_value=lim.hi, exclude_min=not lim.hi_open, allow_nan=False, allow_infinity=False))
    return key, v


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_invalid())
def test_any_invalid_number_is_one_line_naming_the_key(case):
    key, v = case
    override = ["data.path=somewhere", f"{key}={_yaml_number(v)}"]
    if key.startswith("data.mixture."):  # a field of a list entry: the error names the entry
        override = [f"data.mixture=[{{path: a}}, {{path: b, {key.split('.')[-1]}: {_yaml_number(v)}}}]"]
        key = key.replace("data.mixture.", "data.mixture[1].")
    with pytest.raises(PretokError) as e:
        load_config(None, override)
    msg = str(e.value)
    assert f"{key} must be" in msg and "\n" not in msg


@pytest.mark.parametrize("override", ["train.lr=-0.001", "train.lr=.nan", "train.eps=0", "model.num_heads=0"])
def test_cli_invalid_number_exits_2_with_one_line(override, tmp_path, capsys):
    from pretok_lib.cli import main as cli_main

    rc = cli_main(["train", f"run.dir={tmp_path}", "data.path=somewhere", override])
    err = capsys.readouterr().err
    assert rc == 2 and override.split("=")[0] + " must be" in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_a_dataset_twice_in_a_mixture_is_refused():
    """One dataset twice (also spelled differently) repeated each sample back to back: the entries share a seed."""
    with pytest.raises(PretokError, match=r"data.mixture\[1\].path is data.mixture\[0\]'s dataset again"):
        load_config(None, ["data.mixture=[{path: /d/a, weight: 1}, {path: /d/b/../a, weight: 2}]"])
    assert len(load_config(None, ["data.mixture=[{path: /d/a, weight: 1}, {path: /d/b, weight: 2}]"]).data.mixture) == 2


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("[]{},:'\"&*!|>%@`#-? ab1.\\\t"), max_size=12))
def test_an_override_value_that_is_not_yaml_is_one_line(text: str) -> None:
    """`pretok train ... key=<text>`: whatever the text, a config or a one-line PretokError naming the override
    (a PyYAML exception reached the user as a traceback)."""
    import yaml

    try:
        yaml.safe_load(text.strip() and text)   # an empty value is null
        is_yaml = True
    except yaml.YAMLError:
        is_yaml = False
    try:
        load_config(None, [f"run.id={text}"])
    except PretokError as e:
        assert "\n" not in str(e) and (is_yaml or f"override 'run.id={text}'" in str(e)), str(e)
