"""The report's first screen: the study's findings in numbers, each beside what the original study found and
linked to its figure further down (`#fig-<name>`, notebook 05). Computed from the study directory (runs,
benchmark JSON, dataset manifests) when the report is assembled."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.captions import runs_device
from ..datapaths import BASELINE, PACKING_PAIRS, PADDED, STUDY_PRETOKENIZED

# What the original study (the one this project reproduces) found, as recorded in this project's issues and
# README; where it gave no number, its claim in words. None: it did not measure this.
ORIGINAL: dict[str, str | None] = {
    "tokenization": "Central finding: a large speedup of tokenization in isolation becomes a small speedup in "
                    "training (no figure recorded here).",
    "stall": None,
    "packing": "~75% of padded slots were padding and ~0.15% of packed labels masked (short documents): packing "
               "could gain up to ~4x effective tokens/s.",
    "storage": "zstd-22 compressed parquet slowed the training reads.",
    "scaling": "Ran DDP on CSCS Alps (4 GPUs per node, up to 4 nodes); no efficiency figure recorded here.",
    "mfu": None,
}


ORIGINAL_NOTE = ("The original study: the study of on-the-fly against pretokenized data loading that this project "
                 "reproduces (its two baselines, its padded layout, configs/study.yaml's model); its column gives what "
                 "it found as recorded in this project's README and issues, for comparison with your numbers.")


@dataclass
class Finding:
    """One line of the findings block: what was asked, this study's numbers (None: not measured), the original
    study's figure or claim, the figure it links to and a note (e.g. what CPU runs cannot show)."""

    key: str
    question: str
    value: str | None
    figure: str
    original: str | None = None
    note: str = ""
    context: str = ""   # what no repeated measurement gives (a prediction, a count): shown beside the measured lines


def _x(v: float | None) -> str:
    return "-" if v is None else f"x{v:.3g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else "0%" if v == 0 else f"{v:.2%}" if v < 0.01 else f"{v:.1%}"


def _mean(vals: Sequence[float]) -> float | None:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _span(vals: Sequence[float], fmt) -> str:
    lo, hi = min(vals), max(vals)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi).lstrip('x')}"


def tokenization_finding(bench: Mapping | None, runs: Sequence[Any]) -> str | None:
    """Isolated speedup (engine vs per-document loop) against the in-training one, per pretokenized path."""
    from ..analysis import tokenization_speedups

    rows = tokenization_speedups(bench, runs)
    parts = []
    for pre in STUDY_PRETOKENIZED:   # the packed and the padded layout
        mine = [r for r in rows if r["pretok"] == pre]
        if not mine:
            continue
        iso = mine[0]["isolated"]
        tr = [r["training"] for r in mine if r["training"] is not None]
        parts.append(f"{pre} vs {mine[0]['on_the_fly']}: {_x(iso)} in isolation → "
                     + (f"{_span(tr, _x)} in training" if tr else "not trained on both"))
    return "; ".join(parts) or None


def _completed(runs: Sequence[Any]) -> list[Any]:
    from ..analysis import all_metrics

    return [m for m in all_metrics(runs) if m.status == "completed"]


def _smallest_world(ms: list[Any]) -> list[Any]:
    ws = min((m.world_size for m in ms if m.world_size), default=None)
    return [m for m in ms if m.world_size == ws]


def _path_comparison(runs: Sequence[Any], key: str) -> tuple[str | None, dict[str, float]]:
    """Mean `key` per data path over the completed runs at the smallest world size, in the group of runs equal
    but for the data path that compares the most paths (a precision or micro-batch variant of one path is not
    averaged in, as the figures keep it a bar of its own); the group's label when there are other groups."""
    from ..analysis import path_speedups

    ids = {m.run_id for m in _smallest_world(_completed(runs))}
    rows = [r for r in path_speedups([r for r in runs if r.run_id in ids], BASELINE, key) if r["value"] is not None]
    groups = list(dict.fromkeys(r["group"] for r in rows))
    if not groups:
        return None, {}
    main = max(groups, key=lambda g: sum(r["group"] == g for r in rows))   # the first of the largest
    return (main if len(groups) > 1 else None), {r["data_kind"]: r["value"] for r in rows if r["group"] == main}


