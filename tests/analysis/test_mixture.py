"""analysis/mixture.py: the realised mixture of a run against its weights (rows and figure), from the files."""

from __future__ import annotations

from pathlib import Path

from pretok_lib.analysis.mixture import mixture_figure, mixture_rows, mixture_series
from pretok_lib.analysis.runs import load_runs
from pretok_lib.data.blend import Blend

from .helpers import simple_run, train_record, write_run

SEQ, GLOBAL = 64, 8


def _mixture_run(root: Path, weights=(0.25, 0.75), steps: int = 10) -> Path:
    """A run whose per-dataset counters are what `pretok train` logs for this blend (samples × seq_len)."""
    blend, train = Blend(list(weights)), []
    for s in range(1, steps + 1):
        r = train_record(s, float(s), tokens=GLOBAL * SEQ)
        r["samples"] = s * GLOBAL
        r["cum_source_tokens"] = [c * SEQ for c in blend.counts(s * GLOBAL)]
        train.append(r)
    mixture = [{"path": "/data/code", "weight": weights[0]}, {"path": "/data/web", "weight": weights[1]}]
    return write_run(root, "mix", kind="pretok-memmap", seq_len=SEQ,
                     config_extra={"data": {"kind": "pretok-memmap", "path": "", "seq_len": SEQ, "micro_batch": 8,
                                            "mixture": mixture, "mixture_exhausted": "epoch"}}, train=train)


def test_rows_and_series_show_the_realised_mixture(tmp_path):
    _mixture_run(tmp_path, (1, 3), steps=10)
    simple_run(tmp_path, "single", tokens_per_s=1000.0)            # no mixture: left out
    runs = {r.run_id: r for r in load_runs(tmp_path)}
    rows = mixture_rows(runs.values())
    assert [(r["dataset"], r["weight"], r["tokens"]) for r in rows] == [("/data/code", 0.25, 20 * SEQ),
                                                                       ("/data/web", 0.75, 60 * SEQ)]
    assert all(abs(r["difference"]) < 1e-12 for r in rows)          # 80 samples: exactly 20 / 60
    steps, fracs = mixture_series(runs["mix"])
    assert steps == list(range(1, 11))
    assert all(abs(f[0] - 0.25) <= 1 / (s * GLOBAL) for s, f in zip(steps, fracs))  # within a sample of the weight


def test_figure_plots_each_dataset_and_its_weight(tmp_path):
    _mixture_run(tmp_path)
    fig = mixture_figure(load_runs(tmp_path))
    assert len(fig.data) == 4 and [t.y[0] for t in fig.data[1::2]] == [0.25, 0.75]
    empty = mixture_figure([])
    assert not empty.data and "no runs" in empty.layout.annotations[0].text
