"""metrics.py: every derived number against values computed by hand on small synthetic logs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pretok_lib.analysis.metrics import (SUMMARY_COLUMNS, auto_target_loss, isolated_tokenization_speedups,
                                         path_speedups, precision_groups, rows_to_text, run_metrics, scaling_efficiency,
                                         storage_rows, summary_table, time_to_target, tokenization_speedups)
from pretok_lib.analysis.runs import Records, Run, load_run, load_runs

from .helpers import add_own_val, simple_run, train_record, val_record, write_run


def test_means_skip_warmup_records(tmp_path: Path) -> None:
    train = [train_record(1, 1.0, tokens_per_s=100.0, eff_frac=0.5, mfu=0.9, data_stall=0.9),
             train_record(2, 2.0, tokens_per_s=200.0, eff_frac=0.5, mfu=0.3, data_stall=0.1),
             train_record(3, 3.0, tokens_per_s=400.0, eff_frac=0.75, mfu=None, data_stall=0.3),
             train_record(4, 4.0, tokens_per_s=400.0, eff_frac=0.75, mfu=0.5, data_stall=0.2, peak_mem_mb=900.0)]
    run = load_run(write_run(tmp_path, "r", train=train))
    m = run_metrics(run, skip=1)
    # totals over the kept records (256 tokens each in 1.28, 0.64, 0.64 s), not means of the per-step rates
    # (which were 333.3 tokens/s, 233.3 effective, MFU 0.4, stall 0.2)
    assert m.tokens_per_s == pytest.approx(3 * 256 / 2.56) and m.measured_s == pytest.approx(2.56)
    assert m.effective_tokens_per_s == pytest.approx((128 + 192 + 192) / 2.56)
    assert m.mfu == pytest.approx((0.3 * 1.28 + 0.5 * 0.64) / 1.92)  # null MFU ignored, warm-up 0.9 skipped
    assert m.data_stall == pytest.approx((0.1 * 1.28 + 0.3 * 0.64 + 0.2 * 0.64) / 2.56)  # Σ wait / Σ step time
    assert m.padding_frac == pytest.approx((0.5 + 0.25 + 0.25) / 3)  # weighted by tokens (equal here)
    assert (m.tokens_per_s_p10, m.tokens_per_s_p90) == pytest.approx((240.0, 400.0))  # the per-step spread
    assert m.peak_mem_mb == 900.0 and m.steps == 4 and m.logged == 4 and m.used == 3
    assert run_metrics(run, skip=0).effective_tokens_per_s == pytest.approx((128 + 128 + 192 + 192) / 5.12)
    short = run_metrics(run, skip=4)  # no more records than skip: all kept (as pretok train's summary does)
    assert short.tokens_per_s == pytest.approx(4 * 256 / 5.12) and short.used == 4


def test_skip_defaults_to_config_log_skip_steps(tmp_path: Path) -> None:
    train = [train_record(i, float(i), tokens_per_s=r) for i, r in enumerate((10.0, 20.0, 30.0, 60.0), 1)]
    plain = load_run(write_run(tmp_path, "plain", train=train))  # no log.skip_steps: pretok train's default 2
    assert run_metrics(plain).tokens_per_s == pytest.approx(2 * 256 / (256 / 30 + 256 / 60))  # 40 (mean: 45)
    cfg = load_run(write_run(tmp_path, "cfg", train=train, config_extra={"log": {"every": 1, "skip_steps": 1}}))
    assert run_metrics(cfg).tokens_per_s == pytest.approx(3 / (1 / 20 + 1 / 30 + 1 / 60)) \
        and run_metrics(cfg, skip=0).used == 4


def test_final_losses_and_ppl(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, "r", train=[train_record(1, 1.0, loss=3.0), train_record(2, 2.0, loss=2.5)],
                             val=[val_record(1, 1.5, 2.9), val_record(2, 2.5, 2.7)]))
    m = run_metrics(run)
    assert (m.final_loss, m.final_val_loss) == (2.5, 2.7)
    assert m.final_val_ppl == pytest.approx(math.exp(2.7))
    assert m.wall_s == 2.5


def test_time_to_target_interpolates_the_crossing(tmp_path: Path) -> None:
    """Linear between the last record above the target and the first at or below it (was: the first record's wall
    time, up to eval.every steps late); the step rounded up; the first record's own when nothing precedes it."""
    val = [val_record(10, 5.0, 3.0), val_record(20, 10.0, 2.4), val_record(30, 15.0, 2.0)]
    train = [train_record(s, s / 2, loss=l) for s, l in ((10, 2.2), (20, 2.1), (30, 1.9))]
    run = load_run(write_run(tmp_path, "r", train=train, val=val))
    wall, step = time_to_target(run, 2.5)   # 3.0 -> 2.4 between 5 and 10 s: 5/6 of the way
    assert wall == pytest.approx(5.0 + 5 * 5 / 6) and step == 19
    assert time_to_target(run, 2.4) == (10.0, 20)  # at the target counts
    assert time_to_target(run, 3.5) == (5.0, 10)   # below it from the first record
    assert time_to_target(run, 1.0) == (None, None)
    assert time_to_target(run, 2.15, source="train") == (pytest.approx(7.5), 15)  # train 2.2 at 5 s, 2.1 at 10 s
    m = run_metrics(run, target_loss=2.0)
    assert (m.time_to_target_s, m.step_to_target) == (15.0, 30)


