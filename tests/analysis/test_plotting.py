"""What every figure shares (`analysis/plotting.py`): a color per data path, the empty figure, mean ± std bars."""

from __future__ import annotations

import pytest

from pretok_lib.analysis.plotting import PALETTE, _mean_std, _path_bars, empty_figure, path_color
from pretok_lib.analysis.runs import load_runs
from pretok_lib.datapaths import KINDS

from .helpers import simple_run


def test_every_data_path_has_its_own_fixed_color():
    colors = [path_color(k, i) for i, k in enumerate(KINDS)]
    assert len(set(colors)) == len(KINDS)
    assert [path_color(k, 7) for k in KINDS] == colors  # fixed: not by position
    assert path_color("other", 1) == PALETTE[1] and path_color(None, 0) == PALETTE[0]


def test_empty_figure_says_why():
    fig = empty_figure("Title", "no runs with X")
    assert fig.layout.title.text == "Title" and fig.layout.annotations[0].text == "no runs with X"
    assert not fig.data


def test_mean_std_and_path_bars(tmp_path):
    assert _mean_std([]) == (None, None) and _mean_std([2.0]) == (2.0, None)
    assert _mean_std([1.0, 3.0]) == pytest.approx((2.0, 2 ** 0.5))
    simple_run(tmp_path, "a", tokens_per_s=1000, kind="padded")
    simple_run(tmp_path, "b", tokens_per_s=3000, kind="pretok-memmap")
    simple_run(tmp_path, "c", tokens_per_s=5000, kind="pretok-memmap", seed=1)
    fig = _path_bars(load_runs(tmp_path), [("tokens_per_s", "tokens/s")], "T", "tokens/s", "tokens/s", 0,
                     ratio_to="padded")
    bars = next(t for t in fig.data if t.type == "bar")
    assert list(bars.x) == ["padded", "pretok-memmap"]  # canonical data-path order
    assert list(bars.y) == pytest.approx([1000, 4000], rel=0.01)  # the mean of the repeats
    assert list(bars.text) == ["x1", "x4"]
    assert sum(len(t.y) for t in fig.data if t.type == "scatter") == 3  # one marker per run
