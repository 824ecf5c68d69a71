"""A run directory belongs to one config (pretok_lib/train/identity.py): every field of the config, generated from
the dataclasses so a new field is covered the day it is added, either changes the run's identity or is listed as
exempt; values resolved at run time and equal paths spelled differently match."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.train.config import Config, load_config, save_config
from pretok_lib.train.identity import EXEMPT_KEYS, EXEMPT_SECTIONS, RESOLVED_AT_RUN_TIME, changed, differences
from pretok_lib.train.run_record import flatten as _flat


def _other(v):
    """A different value of the same kind."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v * 2 + 1
    if isinstance(v, str):
        return v + "-x"
    if isinstance(v, list):
        return [*v, {"path": "/elsewhere", "weight": 1.0}] if v == [] else v[:-1]
    return "set-now" if v is None else None


def _set(d: dict, key: str, value) -> dict:
    out = json.loads(json.dumps(d))
    *head, last = key.split(".")
    node = out
    for h in head:
        node = node[h]
    node[last] = value
    return out


KEYS = sorted(_flat(Config().to_dict()))


@pytest.mark.parametrize("key", KEYS)
def test_every_field_is_identity_or_exempt(key: str) -> None:
    saved = Config().to_dict()
    saved = _set(saved, key, _other(_flat(saved)[key]) if _flat(saved)[key] is None else _flat(saved)[key])
    new = _set(saved, key, _other(_flat(saved)[key]))
    diffs = differences(saved, new)
    exempt = key in EXEMPT_KEYS or key.startswith(EXEMPT_SECTIONS)
    if exempt:
        assert diffs == [], key
    else:
        assert len(diffs) == 1 and diffs[0].startswith(f"{key}: "), (key, diffs)


@pytest.mark.parametrize("key", ["train.precision", "model.vocab_size", "data.order", "model.intermediate_size"])
def test_values_resolved_at_run_time_match_what_was_recorded(key: str) -> None:
    recorded = {"train.precision": "bf16", "model.vocab_size": 50304, "data.order": "block",
                "model.intermediate_size": 384}[key]
    saved = _set(Config().to_dict(), key, recorded)
    unresolved = "auto" if key == "train.precision" else None
    assert differences(saved, _set(saved, key, unresolved)) == []
    if key == "train.precision":  # an explicit other precision is another run
        assert differences(saved, _set(saved, key, "fp32")) == ["train.precision: \"bf16\" -> \"fp32\""]


def test_paths_compare_resolved(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "data", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    saved = _set(Config().to_dict(), "data.path", str(tmp_path / "data"))
    for same in ("data", "./data", "link", str(tmp_path / "link") + "/"):
        assert differences(saved, _set(saved, "data.path", same)) == [], same
    assert differences(saved, _set(saved, "data.path", "other")) != []
    mix = _set(Config().to_dict(), "data.mixture", [{"path": str(tmp_path / "data"), "weight": 1.0}])
    assert differences(mix, _set(mix, "data.mixture", [{"path": "link", "weight": 1.0}])) == []
    assert differences(mix, _set(mix, "data.mixture", [{"path": "link", "weight": 2.0}])) == []  # one dataset: 1/1
    two = _set(mix, "data.mixture", [{"path": "link", "weight": 1.0}, {"path": "/elsewhere", "weight": 1.0}])
    assert differences(two, _set(two, "data.mixture", [{"path": "link", "weight": 2.0},
                                                       {"path": "/elsewhere", "weight": 1.0}])) != []
    named = _set(saved, "data.tokenizer", "cl100k_base")  # a name, not a file: compared as written, wherever run
    monkeypatch.chdir(tmp_path / "data")
    assert differences(named, _set(named, "data.tokenizer", "cl100k_base")) == []
    assert differences(named, _set(named, "data.tokenizer", "o200k_base")) != []
    remote = _set(saved, "data.path", "s3://bucket/ds")
    assert differences(remote, _set(remote, "data.path", "s3://bucket/ds")) == []


def test_changed_reads_the_run_directory(tmp_path: Path) -> None:
    cfg = load_config(None, ["data.path=/d", "train.steps=3", "data.micro_batch=4"])
    run = tmp_path / "run"
    assert changed(run, cfg, 1) is None                      # nothing there yet
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    (run / "run.json").write_text(json.dumps({"status": "completed", "global_batch": 8}))
    assert changed(run, cfg, 2) is None                      # 4 x 2 ranks, as recorded
    elastic = load_config(None, ["data.path=/d", "train.steps=3", "data.micro_batch=8"])
    assert changed(run, elastic, 1) is None                  # elastic resume: same global batch on one rank
    why = changed(run, cfg, 1)
    assert why and "global batch" in why and "8 -> 4" in why
    many = load_config(None, ["data.path=/d", "train.steps=4", "train.lr=1", "train.beta1=0.5", "model.num_layers=9",
                              "run.seed=7", "data.micro_batch=4"])
    why = changed(run, many, 2)
    assert why.count(" -> ") == 4 and why.endswith("and 1 more)")
    (run / "config.yaml").write_text("{unclosed")
    assert "cannot be read" in changed(run, cfg, 2)


OPTIONAL = [k for k in KEYS if _flat(Config().to_dict())[k] is None and k not in RESOLVED_AT_RUN_TIME
            and k not in EXEMPT_KEYS and not k.startswith(EXEMPT_SECTIONS)]


@pytest.mark.parametrize("key", OPTIONAL)
def test_leaving_out_a_setting_the_run_had_is_a_change(key: str) -> None:
    """An unset value matched anything, so dropping eval.path, train.target_loss, data.tokenizer, ... reused the
    run; only the values the run resolves itself (`RESOLVED_AT_RUN_TIME`) may be left out."""
    assert OPTIONAL and "train.target_loss" in OPTIONAL and "eval.path" in OPTIONAL
    saved = _set(Config().to_dict(), key, _other(None))
    diffs = differences(saved, Config().to_dict())
    assert len(diffs) == 1 and diffs[0].startswith(f"{key}: "), (key, diffs)


def test_relative_paths_resolve_in_the_directory_each_attempt_ran_in(tmp_path: Path, monkeypatch) -> None:
    """`data.path=ds` from A, then `data.path=ds` from B (other data) was taken for the same run, and `A/ds` from
    their parent (the same data) for another: relative paths resolved against today's directory on both sides."""
    for d in ("A/ds", "B/ds"):
        (tmp_path / d).mkdir(parents=True)
    cfg_a = load_config(None, ["data.path=ds", "train.steps=3"])
    run = tmp_path / "run"
    run.mkdir()
    save_config(cfg_a, run / "config.yaml")
    (run / "run.json").write_text(json.dumps({"status": "completed", "global_batch": 8, "cwd": str(tmp_path / "A")}))
    monkeypatch.chdir(tmp_path / "B")
    why = changed(run, cfg_a, 1)
    assert why and "data.path" in why
    monkeypatch.chdir(tmp_path)
    assert changed(run, load_config(None, ["data.path=A/ds", "train.steps=3"]), 1) is None


def test_the_global_batch_of_a_completed_run_without_it_in_run_json_comes_from_its_summary(tmp_path: Path) -> None:
    cfg = load_config(None, ["data.path=/d", "train.steps=3", "data.micro_batch=4"])
    run = tmp_path / "run"
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    (run / "run.json").write_text(json.dumps({"status": "completed"}))
    (run / "summary.json").write_text(json.dumps({"global_batch": 8}))
    assert changed(run, cfg, 2) is None
    assert "8 -> 4" in changed(run, cfg, 1)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 40), min_size=2, max_size=5), st.sampled_from([1, 10, 0.1, 0.5, 4, 1e-3]),
       st.data())