def stall_finding(runs: Sequence[Any], prediction: Sequence[Mapping] = ()) -> str | None:
    """Measured data stall per data path (smallest world size, the data-path comparison's runs:
    `_path_comparison`), and the stall predicted on the first accelerator of `prediction` (rows of
    `analysis.stall.predict`) at its MFU range, best worker count per path."""
    group, stall = _path_comparison(runs, "data_stall")
    text = (f"({group}) " if group else "") + ", ".join(f"{k} {_pct(v)}" for k, v in stall.items())
    if prediction:
        text = (f"measured: {text}; " if text else "") + stall_prediction_text(prediction)
    return text or None


def stall_prediction_text(prediction: Sequence[Mapping]) -> str:
    """The stall predicted on the first accelerator of `prediction` at its middle MFU, best worker count per path
    (a model's output, not a repeated measurement: no interval)."""
    if not prediction:
        return ""
    acc = prediction[0]["accelerator"]
    best: dict[str, float] = {}
    for r in (r for r in prediction if r["accelerator"] == acc):
        mid = r["stall_mid"]   # the stall at the middle MFU (not the mean of the ends: it is not linear)
        best[r["path"]] = min(best.get(r["path"], 1.0), mid)
    return f"predicted on one {acc} (best worker count): " + ", ".join(f"{k} {_pct(v)}" for k, v in best.items())


def packing_finding(runs: Sequence[Any]) -> str | None:
    """Effective tokens/s packed over padded, on the fly and pretokenized, with the padding share of the padded
    path."""
    from ..analysis import path_speedups

    rows = path_speedups(runs, BASELINE, "effective_tokens_per_s")
    parts = []
    for packed, padded in PACKING_PAIRS:
        ratios = []
        for g in dict.fromkeys(r["group"] for r in rows):
            vals = {r["data_kind"]: r["value"] for r in rows if r["group"] == g}
            if vals.get(packed) and vals.get(padded):
                ratios.append(vals[packed] / vals[padded])
        if ratios:
            parts.append(f"{packed} / {padded} {_span(ratios, _x)}")
    if parts:
        parts[0] = "effective tokens/s " + parts[0]
    if pad := padding_text(runs):
        parts.append(pad)
    return "; ".join(parts) or None


def padding_text(runs: Sequence[Any]) -> str:
    """The padding share of the padded path's batches (a count over the batches, not a timing)."""
    pad = _path_comparison(runs, "padding_frac")[1].get(PADDED)
    return "" if pad is None else f"padded rows are {_pct(pad)} padding"


def storage_finding(rows: Sequence[Mapping]) -> str | None:
    """Bytes on disk per token per format (range over the parquet codecs), and the HF Arrow cache."""
    by: dict[str, list[Mapping]] = {}
    for r in rows:
        if r.get("bytes_per_token"):
            by.setdefault(r["format"], []).append(r)
    parts = []
    for fmt, rs in by.items():
        rs = sorted(rs, key=lambda r: r["bytes_per_token"])
        if len(rs) == 1:
            parts.append(f"{fmt} {rs[0]['bytes_per_token']:.3g}")
        else:
            parts.append(f"{fmt} {rs[0]['bytes_per_token']:.3g} ({rs[0].get('compression') or 'none'})"
                         f" – {rs[-1]['bytes_per_token']:.3g} ({rs[-1].get('compression') or 'none'})")
    return ("bytes/token: " + ", ".join(parts)) if parts else None


