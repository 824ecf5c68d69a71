"""Bars group repeats, not configs: runs equal apart from the seed share a bar (mean of the completed ones), runs
of different configs get bars of their own, and ratio labels pair only runs equal except for the data path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.analysis import figures as F
from pretok_lib.analysis.metrics import path_speedups
from pretok_lib.analysis.runs import load_runs

from .helpers import simple_run

# (config variant as `simple_run` keywords, a text its bars' labels must show)
VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    "lr": ({"config_extra": {"train": {"steps": 40, "precision": "fp32", "lr": 2e-3}}}, "train.lr=0.002"),
    "new section": ({"config_extra": {"optim": {"weight_decay": 0.1}}}, "optim.weight_decay=0.1"),
    "model": ({"config_extra": {"model": {"n_layer": 4, "n_embd": 64}}}, "model.n_layer=4"),
    "precision": ({"precision": "bf16"}, "bf16"),
}
# run id: (data path, variant?, seed, status, tokens/s, loss0). Times to val loss <= 3.0 (val every 2 s from 2.5 s):
# loss0 4.0 -> 6.5 s, 3.5 -> 4.5 s, 3.0 -> 2.5 s, 2.5 -> 2.5 s.
RUNS = {
    "pa": ("padded", False, 0, "completed", 1000.0, 4.0),
    "pa-s1": ("padded", False, 1, "completed", 1200.0, 4.0),
    "pa-failed": ("padded", False, 2, "failed", 100.0, 2.5),       # partial numbers: a marker, not in the mean
    "pb": ("padded", True, 0, "completed", 3000.0, 3.5),
    "ma": ("pretok-memmap", False, 0, "completed", 2000.0, 3.5),
    "mb": ("pretok-memmap", True, 0, "completed", 9000.0, 3.0),
    "mb-s1": ("pretok-memmap", True, 1, "running", 1.0, 4.0),      # incomplete: a marker, not in the mean
}
GROUPS = {"pa": ("pa", "pa-s1", "pa-failed"), "pb": ("pb",), "ma": ("ma",), "mb": ("mb", "mb-s1")}
TOKENS_PER_S = {"pa": 1100.0, "pb": 3000.0, "ma": 2000.0, "mb": 9000.0}   # completed runs only
# val losses loss0 - 0.15, - 0.65, - 1.15 at 2.5, 4.5, 6.5 s: loss0 = 4 crosses 3.0 at 4.5 + 0.35/0.5 x 2 = 5.9 s
# (interpolated; was the next evaluation's 6.5), loss0 = 3.5 at 2.5 + 1.4 = 3.9 s, loss0 = 3 at its first (2.5 s)
TIME_TO_TARGET = {"pa": "5.9 s · x1", "pb": "3.9 s · x1", "ma": "3.9 s · x1.51", "mb": "2.5 s · x1.56"}
FIGURES = {"tokens_per_s": F.throughput_figure, "mfu": F.mfu_figure, "data_stall": F.data_stall_figure,
           "padding_frac": F.padding_figure}


def _write(root: Path, variant: dict[str, Any]) -> list:
    for rid, (kind, varied, seed, status, tps, loss0) in RUNS.items():
        simple_run(root, rid, kind=kind, tokens_per_s=tps, loss0=loss0, seed=seed, status=status,
                   mfu=tps / 1e4, data_stall=tps / 1e4, eff_frac=0.5, **(variant if varied else {}))
    return load_runs(root)


def _bars(fig: go.Figure, trace: int = 0) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """(bar label -> height, bar label -> text, run id -> its marker's bar label) of the trace-th bar series."""
    bar = [t for t in fig.data if t.type == "bar"][trace]
    pts = [t for t in fig.data if t.type == "scatter"][trace]
    where = {h.split(" (")[0]: x for h, x in zip(pts.hovertext, pts.x, strict=True)}
    return dict(zip(bar.x, bar.y, strict=True)), dict(zip(bar.x, bar.text or [""] * len(bar.x), strict=True)), where


def _labels(where: dict[str, str], variant_text: str) -> dict[str, str]:
    """The bar label of each group, checking that repeats share one and different configs do not."""
    labels = {g: {where[r] for r in rids} for g, rids in GROUPS.items()}
    assert all(len(v) == 1 for v in labels.values()), labels
    out = {g: v.pop() for g, v in labels.items()}
    assert len(set(out.values())) == len(GROUPS), out
    assert variant_text in out["pb"] and variant_text in out["mb"], out
    assert out["pa"].startswith("padded") and out["mb"].startswith("pretok-memmap")
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("key", sorted(FIGURES))
def test_path_bars_group_repeats_not_configs(variant: str, key: str, tmp_path: Path) -> None:
    kw, text = VARIANTS[variant]
    fig = FIGURES[key](_write(tmp_path, kw))
    height, _, where = _bars(fig)
    label = _labels(where, text)
    per_run = {"tokens_per_s": 1.0, "mfu": 1e-4, "data_stall": 1e-4}
    for g, lab in label.items():
        want = TOKENS_PER_S[g] * per_run[key] if key in per_run else 0.5
        assert height[lab] == pytest.approx(want), (g, lab)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_speedup_labels_pair_runs_equal_but_for_the_data_path(variant: str, tmp_path: Path) -> None:
    kw, text = VARIANTS[variant]
    runs = _write(tmp_path, kw)
    _, texts, where = _bars(F.throughput_figure(runs), trace=1)   # effective tokens/s, labelled with ratios
    label = _labels(where, text)
    assert {g: texts[lab] for g, lab in label.items()} == {"pa": "x1", "pb": "x1", "ma": "x1.82", "mb": "x3"}
    # the same numbers as the findings' `path_speedups` over the completed runs
    for row in path_speedups([r for r in runs if r.status == "completed"]):
        assert texts[where[row["runs"][0]]] == f"x{row['speedup']:.3g}", row


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_time_to_target_groups_repeats_not_configs(variant: str, tmp_path: Path) -> None:
    kw, text = VARIANTS[variant]
    fig = F.time_to_target_figure(_write(tmp_path, kw), target_loss=3.0)
    height, texts, where = _bars(fig)
    label = _labels(where, text)
    assert {g: texts[lab] for g, lab in label.items()} == TIME_TO_TARGET
    assert height[label["pa"]] == pytest.approx(5.9) and height[label["mb"]] == 2.5   # failed / incomplete runs: markers only


def test_configs_told_apart_only_by_data_settings_get_own_bars(tmp_path: Path) -> None:
    data = {"kind": "padded", "path": "/data/padded", "seq_len": 64, "micro_batch": 4}
    simple_run(tmp_path, "w2", kind="padded", tokens_per_s=1000.0, config_extra={"data": {**data, "num_workers": 2}})
    simple_run(tmp_path, "w8", kind="padded", tokens_per_s=3000.0, config_extra={"data": {**data, "num_workers": 8}})
    height, _, where = _bars(F.throughput_figure(load_runs(tmp_path)))
    assert where["w2"] != where["w8"] and "data.num_workers=8" in where["w8"]
    assert sorted(np.round(list(height.values()))) == [1000, 3000]


@pytest.mark.parametrize("status", ["failed", "running"])
def test_scaling_means_completed_runs_only(status: str, tmp_path: Path) -> None:
    simple_run(tmp_path, "n1", kind="padded", tokens_per_s=1000.0)
    simple_run(tmp_path, "n2", kind="padded", tokens_per_s=1800.0, world_size=2)
    simple_run(tmp_path, "n2-bad", kind="padded", tokens_per_s=10.0, world_size=2, seed=1, status=status)
    (line,) = [t for t in F.scaling_figure(load_runs(tmp_path)).data if t.mode == "lines+markers+text"]
    assert list(line.y) == [1000.0, 1800.0] and list(line.text) == ["", "90%"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(["completed", "failed", "running", "interrupted"]), min_size=len(RUNS),
                max_size=len(RUNS)))