def test_time_to_target_uses_train_loss_without_val_and_config_target(tmp_path: Path) -> None:
    train = [train_record(s, float(s), loss=l) for s, l in ((1, 3.0), (2, 2.0), (3, 1.0))]
    run = load_run(write_run(tmp_path, "r", train=train, config_extra={"eval": {"target_loss": 2.0}}))
    m = run_metrics(run)
    assert m.target_loss == 2.0 and m.time_to_target_s == 2.0


def test_scaling_efficiency_hand_computed(tmp_path: Path) -> None:
    simple_run(tmp_path, "n1", tokens_per_s=1000.0)
    simple_run(tmp_path, "n1-seed", tokens_per_s=1200.0, seed=7)
    simple_run(tmp_path, "n2", tokens_per_s=1980.0, world_size=2)
    simple_run(tmp_path, "n4", tokens_per_s=3300.0, world_size=4)
    simple_run(tmp_path, "other-path-n1", tokens_per_s=50.0, kind="padding-free")  # alone: no scaling group
    rows = scaling_efficiency(load_runs(tmp_path))
    assert [r["world_size"] for r in rows] == [1, 2, 4]
    assert rows[0]["value"] == pytest.approx(1100.0) and rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["efficiency"] == pytest.approx(1980 / (2 * 1100)) and rows[1]["speedup"] == pytest.approx(1.8)
    assert rows[2]["efficiency"] == pytest.approx(0.75)
    assert rows[0]["runs"] == ["n1", "n1-seed"] and rows[0]["group"].startswith("padded")


def test_path_speedups_and_tokenization_speedups(tmp_path: Path, bench: dict) -> None:
    simple_run(tmp_path, "padded", kind="padded", tokens_per_s=1000.0, eff_frac=0.5)  # eff 500
    simple_run(tmp_path, "pf", kind="padding-free", tokens_per_s=1000.0, eff_frac=1.0)  # eff 1000
    simple_run(tmp_path, "mm", kind="pretok-memmap", tokens_per_s=1100.0, eff_frac=1.0)  # eff 1100
    simple_run(tmp_path, "mm-n2", kind="pretok-memmap", tokens_per_s=2000.0, world_size=2)  # another group
    runs = load_runs(tmp_path)
    rows = path_speedups(runs, baseline="padded")
    by = {(r["group"], r["data_kind"]): r for r in rows}
    g = next(r["group"] for r in rows if r["data_kind"] == "padded")
    assert by[(g, "pretok-memmap")]["speedup"] == pytest.approx(2.2)
    assert by[(g, "padding-free")]["speedup"] == pytest.approx(2.0)
    assert [r["speedup"] for r in rows if r["group"] != g] == [None]  # no padded run at N=2
    iso = isolated_tokenization_speedups(bench)
    assert iso["memmap"]["speedup"] == pytest.approx(44.0) and iso["memmap"]["engine"] == "(d) engine memmap w2"
    assert iso["padded"]["speedup"] == pytest.approx(47.0)
    tok = {r["pretok"]: r for r in tokenization_speedups(bench, runs)}
    assert tok["pretok-memmap"]["isolated"] == pytest.approx(44.0)
    assert tok["pretok-memmap"]["training"] == pytest.approx(1.1)  # the study's point: 44x becomes 1.1x
    assert tok["pretok-padded"]["training"] is None and tok["pretok-padded"]["isolated"] == pytest.approx(47.0)
    assert tokenization_speedups(None, []) == []


def test_failed_and_incomplete_runs_in_summary_table(study_root: Path) -> None:
    rows = summary_table(load_runs(study_root))
    assert len(rows) == 15 and list(rows[0]) == list(SUMMARY_COLUMNS)
    by = {r["run_id"]: r for r in rows}
    assert by["padded-failed"]["status"] == "failed" and "out of memory" in by["padded-failed"]["note"]
    assert by["padded-failed"]["tokens_per_s"] == pytest.approx(900.0)  # partial logs still count
    assert by["padded-running"]["status"] == "incomplete" and "truncated" in by["padded-running"]["note"]
    assert by["padded-n1"]["tokens_per_s"] == pytest.approx(1000.0)  # not summary.json's -1
    text = rows_to_text(rows, ["run_id", "status", "tokens_per_s"])
    assert "padded-failed" in text and "failed" in text and "incomplete" in text