def scaling_finding(runs: Sequence[Any]) -> str | None:
    """DDP scaling efficiency per data path at the largest world size measured."""
    from ..analysis import scaling_efficiency

    rows = [r for r in scaling_efficiency(runs)
            if r["efficiency"] is not None and r["world_size"] != r["base_world_size"]]
    if not rows:
        return None
    top = max(r["world_size"] for r in rows)
    by: dict[str, list[float]] = {}
    for r in rows:
        if r["world_size"] == top:
            by.setdefault(r["data_kind"] or "?", []).append(r["efficiency"])
    from .measured import threads_per_rank, threads_text

    ids = [i for r in scaling_efficiency(runs) for i in r["runs"]]
    return (f"efficiency at {top} ranks ({threads_text(threads_per_rank(runs, ids))}): "
            + ", ".join(f"{k} {_span(v, lambda e: f'{e:.0%}')}" for k, v in by.items()))


def mfu_finding(runs: Sequence[Any]) -> str | None:
    """MFU range over the completed runs, and the peak it divides by."""
    ms = [m for m in _completed(runs) if m.mfu is not None]
    if not ms:
        return None
    peak = peak_text(ms)
    return f"{_span([m.mfu for m in ms], _pct)} over {len(ms)} runs" + (f"; {peak}" if peak else "")


def peak_text(ms: Sequence[Any]) -> str:
    """The peak the MFU divides by (the first of the runs' peak sources)."""
    sources = list(dict.fromkeys(m.peak_source for m in ms if getattr(m, "peak_source", None)))
    return (f"peak: {sources[0]}" + (f" (+{len(sources) - 1} more)" if len(sources) > 1 else "")) if sources else ""


def study_findings(runs: Sequence[Any], bench: Mapping | None, storage: Sequence[Mapping],
                   prediction: Sequence[Mapping] = ()) -> list[Finding]:
    """The six findings of the first screen, from the completed runs (a failed run's partial numbers would skew
    the means it joins)."""
    from .measured import split_measurable

    dev = runs_device(runs)
    runs = split_measurable(runs)[0]   # completed, and not too short to measure
    cores = dev["cpus"] or "few"
    cpu_stall = ("CPU runs: the model step is slow, so loaders keep up; the GPU prediction is the number that "
                 "matters." if dev["cpu"] else "")
    return [
        Finding("tokenization", "Tokenization speedup: in isolation vs in training", tokenization_finding(bench, runs),
                "tokenization_speedup", ORIGINAL["tokenization"]),
        Finding("stall", "Data stall per data path (share of the step waiting for data)",
                stall_finding(runs, prediction), "stall_prediction" if prediction else "data_stall",
                ORIGINAL["stall"], cpu_stall, stall_prediction_text(prediction)),
        Finding("packing", "Packing gain (effective tokens/s packed vs padded)", packing_finding(runs), "throughput",
                ORIGINAL["packing"], context=padding_text(runs)),
        Finding("storage", "Storage per format", storage_finding(storage), "storage", ORIGINAL["storage"]),
        Finding("scaling", "DDP scaling efficiency", scaling_finding(runs), "ddp_scaling", ORIGINAL["scaling"],
                f"CPU runs: gloo ranks share {cores} cores, so this is not GPU scaling." if dev["cpu"] else ""),
        Finding("mfu", "MFU (model FLOP/s over the device's peak)", mfu_finding(runs), "mfu", ORIGINAL["mfu"],
                "CPU runs: against this CPU's measured matmul peak." if dev["cpu"] else "",
                peak_text(_completed(runs))),
    ]


