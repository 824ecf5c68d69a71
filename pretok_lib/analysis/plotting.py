"""What every analysis figure shares: the data paths' colors, the layout, the empty figure, and bars of means with
a standard-deviation error bar and one marker per run (circle completed, x failed, open diamond incomplete).

A bar is one setting: runs whose config signatures are equal apart from the seed (`runs.config_signature`) are its
repeats, and only completed ones enter its mean (as in the study's findings); runs of different configs are
different bars, labelled by the settings that tell them apart. Ratio labels pair runs equal except for the data
path, as `metrics.path_speedups` does.
"""

from __future__ import annotations

import math
import numbers
import re
from collections import defaultdict
from typing import Callable, Hashable, Iterable

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from ..datapaths import COLOURS
from .metrics import RunMetrics, all_metrics, path_rank
from .metrics import differing_keys as _differing
from .metrics import shown_settings as _shown
from .runs import (BATCH_SHAPE_KEYS, DATA_PATH_KEYS, PRECISION_KEYS, WORLD_SIZE_KEYS, Run, _matches,
                   config_signature)

PATH_COLORS = COLOURS   # the data paths' own colours (datapaths.REGISTRY)
STATUS_SYMBOLS = {"completed": "circle", "failed": "x", "incomplete": "diamond-open"}
STATUS_FILL = {"completed": "#ffffff", "failed": "#fde0dd", "incomplete": "#fff3cd"}
PALETTE = qualitative.Plotly + qualitative.D3
VARYING = ("world_size", "global_batch", "seq_len", "precision")
LAYOUT = dict(template="plotly_white", height=460, margin=dict(l=70, r=30, t=70, b=70))
PERCENT = {"mfu", "data_stall", "padding_frac", "masked_frac"}


def _nice(x: float) -> float:
    """The 1-2-5 step at or above `x` (> 0)."""
    e = 10.0 ** math.floor(math.log10(x))
    return next(m * e for m in (1, 2, 5, 10) if m * e >= x * (1 - 1e-9))


def _numbers(seq) -> list[float]:
    return [float(v) for v in (seq if seq is not None and not isinstance(seq, str) else ())
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)]


def percent_ticks(values) -> dict:
    """Ticks of a share axis over `values`: a 1-2-5 step of about a sixth of the largest value and a percent
    format with the decimals that step needs (0.1% steps read "0.1%", "0.2%", never "0%" six times)."""
    top = max((abs(v) for v in _numbers(values)), default=0.0)
    if top <= 0:
        return {"tickformat": ".0%"}
    step = _nice(top / 6)
    return {"tickformat": f".{max(0, min(6, -math.floor(math.log10(step * 100) + 1e-9)))}%", "dtick": step,
            "tick0": 0}


def percent_text(v: float) -> str:
    """A share as text with the decimals it needs: 0%, 0.04%, 12.5%."""
    return "0%" if v == 0 else f"{v:.2%}" if abs(v) < 0.01 else f"{v:.1%}"


def number_label(v: float) -> str:
    """A tick label: 0.5, 20, 2k, 1.5M (never the bare leading digit of plotly's log minor ticks)."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{unit}"
    return f"{v:g}"


def log_ticks(values) -> dict:
    """Ticks of a log axis over `values` (> 0): 1-2-5 per decade (powers of ten alone over more than five
    decades), each labelled with its value (`number_label`): plotly's own label 0.5 as "5" and 2000 as "2"."""
    vals = [v for v in _numbers(values) if v > 0]
    if not vals:
        return {}
    lo, hi = min(vals), max(vals)
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1, 2, 5) if k1 - k0 <= 5 else (1,)
    ticks = [m * 10.0 ** k for k in range(k0, k1 + 1) for m in mults]
    inside = [t for t in ticks if lo / 2.5 <= t <= hi * 2.5] or ticks
    return {"tickmode": "array", "tickvals": inside, "ticktext": [number_label(t) for t in inside]}


def integer_ticks(values) -> dict:
    """Ticks of a count axis (steps, world sizes): integer steps only (no 3.5th step)."""
    top = max((abs(v) for v in _numbers(values)), default=1.0)
    return {"tick0": 0, "dtick": max(1, int(_nice(max(top, 1) / 6))), "tickformat": ",d"}


AXIS_KEY = re.compile(r"^[xy]axis\d*$")


def _axis_values(fig: go.Figure) -> dict[str, list[float]]:
    """The numbers each axis shows (layout key -> values): trace coordinates, bar tops with their error bars, and
    the lines drawn on it (add_hline)."""
    out: dict[str, list[float]] = defaultdict(list)
    for t in fig.data:
        for letter in ("x", "y"):
            ref = getattr(t, f"{letter}axis", None) or letter
            key = f"{letter}axis{ref[1:]}"
            vals = _numbers(getattr(t, letter, None))
            err = getattr(t, f"error_{letter}", None)
            if err is not None and err.array is not None:
                vals += [v + e for v, e in zip(vals, _numbers(err.array))]
            out[key] += vals
    for sh in fig.layout.shapes:
        for letter in ("x", "y"):
            ref = getattr(sh, f"{letter}ref", None) or letter
            if "domain" not in ref and ref != "paper":
                out[f"{letter}axis{ref[1:]}"] += _numbers([getattr(sh, f"{letter}0"), getattr(sh, f"{letter}1")])
    return out


def fit_ticks(fig: go.Figure, integer_x: bool = False) -> go.Figure:
    """Tick labels that read right whatever the data: log axes labelled with values (`log_ticks`), share axes
    (a "%" tickformat) with enough decimals (`percent_ticks`), and, with `integer_x`, integer x ticks (steps)."""
    vals = _axis_values(fig)
    for key in [k for k in fig.layout.to_plotly_json() if AXIS_KEY.match(k)]:
        ax, v = fig.layout[key], vals.get(key, [])
        if not v:
            continue
        if ax.type == "log":
            ax.update(**log_ticks(v))
        elif isinstance(ax.tickformat, str) and ax.tickformat.endswith("%"):
            ax.update(**percent_ticks(v))
        elif integer_x and key.startswith("x"):
            ax.update(**integer_ticks(v))
    return fig


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
        fig.update_yaxes(tickformat=".0%")   # decimals and step fitted to the values (fit_ticks)
    if ratio_to and any(m.data_kind == ratio_to for m in ms):
        fig.add_annotation(text=f"labels: ratio to {ratio_to} with an otherwise equal config · bars: completed runs",
                           x=1, y=1.08, xref="paper", yref="paper", showarrow=False, xanchor="right",
                           font=dict(size=11))
    return fit_ticks(fig)
