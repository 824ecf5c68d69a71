"""`pretok report RUNS_DIR`: the study's figures, findings and one self-contained HTML report for any directory of
runs (docs/RUNS.md): a custom `pretok sweep`, runs of `pretok train`, runs measured with `pretok_lib.measure` (your
own trainer), or all of them together. Built in-process from the same pieces as notebook 05 and the study's first
screen (`analysis.figures.all_figures`, `study.findings`, `study.measured`, `analysis.captions`), no notebook.

    RUNS_DIR/report/report.html        first screen: runs that failed (with their errors), then the findings
    RUNS_DIR/report/figures/NAME.html  each figure (plotly.js embedded: opens offline), NAME.png with --png
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text
from ..errors import PretokError

REPORT_DIR = "report"   # default output folder inside RUNS_DIR (not a run: it holds no run.json)


def _bench(path: str | Path | None) -> dict | None:
    if path is None:
        return None
    try:
        b = json.loads(Path(path).read_text())
    except OSError as e:
        raise PretokError(f"cannot read: {e.strerror}", path) from None
    except ValueError:
        raise PretokError("not a JSON file (expected `pretok bench tokenize --json` output)", path) from None
    if not isinstance(b, dict) or not isinstance(b.get("methods"), dict):
        raise PretokError("not a `pretok bench tokenize --json` result (no 'methods')", path)
    return b


def _is_empty(fig: Any) -> bool:
    """A figure `plotting.empty_figure` made: no traces, only its message."""
    return not fig.data and fig.layout.xaxis.visible is False


def failures_html(runs: Sequence[Any]) -> str:
    """The runs that did not complete, each with its error or problems, for the first screen ('' if none)."""
    bad = [r for r in runs if r.status != "completed"]
    if not bad:
        return ""
    e = html.escape
    items = "".join(f"<li><b>{e(r.run_id)}</b> [{e(r.status)}]: "
                    f"{e(r.error or '; '.join(r.problems) or 'no error recorded')}</li>" for r in bad)
    return (f'<section id="failures" style="color:#b30"><h2>{len(bad)} of {len(runs)} runs did not complete</h2>'
            f"<ul>{items}</ul><p>Their partial numbers are in the runs table and marked in the figures; no finding "
            "uses them.</p></section>")


def runs_table_html(runs: Sequence[Any], target_loss: float | None = None) -> str:
    """Every run with its numbers (`metrics.summary_table`), as an HTML table."""
    from .metrics import SUMMARY_COLUMNS, summary_table
    from .plotting import PERCENT, percent_text
    from .text import format_value

    e = html.escape
    rows = summary_table(runs, target_loss=target_loss)

    def cell(k: str, v: Any) -> str:
        return percent_text(v) if k in PERCENT and isinstance(v, float) else format_value(v)

    head = "".join(f"<th>{e(c.replace('_', ' '))}</th>" for c in SUMMARY_COLUMNS)
    body = "".join(f'<tr class="run" data-run-id="{e(str(r["run_id"]))}" data-status="{e(str(r["status"]))}">'
                   + "".join(f"<td>{e(cell(c, r[c]))}</td>" for c in SUMMARY_COLUMNS) + "</tr>" for r in rows)
    return (f'<section id="runs"><h2>All runs</h2><div style="overflow-x:auto"><table class="runs" '
            f'style="border-collapse:collapse;font-size:0.85em"><tr>{head}</tr>{body}</table></div></section>')


def report_html(runs: Sequence[Any], figs: dict[str, Any], title: str, bench: dict | None = None,
                target_loss: float | None = None, source: str = "") -> str:
    """The whole report as one HTML page: title, failures, findings (with intervals), figures with captions, runs."""
    from ..study.findings import findings_html, study_findings
    from ..study.measured import study_measures
    from ..study.present import figure_anchor
    from .captions import caption_html, runs_device

    dev = runs_device(runs)
    measured = study_measures(Path(source or "."), {}, runs)
    where = "measured on CPU" if dev["cpu"] else "measured on the runs' devices"
    subtitle = (f"{len(runs)} runs from {source}, {where}. Every number is recomputed from the runs' metrics.jsonl; "
                "each links to its figure below. Values: median [interval] (n repeats).")
    findings = findings_html(study_findings(runs, bench, [], ()), subtitle, measured["findings"],
                             measured["machine"], measured["too_short"])
    parts, first = [], True
    for name, fig in figs.items():
        if name == "runs_status" or _is_empty(fig):
            continue
        parts.append(f'<h3 id="{figure_anchor(name)}">{html.escape(name.replace("_", " "))}</h3>'
                     + fig.to_html(full_html=False, include_plotlyjs=first)
                     + caption_html(name, dev["cpu"], dev["cpus"]))
        first = False
    skipped = [n for n, f in figs.items() if _is_empty(f)]
    note = (f"<p><small>Not shown (nothing to draw for these runs): {html.escape(', '.join(skipped))}.</small></p>"
            if skipped else "")
    return "\n".join(["<!DOCTYPE html>", '<html><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
                      "</head><body style=\"font-family:sans-serif;max-width:1200px;margin:auto\">",
                      f"<h1>{html.escape(title)}</h1>", failures_html(runs), findings, "<h2>Figures</h2>", *parts,
                      note, runs_table_html(runs, target_loss), "</body></html>"])


def build_report(runs_dir: str | Path, out: str | Path | None = None, *, target_loss: float | None = None,
                 bench: str | Path | None = None, png: bool = False, title: str | None = None) -> dict[str, Path]:
    """Figures and report.html for every run under `runs_dir` (default out: RUNS_DIR/report). Bad input (no such
    directory, no runs, an unreadable benchmark) is a PretokError before anything is written; report.html is
    written last, atomically."""
    from . import load_runs
    from .figures import all_figures
    from .report import save_figures

    root = Path(runs_dir)
    if not root.is_dir():
        raise PretokError("no such runs directory", root)
    out = Path(out) if out is not None else root / REPORT_DIR
    b = _bench(bench)
    runs = load_runs(root)
    if not runs:
        raise PretokError("holds no runs (no directory with run.json, metrics.jsonl or launcher.json under it)", root)
    figs = all_figures(runs, bench=b, target_loss=target_loss)
    saved = save_figures(figs, out / "figures", png=png)
    page = report_html(runs, figs, title or f"Runs in {root}", b, target_loss, str(root))
    atomic_write_text(out / "report.html", page)
    return {"report": out / "report.html", **{name: p["html"] for name, p in saved.items()}}
