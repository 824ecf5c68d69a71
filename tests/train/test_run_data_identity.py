"""A run's identity includes its data (train/identity.py `data_changes`): a completed run whose data path was
re-tokenized since, from another corpus or with another tokenizer, is not reused as this config's run by `pretok
train` (refused, exit 2), `pretok sweep` (failed, or started over with --rerun-changed, as a study does); the
same input tokenized again to the same bytes is the same data. And `run.overwrite` / a sweep's rerun never empty
a run directory that holds the run's own inputs.

Fault injection: the dataset directory of a completed run is replaced under it by each kind of other data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pretok_lib.launch.sweep import Point, run_sweep
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.train.config import load_config
from pretok_lib.train.identity import data_fingerprint
from pretok_lib.train.run import EXIT_BAD_INPUT, _prepare_dir, train

from ..conftest import CL100K_JSON, GPT2_JSON
from .conftest import tiny_overrides

POINT = Point(1, ())


def _nested(overrides: list[str]) -> dict:
    out: dict = {}
    for item in overrides:
        key, _, value = item.partition("=")
        section, name = key.split(".")
        out.setdefault(section, {})[name] = yaml.safe_load(value)
    return out


@pytest.fixture(scope="module")
def completed(train_data, tmp_path_factory):
    """(config file, runs dir, dataset dir, a pristine copy of it): one completed 2-step run on `ds`."""
    base = tmp_path_factory.mktemp("data-identity")
    ds, pristine = base / "ds", base / "pristine"
    shutil.copytree(train_data.dirs["pretok-memmap"], ds)
    shutil.copytree(ds, pristine)
    o = [x for x in tiny_overrides(train_data, base / "runs", **{"train.steps": 2, "data.path": ds})
         if not x.startswith(("data.tokenizer=", "run.id=", "run.dir="))]
    cfg = base / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_nested(o)))
    assert train(load_config(cfg, [f"run.id={POINT.run_id}", f"run.dir={base / 'runs'}"])) == 0
    return cfg, base / "runs", ds, pristine


def _tokenize(text: Path, out: Path, tokenizer: Path) -> None:
    run_tokenize(TokenizeConfig(inputs=[str(text)], out=str(out), tokenizer=str(tokenizer), format="memmap",
                                workers=0, progress=False))


FAULTS = {  # how the dataset directory is replaced -> whether it is other data
    "the same input tokenized again": (lambda td, ds: _tokenize(td.text, ds, GPT2_JSON), False),
    "another corpus, same tokenizer": (lambda td, ds: shutil.copytree(td.val, ds), True),
    "another tokenizer": (lambda td, ds: _tokenize(td.text.parent / "val.parquet", ds, CL100K_JSON), True),
    "another tokenizer, run.json from before data_fingerprint": (
        lambda td, ds: _tokenize(td.text.parent / "val.parquet", ds, CL100K_JSON), True),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_completed_run_on_data_re_tokenized_since_is_not_reused(fault, completed, train_data, capsys):
    cfg_file, runs, ds, pristine = completed
    run = runs / POINT.run_id
    args = [f"run.id={POINT.run_id}", f"run.dir={runs}"]
    record = json.loads((run / "run.json").read_text())
    assert record["data_fingerprint"] == data_fingerprint(load_config(cfg_file, args))  # what the trainer saw
    before = (run / "metrics.jsonl").read_text()
    make, other = FAULTS[fault]
    try:
        if "from before" in fault:
            (run / "run.json").write_text(json.dumps({k: v for k, v in record.items() if k != "data_fingerprint"}))
        shutil.rmtree(ds)
        make(train_data, ds)
        capsys.readouterr()
        rc = train(load_config(cfg_file, args))
        err = capsys.readouterr().err.strip().splitlines()
        [(_, status)] = run_sweep(cfg_file, [POINT], runs, echo=None)
        if other:
            assert rc == EXIT_BAD_INPUT and len(err) == 1 and "holds a run of other data (" in err[0], err
            why = "tokenizer fingerprint" if "another tokenizer" in fault else "train data: its tokens changed"
            assert why in err[0] and status == "failed"
            attempt = json.loads((run / "launcher.json").read_text())["attempts"][-1]
            assert "holds a run of other data" in attempt["reason"]
        else:
            assert rc == 0 and "already completed" in err[-1]
            assert status == "skipped"
        assert (run / "metrics.jsonl").read_text() == before          # the old run untouched either way
    finally:
        (run / "run.json").write_text(json.dumps(record))
        (run / "launcher.json").unlink(missing_ok=True)
        shutil.rmtree(ds)
        shutil.copytree(pristine, ds)


INPUTS = {  # config override that puts one of the run's inputs inside its run directory
    "data.path": lambda run, td: f"data.path={shutil.copytree(td.dirs['pretok-memmap'], run / 'data')}",
    "data.tokenizer": lambda run, td: f"data.tokenizer={shutil.copy(GPT2_JSON, run / 'tokenizer.json')}",
    "eval.path": lambda run, td: f"eval.path={shutil.copytree(td.val, run / 'val')}",
    "data.mixture": lambda run, td: "data.mixture=[{path: '%s', weight: 1}]"
                                    % shutil.copytree(td.dirs["pretok-memmap"], run / "sub" / "mix"),
}


@pytest.mark.parametrize("key", INPUTS)
def test_overwrite_never_empties_a_run_directory_holding_the_runs_inputs(key, train_data, tmp_path):
    """run.overwrite=true emptied the run directory whole: data, tokenizer or eval data kept there went with it."""
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("old\n")
    o = tiny_overrides(train_data, tmp_path / "runs", **{"run.overwrite": "true"})
    o.append(INPUTS[key](run, train_data))
    if key == "data.mixture":
        o = [x for x in o if not x.startswith("data.path=")]
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    rc, msg = _prepare_dir(load_config(None, o), run, 1)
    assert rc == EXIT_BAD_INPUT and "holds the run's own inputs" in msg and str(run) in msg
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_a_sweep_never_clears_a_run_directory_holding_the_runs_inputs(train_data, tmp_path):
    """--rerun-changed (a study's policy) renamed the changed point's directory aside and deleted it whole."""
    from pretok_lib.train.config import save_config

    runs = tmp_path / "runs"
    run = runs / POINT.run_id
    data = shutil.copytree(train_data.dirs["pretok-memmap"], run / "data")
    o = [x for x in tiny_overrides(train_data, runs, **{"data.path": data})
         if not x.startswith(("run.id=", "run.dir="))]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_nested(o)))
    save_config(load_config(cfg, ["train.steps=7", f"run.id={POINT.run_id}", f"run.dir={runs}"]), run / "config.yaml")
    (run / "run.json").write_text(json.dumps({"status": "completed", "global_batch": 4}))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    [(_, status)] = run_sweep(cfg, [POINT], runs, echo=None, changed="rerun")
    assert status == "failed"
    reason = json.loads((run / "launcher.json").read_text())["attempts"][-1]["reason"]
    assert "train.steps: 7 -> 3" in reason and "holds the run's own inputs" in reason
    assert sorted(p.relative_to(run) for p in run.rglob("*") if p.name != "launcher.json") == before
