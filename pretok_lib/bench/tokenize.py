"""`pretok bench tokenize`: per-doc loop vs datasets.map vs in-memory backend ceiling vs the engine, in one run.

Every method sees the same documents (the engine's readers, bad documents dropped); the slow baselines run on a
prefix and all ratios compare MB/s. How each number is measured is printed under the table (NOTES). Peak RSS never
uses ru_maxrss: a spawned process inherits its parent's.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..formats import FORMATS
from ..machine.cpu_affinity import usable_cpus
from .common import (GPT2_REL, BenchConfig, add_common_args, add_output_args, at_least, cached_corpus, check_targets,
                     corpus_repeats_note, environment, from_args, offline, positive, resolve_tokenizer, sizes,
                     write_json)
from .repeats import probed, rotated
from .scaling import scaling, scaling_lines
from .tokenize_methods import (ChildRss, ceiling_parallel, child_ceiling, child_datasets, child_loop, hf_tokenizer,
                               in_child, iter_docs, run_engine, same_as_engine, scan_corpus)
from .tokenize_report import (CEIL, LOOP, MAP, add_intervals, ceil_name, fastest, paired_ratio, phase_name,
                              print_repeats, rates, repeat_summary, table, targets)

SKIPPABLE = ("loop", "datasets-map", "ceiling", "engine-1", "rss-scan", "stages")
NOTES = """\
(a), (b) measured on the first {k} docs ({kmb:.1f} MB), the others on all {docs} docs ({mb:.1f} MB); ratios: MB/s.
(a) HF fast tokenizer, 1 pinned core, ids -> np.uint32 per doc. (b) map(batched, num_proc={n}) + save_to_disk as
    run_clm.py (input_ids + attention_mask; from_parquet excluded). (c) {backend} encode_batch on texts in memory,
    1 pinned core; {n} cores: {n} pinned processes at once on disjoint batches (measured).
    (d) end to end: read + tokenize + write + checksums + manifest; "x ceiling" compares wK with the K-core ceiling.
    (c) and (d): the fastest of --repeat runs. Targets comparing memmap w1, w{n} and the ceilings: the median of
    their ratios within each of the --repeat rounds (one of each, back to back). The w1 -> w{n} speedup target is
    on the engine's tokenizing phase (its steady state, as the ceilings are timed); end to end is shown beside it.
Peak RSS: (a), (c) VmHWM of the process (it holds all its texts); (b) max of its main process and any map worker,
    (d) the largest worker VmHWM recorded in the manifest. tokens/s: text tokens (no BOS/EOS). bytes/token: bytes on disk per
    stored token (BOS/EOS included, padding and truncated tokens excluded)."""


@dataclass
class TokenizeBench(BenchConfig):
    """`pretok bench tokenize`: what is measured, on what, how often."""

    mb: float = 500.0
    workdir: str = "runs/bench/tokenize"
    workers: int = field(default_factory=usable_cpus)  # datasets.map and the engine
    formats: list[str] = field(default_factory=lambda: list(FORMATS))
    skip: list[str] = field(default_factory=list)  # methods left out (SKIPPABLE)
    loop_mb: float = 20.0  # corpus prefix measured by (a) and (b)
    rss_scan: str = "10,100,500,2000"  # corpus MB sizes for the worker-RSS check ('' = off)
    stages_mb: float = 200.0  # text (every k-th row group) each format's stage bound is measured on, per round
    part_mb: float | None = None  # engine --part-mb (None: the engine's)
    batch_mb: float | None = None  # engine --batch-mb, also the ceiling's batch size
    repeat: int = 3  # rounds of the engine, the ceilings and the loop: the table keeps the fastest, targets pair
    probe: bool = True  # machine_probe around every timed run


def add_args(p: argparse.ArgumentParser) -> None:
    """Arguments of `pretok bench tokenize` (defaults: `TokenizeBench`)."""
    d = TokenizeBench()
    add_common_args(p, d, "corpora cache and all outputs")
    p.add_argument("--workers", type=at_least(0), default=d.workers,
                   help=f"N for datasets.map and the engine (default {d.workers})")
    p.add_argument("--formats", nargs="+", default=d.formats, choices=FORMATS)
    p.add_argument("--skip", nargs="*", default=d.skip, choices=SKIPPABLE)
    p.add_argument("--loop-mb", type=positive, default=d.loop_mb, help="corpus prefix measured by (a) and (b)")
    p.add_argument("--rss-scan", type=sizes, default=d.rss_scan,
                   help="corpus MB sizes for the worker-RSS check, smallest to largest ('' = off)")
    p.add_argument("--stages-mb", type=positive, default=d.stages_mb,
                   help="text MB (every k-th row group of the corpus) each format's stage bound is timed on, per round")
    p.add_argument("--part-mb", type=positive, default=d.part_mb, help="engine --part-mb (default: the engine's)")
    p.add_argument("--batch-mb", type=positive, default=d.batch_mb,
                   help="engine --batch-mb, also the ceiling's batch size")
    p.add_argument("--repeats", "--repeat", dest="repeat", type=at_least(1), default=d.repeat,
                   help="time the engine and the ceilings this many times: the table keeps the fastest, the targets "
                        "take the median of the ratios within each round with its interval (noisy machines)")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="no machine probe (calibration, outside CPU) around the timed runs")
    add_output_args(p)


def main(args: argparse.Namespace) -> dict:
    """`pretok bench tokenize`: `run` with the command line's config."""
    return run(from_args(TokenizeBench, args))


