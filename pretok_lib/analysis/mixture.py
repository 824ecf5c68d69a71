"""The realised mixture of a run trained on `data.mixture` (docs/MIXTURES.md), against its weights.

Read from the contract files only: the weights from config.yaml, the per-dataset cumulative tokens
(`cum_source_tokens`, in data.mixture's order) from metrics.jsonl's train records.
"""

from __future__ import annotations

from typing import Any, Iterable

import plotly.graph_objects as go

from .runs import Run


def mixture_weights(run: Run) -> list[tuple[str, float]]:
    """(dataset path, normalised weight) of each dataset of the run's mixture; [] when it trained on one path."""
    entries = (run.config.get("data") or {}).get("mixture") or []
    total = sum(float(e.get("weight") or 0) for e in entries)
    return [(str(e.get("path")), float(e.get("weight") or 0) / total) for e in entries] if total > 0 else []


def mixture_series(run: Run, key: str = "cum_source_tokens") -> tuple[list[int], list[list[float]]]:
    """(steps, per step the fraction of the tokens so far each dataset contributed) from the logged records."""
    steps, fracs = [], []
    for r in run.train.rows:
        cum = r.get(key)
        if isinstance(cum, list) and sum(cum) > 0:
            steps.append(r["step"])
            fracs.append([c / sum(cum) for c in cum])
    return steps, fracs


def mixture_rows(runs: Iterable[Run], key: str = "cum_source_tokens") -> list[dict[str, Any]]:
    """One row per dataset of each mixture run: its weight, its tokens at the last logged step, the realised
    fraction and the difference (realised - weight). Runs without a mixture are left out."""
    out = []
    for run in runs:
        weights = mixture_weights(run)
        last = next((r.get(key) for r in reversed(run.train.rows) if isinstance(r.get(key), list)), None)
        if not weights or last is None or len(last) != len(weights) or sum(last) == 0:
            continue
        for (path, w), tokens in zip(weights, last):
            out.append({"run": run.label, "dataset": path, "weight": w, "tokens": tokens,
                        "realised": tokens / sum(last), "difference": tokens / sum(last) - w})
    return out


def mixture_figure(runs: Iterable[Run], key: str = "cum_source_tokens") -> go.Figure:
    """Realised fraction of the tokens per dataset against the step (solid), and each weight (dotted)."""
    from .figures import LAYOUT, PALETTE, empty_figure

    title = "Realised mixture: each dataset's share of the tokens seen so far, against its weight"
    fig = go.Figure(layout=dict(title=title, **LAYOUT))
    shown = 0
    for run in runs:
        weights = mixture_weights(run)
        steps, fracs = mixture_series(run, key)
        if not weights or not steps or len(fracs[0]) != len(weights):
            continue
        for j, (path, w) in enumerate(weights):
            color = PALETTE[(shown + j) % len(PALETTE)]
            name = f"{run.label}: {path}"
            fig.add_trace(go.Scatter(x=steps, y=[f[j] for f in fracs], mode="lines+markers", name=name,
                                     line=dict(color=color), legendgroup=name))
            fig.add_trace(go.Scatter(x=[steps[0], steps[-1]], y=[w, w], mode="lines", name=f"weight {w:.3g}",
                                     line=dict(color=color, dash="dot"), legendgroup=name, showlegend=False,
                                     hovertemplate=f"weight {w:.4g}<extra>{name}</extra>"))
        shown += len(weights)
    if not shown:
        return empty_figure(title, "no runs with a data.mixture and per-dataset token counts")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="fraction of tokens", tickformat=".0%", rangemode="tozero")
    return fig
