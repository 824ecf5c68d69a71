"""The study's findings as data (study.json `findings` and `machine`, docs/MEASURING.md): each a median with its
interval and n, resolved or not against "no effect", valid or an invalid measurement naming its runs. The
report's first screen (`findings.findings_html`) is built from them.

Samples: the tokenize benchmark's paired rounds (isolated speedup); for the training comparisons, runs paired by
their repeat suffix (`-r<k>`) within a group of runs equal but for the compared setting, else one ratio of means
per group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..analysis.uncertainty import (Estimate, check_efficiency, check_fraction, check_isolated_speedup, check_times,
                                    estimate, finding)
from ..datapaths import BASELINE, PACKING_PAIRS, PRETOK_PAIRS, STUDY_PRETOKENIZED

_REPEAT = re.compile(r"-r(\d+)$")
# A completed run with fewer logged steps than this after its warm-up (`log.skip_steps`) is "too short to measure":
# its rates rest on too few steps (issue 34: a 1-rank run's tokens/s was the mean of 2 steps), so it gives no
# number to any finding and the first screen names it (docs/MEASURING.md). Same default as `bench train`.
MIN_MEASURED_STEPS = 3

# finding id prefix -> the first-screen row (findings.Finding.key) it belongs to
ROW = {"tokenization": "tokenization", "loaders": "tokenization", "stall": "stall", "packing": "packing",
       "time_to_target": "tokenization", "scaling": "scaling", "mfu": "mfu"}


def _by_repeat(ids: Sequence[str], values: Mapping[str, float | None]) -> dict[str, float]:
    return {m.group(1): values[i] for i in ids if (m := _REPEAT.search(i)) and values.get(i) is not None}


def paired_samples(num_ids: Sequence[str], den_ids: Sequence[str], values: Mapping[str, float | None]) -> list[float]:
    """Ratios num/den: per repeat suffix present on both sides, else the ratio of the two sides' means."""
    a, b = _by_repeat(num_ids, values), _by_repeat(den_ids, values)
    common = [k for k in a if k in b and b[k]]
    if common:
        return [a[k] / b[k] for k in common]
    na = [values[i] for i in num_ids if values.get(i) is not None]
    nb = [values[i] for i in den_ids if values.get(i) is not None]
    if na and nb and sum(nb):
        return [(sum(na) / len(na)) / (sum(nb) / len(nb))]
    return []


def measured_steps(run: Any) -> int:
    """Logged steps of `run` after its warm-up records (0 when it logged no more than the warm-up)."""
    from ..analysis.metrics import skip_of

    n = len(run.train)
    skip = skip_of(run)
    return n - skip if n > skip else 0


def split_measurable(runs: Sequence[Any], min_steps: int = MIN_MEASURED_STEPS) -> tuple[list[Any], list[str]]:
    """(the completed runs with >= `min_steps` measured steps, the ids of the completed runs too short to measure)."""
    done = [r for r in runs if r.status == "completed"]
    return [r for r in done if measured_steps(r) >= min_steps], [r.run_id for r in done
                                                                 if measured_steps(r) < min_steps]


def too_short_text(ids: Sequence[str]) -> str:
    return (f"too short to measure (< {MIN_MEASURED_STEPS} steps after the warm-up, no number from them): runs "
            + ", ".join(ids)) if ids else ""


def threads_per_rank(runs: Sequence[Any], ids: Iterable[str]) -> list[int | None]:
    """The distinct torch threads per rank (run.json `torch_threads`; None: not recorded) of the runs `ids`."""
    want = set(ids)
    return sorted({r.info.get("torch_threads") for r in runs if r.run_id in want}, key=lambda t: (t is None, t))


def threads_text(threads: Sequence[int | None]) -> str:
    if len(threads) == 1:
        return "threads per rank not recorded" if threads[0] is None else f"{threads[0]} torch thread{'s' * (threads[0] != 1)} per rank"
    return "torch threads per rank " + "/".join("?" if t is None else str(t) for t in threads)


