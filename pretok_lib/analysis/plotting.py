"""What every analysis figure shares: the data paths' colors, the layout, the empty figure, and bars of means with
a standard-deviation error bar and one marker per run (circle completed, x failed, open diamond incomplete).

A bar is one setting: runs whose config signatures are equal apart from the seed (`runs.config_signature`) are its
repeats, and only completed ones enter its mean (as in the study's findings); runs of different configs are
different bars, labelled by the settings that tell them apart. Ratio labels pair runs equal except for the data
path, as `metrics.path_speedups` does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Hashable, Iterable

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from .metrics import RunMetrics, all_metrics, path_rank
from .metrics import differing_keys as _differing
from .metrics import shown_settings as _shown
from .runs import (BATCH_SHAPE_KEYS, DATA_PATH_KEYS, PRECISION_KEYS, WORLD_SIZE_KEYS, Run, _matches,
                   config_signature)

PATH_COLORS = {"padded": "#d62728", "padding-free": "#ff7f0e", "pretok-padded": "#9467bd",
               "pretok-token-list": "#2ca02c", "pretok-memmap": "#1f77b4"}
STATUS_SYMBOLS = {"completed": "circle", "failed": "x", "incomplete": "diamond-open"}
STATUS_FILL = {"completed": "#ffffff", "failed": "#fde0dd", "incomplete": "#fff3cd"}
PALETTE = qualitative.Plotly + qualitative.D3
VARYING = ("world_size", "global_batch", "seq_len", "precision")
LAYOUT = dict(template="plotly_white", height=460, margin=dict(l=70, r=30, t=70, b=70))
PERCENT = {"mfu", "data_stall", "padding_frac", "masked_frac"}


def path_color(kind: str | None, i: int = 0) -> str:
    """The fixed color of a data path (others: palette by index)."""
    return PATH_COLORS.get(kind or "", PALETTE[i % len(PALETTE)])


def empty_figure(title: str, message: str) -> go.Figure:
    """A figure with only a centered message, for groups with no data."""
    fig = go.Figure(layout=dict(title=title, **LAYOUT))
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=16))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _varying(ms: list[RunMetrics], fields: Iterable[str] = VARYING) -> list[str]:
    return [f for f in fields if len({getattr(m, f) for m in ms}) > 1]


def _category(m: RunMetrics, varying: list[str]) -> str:
    fmt = {"world_size": "N={}", "global_batch": "B={}", "seq_len": "L={}", "precision": "{}"}
    return " · ".join([m.data_kind or "?"] + [fmt[f].format(getattr(m, f)) for f in varying])


def _path_of(category: str) -> str:
    return category.split(" · ")[0]


SHOWN_BY_VARYING = (*WORLD_SIZE_KEYS, *PRECISION_KEYS, *BATCH_SHAPE_KEYS)  # config keys the VARYING labels show


def _signature(m: RunMetrics, ignore: Iterable[str] = (), keep: Iterable[str] = ()) -> tuple:
    return config_signature(m.run, ignore, keep) if m.run is not None else (("run_id", repr(m.run_id)),)


def path_free_signature(m: RunMetrics) -> tuple:
    """A run's config signature apart from the data path (batch shape kept), as `metrics.path_speedups` pairs."""
    return _signature(m, DATA_PATH_KEYS, BATCH_SHAPE_KEYS)


def categorize(ms: list[RunMetrics]) -> Callable[[RunMetrics], str]:
    """A run's bar label: equal for repeats (config signatures equal apart from the seed), different for
    different configs. The label is the data path, the VARYING settings that vary, then any other config key
    that tells the settings apart (e.g. `train.lr=0.002`)."""
    var = _varying(ms)
    extra = [k for k in _differing({path_free_signature(m) for m in ms}) if not _matches(k, SHOWN_BY_VARYING)]
    by_label: dict[str, dict[tuple, None]] = defaultdict(dict)
    for m in ms:
        label = " · ".join([_category(m, var), *_shown(path_free_signature(m), extra)])
        by_label[label][_signature(m)] = None
    labels = {}
    for label, sigs in by_label.items():  # settings the above does not show apart: name what differs
        more = _differing(sigs) if len(sigs) > 1 else []
        labels.update({sig: " · ".join([label, *_shown(sig, more)]) for sig in sigs})
    return lambda m: labels[_signature(m)]


def _ordered_categories(ms: list[RunMetrics], cat: Callable[[RunMetrics], str]) -> list[str]:
    key = {cat(m): (path_rank(m.data_kind), [str(getattr(m, f)) for f in VARYING], cat(m)) for m in ms}
    return sorted(key, key=lambda c: key[c])


def _finite(m: RunMetrics, key: str) -> float | None:
    v = getattr(m, key)
    return v if v is not None and math.isfinite(v) else None


def completed_values(ms: Iterable[RunMetrics], cat: Callable[[RunMetrics], Hashable], key: str
                     ) -> dict[Hashable, list[float]]:
    """Per category: the finite `key` values of its completed runs (what a bar averages)."""
    out: dict[Hashable, list[float]] = defaultdict(list)
    for m in ms:
        if m.status == "completed" and (v := _finite(m, key)) is not None:
            out[cat(m)].append(v)
    return out


