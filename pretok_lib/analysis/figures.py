"""Plotly figure builders: each takes runs (and settings) and returns a `go.Figure`.

Bars are means over the completed repeats of one config (runs equal apart from the seed; error bar: standard
deviation), runs of different configs are different bars (`plotting.categorize`); every run is also a marker
(circle completed, x failed, open diamond incomplete) so a failed run's partial numbers stay visible. A builder
given nothing to show returns a figure saying "no runs with ..." instead of raising.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..datapaths import BASELINE
from .bench_tables import storage_rows, tokenization_speedups
from .metrics import all_metrics, precision_groups, scaling_efficiency, summary_table, target_loss_choice
from .plotting import (LAYOUT, PALETTE, PATH_COLORS, PERCENT, STATUS_FILL, STATUS_SYMBOLS, VARYING, _add_bars,
                       _mean_std, _ordered_categories, _path_bars, _path_of, baseline_means, categorize,
                       completed_values, empty_figure, fit_ticks, path_color, percent_text)
from .runs import Run
from .stall import mid_stall
from .text import format_value

__all__ = ["LAYOUT", "PALETTE", "PATH_COLORS", "PERCENT", "STATUS_FILL", "STATUS_SYMBOLS", "TABLE_COLUMNS", "VARYING",
           "all_figures", "data_stall_figure", "empty_figure", "loss_curves_figure", "mfu_figure", "padding_figure",
           "path_color", "precision_figure", "scaling_figure", "stall_prediction_figure", "status_table_figure",
           "storage_figure", "throughput_figure", "time_to_target_figure", "tokenization_speedup_figure",
           "val_loss_by_batch_figure"]


def throughput_figure(runs: Iterable[Run], skip: int | None = None, baseline: str = BASELINE) -> go.Figure:
    """Tokens/s and effective tokens/s per data path, effective bars labelled with the speedup over `baseline`."""
    return _path_bars(runs, [("tokens_per_s", "tokens/s"), ("effective_tokens_per_s", "effective tokens/s")],
                      "Training throughput per data path", "tokens / s (global)", "throughput records", skip,
                      ratio_to=baseline)


def mfu_figure(runs: Iterable[Run], skip: int | None = None) -> go.Figure:
    """Model FLOPs utilisation per data path, with the source of the peak FLOP/s it divides by."""
    runs = list(runs)
    fig = _path_bars(runs, [("mfu", "MFU")], "MFU per data path", "MFU",
                     "MFU (null when the device's peak FLOP/s is unknown)", skip)
    sources = list(dict.fromkeys(s for r in runs if isinstance(s := r.info.get("peak_source"), str)))
    if sources:
        fig.add_annotation(text="peak: " + "<br>peak: ".join(sources[:3]) + (" ..." if len(sources) > 3 else ""),
                           x=0, y=1.0, xref="paper", yref="paper", yanchor="bottom", showarrow=False,
                           xanchor="left", align="left", font=dict(size=11))
    return fig


def data_stall_figure(runs: Iterable[Run], skip: int | None = None) -> go.Figure:
    """Share of step time spent waiting for batches, per data path."""
    return _path_bars(runs, [("data_stall", "data stall")], "Data-stall fraction per data path",
                      "data wait / step time", "data-stall records", skip)


PADDING_AXIS = "share of the token slots trained on<br>(logged steps after warm-up)"


def padding_figure(runs: Iterable[Run], skip: int | None = None) -> go.Figure:
    """Padding share (padded paths) and masked-label share (packed paths) of the token slots, per data path."""
    return _path_bars(runs, [("padding_frac", "padding"), ("masked_frac", "masked labels")],
                      "Padding share per data path", PADDING_AXIS, "padding/masked records", skip)


def _run_colors(runs: list[Run]) -> dict[str, str]:
    return {r.run_id: PALETTE[i % len(PALETTE)] for i, r in enumerate(runs)}


def loss_curves_figure(runs: Iterable[Run], x: str = "step") -> go.Figure:
    """Train loss (left) and val loss (right) vs `x` ("step" or "wall_s"), one line per run; failed and
    incomplete runs dashed."""
    runs = [r for r in runs if r.train.has("loss") or r.val.has("val_loss")]
    title = "Loss curves"
    if not runs:
        return empty_figure(title, "no runs with logged loss")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("train loss", "val loss"))
    colors = _run_colors(runs)
    for r in runs:
        dash = "solid" if r.status == "completed" else "dash"
        for col, recs, key in ((1, r.train, "loss"), (2, r.val, "val_loss")):
            if recs.has(key):
                fig.add_trace(go.Scatter(x=recs[x], y=recs[key], mode="lines+markers" if col == 2 else "lines",
                                         name=r.label, legendgroup=r.run_id, showlegend=col == 1 or not r.train.has(
                                             "loss"), line=dict(color=colors[r.run_id], dash=dash),
                                         marker=dict(size=5)), row=1, col=col)
    fig.update_layout(title=title, **LAYOUT)
    fig.update_xaxes(title_text=x)
    fig.update_yaxes(title_text="loss", col=1)
    return fit_ticks(fig, integer_x=x == "step")


def val_loss_by_batch_figure(runs: Iterable[Run], x: str = "step") -> go.Figure:
    """Val loss vs `x`, one line per run, colored by global batch size."""
    runs = [r for r in runs if r.val.has("val_loss")]
    title = "Val loss by global batch size"
    if not runs:
        return empty_figure(title, "no runs with val loss")
    batches = sorted({r.settings["global_batch"] for r in runs}, key=lambda b: (b is None, b or 0))
    fig = go.Figure(layout=dict(title=title, xaxis_title=x, yaxis_title="val loss", legend_title="global batch",
                                **LAYOUT))
    shown: set = set()
    for r in sorted(runs, key=lambda r: batches.index(r.settings["global_batch"])):
        b = r.settings["global_batch"]
        fig.add_trace(go.Scatter(x=r.val[x], y=r.val["val_loss"], mode="lines+markers", name=f"B={b}",
                                 legendgroup=str(b), showlegend=b not in shown, hovertext=r.label,
                                 line=dict(color=PALETTE[batches.index(b) % len(PALETTE)],
                                           dash="solid" if r.status == "completed" else "dash")))
        shown.add(b)
    return fit_ticks(fig, integer_x=x == "step")


def scaling_figure(runs: Iterable[Run], metric: str = "tokens_per_s", skip: int | None = None
                   ) -> go.Figure:
    """DDP scaling: `metric` vs world size (left, dashed: ideal linear) and scaling efficiency (right), per group
    of runs equal in all but the world size, completed runs only; points labelled with their efficiency."""
    rows = scaling_efficiency([r for r in runs if r.status == "completed"], metric, skip)
    title = "DDP scaling"
    if not rows:
        return empty_figure(title, "no runs with >= 2 world sizes and otherwise equal settings")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(metric.replace("_", " "), "scaling efficiency"))
    for i, group in enumerate(dict.fromkeys(r["group"] for r in rows)):
        g = [r for r in rows if r["group"] == group]
        color = path_color(g[0]["data_kind"], i)
        ns = [r["world_size"] for r in g]
        fig.add_trace(go.Scatter(x=ns, y=[r["value"] for r in g], mode="lines+markers+text", name=group,
                                 legendgroup=group, line_color=color, textposition="top center",
                                 text=[f"{r['efficiency']:.0%}" if r["efficiency"] is not None and
                                       r["world_size"] != r["base_world_size"] else "" for r in g]),
                      row=1, col=1)
        base, n0 = g[0]["value"], g[0]["base_world_size"]
        fig.add_trace(go.Scatter(x=ns, y=[base * n / n0 for n in ns], mode="lines", name=f"{group} ideal",
                                 legendgroup=group, showlegend=False, line=dict(color=color, dash="dot")),
                      row=1, col=1)
        pts = [(r["world_size"], v) for r in g for v in r["values"]]
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", legendgroup=group,
                                 showlegend=False, marker=dict(color=color, size=5, opacity=0.5)), row=1, col=1)
        fig.add_trace(go.Scatter(x=ns, y=[r["efficiency"] for r in g], mode="lines+markers", legendgroup=group,
                                 showlegend=False, line_color=color), row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888", row=1, col=2)
    fig.update_layout(title=title, **LAYOUT)
    fig.update_xaxes(title_text="world size", dtick=1)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    return fit_ticks(fig, integer_x=True)


OWN_LAYOUT = "own layout"   # the time-to-target bars of val_loss_own (eval.own_path: a padded path's own layout)


def _time_labels(ms: list, cats: list[str], cat, key: str, baseline: str) -> list[str]:
    """Per bar: the mean time of its completed runs and its speedup over the `baseline` runs of the same config."""
    done, bases = completed_values(ms, cat, key), baseline_means(ms, cat, key, baseline)
    out = []
    for c in cats:
        mean, base = _mean_std(done.get(c, []))[0], bases.get(c)
        out.append(("" if mean is None else f"{mean:.3g} s") + (f" · x{base / mean:.3g}" if base and mean else ""))
    return out


def time_to_target_figure(runs: Iterable[Run], target_loss: float | None = None, baseline: str = BASELINE,
                          skip: int | None = None) -> go.Figure:
    """Wall time until the loss first reaches `target_loss` (val loss if logged, else train), per setting (see
    `plotting.categorize`), bars labelled with the speedup over `baseline` runs of an otherwise equal config.
    Runs validated on their own layout too (`eval.own_path`, the study's padded paths) get a second, hatched bar
    "own layout" (val_loss_own, the same target). Target: given, else the runs' common configured one, else 90% of
    the descent every completed run made (so every completed run reaches it before its end; the title says which).
    Crossings are interpolated between evaluations (`metrics.time_to_target`)."""
    runs = list(runs)
    target_loss, how = target_loss_choice(runs, target_loss, skip)
    ms = all_metrics(runs, skip, target_loss)
    title = "Time to target loss" + (f" (loss <= {target_loss:.4g}, {how}; interpolated between evaluations)"
                                     if target_loss is not None else "")
    series = [("time_to_target_s", "val loss on eval.path")]
    if any(m.time_to_target_own_s is not None for m in ms):
        series.append(("time_to_target_own_s", f"{OWN_LAYOUT} (eval.own_path)"))
    reached = [m for m in ms if any(getattr(m, key) is not None for key, _ in series)]
    if not reached:
        return empty_figure(title, "no runs with a logged loss reaching the target" if target_loss is not None
                            else "no runs with a loss to set a target from")
    cat = categorize(reached)
    cats = _ordered_categories(reached, cat)
    fig = go.Figure(layout=dict(title=title, barmode="group", scattermode="group", yaxis_title="wall time (s)",
                                **LAYOUT))
    for i, (key, name) in enumerate(series):
        _add_bars(fig, reached, cats, cat, key, name if len(series) > 1 else "time to target",
                  [path_color(_path_of(c)) for c in cats], texts=_time_labels(reached, cats, cat, key, baseline),
                  showlegend=len(series) > 1, points_legend=i == 0)
        if i:
            fig.data[-2].marker.pattern = dict(shape="/", fgcolor="#fff")   # the own-layout bar, hatched
    missed = [m.run_id + ("" if m.status == "completed" else f" [{m.status}]") for m in ms
              if m.time_to_target_s is None and m.logged]
    missed += [f"{OWN_LAYOUT}: {m.run_id}" for m in ms
               if m.time_to_target_own_s is None and m.final_val_loss_own is not None]
    has_base = any(m.data_kind == baseline for m in reached)
    note = " · ".join(([f"x = speedup over {baseline} with an otherwise equal config"] if has_base else [])
                      + ([f"not reached: {', '.join(missed)}"] if missed else []))
    if note:
        fig.add_annotation(text=note, x=1, y=1.08, xref="paper", yref="paper", showarrow=False, xanchor="right",
                           font=dict(size=11))
    return fig


HF_ARROW = "hf-arrow"
HF_ARROW_NOTE = ("hf-arrow: not a pretok format; the Hugging Face datasets Arrow cache that datasets.map + "
                 "save_to_disk writes<br>for the same text (the tokenize benchmark's baseline (b)), for reference")


def storage_figure(rows: list[dict[str, Any]] | Iterable[str | Path]) -> go.Figure:
    """Bytes on disk per stored token of each pretokenized output (bar label: total size). Takes `storage_rows`
    or dataset directories."""
    rows = list(rows)
    if rows and not isinstance(rows[0], dict):
        rows = storage_rows(rows)
    rows = [r for r in rows if r.get("bytes_per_token")]
    title = "Storage per format"
    if not rows:
        return empty_figure(title, "no datasets with a manifest.json")
    xs = [f"{r['name']}<br>{r['format']}" + (f" · {r['compression']}" if r.get("compression") else "") for r in rows]
    colors = [path_color("pretok-" + (r["format"] or ""), i) for i, r in enumerate(rows)]
    hover = [f"{r['path']}<br>{format_value(r.get('tokens'))} tokens, {format_value(r.get('documents'))} documents"
             + (f", {format_value(r['padding'])} padding slots" if r.get("padding") else "") for r in rows]
    fig = go.Figure(go.Bar(x=xs, y=[r["bytes_per_token"] for r in rows], marker_color=colors, hovertext=hover,
                           text=[f"{r['disk_bytes'] / 1e6:.3g} MB" for r in rows], textposition="outside"),
                    layout=dict(title=title, yaxis_title="bytes on disk per stored token", **LAYOUT))
    if any(r.get("format") == HF_ARROW for r in rows):
        fig.add_annotation(text=HF_ARROW_NOTE, x=0, y=1.02, xref="paper", yref="paper", showarrow=False,
                           xanchor="left", yanchor="bottom", align="left", font=dict(size=11))
    return fig


def tokenization_speedup_figure(bench: str | Path | dict | None, runs: Iterable[Run],
                                skip: int | None = None, metric: str = "effective_tokens_per_s") -> go.Figure:
    """Tokenization speedup in isolation (benchmark: engine vs per-document tokenizer, MB/s) next to the speedup
    it buys in training (`metric`, pretokenized path / on-the-fly path of the same layout), log scale."""
    rows = tokenization_speedups(bench, runs, metric, skip)
    title = "Tokenization speedup: in isolation vs in training"
    if not rows:
        return empty_figure(title, "no tokenize benchmark and no pretokenized / on-the-fly run pairs")
    multi = len({r["group"] for r in rows if r["group"]}) > 1
    xs = [f"{r['pretok']}<br>vs {r['on_the_fly']}" + (f"<br>{r['group']}" if multi and r["group"] else "")
          for r in rows]
    fig = go.Figure(layout=dict(title=title, barmode="group", yaxis_title="speedup (x)", yaxis_type="log",
                                **LAYOUT))
    for key, name, color in (("isolated", "isolated (tokenize benchmark)", "#7f7f7f"),
                             ("training", f"in training ({metric.replace('_', ' ')})", "#1f77b4")):
        ys = [r[key] for r in rows]
        fig.add_trace(go.Bar(x=xs, y=ys, name=name, marker_color=color, textposition="outside",
                             text=["" if y is None else f"x{y:.3g}" for y in ys]))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    return fit_ticks(fig)


def precision_figure(runs: Iterable[Run], skip: int | None = None) -> go.Figure:
    """Mixed vs full precision for runs equal in all else: effective tokens/s, peak memory, final val loss and
    perplexity per precision (one bar series per group of otherwise equal runs)."""
    groups = precision_groups(runs, skip)
    title = "Mixed vs full precision"
    if not groups:
        return empty_figure(title, "no runs differing only in precision")
    panels = (("effective_tokens_per_s", "effective tokens/s"), ("peak_mem_mb", "peak memory MB"),
              ("final_val_loss", "final val loss"), ("final_val_ppl", "final val ppl"))
    fig = make_subplots(rows=1, cols=4, subplot_titles=[p[1] for p in panels])
    cat = lambda m: str(m.precision)  # noqa: E731
    for i, (label, ms) in enumerate(groups):
        cats = sorted({cat(m) for m in ms})
        for j, (key, _) in enumerate(panels):
            _add_bars(fig, ms, cats, cat, key, label, path_color(ms[0].data_kind, i), row=1, col=j + 1,
                      showlegend=j == 0, points_legend=i == 0 and j == 0, group=f"g{i}")
    steps = {f"{cat(m)} {m.steps}" for _, ms in groups for m in ms if m.steps is not None}
    if len({s.split()[1] for s in steps}) > 1:   # e.g. a slow precision stopped by train.time_budget_s
        title += f"<br><sup>steps run: {', '.join(sorted(steps))}: losses after different step counts</sup>"
    fig.update_layout(title=title, barmode="group", scattermode="group", **LAYOUT)
    return fig


def stall_prediction_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """Predicted data-stall fraction (bar: the stall at the mid MFU, whiskers: at the ends of the MFU range) and
    headroom S/C (log) per accelerator, one bar series per data path x worker count; rows from
    `analysis.stall.predict`."""
    title = "Would this loader stall a GPU? Predicted per rank"
    if not rows:
        return empty_figure(title, "no loader benchmark results (notebook 02)")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("predicted data stall (MFU range)", "headroom S / C"))
    accs = list(dict.fromkeys(r["accelerator"] for r in rows))
    for i, key in enumerate(dict.fromkeys((r["path"], r["workers"], r["target_workers"]) for r in rows)):
        mine = {r["accelerator"]: r for r in rows if (r["path"], r["workers"], r["target_workers"]) == key}
        rs = [mine[a] for a in accs]
        name = f"{key[0]} w{key[2]}" + (f" (measured w{key[1]})" if key[1] != key[2] else "")
        mid = [mid_stall(r) for r in rs]
        common = dict(x=accs, name=name, marker_color=path_color(key[0], i), legendgroup=name,
                      opacity=1.0 if key[2] == 0 else 0.6)
        fig.add_trace(go.Bar(y=mid, error_y=dict(type="data", symmetric=False,
                                                 array=[r["stall_high"] - m for r, m in zip(rs, mid)],
                                                 arrayminus=[m - r["stall_low"] for r, m in zip(rs, mid)]),
                             hovertext=[f"C {r['consumption_low']:,.0f}-{r['consumption_high']:,.0f} tok/s, "
                                        f"S {r['supply']:,.0f} tok/s" for r in rs], **common), row=1, col=1)
        fig.add_trace(go.Bar(y=[r["headroom_low"] for r in rs], showlegend=False, **common), row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888", row=1, col=2)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(type="log", title_text="S / C at the high MFU (< 1: stalls)", row=1, col=2)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fit_ticks(fig)


TABLE_COLUMNS = ("run_id", "status", "data_kind", "world_size", "global_batch", "seq_len", "precision", "steps",
                 "tokens_per_s", "effective_tokens_per_s", "mfu", "data_stall", "padding_frac", "peak_mem_mb",
                 "final_loss", "final_val_loss", "final_val_ppl", "final_val_loss_own", "time_to_target_s",
                 "time_to_target_own_s", "note")


def status_table_figure(runs: Iterable[Run], skip: int | None = None, target_loss: float | None = None
                        ) -> go.Figure:
    """All runs as a table, rows colored by status (failed red, incomplete yellow), with error/problems."""
    rows = summary_table(runs, skip, target_loss)
    if not rows:
        return empty_figure("Runs", "no runs found")

    def cell(k: str, v: Any) -> str:
        if k in PERCENT and isinstance(v, float) and math.isfinite(v):
            return percent_text(v)
        return (v[:157] + "...") if k == "note" and isinstance(v, str) and len(v) > 160 else format_value(v)

    values = [[cell(c, r[c]) for r in rows] for c in TABLE_COLUMNS]
    widths = [max(6, min(40, max(len(x) for x in col))) for col in values]
    fills = [STATUS_FILL.get(r["status"], "#fff") for r in rows]
    counts = ", ".join(f"{sum(r['status'] == s for r in rows)} {s}" for s in ("completed", "failed", "incomplete"))
    target = rows[0]["target_loss"]
    title = f"Runs: {counts}" + (f" (time to target: loss <= {target:.4g})" if target is not None else "")
    return go.Figure(go.Table(
        columnwidth=widths,
        header=dict(values=[c.replace("_", " ") for c in TABLE_COLUMNS], fill_color="#e8e8e8", align="left"),
        cells=dict(values=values, fill_color=[fills] * len(TABLE_COLUMNS), align="left", height=24)),
        layout=dict(title=title, **{**LAYOUT, "height": min(1400, 200 + 30 * len(rows))}))


def all_figures(runs: Iterable[Run], bench: str | Path | dict | None = None,
                dataset_dirs: Iterable[str | Path] = (), skip: int | None = None,
                target_loss: float | None = None) -> dict[str, go.Figure]:
    """Every figure of the study by file name, ready for `report.save_figures`."""
    runs = list(runs)
    return {
        "runs_status": status_table_figure(runs, skip, target_loss),
        "throughput": throughput_figure(runs, skip),
        "mfu": mfu_figure(runs, skip),
        "data_stall": data_stall_figure(runs, skip),
        "padding": padding_figure(runs, skip),
        "loss_curves": loss_curves_figure(runs),
        "val_loss_by_batch": val_loss_by_batch_figure(runs),
        "ddp_scaling": scaling_figure(runs, skip=skip),
        "time_to_target": time_to_target_figure(runs, target_loss, skip=skip),
        "storage": storage_figure(storage_rows(dataset_dirs, bench)),
        "tokenization_speedup": tokenization_speedup_figure(bench, runs, skip),
        "precision": precision_figure(runs, skip),
    }