def run(cfg: TokenizeBench) -> dict:
    """Measure every method side by side, print the table and targets, write `cfg.json`; returns the results."""
    from ..tokenizer import backends_for, load_tokenizer

    offline()
    work = Path(cfg.workdir)
    work.mkdir(parents=True, exist_ok=True)
    n, skip = max(1, cfg.workers), set(cfg.skip or [])
    tok = resolve_tokenizer(cfg.tokenizer, work)
    info = load_tokenizer(tok)
    backends = backends_for(info)
    corpus = str(Path(cfg.corpus)) if cfg.corpus else str(cached_corpus(work, cfg.mb))
    cinfo = scan_corpus(corpus, int(cfg.loop_mb * 1e6), work / "prefix.parquet")
    cinfo["repeats_note"] = corpus_repeats_note(corpus)
    print(f"corpus {corpus}: {cinfo['documents']} docs, {cinfo['text_bytes'] / 1e6:.1f} MB of text; tokenizer {tok} "
          f"(backends {', '.join(backends)}); N = {n}" + (f"\n  {cinfo['repeats_note']}" if cinfo["repeats_note"]
                                                          else ""), flush=True)
    warm = run_engine(cinfo["prefix_path"], tok, "memmap", n, work / "warm-up", None, cfg.batch_mb)  # untimed:
    shutil.rmtree(warm["out"], ignore_errors=True)  # page cache, imports and lazy inits warm before the first timing
    widths = ([1] if n > 1 and "engine-1" not in skip else []) + [n]
    runs, rounds, ref = _timed_rounds(cfg, corpus, tok, backends[0], n, widths, cinfo["prefix_path"])
    methods = _fastest_methods(runs, cfg.formats, widths, n, cinfo["text_bytes"])
    if LOOP in runs:
        _note(LOOP, r := fastest(runs[LOOP]))
        methods[LOOP] = rates({**r, "ids_identical": runs[LOOP][0].get("ids_identical")}, cinfo["prefix_bytes"])
    if "datasets-map" not in skip:
        _note(MAP, r := in_child(child_datasets, cinfo["prefix_path"], tok, n, str(work), ref))
        methods[MAP] = rates(r, cinfo["prefix_bytes"])
    scan = [] if "rss-scan" in skip else _rss_scan(cfg, tok, n)
    coarse = _coarse_run(cfg, tok, n, scan)
    bounds = None if "stages" in skip else _stage_bounds(cfg, corpus, tok, runs, backends[0])
    tg = targets(methods, n, scan, rounds, bounds)
    repeated = repeat_summary(runs, rounds, cinfo, n)
    add_intervals(tg, rounds, n)
    env = environment()
    print(f"\nCPU: {env['cpu_model']}, {env['cpus']} usable; tokenizer: {tok} (vocab {info.vocab_size})")
    _print_results(methods, cinfo, n, scan, tg, bounds)
    print_repeats(repeated)
    sc = scaling(runs, rounds, cinfo["text_bytes"], n, phase_name(""), scan, coarse)
    print("\n" + "\n".join(scaling_lines(sc)))
    result = {"repeats": repeated, "machine": repeated["machine"],
              "corpus": cinfo, "tokenizer": {"spec": tok, "info": info.to_dict(), "backends": backends},
              "workers": n, "methods": methods, "rounds": rounds, "rss_scan": scan, "coarse_run": coarse,
              "stage_bounds": bounds,
              "targets": tg, "scaling": sc,
              "environment": env,
              "env": {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")},
              "args": cfg.record()}
    write_json(cfg.json, result)
    check_targets(cfg, any(t["pass"] is False for t in tg))
    return result


def _note(name: str, r: dict) -> None:
    print(f"  {name}: {r['seconds']:.2f} s", flush=True)


def _timed_rounds(cfg: TokenizeBench, corpus: str, tok: str, first_backend: str, n: int, widths: list[int],
                  prefix: str | None = None) -> tuple[dict[str, list[dict]], list[dict[str, float]], dict | None]:
    """(every timed run of each method, seconds per round, the engine's memmap output the ids are checked against).

    Rounds: the memmap engine at 1 and N workers, the ceilings on 1 and N cores and the per-document loop (on
    `prefix`) run one after the other, `repeat` times, the order rotated each round and each run probed
    (machine_probe), so the ratios between them are taken within a round (the machine's speed drifts); then the
    other formats."""
    from ..engine.config import TokenizeConfig

    runs: dict[str, list[dict]] = {}
    rounds: list[dict[str, float]] = []
    ref = None  # the engine's memmap output (N workers): the ids every other method is checked against
    batch = int((cfg.batch_mb or TokenizeConfig.batch_mb) * 1e6)

    def engine(fmt: str, w: int) -> dict:
        r = run_engine(corpus, tok, fmt, w, Path(cfg.workdir) / f"engine-{fmt}-w{w}", cfg.part_mb, cfg.batch_mb)
        runs.setdefault(f"(d) engine {fmt} w{w}", []).append(r)
        return r

    def memmap(w: int) -> dict:
        nonlocal ref
        r = engine("memmap", w)
        if w == widths[-1]:
            ref = {"out": r["out"], "bos": r["policy"]["bos_id"], "eos": r["policy"]["eos_id"]}
        return r

    def ceiling(k: int) -> dict:
        backend = next((rs[0]["backend"] for name, rs in runs.items() if name.startswith("(d)")), first_backend)
        return in_child(child_ceiling, corpus, tok, backend, batch, ref if k == 0 else None, 0, 1)

    def parallel() -> dict:
        backend = next((rs[0]["backend"] for name, rs in runs.items() if name.startswith("(d)")), first_backend)
        return ceiling_parallel(corpus, tok, backend, batch, n)

    # one round: these, rotated by the round's number (round 0 in this order: the ids the ceiling and the loop
    # check against come from its memmap run at N workers)
    entries: list[tuple[str, Callable[[int], dict]]] = []
    if "memmap" in cfg.formats:
        entries += [(f"(d) engine memmap w{w}", lambda k, w=w: memmap(w)) for w in widths]
    if "ceiling" not in cfg.skip:
        entries.append((CEIL, ceiling))
        if n > 1:
            entries.append((ceil_name(n), lambda k: parallel()))
    if "loop" not in cfg.skip and prefix:
        entries.append((LOOP, lambda k: in_child(child_loop, prefix, tok, ref if k == 0 else None)))
    for k in range(max(1, cfg.repeat)):
        done = []
        for name, fn in rotated(entries, k):
            r = probed(f"{name}#{k}", lambda fn=fn: fn(k), cfg.probe)
            if name in (CEIL, ceil_name(n), LOOP):
                runs.setdefault(name, []).append(r)
            elif r.get("probe"):
                runs[name][-1] = r
            done.append(name)
        rounds.append({name: runs[name][-1]["seconds"] for name in done})
        rounds[-1].update({phase_name(name): runs[name][-1]["timeline"]["tokenize_seconds"] for name in done
                           if name.startswith("(d) engine memmap")})
        print(f"  round {k + 1}: " + ", ".join(f"{name} {runs[name][-1]['seconds']:.2f} s" for name in done),
              flush=True)
    for fmt in (f for f in cfg.formats if f != "memmap"):
        for w in widths:
            for _ in range(max(1, cfg.repeat)):
                engine(fmt, w)
    return runs, rounds, ref


def _fastest_methods(runs: dict[str, list[dict]], formats: list[str], widths: list[int], n: int,
                     text_bytes: int) -> dict[str, dict]:
    """The fastest run of each engine method and ceiling, with its rates."""
    methods: dict[str, dict] = {}
    for name in [f"(d) engine {fmt} w{w}" for fmt in formats for w in widths] + [CEIL, ceil_name(n)]:
        if name in runs and name not in methods:
            r = fastest(runs[name])
            if name == CEIL:
                r["ids_identical"] = runs[CEIL][0].get("ids_identical")  # checked in the first round
            _note(name, r)
            methods[name] = rates(r, text_bytes)
    return methods


def _rss_scan(cfg: TokenizeBench, tok: str, n: int) -> list[dict]:
    """The engine's worker peak RSS on embedded corpora of growing size (`cfg.rss_scan` MB)."""
    scan: list[dict] = []
    for mb in sorted(float(s) for s in cfg.rss_scan.split(",") if s.strip()):
        path = str(cached_corpus(Path(cfg.workdir), mb))
        r = run_engine(path, tok, "memmap", n, Path(cfg.workdir) / f"rss-{mb:g}mb", cfg.part_mb, cfg.batch_mb)
        shutil.rmtree(r["out"], ignore_errors=True)
        scan.append({"mb": mb, "mb_per_s": mb / r["seconds"], **{k: r[k] for k in (
            "peak_rss_mb", "seconds", "units", "documents", "cpu", "input_bytes")}})
        print(f"  rss scan {mb:g} MB: worker peak {r['peak_rss_mb']} MB, {mb / r['seconds']:.1f} MB/s", flush=True)
    return scan


def _coarse_run(cfg: TokenizeBench, tok: str, n: int, scan: list[dict]) -> dict | None:
    """The scan's largest input again, cut into the plan's largest units (64 MB): with it the main process's CPU per
    unit and per byte can be told apart (`scaling.per_unit`). Only its CPU record and counts are kept."""
    from ..engine.config import MAX_PART_BYTES

    if len(scan) < 2:
        return None
    mb, part_mb = scan[-1]["mb"], MAX_PART_BYTES / 1e6
    r = run_engine(str(cached_corpus(Path(cfg.workdir), mb)), tok, "memmap", n,
                   Path(cfg.workdir) / f"coarse-{mb:g}mb", part_mb, cfg.batch_mb)
    shutil.rmtree(r["out"], ignore_errors=True)
    print(f"  {mb:g} MB in {part_mb:g} MB units: {r['units']} units", flush=True)
    return {"mb": mb, **{k: r[k] for k in ("seconds", "units", "cpu", "input_bytes")}}


def _stage_bounds(cfg: TokenizeBench, corpus: str, tok: str, runs: dict[str, list[dict]], first_backend: str
                  ) -> dict[str, dict] | None:
    """Each format's stages timed on one pinned core in a child (`bench.stages`): the bound (the same batches encoded
    alone / the stages' total) that no engine reading this input and writing this format passes against the
    ceiling."""
    from ..engine.config import TokenizeConfig
    from .stages import bounds

    if not corpus.endswith(".parquet"):  # the stages time the Parquet reader (the embedded corpus, or --corpus)
        print(f"  stages: not timed ({Path(corpus).name} is not Parquet)", flush=True)
        return None
    backend = next((rs[0]["backend"] for name, rs in runs.items() if name.startswith("(d)")), first_backend)
    batch = int((cfg.batch_mb or TokenizeConfig.batch_mb) * 1e6)
    out = in_child(bounds, corpus, tok, backend, list(cfg.formats), max(1, cfg.repeat), batch, cfg.workdir,
                   int(cfg.stages_mb * 1e6))
    for fmt, b in out.items():
        lo, hi = b["bound"]["interval"]
        print(f"  stages {fmt}: {b['total']:.2f} CPU-s/GB, bound {b['bound']['median']:.2f} [{lo:.2f}, {hi:.2f}]",
              flush=True)
    return out


def _print_results(methods: dict[str, dict], cinfo: dict, n: int, scan: list[dict], tg: list[dict],
                   bounds: dict[str, dict] | None = None) -> None:
    """The table, how each number is measured, the RSS scan, the engine's timeline, the targets."""
    b, ceil = methods.get(MAP), methods.get(CEIL)
    print("\n" + table(methods, b["mb_per_s"] if b else None))
    print("\n" + NOTES.format(k=cinfo["prefix_documents"], kmb=cinfo["prefix_bytes"] / 1e6, docs=cinfo["documents"],
                              mb=cinfo["text_bytes"] / 1e6, n=n, backend=ceil["backend"] if ceil else "-"))
    if scan:
        print("engine memmap worker peak RSS by input size: " + ", ".join(
            f"{s['mb']:g} MB -> {s['peak_rss_mb']} MB ({s['units']} units, {s['mb_per_s']:.1f} MB/s)" for s in scan))
    for name, r in methods.items():
        tl = r.get("timeline") or {}
        if name.startswith("(d) engine memmap") and tl.get("tokenize_seconds"):
            times = ", ".join(f"{x:.2f}" for x in r["all_seconds"])
            steady = cinfo["text_bytes"] / 1e6 / tl["tokenize_seconds"]
            print(f"{name} (fastest of {len(r['all_seconds'])}: {times} s): start-up {tl['startup_seconds']:.2f} s, "
                  f"tokenizing {tl['tokenize_seconds']:.2f} s ({steady:.0f} MB/s), finish {tl['finish_seconds']:.2f} s")
    for fmt, b in (bounds or {}).items():
        lo, hi = b["bound"]["interval"]
        print(f"stages of {fmt} on one pinned core, CPU-s per GB of text (median of {b['bound']['n']} rounds): "
              + ", ".join(f"{k} {v:.2f}" for k, v in b["stages"].items())
              + f"; total {b['total']:.2f}; encoding alone {b['alone']:.2f}; bound (alone / total) "
              f"{b['bound']['median']:.3f} [{lo:.3f}, {hi:.3f}]")
    print()
    for t in tg:
        v, status = "n/a" if t["value"] is None else f"{t['value']:.2f}", {True: "PASS", False: "FAIL", None: "info"}
        print(f"  [{status[t['pass']]}] {t['target']}: {v} (need {t['need']}) {t['note']}".rstrip())


__all__ = ["CEIL", "FORMATS", "GPT2_REL", "LOOP", "MAP", "NOTES", "ChildRss", "TokenizeBench",
           "add_args", "cached_corpus", "ceil_name", "ceiling_parallel", "child_ceiling", "child_datasets",
           "child_loop", "fastest", "hf_tokenizer", "in_child", "iter_docs", "main", "paired_ratio", "phase_name",
           "rates", "resolve_tokenizer", "run", "run_engine", "same_as_engine", "scan_corpus", "table", "targets"]
