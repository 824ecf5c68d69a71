"""log.tracking: every metrics.jsonl record mirrored to MLflow (a local file store: no server, no network) and to
W&B (offline: written under the run, read back here from its own files), from `pretok train` and from
`pretok_lib.measure.Run`; a tracker that cannot be used is one config line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pretok_lib.errors import PretokError
from pretok_lib.train.config import load_config

from .conftest import run_here, tiny_overrides
from .wandb_records import history, of_kind

mlflow = pytest.importorskip("mlflow", reason="log.tracking mlflow needs: pip install -e '.[tracking]'")


def _history(uri: str, run_dir, key: str) -> tuple[list[tuple[int, float]], object]:
    client = mlflow.MlflowClient(tracking_uri=uri)
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]
    hist = client.get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in hist), client.get_run(run_id)


def test_a_training_run_mirrors_its_records_to_mlflow(train_data, tmp_path):
    uri = (tmp_path / "mlruns").as_uri()
    run_here(tiny_overrides(train_data, tmp_path / "runs", **{"log.tracking": "[mlflow]", "log.mlflow_uri": uri,
                                                              "log.experiment": "tiny"}))
    run_dir = tmp_path / "runs" / "run"
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    for key in ("loss", "tokens_per_s", "data_stall"):
        hist, run = _history(uri, run_dir, f"train/{key}")
        assert [s for s, _ in hist] == [r["step"] for r in train]
        assert [v for _, v in hist] == pytest.approx([r[key] for r in train])
    assert run.info.status == "FINISHED" and run.data.params["train.steps"] == "3"
    assert mlflow.MlflowClient(tracking_uri=uri).get_experiment(run.info.experiment_id).name == "tiny"


def test_a_measured_run_mirrors_to_mlflow_and_ends_with_its_status(tmp_path):
    from pretok_lib.measure import Run

    uri = (tmp_path / "mlruns").as_uri()
    with pytest.raises(RuntimeError):
        with Run(tmp_path / "r", {"train": {"lr": 0.1}}, tracking=["mlflow"], mlflow_uri=uri) as m:
            for i, _ in enumerate(m.batches(np.ones((3, 2, 8), dtype=np.int64))):
                m.step(loss=2.0 - i)
            raise RuntimeError("the user's loop died")
    hist, run = _history(uri, tmp_path / "r", "train/loss")
    assert hist == [(1, 2.0), (2, 1.0), (3, 0.0)] and run.info.status == "FAILED"
    assert run.data.params["train.lr"] == "0.1"


@pytest.mark.parametrize("tracking,why", [("[neptune]", "log.tracking 'neptune' is not one of mlflow, wandb"),
                                          ("[mlflow]", "the mlflow package is not installed"),
                                          ("[wandb]", "the wandb package is not installed"),
                                          ("[wandb]\nlog.wandb_mode=cloud", "log.wandb_mode 'cloud' is not one of")])
def test_a_tracker_that_cannot_be_used_is_one_config_line(monkeypatch, tracking, why):
    import importlib.util

    real = importlib.util.find_spec
    missing = why.split("the ")[-1].split(" package")[0] if "package" in why else None
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == missing else real(n, *a))
    with pytest.raises(PretokError, match=why):
        load_config(None, ["data.path=x", *(f"log.tracking={tracking}".split("\n"))])


def test_a_training_run_mirrors_to_wandb_offline_beside_mlflow(train_data, tmp_path, monkeypatch):
    """Both trackers at once; W&B offline with no key and no network: its records are the train records of
    metrics.jsonl, its config the run's, its summary the status. (W&B's service process lives as long as the process
    that used it: `pretok train`'s, or a notebook kernel's.)"""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # any upload attempt would fail, not hang
    run_here(tiny_overrides(train_data, tmp_path / "runs", **{"log.tracking": "[mlflow, wandb]",
                                                              "log.mlflow_uri": (tmp_path / "mlruns").as_uri(),
                                                              "log.experiment": "tiny"}))
    run_dir = tmp_path / "runs" / "run"
    train = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    got = history(run_dir)
    for key in ("loss", "tokens_per_s", "data_stall"):
        assert [s for s, _ in got[f"train/{key}"]] == [r["step"] for r in train]
        assert [v for _, v in got[f"train/{key}"]] == pytest.approx([r[key] for r in train])
    (run,) = of_kind(run_dir, "run")
    config = {u.key: json.loads(u.value_json) for u in run.run.config.update}
    assert run.run.project == "tiny" and run.run.display_name == "run" and config["train.steps"] == 3
    assert run.run.run_id == json.loads((run_dir / "tracking.json").read_text())["wandb"]["run_id"]
    status = [json.loads(u.value_json) for r in of_kind(run_dir, "summary") for u in r.summary.update
              if u.key == "pretok/status"]
    assert status == ["completed"] and [r.exit.exit_code for r in of_kind(run_dir, "exit")] == [0]


def test_a_resumed_run_continues_its_wandb_run_and_a_fresh_start_gets_a_new_one(tmp_path):
    from pretok_lib.measure import Run
    from pretok_lib.train.tracking import open_trackers

    (tmp_path / "r").mkdir()
    ids = []
    for resume, status in ((False, "interrupted"), (True, "failed"), (False, "completed")):
        (t,) = open_trackers(["wandb"], tmp_path / "r", "r", {"a": 1}, None, "e", resume=resume)
        t.log({"kind": "train", "step": len(ids) + 1, "loss": 1.0, "per_dataset": [0.5, float("nan")]})
        t.close(status)
        ids.append(t.id)
    assert ids[0] == ids[1] != ids[2]
    assert [r.exit.exit_code for r in of_kind(tmp_path / "r", "exit")] == [3, 1, 0]
    assert history(tmp_path / "r")["train/per_dataset/0"] == [(1, 0.5), (2, 0.5), (3, 0.5)]
    with Run(tmp_path / "m", {"train": {"lr": 0.1}}, tracking=["wandb"]) as m:
        for i, _ in enumerate(m.batches(np.ones((3, 2, 8), dtype=np.int64))):
            m.step(loss=2.0 - i)
    assert history(tmp_path / "m")["train/loss"] == [(1, 2.0), (2, 1.0), (3, 0.0)]


def test_a_resumed_run_continues_its_mlflow_run_and_a_fresh_start_gets_a_new_one(tmp_path):
    from pretok_lib.train.tracking import open_trackers

    uri = (tmp_path / "mlruns").as_uri()
    (tmp_path / "r").mkdir()
    ids = []
    for resume in (False, True, False):
        (t,) = open_trackers(["mlflow"], tmp_path / "r", "r", {"a": 1}, uri, "e", resume=resume)
        t.log({"kind": "train", "step": len(ids) + 1, "loss": 1.0, "per_dataset": [0.5, float("nan")]})
        t.close("interrupted")
        ids.append(t.id)
    assert ids[0] == ids[1] != ids[2]
    client = mlflow.MlflowClient(tracking_uri=uri)
    assert [m.step for m in client.get_metric_history(ids[0], "train/loss")] == [1, 2]
    assert client.get_run(ids[0]).info.status == "KILLED"
    assert set(client.get_run(ids[2]).data.metrics) == {"train/loss", "train/per_dataset/0"}