def check_threads(threads: Sequence[int | None], ids: Sequence[str]) -> str | None:
    """The reason a scaling efficiency is invalid because its world sizes ran unequal threads per rank (issue 34:
    2 threads at 1 rank against 1 at 2 ranks)."""
    known = [t for t in threads if t is not None]
    return (f"unequal torch threads per rank across world sizes ({', '.join(map(str, known))}; runs "
            f"{', '.join(ids)})") if len(known) > 1 else None


def _metric_values(runs: Sequence[Any], key: str) -> dict[str, float | None]:
    from ..analysis import all_metrics

    return {m.run_id: getattr(m, key) for m in all_metrics(runs)}


def _path_ratio(runs: Sequence[Any], num: str, den: str, key: str, values: Mapping[str, float | None] | None = None
                ) -> tuple[Estimate | None, list[str]]:
    """num / den of `key` (or of `values` by run id), paired by repeat within each group of runs equal but for the
    data path."""
    from ..analysis import path_speedups

    rows = path_speedups(runs, BASELINE, key)
    values = _metric_values(runs, key) if values is None else values
    samples, ids = [], []
    for g in dict.fromkeys(r["group"] for r in rows):
        by = {r["data_kind"]: r["runs"] for r in rows if r["group"] == g}
        if num in by and den in by:
            samples += paired_samples(by[num], by[den], values)
            ids += by[num] + by[den]
    return estimate(samples), ids


def time_to_target_speedups(runs: Sequence[Any]) -> list[tuple[str, str, Estimate | None, list[str], float,
                                                              str | None]]:
    """(pretokenized path, its on-the-fly baseline, baseline's time to the target / the path's, runs, target, the
    reason its times cannot be true): the time-to-target speedup, paired by repeat, at the study's target
    (`target_loss_choice`: one every compared run reaches)."""
    from ..analysis import all_metrics
    from ..analysis.metrics import resolve_target_loss

    target = resolve_target_loss(runs)
    if target is None:
        return []
    times = {m.run_id: m.time_to_target_s for m in all_metrics(runs, target_loss=target)}
    inverse = {i: (1 / t if t and t > 0 else None) for i, t in times.items()}
    out = []
    for pre, otf in PRETOK_PAIRS.items():
        e, ids = _path_ratio(runs, pre, otf, "time_to_target_s", inverse)   # (1/t_pre) / (1/t_otf) = t_otf / t_pre
        if ids:
            out.append((pre, otf, e, ids, target, check_times([times.get(i) for i in ids], ids)))
    return out


def bench_loaders(bench: Mapping | None) -> list[tuple[str, str, Estimate | None, list[str]]]:
    """(pretokenized path, its on-the-fly baseline, tokens/s ratio, rows) from the loader benchmark's rounds with
    no DataLoader workers (in-process: the loader's own cost), each round's ratio paired."""
    from ..analysis.uncertainty import paired_ratio

    rows = (bench or {}).get("loaders") or {}
    out = []
    for pre, otf in PRETOK_PAIRS.items():
        a, b = rows.get(f"{pre} w0"), rows.get(f"{otf} w0")
        if a and b:
            xa, xb = a.get("tokens_per_s_all") or [a["tokens_per_s"]], b.get("tokens_per_s_all") or [b["tokens_per_s"]]
            e = paired_ratio(xa, xb) if len(xa) == len(xb) else estimate([a["tokens_per_s"] / b["tokens_per_s"]])
            out.append((pre, otf, e, [f"loader bench {pre} w0 x{len(xa)}", f"{otf} w0 x{len(xb)}"]))
    return out


def bench_ceilings(bench: Mapping | None) -> tuple[Estimate | None, str, str | None]:
    """The tokenizer's in-memory ceiling on n cores over 1 core (paired rounds), its name, and the reason the
    ceilings cannot be true (a ceiling on more cores below one on fewer) from the benchmark's checks."""
    rep = (bench or {}).get("repeats") or {}
    for name, e in (rep.get("ratios") or {}).items():
        if name.startswith("(c) ceiling") and e:
            bad = next((w for w in rep.get("invalid", []) if w.startswith("ceiling on")), None)
            return Estimate(e["median"], *e["interval"], e["n"], e.get("coverage", 0.0), tuple(e["samples"])), \
                name, bad
    return None, "", None


