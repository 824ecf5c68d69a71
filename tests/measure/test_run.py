"""pretok_lib.measure.Run: a measured loop writes the trainer's run directory contract (docs/RUNS.md), and the
analysis reads the same numbers from it. Time is a fake clock: every duration is exact."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.analysis import load_runs, run_metrics
from pretok_lib.errors import PretokError
from pretok_lib.measure import Run
from pretok_lib.measure import run as run_mod


class Clock:
    """A perf_counter the test advances."""

    def __init__(self) -> None:
        self.t = 100.0

    def perf_counter(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(run_mod, "time", c)
    return c


def _loader(clock: Clock, waits: list[float], rows: int = 2, seq: int = 8, masked: int = 0):
    for w in waits:
        clock.t += w
        x = np.ones((rows, seq), dtype=np.int64)
        y = x.copy()
        y[:, :masked] = -1
        yield x, y


steps_st = st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.01, 2.0)), min_size=1, max_size=12)


@settings(max_examples=30, deadline=None)
@given(steps=steps_st, skip=st.integers(0, 3), masked=st.integers(0, 8), world=st.integers(1, 4))
def test_records_and_analysis_are_the_exact_timings(steps, skip, masked, world):
    clock = Clock()
    run_mod.time, saved = clock, run_mod.time
    try:
        with tempfile.TemporaryDirectory() as tmp:
            waits = [w for w, _ in steps]
            with Run(Path(tmp) / "r", {"train": {"lr": 0.1}}, seq_len=8, skip_steps=skip, world_size=world,
                     rank=0) as m:
                for (w, c), b in zip(steps, m.batches(_loader(clock, waits, masked=masked))):
                    clock.t += c
                    m.step(loss=1.0)
            recs = [json.loads(x) for x in (Path(tmp) / "r" / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in recs] == list(range(1, len(steps) + 1))
            for r, (w, c) in zip(recs, steps):
                assert r["data_wait_s"] == pytest.approx(w, abs=1e-9)
                assert r["step_time_s"] == pytest.approx(w + c, abs=1e-9)
                assert r["tokens"] == 16 * world and r["effective_tokens"] == 2 * (8 - masked) * world
                assert r["masked_frac"] == pytest.approx(masked / 8)
                assert r["tokens_per_s_per_device"] == pytest.approx(16 / (w + c))
            (run,) = load_runs(tmp)
            assert run.status == "completed" and run.settings["seq_len"] == 8 and run.settings["world_size"] == world
            kept = steps[skip:] if len(steps) > skip else steps
            met = run_metrics(run)
            assert met.data_stall == pytest.approx(sum(w for w, _ in kept) / sum(w + c for w, c in kept))
            assert met.tokens_per_s == pytest.approx(16 * world * len(kept) / sum(w + c for w, c in kept))
            summary = json.loads((Path(tmp) / "r" / "summary.json").read_text())
            assert summary["data_stall"] == pytest.approx(met.data_stall)
            assert summary["global_batch"] == 2 * world and summary["steps"] == len(steps)
    finally:
        run_mod.time = saved


def test_grad_accumulation_and_paused_time(clock, tmp_path):
    """Micro-batches of one step add up; time inside paused() (evaluation) is in no step."""
    with Run(tmp_path / "r", seq_len=8) as m:
        it = m.batches(_loader(clock, [0.5] * 4))
        for _ in range(2):
            next(it), next(it)
            clock.t += 1.0
            with m.paused():
                clock.t += 7.0
            m.step(loss=2.0)
            with m.paused():
                clock.t += 3.0
                m.eval(1.5)
    recs = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["tokens"] for r in train] == [32, 32] and [r["samples"] for r in train] == [4, 8]
    assert [r["step_time_s"] for r in train] == [2.0, 2.0] and [r["data_wait_s"] for r in train] == [1.0, 1.0]
    assert [r["val_loss"] for r in recs if r["kind"] == "val"] == [1.5, 1.5]


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_an_exception_marks_the_run_and_writes_no_summary(clock, tmp_path, error):
    with pytest.raises(type(error)):
        with Run(tmp_path / "r") as m:
            for _ in m.batches(_loader(clock, [0.1] * 3)):
                m.step(loss=1.0)
                raise error
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["status"] == ("failed" if isinstance(error, RuntimeError) else "interrupted")
    assert not (tmp_path / "r" / "summary.json").exists()
    (run,) = load_runs(tmp_path)
    assert run.status == ("failed" if isinstance(error, RuntimeError) else "incomplete") and len(run.train) == 1


def test_a_run_directory_is_not_overwritten_unless_asked(clock, tmp_path):
    with Run(tmp_path / "r") as m:
        for _ in m.batches(_loader(clock, [0.1])):
            m.step()
    with pytest.raises(PretokError, match=r"r: holds a run already \(status completed\)"):
        Run(tmp_path / "r").start()
    with Run(tmp_path / "r", overwrite=True) as m:
        for _ in m.batches(_loader(clock, [0.1] * 2)):
            m.step()
    assert run_metrics(load_runs(tmp_path)[0]).steps == 2


def test_other_ranks_write_nothing_and_uncountable_batches_need_tokens(clock, tmp_path):
    with Run(tmp_path / "r1", rank=1, world_size=2) as m:
        for _ in m.batches(_loader(clock, [0.1])):
            assert m.step() is None
    assert not (tmp_path / "r1").exists()
    with Run(tmp_path / "r0") as m:
        for _ in m.batches([object()]):
            with pytest.raises(PretokError, match="pass tokens="):
                m.step()
        for _ in m.batches([object()]):
            assert m.step(tokens=10, effective_tokens=7)["effective_tokens"] == 7