def test_mixture_weights_compare_as_the_shares_they_realise(weights, scale, data):
    """Weights 3/7 after 0.3/0.7 (the same blend, the same samples) were another config; another ratio still is."""
    from pretok_lib.data.blend import rational_weights

    mix = [{"path": "/a", "weight": 0.3}, {"path": "/b", "weight": 0.7}]
    three_seven = _set(Config().to_dict(), "data.mixture", mix)
    assert differences(three_seven, _set(three_seven, "data.mixture", [{**mix[0], "weight": 3},
                                                                       {**mix[1], "weight": 7}])) == []
    entries = [{"path": f"/d{j}", "weight": w} for j, w in enumerate(weights)]
    saved = _set(Config().to_dict(), "data.mixture", entries)
    scaled = [{**e, "weight": e["weight"] * scale} for e in entries]
    same = rational_weights([e["weight"] for e in scaled]) == rational_weights(weights)
    assert same or scale not in (1, 10, 4)       # integer scales are always the same blend
    assert (differences(saved, _set(saved, "data.mixture", scaled)) == []) == same
    j = data.draw(st.integers(0, len(weights) - 1))
    other = [{**e, "weight": e["weight"] + (i == j)} for i, e in enumerate(entries)]
    if rational_weights([e["weight"] for e in other]) != rational_weights(weights):
        assert differences(saved, _set(saved, "data.mixture", other)) != []


def _without(d: dict, key: str) -> dict:
    out = json.loads(json.dumps(d))
    *head, last = key.split(".")
    node = out
    for h in head:
        node = node[h]
    del node[last]
    return out


@pytest.mark.parametrize("key", KEYS)
def test_a_key_the_saved_config_lacks_counts_as_its_default(key: str) -> None:
    """A run from before a key existed (its config.yaml lacks it) ran as the key's default does: the same config
    now matches it, another value is a change (a study run without `eval.own_path` was reused for the config that
    adds one, so the own-layout loss never came)."""
    defaults = Config().to_dict()
    old = _without(defaults, key)
    assert differences(old, defaults) == [], key
    diffs = differences(old, _set(defaults, key, _other(_flat(defaults)[key])))
    if key in EXEMPT_KEYS or key.startswith(EXEMPT_SECTIONS):
        assert diffs == [], (key, diffs)
    else:   # a value resolved at run time too: what the old run resolved it to is not known

        assert len(diffs) == 1 and diffs[0].startswith(f"{key}: "), (key, diffs)