def bench_isolated(bench: Mapping | None) -> tuple[Estimate | None, list[str]]:
    """The isolated tokenization speedup from the tokenize benchmark's paired rounds (one value from a benchmark
    JSON of before the rounds held the loop)."""
    if not bench:
        return None, []
    for name, e in ((bench.get("repeats") or {}).get("ratios") or {}).items():
        if name.startswith("isolated tokenization speedup") and e:
            return Estimate(e["median"], *e["interval"], e["n"], e.get("coverage", 0.0), tuple(e["samples"])), \
                [f"{name} ({e['n']} rounds)"]
    from ..analysis import isolated_tokenization_speedups

    iso = isolated_tokenization_speedups(bench).get("memmap") or {}
    return estimate([iso["speedup"]] if iso.get("speedup") else []), [str(iso.get("engine"))]


def skip_reason(bench: Mapping | None, method: str) -> str:
    """Why the benchmark left `method` out (its JSON's `skipped`: e.g. the baselines that need a HF tokenizer.json,
    with a SentencePiece, tiktoken or tekken tokenizer); "" when it did not."""
    return str(((bench or {}).get("skipped") or {}).get(method) or "")


def measured_findings(runs: Sequence[Any], bench: Mapping | None, flagged: Iterable[str] = (),
                      loaders: Mapping | None = None) -> list[dict]:
    """The findings of study.json (`uncertainty.finding` records), from the completed runs and the tokenize and
    loader benchmarks. A finding drawn from runs is marked with them (`runs`) and with those of them the machine
    probe flagged (`flagged`: kept in the numbers, named as noisy)."""
    from ..analysis import all_metrics, scaling_efficiency

    runs, noisy = split_measurable(runs)[0], set(flagged)
    out: list[dict] = []

    def add(f: dict, ids: Iterable[str]) -> None:
        ids = list(dict.fromkeys(ids))
        out.append({**f, "runs": ids, "flagged": [i for i in ids if i in noisy]})
    iso, ids = bench_isolated(bench)
    out.append(finding("tokenization.isolated", "Tokenization speedup in isolation (engine vs per-document loop)",
                       iso, "x", 1.0, check_isolated_speedup(iso.median if iso else None, ids),
                       note="" if iso else skip_reason(bench, "loop")))
    ceil, name, bad = bench_ceilings(bench)
    if ceil:
        out.append(finding("tokenization.ceiling", f"Tokenizer ceiling scaling: {name}", ceil, "x", 1.0, bad))
    for pre, otf, e, ids in bench_loaders(loaders):
        out.append({**finding(f"loaders.{pre}", f"Loader speedup in isolation: {pre} / {otf} (tokens/s, no workers)",
                              e, "x", 1.0, check_isolated_speedup(e.median if e else None, ids)), "runs": ids})
    for pre, otf in ((k, PRETOK_PAIRS[k]) for k in STUDY_PRETOKENIZED):
        e, ids = _path_ratio(runs, pre, otf, "effective_tokens_per_s")
        if e:
            add(finding(f"tokenization.training.{pre}", f"Tokenization speedup in training: {pre} / {otf}",
                        e, "x", 1.0), ids)
    for num, den in PACKING_PAIRS:
        e, ids = _path_ratio(runs, num, den, "effective_tokens_per_s")
        if e:
            add(finding(f"packing.{num}", f"Packing gain: effective tokens/s {num} / {den}", e, "x", 1.0), ids)
    for pre, otf, e, ids, target, bad in time_to_target_speedups(runs):
        add(finding(f"time_to_target.{pre}", f"Time-to-target speedup: {otf} / {pre} (time to loss {target:.4g})",
                    e, "x", 1.0, bad), ids)
    ms = [m for m in all_metrics(runs)]
    ws = min((m.world_size for m in ms if m.world_size), default=None)
    for kind in dict.fromkeys(m.data_kind for m in ms if m.world_size == ws):
        sel = [m for m in ms if m.world_size == ws and m.data_kind == kind and m.data_stall is not None]
        e = estimate(m.data_stall for m in sel)
        if e:
            bad = check_fraction(max(e.samples), "data stall", [m.run_id for m in sel])
            add(finding(f"stall.{kind}", f"Data stall of {kind} (share of the step waiting for data)", e,
                        "fraction", None, bad), [m.run_id for m in sel])
    every = scaling_efficiency(runs)
    rows = [r for r in every if r["efficiency"] is not None and r["world_size"] != r["base_world_size"]]
    base = [r for r in every if r["world_size"] == r["base_world_size"]]
    top = max((r["world_size"] for r in rows), default=None)
    for r in (r for r in rows if r["world_size"] == top):
        e = estimate([r["efficiency"]])
        ids = [i for x in rows + base if (x["group"], x["data_kind"]) == (r["group"], r["data_kind"])
               for i in x["runs"]]
        threads = threads_per_rank(runs, ids)
        add(finding(f"scaling.{r['data_kind']}", f"DDP scaling efficiency of {r['data_kind']} at {top} ranks"
                    + (f" ({r['group']})" if r["group"] else "") + f", {threads_text(threads)}", e, "fraction",
                    None, check_efficiency(e.median, r["runs"]) or check_threads(threads, ids)), ids)
    sel = [m for m in ms if m.mfu is not None]
    if sel:
        e = estimate(m.mfu for m in sel)
        add(finding("mfu", "MFU (model FLOP/s over the device's peak)", e, "fraction", None,
                    check_fraction(max(e.samples), "MFU", [m.run_id for m in sel if not 0 <= m.mfu <= 1])),
            [m.run_id for m in sel])
    return out


