"""What notebook 05 shows beside the figures: the study's runs, its benchmark results and findings in numbers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..datapaths import BASELINE, ON_THE_FLY, PADDED, PADDING_FREE, PRETOK_MEMMAP, PRETOKENIZED

if TYPE_CHECKING:
    from .steps import StudyPaths


SWEEP_RECORD = "sweep.json"  # in the study directory: the run ids of notebook 04's last sweep, per prefix


def select_runs(runs: Sequence[Any], prefix: str = "") -> list:
    """The runs whose id starts with `prefix-` (all of them for an empty prefix)."""
    return [r for r in runs if not prefix or r.run_id.startswith(f"{prefix}-")]


def record_sweep(paths: StudyPaths, prefix: str, run_ids: Sequence[str]) -> None:
    """Note which runs the study's sweep holds now (written before it runs), so runs of an earlier sweep with
    other parameters, left in runs/ under other ids, are not compared with them."""
    from ..atomic import atomic_write_json

    try:
        record = json.loads((paths.root / SWEEP_RECORD).read_text())
    except (OSError, ValueError):
        record = {}
    record = record if isinstance(record, dict) else {}
    record[prefix] = list(run_ids)
    paths.root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(paths.root / SWEEP_RECORD, record)


def sweep_runs(paths: StudyPaths, prefix: str = "sweep") -> list:
    """The runs notebook 05 compares: those of the study's last sweep with this prefix, as `record_sweep` noted
    them (every `prefix-*` run for a study from before the record; every run for an empty prefix)."""
    from ..analysis import load_runs

    runs = select_runs(load_runs(paths.runs) if paths.runs.is_dir() else [], prefix)
    try:
        ids = json.loads((paths.root / SWEEP_RECORD).read_text()).get(prefix) if prefix else None
    except (OSError, ValueError, AttributeError):
        ids = None
    if ids is None:
        return runs
    order = {run_id: i for i, run_id in enumerate(ids)}
    return sorted((r for r in runs if r.run_id in order), key=lambda r: order[r.run_id])


def png_available() -> bool:
    """Whether PNGs can be written (kaleido needs a Chromium); says why not."""
    from ..analysis.report import find_chromium

    try:
        find_chromium()
        return True
    except RuntimeError as e:
        print(f"no PNGs: {e}")
        return False


def read_bench(paths: StudyPaths, name: str) -> dict | None:
    """`bench/<name>.json` (tokenize, loaders) if notebook 01/02 wrote it."""
    try:
        return json.loads((paths.bench / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def bench_figures(paths: StudyPaths) -> dict:
    """The benchmark figures of notebooks 01 and 02, by file name (for `save_figures`)."""
    from . import plots

    figs = {}
    if tok := read_bench(paths, "tokenize"):
        figs["tokenize_throughput"] = plots.tokenize_bench_figure(tok)
    if ld := read_bench(paths, "loaders"):
        figs["loader_throughput"] = plots.loader_bench_figure(ld)
        figs["compression"] = plots.compression_figure(ld)
    return figs


def _x(v: float | None) -> str:
    return "-" if v is None else f"x{v:.3g}"


def findings(runs: Sequence[Any], paths: StudyPaths) -> str:
    """The study's answer in numbers (markdown): tokenization and loading in isolation, then in training
    (effective tokens/s per data path relative to the on-the-fly padded baseline, and the data-stall share)."""
    from ..analysis import all_metrics, path_speedups

    out = ["### Findings", ""]
    tok, ld = read_bench(paths, "tokenize"), read_bench(paths, "loaders")
    if tok:
        m = tok["methods"]
        loop = next((r for k, r in m.items() if k.startswith("(a)")), None)
        eng = max((r for k, r in m.items() if k.startswith("(d) engine memmap")), key=lambda r: r["mb_per_s"],
                  default=None)
        if loop and eng:
            out.append(f"- **Tokenizing** (isolated): the engine writes memmap at {eng['mb_per_s']:.3g} MB/s, the "
                       f"per-document on-the-fly loop runs at {loop['mb_per_s']:.3g} MB/s "
                       f"({_x(eng['mb_per_s'] / loop['mb_per_s'])}).")
    if ld:
        r = ld["loaders"]
        best = {k: max((v for n, v in r.items() if v.get("kind") == k), key=lambda v: v["tokens_per_s"], default=None)
                for k in (PADDED, PADDING_FREE, PRETOK_MEMMAP)}
        ceil = next((v for n, v in r.items() if n.startswith("ref: raw memmap")), None)
        mm, pad = best[PRETOK_MEMMAP], best[PADDED]
        if mm and pad:
            out.append(f"- **Loading** (isolated, best worker count): {PRETOK_MEMMAP} "
                       f"{mm['tokens_per_s'] / 1e6:.3g} M tokens/s, "
                       f"{_x(mm['tokens_per_s'] / pad['tokens_per_s'])} the on-the-fly "
                       f"padded path" + (f", {_x(mm['tokens_per_s'] / ceil['tokens_per_s'])} "
                                         "nanoGPT's raw-memmap get_batch" if ceil else "") + ".")
    ms = [m for m in all_metrics(runs) if m.status == "completed"]
    if ms:
        rows = path_speedups(runs, BASELINE, "effective_tokens_per_s")
        stall = {m.run_id: m.data_stall for m in ms}
        groups = dict.fromkeys(r["group"] for r in rows if r["baseline_value"] is not None)  # comparable groups
        out += ["", ("**In training** (effective tokens/s: labels that count, per second; data stall: share of the "
                     "step spent waiting for batches):"), "",
                "| runs | data path | effective tokens/s | x padded | data stall |", "|---|---|---:|---:|---:|"]
        for g in groups:
            for r in (r for r in rows if r["group"] == g):
                st = [stall[i] for i in r["runs"] if stall.get(i) is not None]
                value = "-" if r["value"] is None else f"{r['value']:,.0f}"
                stalled = "-" if not st else f"{sum(st) / len(st):.1%}"
                out.append(f"| {g or '-'} | {r['data_kind']} | {value} | {_x(r['speedup'])} | {stalled} |")
        worst = max((m.data_stall for m in ms if m.data_stall is not None and m.data_kind and
                     m.data_kind in PRETOKENIZED), default=None)
        otf = max((m.data_stall for m in ms if m.data_stall is not None and m.data_kind in ON_THE_FLY),
                  default=None)
        if worst is not None:
            verdict = "is not" if worst < 0.05 else "may be"
            out += ["", f"With pretokenized data the data path **{verdict}** the bottleneck here: at most "
                        f"{worst:.1%} of a step waits for data" + (f" (on-the-fly paths: up to {otf:.1%})."
                                                                   if otf is not None else ".")]
    failed = [r.run_id for r in runs if r.status != "completed"]
    if failed:
        out += ["", f"Not completed ({len(failed)}): {', '.join(failed)} (see the runs table)."]
    return "\n".join(out) if len(out) > 2 else "No benchmark results or runs yet."