def baseline_means(ms: Iterable[RunMetrics], cat: Callable[[RunMetrics], str], key: str, baseline: str
                   ) -> dict[str, float]:
    """Per category: the mean `key` of the completed `baseline`-path runs equal to it except for the data path
    (categories without such runs are left out)."""
    ms = list(ms)
    base = completed_values([m for m in ms if m.data_kind == baseline], path_free_signature, key)
    return {cat(m): float(np.mean(base[pf])) for m in ms if (pf := path_free_signature(m)) in base}


def _mean_std(vals: list[float]) -> tuple[float | None, float | None]:
    if not vals:
        return None, None
    return float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else None


def _ratio_text(v: float | None, base: float | None) -> str:
    return "" if v is None or not base else f"x{v / base:.3g}"


def _add_bars(fig: go.Figure, ms: list[RunMetrics], cats: list[str], cat: Callable[[RunMetrics], str], key: str,
              name: str, color: str | list[str], *, row: int | None = None, col: int | None = None,
              texts: list[str] | None = None, showlegend: bool = True, points_legend: bool = False,
              group: str | None = None) -> None:
    """One bar per category (mean of `key` over its completed runs, std error bar) plus one marker per run of
    any status; bars and markers share the offset group `group` (default: `key`).

    Args:
        fig: the figure drawn into; ms: the runs; cats: the categories in bar order; cat: a run's category.
        key: the RunMetrics field averaged; name: the legend name; color: one color or one per category.
        row, col: the subplot (None: a plain figure); texts: a label per bar (e.g. ratios).
        showlegend: the bars in the legend; points_legend: the run markers too; group: the offset group (`key`).
    """
    group = group or key
    by: dict[str, list[RunMetrics]] = defaultdict(list)
    for m in ms:
        if _finite(m, key) is not None:
            by[cat(m)].append(m)
    done = completed_values(ms, cat, key)
    stats = [_mean_std(done.get(c, [])) for c in cats]
    pos = dict(row=row, col=col) if row else {}
    fig.add_trace(go.Bar(x=cats, y=[s[0] for s in stats], name=name, marker_color=color, offsetgroup=group,
                         legendgroup=group, showlegend=showlegend, text=texts, textposition="outside",
                         error_y=dict(type="data", array=[s[1] or 0 for s in stats], visible=True),
                         hovertemplate="%{x}<br>" + name + ": %{y:.4g}<extra></extra>"), **pos)
    pts = [m for c in cats for m in by[c]]
    fig.add_trace(go.Scatter(x=[cat(m) for m in pts], y=[getattr(m, key) for m in pts], mode="markers",
                             offsetgroup=group, name="runs", legendgroup="runs", showlegend=points_legend,
                             marker=dict(color="#222", size=7, symbol=[STATUS_SYMBOLS.get(m.status) for m in pts]),
                             hovertext=[f"{m.run_id} ({m.status})" for m in pts],
                             hovertemplate="%{hovertext}<br>" + name + ": %{y:.4g}<extra></extra>"), **pos)


def _path_bars(runs: Iterable[Run], series: list[tuple[str, str]], title: str, ytitle: str, what: str,
               skip: int | None, ratio_to: str | None = None) -> go.Figure:
    """Grouped bars per setting (x: data path + the settings that tell configs apart, see `categorize`) of the
    given (metric, name) series. `ratio_to`: label the last series' bars with their ratio to that path's runs of
    the same config otherwise."""
    ms = [m for m in all_metrics(runs, skip) if any(getattr(m, k) is not None for k, _ in series)]
    if not ms:
        return empty_figure(title, f"no runs with {what}")
    cat = categorize(ms)
    cats = _ordered_categories(ms, cat)
    fig = go.Figure(layout=dict(title=title, barmode="group", scattermode="group", yaxis_title=ytitle, **LAYOUT))
    for i, (key, name) in enumerate(series):
        texts = None
        if ratio_to and i == len(series) - 1:
            done, base = completed_values(ms, cat, key), baseline_means(ms, cat, key, ratio_to)
            texts = [_ratio_text(_mean_std(done.get(c, []))[0], base.get(c)) for c in cats]
        color = [path_color(_path_of(c)) for c in cats] if len(series) == 1 else PALETTE[i % len(PALETTE)]
        _add_bars(fig, ms, cats, cat, key, name, color, texts=texts, showlegend=len(series) > 1,
                  points_legend=i == 0)
    if all(k in PERCENT for k, _ in series):
        fig.update_yaxes(tickformat=".0%")
    if ratio_to and any(m.data_kind == ratio_to for m in ms):
        fig.add_annotation(text=f"labels: ratio to {ratio_to} with an otherwise equal config · bars: completed runs",
                           x=1, y=1.08, xref="paper", yref="paper", showarrow=False, xanchor="right",
                           font=dict(size=11))
    return fig