CAUSE_ORDER = ("outside processes", "steal", "host")   # machine_probe.causes


def merge_machines(machines: Iterable[Mapping | None]) -> dict:
    """One machine record from the benchmarks' (and runs') probe summaries: quiet when all probed were."""
    ms = [m for m in machines if m and m.get("quiet") is not None]

    def worst(k: str) -> float | None:
        return max((m[k] for m in ms if m.get(k) is not None), default=None)

    return {"quiet": all(m["quiet"] for m in ms) if ms else None,
            "calibration_drift": worst("calibration_drift"), "outside_cpu_cores": worst("outside_cpu_cores"),
            "loadavg": worst("loadavg"), "steal": worst("steal"),
            "probed_runs": sum(m.get("probed_runs", 0) for m in ms),
            "causes": sorted({c for m in ms for c in m.get("causes", [])}, key=CAUSE_ORDER.index),
            "flagged": [f for m in ms for f in m.get("flagged", [])]}


def run_machine(runs: Sequence[Any]) -> dict:
    """The machine probe summary (`machine_probe.machine`) of the sweep's runs: each run's last launch attempt's
    `probe` (launcher.json, written by the local sweep launcher)."""
    from ..analysis.runs import last_launch
    from ..machine.probe import machine

    return machine(last_launch(Path(r.path)).get("probe") for r in runs)


def study_measures(study_dir, params: Mapping[str, Any], runs: Sequence[Any] | None = None) -> dict:
    """{"findings": [...], "machine": {...}, "too_short": [run ids]} of a study directory: what study.json
    records."""
    from .findings import study_runs
    from .steps import StudyPaths, read_bench

    paths = StudyPaths(Path(study_dir))
    runs = study_runs(study_dir, params) if runs is None else runs
    benches = {k: read_bench(paths, k) for k in ("tokenize", "loaders", "train")}
    probed = run_machine(runs)
    return {"findings": measured_findings(runs, benches["tokenize"], [f["run"] for f in probed["flagged"]],
                                          benches["loaders"]),
            "too_short": split_measurable(runs)[1],
            "machine": merge_machines([*(b.get("machine") for b in benches.values() if b), probed])}