def test_comparisons_mean_completed_runs_only_whoever_calls_them(tmp_path_factory, statuses: list[str]) -> None:
    """path_speedups, scaling_efficiency and tokenization_speedups give the numbers of the completed runs alone,
    whatever the other runs' statuses: notebook 05's findings table and the tokenization figure passed every run
    and showed a failed padded run's partial tokens/s as the baseline ("padded 630 x1")."""
    from pretok_lib.analysis.metrics import scaling_efficiency, tokenization_speedups
    from pretok_lib.study.results import findings
    from pretok_lib.study.steps import StudyPaths

    root = tmp_path_factory.mktemp("runs")
    for (rid, (kind, _, seed, _, tps, loss0)), status in zip(RUNS.items(), statuses, strict=True):
        simple_run(root, rid, kind=kind, tokens_per_s=tps, loss0=loss0, seed=seed, status=status, eff_frac=0.5)
        simple_run(root, f"{rid}-w2", kind=kind, tokens_per_s=tps * 1.5, loss0=loss0, seed=seed, status=status,
                   eff_frac=0.5, world_size=2)
    simple_run(root, "pf", kind="padding-free", tokens_per_s=5000.0, eff_frac=0.5, status=statuses[0])
    runs = load_runs(root)
    done = [r for r in runs if r.status == "completed"]
    bench = {"methods": {"(a) per-doc loop": {"mb_per_s": 1.0}, "(d) engine memmap w1": {"mb_per_s": 50.0},
                         "(d) engine padded w1": {"mb_per_s": 40.0}}}
    assert path_speedups(runs) == path_speedups(done)
    assert scaling_efficiency(runs) == scaling_efficiency(done)
    assert tokenization_speedups(bench, runs) == tokenization_speedups(bench, done)
    table = [line for line in findings(runs, StudyPaths(tmp_path_factory.mktemp("study"))).splitlines()
             if line.startswith("| ") and not line.startswith("| runs")]
    assert table == [line for line in findings(done, StudyPaths(tmp_path_factory.mktemp("study"))).splitlines()
                     if line.startswith("| ") and not line.startswith("| runs")]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_groups_of_other_configs_never_share_a_label(variant: str, tmp_path: Path) -> None:
    """Two sweeps of the data paths (or world sizes) that differ in a setting the group label did not show
    (train.lr, a new section, the model): path_speedups and scaling_efficiency gave both groups one label, and
    every consumer pairing rows by label (tokenization_speedups, the findings' packing and stall, the scaling
    figure's lines) paired a run of one config with a run of the other (lr 1e-3 padded / lr 2e-3 memmap)."""
    from pretok_lib.analysis.metrics import precision_groups, scaling_efficiency, tokenization_speedups
    from pretok_lib.study.findings import packing_finding

    kw, _ = VARIANTS[variant]
    rates = {"padded": 1000.0, "pretok-padded": 1500.0, "padding-free": 2000.0, "pretok-memmap": 4000.0}
    for i, (var, scale) in enumerate(((False, 1.0), (True, 3.0))):
        for kind, tps in rates.items():
            for ws in (1, 2):
                simple_run(tmp_path, f"{kind}-{i}-w{ws}", kind=kind, tokens_per_s=tps * scale * (1.5 if ws == 2 else 1),
                           world_size=ws, eff_frac=0.5, **(kw if var else {}))
    runs = load_runs(tmp_path)
    sp = path_speedups(runs)
    labels = {r["group"]: tuple(sorted(r["runs"])) for r in sp if r["data_kind"] == "padded"}
    assert len(labels) == 4                         # 2 configs x 2 world sizes, each its own label
    assert {round(r["speedup"], 6) for r in sp} == {1.0, 1.5, 2.0, 4.0}   # within a config only
    scaling = scaling_efficiency(runs)
    assert len({r["group"] for r in scaling}) == 8 and {round(r["efficiency"], 6) for r in scaling} == {1.0, 0.75}
    lines = [t for t in F.scaling_figure(runs).data if t.mode == "lines+markers+text"]
    assert len({t.name for t in lines}) == 8 and all(len(t.x) == 2 for t in lines)   # one line per config
    bench = {"methods": {"(a) loop": {"mb_per_s": 1.0}, "(d) engine memmap w1": {"mb_per_s": 9.0},
                         "(d) engine padded w1": {"mb_per_s": 9.0}}}
    assert {round(r["training"], 6) for r in tokenization_speedups(bench, runs)} == {2.0, 1.5}
    assert packing_finding(runs).startswith("effective tokens/s padding-free / padded x2; pretok-memmap / "
                                            "pretok-padded x2.67;")
    for label, ms in precision_groups(runs):
        assert len({m.precision for m in ms}) >= 2 and label
