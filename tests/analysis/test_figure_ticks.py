"""Every figure rendered (kaleido, real Chromium) and its tick labels read back from the SVG (issue 36, item 9):
no axis repeats a label (a data stall of 0.1-0.4% read "0%" at every tick), a log axis labels each tick with its
value (0.5 read "5", 2000 read "2"), a step axis has integer ticks only (3.5 steps), shares have enough
decimals. Figures get tiny, large and short-run values, where plotly's defaults broke."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import plotly.io as pio
import pytest

from pretok_lib.analysis import figures as F
from pretok_lib.analysis import load_runs
from pretok_lib.analysis.plotting import log_ticks, number_label, percent_ticks
from pretok_lib.analysis.report import _kaleido_env
from pretok_lib.study import plots

from .helpers import simple_run, train_record, write_run

TICK = re.compile(r'<g class="([xy]\d*)tick"><text[^>]*>([^<]*)</text>')
PATHS = ("padded", "padding-free", "pretok-padded", "pretok-memmap")


def _labels(svg: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for axis, text in TICK.findall(svg):
        out[axis].append(text)
    return out


def _value(label: str) -> float:
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}
    label = label.replace("\u2212", "-").replace(",", "")
    if label.endswith("%"):
        return float(label[:-1]) / 100
    return float(label[:-1]) * scale[label[-1]] if label[-1] in scale else float(label)


def _figures(root: Path) -> dict:
    for i, kind in enumerate(PATHS):   # data stall 0.1-0.4%: plotly's ".0%" labelled every tick "0%"
        simple_run(root / "study", f"{kind}-n1", kind=kind, tokens_per_s=1000.0 * (i + 1), data_stall=0.001 * (i + 1))
    short = [train_record(s, float(s), loss=4.0 - 0.2 * s) for s in (1, 2, 3, 4)]   # 4 steps: plotly ticks 3.5
    write_run(root / "short", "short", train=short)
    runs, (short_run,) = load_runs(root / "study"), load_runs(root / "short")
    rows = [{"accelerator": "H100", "path": p, "workers": w, "target_workers": w, "supply": s,
             "consumption_low": 1500.0, "consumption_high": 2000.0, "stall_low": st, "stall_high": st * 1.2,
             "headroom_low": s / 2000.0, "main_per_slot": 0.0}
            for p, w, s, st in (("padded", 0, 1000.0, 0.6), ("pretok-memmap", 2, 4e6, 0.0001))]
    tok = {"methods": {"(a) loop": {"mb_per_s": 0.5, "tokens_per_s": 1e5},
                       "(d) engine memmap w2": {"mb_per_s": 2000.0, "tokens_per_s": 4e8}}}
    loaders = {"loaders": {"padded w0": {"kind": "padded", "workers": 0, "effective_tokens_per_s": 0.5e3},
                           "pretok-memmap w0": {"kind": "pretok-memmap", "workers": 0,
                                                "effective_tokens_per_s": 2e6}}}
    return {"data_stall": F.data_stall_figure(runs), "padding": F.padding_figure(runs), "mfu": F.mfu_figure(runs),
            "stall_prediction": F.stall_prediction_figure(rows), "loss_curves": F.loss_curves_figure([short_run]),
            "val_loss_by_batch": F.val_loss_by_batch_figure(runs), "run_curves": plots.run_curves_figure(short_run),
            "tokenize_throughput": plots.tokenize_bench_figure(tok),
            "loader_throughput": plots.loader_bench_figure(loaders)}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, dict[str, list[str]]]:
    root = tmp_path_factory.mktemp("ticks")
    figs = _figures(root)
    _kaleido_env()
    paths = [root / f"{n}.svg" for n in figs]
    pio.write_images(list(figs.values()), paths, format="svg", width=1100, height=520)
    return {n: _labels(p.read_text()) for n, p in zip(figs, paths)}


def test_every_axis_labels_each_tick_apart(rendered):
    for name, axes in rendered.items():
        for axis, labels in axes.items():
            if axis.startswith("y") or all(re.fullmatch(r"[\d.,%kMG\u2212-]+", x) for x in labels):
                assert len(set(labels)) == len(labels), f"{name} {axis}: repeated tick labels {labels}"


def test_share_axes_have_the_decimals_they_need(rendered):
    stall = rendered["data_stall"]["y"]
    assert all(x.endswith("%") for x in stall) and max(_value(x) for x in stall) >= 0.004, stall
    assert rendered["stall_prediction"]["y"][0].endswith("%")


def test_log_axes_label_ticks_with_their_values(rendered):
    head = [_value(x) for x in rendered["stall_prediction"]["y2"]]
    assert head == sorted(head) and 0.5 in head and 2000 in head, head
    for name, axis in (("tokenize_throughput", "x"), ("loader_throughput", "y")):
        vals = [_value(x) for x in rendered[name][axis]]
        assert vals == sorted(vals) and len(set(vals)) == len(vals), (name, rendered[name][axis])


def test_step_axes_have_integer_ticks(rendered):
    for name, axes in (("loss_curves", ("x",)), ("run_curves", ("x", "x2", "x3", "x4"))):
        for axis in axes:
            labels = rendered[name][axis]
            assert labels and all(float(_value(x)).is_integer() for x in labels), (name, axis, labels)


@pytest.mark.parametrize("top,fmt", [(0.004, ".1%"), (0.0004, ".2%"), (0.5, ".0%"), (0.03, ".1%"), (1.2, ".0%")])
def test_percent_ticks_step_and_decimals_agree(top, fmt):
    t = percent_ticks([0.0, top])
    assert t["tickformat"] == fmt and 3 <= top / t["dtick"] <= 8
    labels = [format(k * t["dtick"], fmt[:-1] + "%") for k in range(int(top / t["dtick"]) + 1)]
    assert len(set(labels)) == len(labels)


def test_log_ticks_span_the_values_with_their_own_labels():
    t = log_ticks([0.5, 2000.0])
    assert t["tickvals"][0] <= 0.5 and t["tickvals"][-1] >= 2000
    assert [number_label(v) for v in (0.5, 2000.0, 1.5e6)] == ["0.5", "2k", "1.5M"]
    assert dict(zip(t["tickvals"], t["ticktext"]))[0.5] == "0.5"


def test_hf_arrow_and_the_original_study_are_explained(bench, tmp_path):
    from pretok_lib.analysis import storage_rows
    from pretok_lib.study.findings import Finding, findings_html

    fig = F.storage_figure(storage_rows([], bench))
    assert any("hf-arrow: not a pretok format" in a.text and "datasets.map" in a.text for a in fig.layout.annotations)
    html = findings_html([Finding("k", "Q", "v", "storage")])
    assert 'class="original-note"' in html and "The original study: the study" in html
