"""runs.py: loading run directories, statuses, damaged metrics.jsonl, settings and signatures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pretok_lib.analysis.runs import config_signature, find_run_dirs, load_run, load_runs

from .helpers import simple_run, train_record, val_record, write_run


def test_load_runs_finds_every_run_with_status(study_root: Path) -> None:
    runs = load_runs(study_root)
    assert len(runs) == 15
    by = {r.run_id: r for r in runs}
    assert by["padded-n1"].status == "completed" and by["padded-n1"].has_summary
    assert by["padded-failed"].status == "failed"
    assert by["padded-failed"].error == "RuntimeError: out of memory"
    assert len(by["padded-failed"].train) == 3  # partial metrics are kept
    assert by["padded-running"].status == "incomplete"  # running, no summary
    assert by["padded-running"].label == "padded-running [incomplete]"


def test_truncated_last_line_is_reported_not_raised(study_root: Path) -> None:
    run = load_run(study_root / "padded-running")
    assert len(run.train) == 2 and list(run.train["step"]) == [5, 10]
    assert any("truncated last line" in p for p in run.problems)


def test_corrupt_middle_line_and_non_records(tmp_path: Path) -> None:
    d = write_run(tmp_path, "r", train=[train_record(1, 1.0)])
    with open(d / "metrics.jsonl", "a") as f:
        f.write("{not json\n[1, 2]\n")
        f.write(json.dumps(train_record(2, 2.0)) + "\n")
    run = load_run(d)
    assert list(run.train["step"]) == [1, 2]
    assert any("line 2: not valid JSON" in p for p in run.problems)
    assert any("line 3: not a record" in p for p in run.problems)


def test_resumed_run_keeps_the_later_records(tmp_path: Path) -> None:
    first = [train_record(s, float(s), loss=10.0) for s in (1, 2, 3, 4, 5)]
    again = [train_record(s, float(s) + 0.5, loss=1.0) for s in (3, 4, 5, 6)]
    d = write_run(tmp_path, "r", train=[])
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + again))
    run = load_run(d)
    assert list(run.train["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(run.train["loss"]) == [10, 10, 1, 1, 1, 1]
    assert any("resumed" in p for p in run.problems)


def test_missing_files_are_problems(tmp_path: Path) -> None:
    d = tmp_path / "bare"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps(val_record(3, 1.0, 2.0)) + "\n")
    run = load_run(d)
    assert run.status == "incomplete" and run.run_id == "bare" and run.config == {}
    assert {"run.json: missing", "config.yaml: missing"} <= set(run.problems)
    assert len(run.val) == 1 and len(run.train) == 0 and run.train["loss"].size == 0


def test_interrupted_and_summary_before_run_json(tmp_path: Path) -> None:
    run = load_run(simple_run(tmp_path, "stopped", tokens_per_s=1.0, status="interrupted"))
    assert run.status == "incomplete" and "run.json: status 'interrupted'" in run.problems
    # pretok train writes summary.json before rewriting run.json: a crash in between is still a completed run
    run = load_run(simple_run(tmp_path, "crashed", tokens_per_s=1.0, status="running", summary=True))
    assert run.status == "completed"


def test_launch_that_failed_before_run_json_is_a_failed_run(tmp_path: Path) -> None:
    d = tmp_path / "sweep-padded-w2"
    d.mkdir()
    (d / "launcher.json").write_text(json.dumps({"point": {}, "attempts": [
        {"returncode": 1, "status": "failed", "reason": "exit code 1"}]}))
    (run,) = load_runs(tmp_path)
    assert (run.run_id, run.status, run.error) == ("sweep-padded-w2", "failed", "exit code 1")


def test_completed_run_json_wins_and_summary_never_needed(tmp_path: Path) -> None:
    d = simple_run(tmp_path, "r", tokens_per_s=10.0, summary=False)
    run = load_run(d)
    assert run.status == "completed" and any("summary.json: missing" in p for p in run.problems)


def test_records_columns_nan_for_missing_and_null(tmp_path: Path) -> None:
    d = write_run(tmp_path, "r", train=[train_record(1, 1.0, mfu=None), {"kind": "train", "step": 2, "wall_s": 2}])
    t = load_run(d).train
    assert np.isnan(t["mfu"]).all() and not t.has("mfu")
    assert np.isnan(t["loss"][1]) and t["loss"][0] == 3.0
    assert "effective_tokens_per_s" in t.keys()


def test_settings_from_config_and_run_json(study_root: Path) -> None:
    by = {r.run_id: r for r in load_runs(study_root)}
    s = by["padded-n2"].settings
    assert (s["data_kind"], s["world_size"], s["seq_len"], s["precision"]) == ("padded", 2, 64, "fp32")
    assert s["global_batch"] == 8  # micro_batch 4 x world size 2
    assert by["pretok-memmap-n1-b16"].settings["global_batch"] == 16


def test_global_batch_from_logged_tokens(tmp_path: Path) -> None:
    d = write_run(tmp_path, "r", train=[train_record(1, 1.0, tokens=512)], seq_len=64)
    cfg = (d / "config.yaml").read_text().replace("micro_batch: 4", "other: 4")
    (d / "config.yaml").write_text(cfg)
    assert load_run(d).settings["global_batch"] == 8


def test_config_signature_ignores_seed_and_bookkeeping(study_root: Path) -> None:
    by = {r.run_id: r for r in load_runs(study_root)}
    a, b = by["pretok-memmap-n1"], by["pretok-memmap-n1-seed1"]
    assert config_signature(a) == config_signature(b)  # seed and run id differ only
    assert config_signature(a) != config_signature(by["pretok-memmap-n2"])
    assert config_signature(a, ["world_size"]) == config_signature(by["pretok-memmap-n2"], ["world_size"])
    assert config_signature(a) != config_signature(by["padded-n1"])


def test_find_run_dirs_skips_non_runs_and_nested(tmp_path: Path) -> None:
    simple_run(tmp_path / "sweep", "a", tokens_per_s=1.0)
    (tmp_path / "sweep" / "a" / "checkpoints" / "step_1").mkdir(parents=True)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "tokenize.json").write_text("{}")
    assert find_run_dirs(tmp_path) == [tmp_path / "sweep" / "a"]
    assert find_run_dirs(tmp_path / "sweep" / "a") == [tmp_path / "sweep" / "a"]
    assert load_runs(tmp_path / "bench") == []
    with pytest.raises(FileNotFoundError):
        load_runs(tmp_path / "nope")


# Records a damaged or hand-edited metrics.jsonl may hold: no valid step (bool, negative, float, text, huge ...),
# or an unhashable kind. Each must become a reported problem line, never an exception nor lost valid records.
MALFORMED = {
    "step true": '{"kind": "train", "step": true, "loss": 1.0}',
    "step false": '{"kind": "train", "step": false}',
    "step negative": '{"kind": "train", "step": -1, "loss": 1.0}',
    "step float": '{"kind": "train", "step": 1.5}',
    "step NaN": '{"kind": "train", "step": NaN}',
    "step Infinity": '{"kind": "val", "step": Infinity, "val_loss": 1.0}',
    "step huge": '{"kind": "train", "step": 1' + "0" * 400 + "}",
    "step text": '{"kind": "train", "step": "5"}',
    "step list": '{"kind": "val", "step": [5]}',
    "step null": '{"kind": "train", "step": null}',
    "kind list": '{"kind": ["train"], "step": 7}',
}


@pytest.mark.parametrize("where", ["middle", "end"])
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_records_are_problems_never_exceptions(name: str, where: str, tmp_path: Path) -> None:
    from pretok_lib.analysis import figures, summary_table

    good = [json.dumps(train_record(s, float(s))) for s in (5, 10, 15)]
    lines = good[:2] + [MALFORMED[name]] + good[2:] if where == "middle" else good + [MALFORMED[name]]
    d = write_run(tmp_path, "r", train=[])
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run = load_run(d)
    bad = lines.index(MALFORMED[name]) + 1
    assert list(run.train["step"]) == [5, 10, 15] and len(run.val) == 0
    if not name.startswith("kind"):   # a record of an unknown kind is skipped silently, as before
        assert any(p.startswith(f"metrics.jsonl line {bad}: not a record") for p in run.problems), run.problems
    (row,) = summary_table([run])   # the analysis on top: numbers, not ValueError / TypeError
    assert row["steps"] == 15 and row["tokens_per_s"] == pytest.approx(1000.0)
    assert figures.status_table_figure([run]).data


def test_huge_number_values_are_infinite_not_an_overflow(tmp_path: Path) -> None:
    d = write_run(tmp_path, "r", train=[])
    (d / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": -1' + "0" * 400 + "}\n")
    assert load_run(d).train["loss"][0] == -np.inf


@pytest.mark.parametrize("content", ["", "\n\n", '{"kind": "other", "step": 1}\n'])
@pytest.mark.parametrize("status", ["completed", "failed", "running"])
def test_run_without_records_says_so_in_its_note(content: str, status: str, tmp_path: Path) -> None:
    from pretok_lib.analysis import summary_table

    d = write_run(tmp_path, "r", train=[], status=status)
    (d / "metrics.jsonl").write_text(content)
    (row,) = summary_table(load_runs(tmp_path))
    assert row["steps"] is None and "metrics.jsonl: empty (no train or val records)" in row["note"]
