"""figures.py: every builder on the synthetic study, on empty input and on only failed/incomplete runs."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
import pytest

from pretok_lib.analysis import figures as F
from pretok_lib.analysis.runs import load_runs

from .helpers import add_own_val, simple_run

BUILDERS = {
    "throughput": lambda runs, bench: F.throughput_figure(runs),
    "mfu": lambda runs, bench: F.mfu_figure(runs),
    "data_stall": lambda runs, bench: F.data_stall_figure(runs),
    "padding": lambda runs, bench: F.padding_figure(runs),
    "loss_curves": lambda runs, bench: F.loss_curves_figure(runs),
    "val_loss_by_batch": lambda runs, bench: F.val_loss_by_batch_figure(runs),
    "scaling": lambda runs, bench: F.scaling_figure(runs),
    "time_to_target": lambda runs, bench: F.time_to_target_figure(runs),
    "tokenization_speedup": lambda runs, bench: F.tokenization_speedup_figure(bench, runs),
    "precision": lambda runs, bench: F.precision_figure(runs),
    "status_table": lambda runs, bench: F.status_table_figure(runs),
}


def _annotations(fig: go.Figure) -> str:
    return " ".join(a.text for a in fig.layout.annotations)


def _is_empty(fig: go.Figure) -> bool:
    return not fig.data and "no " in _annotations(fig)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builder_on_study(name: str, study_root: Path, bench: dict) -> None:
    fig = BUILDERS[name](load_runs(study_root), bench)
    assert isinstance(fig, go.Figure) and fig.data and not _is_empty(fig)
    json.loads(fig.to_json())  # serialisable, validated by plotly


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builder_on_no_runs(name: str) -> None:
    fig = BUILDERS[name]([], None)
    assert _is_empty(fig), _annotations(fig)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builder_on_failed_and_incomplete_runs_only(name: str, study_root: Path) -> None:
    runs = [r for r in load_runs(study_root) if r.status != "completed"]
    fig = BUILDERS[name](runs, None)  # may be empty for comparisons, must not raise
    json.loads(fig.to_json())


def test_throughput_bars_and_speedup_labels(study_root: Path) -> None:
    fig = F.throughput_figure(load_runs(study_root))
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name for b in bars] == ["tokens/s", "effective tokens/s"]
    cats = list(bars[0].x)
    # several world sizes, global batches and precisions in the study: they become part of the category
    assert cats[0].startswith("padded") and any(c.startswith("pretok-memmap") for c in cats)
    eff = dict(zip(bars[1].x, bars[1].text, strict=True))
    assert eff["padded · N=1 · B=4 · fp32"] == "x1"
    assert eff["pretok-memmap · N=1 · B=4 · fp32"] == "x3.3"  # mean(1900, 2100) x .99 / (1000 x .6)
    points = [t for t in fig.data if t.type == "scatter"]
    assert "padded-failed (failed)" in points[0].hovertext  # a failed run's partial logs are shown
    assert "x" in points[0].marker.symbol


def test_status_table_shows_failed_and_incomplete(study_root: Path) -> None:
    fig = F.status_table_figure(load_runs(study_root))
    cells = fig.data[0].cells.values
    assert "failed" in cells[1] and "incomplete" in cells[1]
    assert "1 failed" in fig.layout.title.text and "1 incomplete" in fig.layout.title.text
    assert "loss <= 2.93" in fig.layout.title.text  # the auto target: every completed run reached it


def test_scaling_annotates_efficiency(study_root: Path) -> None:
    fig = F.scaling_figure(load_runs(study_root))
    labelled = [t for t in fig.data if t.mode == "lines+markers+text"]
    assert [t.name for t in labelled][:2] == ["padded, L=64, fp32", "padding-free, L=64, fp32"]
    text = {t.name.split(",")[0]: list(t.text) for t in labelled}
    assert text["padded"] == ["", "90%"]  # the base size is not labelled
    assert text["pretok-memmap"] == ["", "86%"]  # 3420 / (2 x mean(1900, 2100))


def test_time_to_target_labels_speedup(tmp_path: Path) -> None:
    simple_run(tmp_path, "a", kind="padded", tokens_per_s=1.0)
    simple_run(tmp_path, "b", kind="pretok-memmap", tokens_per_s=1.0, loss0=3.5)  # reaches 3.0 earlier
    fig = F.time_to_target_figure(load_runs(tmp_path), target_loss=3.0)
    bar = fig.data[0]
    assert list(bar.x) == ["padded", "pretok-memmap"]
    # val 3.35 -> 2.85 between 4.5 and 6.5 s, 3.35 -> 2.85 between 2.5 and 4.5 s: crossings at 5.9 and 3.9 s
    assert list(bar.y) == pytest.approx([5.9, 3.9]) and bar.text[1] == "3.9 s · x1.51"
    nobody = F.time_to_target_figure(load_runs(tmp_path), target_loss=0.1)
    assert _is_empty(nobody)


def test_time_to_target_shows_the_own_layout_of_padded_runs(tmp_path: Path) -> None:
    """A padded run validated on its own layout too (val_loss_own) gets a second, hatched bar "own layout" beside
    its packed-window bar; a packed run has none; the caption says which layout each bar is."""
    from pretok_lib.analysis.captions import caption_text

    add_own_val(simple_run(tmp_path, "a", kind="padded", tokens_per_s=1.0), -0.3)
    add_own_val(simple_run(tmp_path, "c", kind="pretok-padded", tokens_per_s=1.0, loss0=3.8), 2.0)  # never reached
    simple_run(tmp_path, "b", kind="pretok-memmap", tokens_per_s=1.0, loss0=3.5)
    fig = F.time_to_target_figure(load_runs(tmp_path), target_loss=3.0)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name for b in bars] == ["val loss on eval.path", f"{F.OWN_LAYOUT} (eval.own_path)"]
    assert list(bars[0].x) == list(bars[1].x) == ["padded", "pretok-padded", "pretok-memmap"]
    assert list(bars[0].y) == pytest.approx([5.9, 5.1, 3.9])
    assert bars[1].y[0] == pytest.approx(4.7) and list(bars[1].y[1:]) == [None, None]  # 3.55 -> 3.05 -> 2.55
    assert bars[1].marker.pattern.shape == "/" and not bars[0].marker.pattern.shape
    assert f"not reached: {F.OWN_LAYOUT}: c" in fig.layout.annotations[0].text
    cap = caption_text("time_to_target")
    assert "packed memmap windows" in cap and "'own layout' bars on padded rows" in cap
    table = F.status_table_figure(load_runs(tmp_path), target_loss=3.0).data[0].cells.values
    assert list(table[F.TABLE_COLUMNS.index("time_to_target_own_s")]) == ["4.7", "-", "-"]


def test_storage_figure(tmp_path: Path, bench: dict) -> None:
    from .test_metrics import _manifest

    _manifest(tmp_path / "memmap", "memmap", 1000, [2000, 0])  # data.bin, data.idx
    fig = F.storage_figure([tmp_path])
    assert list(fig.data[0].y) == [2.0]
    assert _is_empty(F.storage_figure([]))


def test_all_figures(study_root: Path, bench: dict) -> None:
    figs = F.all_figures(load_runs(study_root), bench=bench)
    assert len(figs) == 12 and all(isinstance(f, go.Figure) for f in figs.values())
    assert _is_empty(figs["storage"]) is False  # the benchmark's datasets.map output is a storage row