def measured_text(m: Mapping[str, Any]) -> str:
    """One machine-readable finding as text: the value with its interval and n, then "invalid measurement:
    <reason>" or "not resolved at this noise (±x%) — ~N repeats would resolve it" where it applies."""
    if m.get("value") is None:   # with the reason it was not, where one is known (a skipped baseline)
        why = m.get("reason") if m.get("reason") not in (None, "", "not measured") else ""
        return f"{m['question']}: not measured" + (f" — {why}" if why else "")
    fmt = _pct if m.get("unit") == "fraction" else (lambda v: f"x{v:.3g}") if m.get("unit") == "x" else \
        (lambda v: f"{v:.3g}")
    lo, hi = m.get("interval") or (m["value"], m["value"])
    text = f"{m['question']}: {fmt(m['value'])} [{fmt(lo)}, {fmt(hi)}] (n={m['n']})"
    if not m.get("valid", True):
        return f"{text} — invalid measurement: {m['reason']}"
    if m.get("flagged"):   # kept, marked: runs the machine probe found not quiet (docs/MEASURING.md)
        text += f" — noisy machine: runs {', '.join(m['flagged'])} flagged by the probe"
    return f"{text} — {m['reason']}" if not m.get("resolved") and m.get("reason") else text


def failure_html(record: Mapping[str, Any]) -> str:
    """The first screen's alarm when the study did not finish (a notebook failed, was stopped, or never recorded
    its end): which notebook, its error, what that leaves out and how to go on; "" when every notebook completed.
    (Before, the report of a study whose notebook 01 failed opened with "(0 s)" and "not measured" findings, the
    error far below.)"""
    bad = {n: r for n, r in (record.get("notebooks") or {}).items() if r.get("status") != "completed"}
    if not bad:
        return ""
    e = html.escape
    items = "".join(f'<li><a href="#{e(n)}"><b>{e(n)}</b></a> {e(str(r.get("status")))}: '
                    f'<code>{e(_one_line(r.get("error") or "no error recorded"))}</code></li>' for n, r in bad.items())
    return ('<div class="study-failed" style="border:2px solid #b30;padding:0.4em 0.8em;margin:0.5em 0">'
            '<p style="color:#b30;margin:0"><b>This study did not finish.</b> The notebooks after the one that '
            "failed did not run: the findings below lack what they would have measured (\"not measured\"). Fix "
            f"the cause and rerun the same command; completed steps are reused.</p><ul>{items}</ul></div>")


def _one_line(text: Any, limit: int = 600) -> str:
    """`text` on one line (an HTML block in a markdown cell ends at a blank line), at most `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def findings_html(findings: Sequence[Finding], subtitle: str = "", measured: Sequence[Mapping] = (),
                  machine: Mapping | None = None, too_short: Sequence[str] = (), failure: str = "") -> str:
    """The findings as one HTML block (`<section id="findings">`, no blank lines: it stays one block inside a
    markdown cell): whether the machine was quiet (`machine`, study.json's), then a table of question, this
    study's numbers, the original study, and a link to the figure. `measured` (study.json's `findings`) gives
    each row its values with intervals, in place of the row's summary text (an invalid one says so, never giving
    the number as a finding), and the row's `context` beside them.
    `too_short`: the ids of runs too short to measure (named, left out of every number); `failure`: the alarm of
    a study that did not finish (`failure_html`), first."""
    from ..machine.probe import machine_line
    from .measured import ROW, too_short_text

    e = html.escape
    rows = []
    for f in findings:
        mine = [m for m in measured if ROW.get(str(m["id"]).split(".")[0]) == f.key]
        lines = "".join(f'<br><span class="measured" data-valid="{str(m.get("valid", True)).lower()}" '
                        f'data-resolved="{str(m.get("resolved")).lower()}">{e(measured_text(m))}</span>'
                        for m in mine)
        # measured lines (each with its interval and n) replace the summary text, whose spans carry no interval;
        # what no repetition measures (a prediction, a count) stays beside them
        if mine:
            value = lines.removeprefix("<br>") + (f"<br>{e(f.context)}" if f.context else "")
        else:
            value = e(f.value) if f.value else "<i>not measured in this study</i>"
        note = f'<br><small style="color:#8a5a00">{e(f.note)}</small>' if f.note else ""
        orig = e(f.original) if f.original else '<span style="color:#888">no figure</span>'
        rows.append(f'<tr class="finding" data-key="{f.key}"><td><b>{e(f.question)}</b></td>'
                    f'<td class="finding-value">{value}{note}</td><td>{orig}</td>'
                    f'<td><a href="#fig-{f.figure}">{e(f.figure.replace("_", " "))}</a></td></tr>')
    style = "border-collapse:collapse;font-size:0.92em;width:100%"
    head = "<tr>" + "".join(f'<th style="text-align:left;width:{w}">{t}</th>' for t, w in (
        ("Question", "20%"), ("This study", "42%"), ("The original study", "28%"), ("Figure", "10%"))) + "</tr>"
    quiet = (machine or {}).get("quiet")
    color = {True: "#2a6", False: "#b30", None: "#888"}[quiet]
    return "\n".join(['<section id="findings"><h2>Findings</h2>', failure,
                      f'<p class="machine" data-quiet="{str(quiet).lower()}" style="color:{color}">'
                      f"{e(machine_line(machine))}</p>",
                      f'<p class="too-short" style="color:#b30">{e(too_short_text(too_short))}</p>' if too_short else "",
                      f"<p>{e(subtitle)}</p>" if subtitle else "",
                      f'<p class="original-note"><small>{e(ORIGINAL_NOTE)}</small></p>',
                      f'<table style="{style}">', head, *rows, "</table></section>"]).replace("\n\n", "\n")


def study_runs(study_dir: str | Path, params: Mapping[str, Any]) -> list[Any]:
    """The runs notebook 05 compares: those of the study's last sweep (`sweep_prefix`, `results.sweep_runs`)."""
    from .steps import StudyPaths, sweep_runs

    return sweep_runs(StudyPaths(Path(study_dir)), params.get("sweep_prefix", "sweep"))


