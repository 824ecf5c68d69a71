"""Figures of the study notebooks not covered by `pretok_lib.analysis`: the two benchmarks and one run's curves."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analysis.figures import LAYOUT, PATH_COLORS, empty_figure
from ..analysis.plotting import fit_ticks
from ..datapaths import FORMAT_OF, PARQUET_KINDS
from ..datapaths import KINDS as PATH_ORDER

METHOD_COLORS = {"(a)": "#d62728", "(b)": "#ff7f0e", "(c)": "#7f7f7f", "(d)": "#1f77b4"}


def tokenize_bench_figure(res: Mapping[str, Any]) -> go.Figure:
    """MB/s of every tokenization method (log scale), labelled with the speedup over the per-document loop."""
    methods = res.get("methods") or {}
    title = "Tokenization throughput: pretokenizing once vs tokenizing on the fly"
    if not methods:
        return empty_figure(title, "no tokenize benchmark results")
    rows = sorted(methods.items(), key=lambda kv: kv[1]["mb_per_s"])
    loop = next((r["mb_per_s"] for k, r in methods.items() if k.startswith("(a)")), None)
    fig = go.Figure(go.Bar(
        y=[k for k, _ in rows], x=[r["mb_per_s"] for _, r in rows], orientation="h",
        marker_color=[METHOD_COLORS.get(k[:3], "#999") for k, _ in rows],
        text=[f"{r['mb_per_s']:.3g} MB/s" + (f" (x{r['mb_per_s'] / loop:.3g} loop)" if loop else "") for _, r in rows],
        textposition="outside", cliponaxis=False, hovertext=[f"{r['tokens_per_s'] / 1e6:.3g} M tokens/s, peak RSS "
                                           f"{r.get('peak_rss_mb') or '-'} MB" for _, r in rows]),
        layout=dict(title=title, xaxis_title="MB of text per second (log)", xaxis_type="log",
                    **{**LAYOUT, "height": 140 + 34 * len(rows), "margin": {"l": 230, "r": 190, "t": 70, "b": 60}}))
    return fit_ticks(fig)


def loader_bench_figure(res: Mapping[str, Any], metric: str = "effective_tokens_per_s") -> go.Figure:
    """Loader-only throughput of each data path per DataLoader worker count (log scale), against the raw-memmap
    `get_batch` ceiling (dashed line)."""
    rows = {k: r for k, r in (res.get("loaders") or {}).items() if r.get("kind") in PATH_ORDER}
    title = "Loader-only throughput per data path"
    if not rows:
        return empty_figure(title, "no loader benchmark results")
    fig = go.Figure(layout=dict(title=title, barmode="group", yaxis_type="log", xaxis_title="data path",
                                yaxis_title=metric.replace("_", " ") + " (log)", legend_title="DataLoader workers",
                                **LAYOUT))
    for i, w in enumerate(sorted({r["workers"] for r in rows.values()})):
        xs = [k for k in PATH_ORDER if f"{k} w{w}" in rows]
        ys = [rows[f"{k} w{w}"][metric] for k in xs]
        fig.add_trace(go.Bar(x=xs, y=ys, name=f"{w} workers", marker_color=["#1f77b4", "#aec7e8", "#ff7f0e"][i % 3],
                             text=[f"x{rows[f'{k} w{w}'].get('x_ceiling') or 0:.2g}" for k in xs],
                             textposition="outside"))
    for k, r in (res.get("loaders") or {}).items():
        if k.startswith("ref: raw memmap"):
            fig.add_hline(y=r["tokens_per_s"], line_dash="dash", line_color="#444")
            fig.add_annotation(x=0, xref="paper", y=math.log10(r["tokens_per_s"]), yref="y", showarrow=False,
                               xanchor="left", yanchor="bottom", font={"size": 11, "color": "#444"},
                               text=f"ceiling: nanoGPT get_batch on the raw memmap ({r['tokens_per_s'] / 1e6:.3g} M/s)")
    fig.add_annotation(text="bar label: x ceiling", x=1, y=1.08, xref="paper", yref="paper", showarrow=False,
                       xanchor="right", font={"size": 11})
    return fit_ticks(fig)


def compression_figure(res: Mapping[str, Any]) -> go.Figure:
    """Parquet codecs: bytes on disk per stored token (left) and read throughput (right), per format."""
    rows = res.get("compression") or []
    title = "Parquet compression: size vs read speed"
    if not rows:
        return empty_figure(title, "no compression results")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes on disk per token", "read tokens/s (warm cache)"))
    for fmt, color in ((FORMAT_OF[k], PATH_COLORS[k]) for k in PARQUET_KINDS):
        rs = [r for r in rows if r["format"] == fmt]
        if not rs:
            continue
        xs = [r["compression"] for r in rs]
        fig.add_trace(go.Bar(x=xs, y=[r["bytes_per_token"] for r in rs], name=fmt, marker_color=color,
                             legendgroup=fmt, text=[f"{r['disk_bytes'] / 1e6:.3g} MB" for r in rs],
                             textposition="outside"), row=1, col=1)
        fig.add_trace(go.Bar(x=xs, y=[r["read_tokens_per_s"] for r in rs], name=fmt, marker_color=color,
                             legendgroup=fmt, showlegend=False), row=1, col=2)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fig


def run_curves_figure(run: Any) -> go.Figure:
    """One run over its steps: train (and val) loss, tokens/s, data-stall share and learning rate."""
    title = f"Run {run.run_id} ({run.status})"
    if not len(run.train):
        return empty_figure(title, "no train records in metrics.jsonl")
    fig = make_subplots(rows=2, cols=2, subplot_titles=("loss", "tokens/s (global)", "data stall (wait / step)",
                                                        "learning rate"))
    t, v = run.train, run.val
    fig.add_trace(go.Scatter(x=t["step"], y=t["loss"], name="train loss", line={"color": "#1f77b4"}), 1, 1)
    if len(v) and v.has("val_loss"):
        fig.add_trace(go.Scatter(x=v["step"], y=v["val_loss"], name="val loss", mode="lines+markers",
                                 line={"color": "#d62728"}), 1, 1)
    for key, name, r, c in (("tokens_per_s", "tokens/s", 1, 2), ("effective_tokens_per_s", "effective tokens/s", 1, 2),
                            ("data_stall", "data stall", 2, 1), ("lr", "lr", 2, 2)):
        if t.has(key):
            fig.add_trace(go.Scatter(x=t["step"], y=t[key], name=name), r, c)
    fig.update_yaxes(tickformat=".1%", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2)
    fig.update_layout(title=title, **{**LAYOUT, "height": 640})
    return fit_ticks(fig, integer_x=True)