def test_precision_groups_and_auto_target(study_root: Path) -> None:
    runs = load_runs(study_root)
    groups = precision_groups(runs)
    assert len(groups) == 1
    label, ms = groups[0]
    assert sorted(m.run_id for m in ms) == ["pretok-memmap-n1", "pretok-memmap-n1-bf16", "pretok-memmap-n1-seed1"]
    from pretok_lib.analysis.metrics import all_metrics

    target = auto_target_loss(all_metrics(runs))
    # 90% of the way from the lowest first val loss (3.65, the run starting at 3.8) to the highest best one (2.85,
    # the others' end; the old default, reached by them only at their end)
    assert target == pytest.approx(2.85 + 0.1 * (3.65 - 2.85))
    assert all(m.time_to_target_s < m.wall_s for m in all_metrics(runs, target_loss=target) if m.status == "completed")


def _manifest(d: Path, fmt: str, tokens: int, sizes: list[int], compression: str | None = "zstd:3") -> None:
    """A signed manifest (as `pretok tokenize` writes it) listing data files of `sizes` bytes."""
    from pretok_lib.formats.manifest import FORMAT_VERSIONS, write_manifest

    d.mkdir(parents=True)
    names = ["data.bin", "data.idx"] if fmt == "memmap" else [f"part-{i:05d}.parquet" for i in range(len(sizes))]
    for name, size in zip(names, sizes):
        (d / name).write_bytes(b"\0" * size)
    policy = {"bos_id": None, "eos_id": None, "dtype": "uint16"}
    if fmt == "padded":
        policy.update(pad_id=0, seq_len=8, row_length=9)
    write_manifest(d, {"format": fmt, "format_version": FORMAT_VERSIONS[fmt], "compression": compression,
                       "dtype": "uint16", "tokenizer": {"vocab_size": 256, "fingerprint": "x"}, "policy": policy,
                       "counts": {"documents": 3, "tokens": tokens, "padding": 10, "input_bytes": 4 * tokens},
                       "files": [{"path": n, "size": s, "sha256": "x"} for n, s in zip(names, sizes)],
                       "inputs": [], "tool": {}, "created": "", "command": []})


def test_storage_rows_from_manifests(tmp_path: Path, bench: dict) -> None:
    _manifest(tmp_path / "out" / "memmap", "memmap", 1000, [2000, 34], None)
    _manifest(tmp_path / "out" / "padded", "padded", 500, [300, 100])
    (tmp_path / "unfinished").mkdir()
    rows = storage_rows([tmp_path / "out", tmp_path / "unfinished"], bench)
    by = {r["name"]: r for r in rows}
    assert by["memmap"]["bytes_per_token"] == pytest.approx(2.034) and by["memmap"]["disk_bytes"] == 2034
    assert by["padded"]["bytes_per_token"] == pytest.approx(0.8)
    assert by["unfinished"]["error"] and by["unfinished"]["bytes_per_token"] is None
    assert by["datasets.map (HF Arrow)"]["bytes_per_token"] == pytest.approx(5.0)


@pytest.mark.parametrize("value, text", [(math.inf, "inf"), (-math.inf, "-inf"), (1e400, "inf"),
                                         ("np.inf", "inf"), ("np.float32(-inf)", "-inf"), (math.nan, "-"),
                                         ("np.float32(nan)", "-"), (2.5e6, "2.50M"), (-12345.0, "-12.3k")])
def test_format_value_non_finite_numbers(value, text: str) -> None:
    import numpy as np

    from pretok_lib.analysis.metrics import format_value

    v = eval(value, {"np": np, "inf": math.inf, "nan": math.nan}) if isinstance(value, str) else value
    assert format_value(v) == text


@pytest.mark.parametrize("val_loss", [800.0, 1e308])
def test_infinite_perplexity_in_tables(val_loss: float, tmp_path: Path) -> None:
    from pretok_lib.analysis import figures

    val = {"kind": "val", "step": 1, "wall_s": 1.5, "val_loss": val_loss, "val_ppl": None}  # exp overflows
    write_run(tmp_path, "r", train=[train_record(1, 1.0)], val=[val])
    rows = summary_table(load_runs(tmp_path))
    assert rows[0]["final_val_ppl"] == math.inf
    text = rows_to_text(rows, ["run_id", "final_val_ppl"])
    assert text.splitlines()[-1].split() == ["r", "inf"]
    cells = figures.status_table_figure(load_runs(tmp_path)).data[0].cells.values
    assert list(cells[figures.TABLE_COLUMNS.index("final_val_ppl")]) == ["inf"]