def findings_of_study(study_dir: str | Path, params: Mapping[str, Any], runs: Sequence[Any] | None = None
                      ) -> list[Finding]:
    """`study_findings` from a study directory and its parameters (sweep prefix, stall-prediction target)."""
    from ..analysis import storage_rows
    from ..analysis.stall import study_prediction
    from .steps import StudyPaths, dataset_dirs, read_bench, resolve

    paths = StudyPaths(Path(study_dir))
    runs = study_runs(study_dir, params) if runs is None else runs
    tok, loaders = read_bench(paths, "tokenize"), read_bench(paths, "loaders")
    prediction = []
    if loaders and params.get("target_config"):
        prediction = study_prediction(loaders, resolve(params["target_config"]), vocab=params.get("target_vocab"),
                                      seq_len=params.get("target_seq_len"),
                                      mfu=params.get("target_mfu") or (0.35, 0.45),
                                      cores_per_rank=params.get("cores_per_rank"))["rows"]
    return study_findings(runs, tok, storage_rows(dataset_dirs(paths), tok), prediction)


def findings_cell(study_dir: str | Path, record: Mapping[str, Any]) -> str:
    """The report's findings block (HTML for a markdown cell) for a study directory and its `study.json`
    record: the machine the runs saw, then `findings_html`."""
    params = record.get("parameters") or {}
    runs = study_runs(study_dir, params)
    dev = runs_device(runs)
    where = ("measured on CPU" + (f" ({dev['cpus']} cores, gloo DDP)" if dev["cpus"] else "")
             + ": GPU stalls come from the stall prediction" if dev["cpu"] else "measured on the runs' devices")
    subtitle = (f"Profile {record.get('profile')}, {len(runs)} training runs, {where}. Every number is recomputed "
                "from the study directory; each links to its figure below. Values: median [interval] (n repeats).")
    if "findings" not in record:
        from .measured import study_measures

        record = {**record, **study_measures(study_dir, params, runs)}
    return findings_html(findings_of_study(study_dir, params, runs), subtitle, record.get("findings") or (),
                         record.get("machine"), record.get("too_short") or (), failure_html(record))