def test_trainer_summary_rates_equal_the_analysis(tmp_path: Path) -> None:
    """summary.json (`train.metrics.summarize`) and `run_metrics` agree on the totals: Σ tokens / Σ step time and
    Σ wait / Σ step time after the warm-up (both averaged the per-step rates before)."""
    from pretok_lib.train.metrics import summarize

    train = [train_record(i, float(i), tokens_per_s=r, data_stall=d, mfu=r / 1e4)
             for i, (r, d) in enumerate(((50.0, 0.9), (100.0, 0.1), (400.0, 0.5), (250.0, 0.0)), 1)]
    m = run_metrics(load_run(write_run(tmp_path, "r", train=train)), skip=1)
    s = summarize(train, 1, None, {})
    for key in ("tokens_per_s", "effective_tokens_per_s", "data_stall", "mfu"):
        assert s[key] == pytest.approx(getattr(m, key)), key
    assert s["tokens_per_s"] == pytest.approx(3 * 256 / (256 / 100 + 256 / 400 + 256 / 250))


def test_own_layout_val_loss_and_its_time_to_target(tmp_path: Path) -> None:
    """val_loss_own (eval.own_path: a padded run's own layout) gets its final value and its time to the same
    target (source="val_own"), interpolated like val_loss; runs without it have None."""
    run = load_run(add_own_val(simple_run(tmp_path, "padded", tokens_per_s=1.0), -0.3))
    # val 3.85, 3.35, 2.85 at 2.5, 4.5, 6.5 s; own 3.55, 3.05, 2.55: 3.0 crossed at 5.9 s and 4.7 s
    assert time_to_target(run, 3.0, source="val_own") == (pytest.approx(4.7), 21)   # steps 20 -> 30
    m = run_metrics(run, target_loss=3.0)
    assert m.final_val_loss_own == pytest.approx(2.55) and m.time_to_target_own_s == pytest.approx(4.7)
    assert m.time_to_target_s == pytest.approx(5.9)
    plain = run_metrics(load_run(simple_run(tmp_path, "memmap", kind="pretok-memmap", tokens_per_s=1.0)), None, 3.0)
    assert plain.final_val_loss_own is None and plain.time_to_target_own_s is None
    assert time_to_target(plain.run, 3.0, source="val_own") == (None, None)
    row = {r["run_id"]: r for r in summary_table(load_runs(tmp_path), target_loss=3.0)}["padded"]
    assert row["time_to_target_own_s"] == pytest.approx(4.7) and row["final_val_loss_own"] == pytest.approx(2.55)


_loss = st.floats(0.5, 8.0)
_val_rows = st.lists(st.tuples(_loss, st.floats(0.001, 5.0), st.one_of(st.none(), _loss)), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(rows=_val_rows, target=_loss)
@example(rows=[(2.0, 1.9, None), (1.0, 4.828125, None)], target=1.0)  # the target on a record: its own time, not +1 ulp
def test_summary_time_to_target_is_the_analysis_interpolation(rows, target) -> None:
    """summary.json's time to target (`train.metrics.summarize`) took the first val record at or below the target
    (up to eval.every steps late); it is now the analysis' interpolated crossing, on val_loss and on val_loss_own,
    for any series (one helper: pretok_lib/train/crossing.py)."""
    from pretok_lib.train.metrics import summarize

    val, wall = [], 0.0
    for k, (loss, dt, own) in enumerate(rows, 1):
        wall = round(wall + dt, 4)                  # the trainer's wall_s is rounded so
        val.append({**val_record(10 * k, wall, loss), **({"val_loss_own": own} if own is not None else {})})
    run = Run("r", Path("r"), "completed", {}, {}, Records([]), Records(val))
    s = summarize(val, 0, target, {})
    assert s["time_to_target_s"] == time_to_target(run, target)[0]
    has_own = any(own is not None for *_, own in rows)
    assert s["time_to_target_own_s"] == (time_to_target(run, target, "val_own")[0] if has_own else None)
    m = run_metrics(run, target_loss=target)
    assert (m.time_to_target_s, m.time_to_target_own_s) == (s["time_to_target_s"], s["time_to_target_own_s"])
    if has_own and val[-1].get("val_loss_own") is not None:
        assert s["final_val_loss_own"] == m.final_val_loss_own
    first = next((r for r in val if r["val_loss"] <= target), None)
    if first is not None and first is not val[0]:   # a crossing after a record above: before the record
        assert s["time_to_target_s"] <= first["wall_s"]
