"""What the study notebooks do, one function per step; the notebooks only call these and show the results.

A study directory holds everything one study made (see `StudyPaths`); relative paths given to these functions
are resolved against the repository root, so a notebook gives the same results from `notebooks/` (JupyterLab)
and from the repository root (papermill, `pretok study`). `pretok study` makes the paths its caller gives (relative
to the caller's directory) absolute before the notebooks get them (`run.absolute_paths`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..datapaths import BY_NAME, DEFAULT, PRETOK_PADDED
from ..errors import PretokError
from .datasets import (FORMATS, HELDOUT_FORMATS, KIND_OF, TRAIN_COMPRESSION, bench_tokenize, data_paths, eval_path,
                       hf_baselines_skipped, prepare_corpus, pretokenize_all, variant_name)
from .results import bench_figures, findings, png_available, read_bench, record_sweep, select_runs, sweep_runs

ROOT = Path(__file__).resolve().parents[2]


def resolve(path: str | os.PathLike) -> Path:
    """An absolute path; a relative one is taken relative to the study's home (home.py: the current project, else
    the installed package's notebooks and configs), not the notebook's cwd (the study directory)."""
    from .home import study_home

    p = Path(path).expanduser()
    return p if p.is_absolute() else (study_home() / p).resolve()


@dataclass(frozen=True)
class StudyPaths:
    """Layout of a study directory."""

    root: Path

    @property
    def data(self) -> Path:  # corpus, tokenizer, pretokenized datasets, datasets.json
        return self.root / "data"

    @property
    def bench(self) -> Path:  # tokenize.json, loaders.json and their work dirs
        return self.root / "bench"

    @property
    def runs(self) -> Path:  # one directory per training run (docs/RUNS.md)
        return self.root / "runs"

    @property
    def figures(self) -> Path:  # the analysis figures, HTML + PNG
        return self.root / "figures"

    @property
    def datasets_json(self) -> Path:
        return self.data / "datasets.json"


def study_paths(study_dir: str | os.PathLike) -> StudyPaths:
    p = StudyPaths(resolve(study_dir))
    p.root.mkdir(parents=True, exist_ok=True)
    return p


def notebook_setup(study_dir: str | os.PathLike) -> StudyPaths:
    """First cell of every study notebook: offline-rendering plotly (survives nbconvert), quiet progress bars,
    wide pandas tables; returns the study directory's paths."""
    import warnings

    import pandas as pd

    from ..analysis.report import setup_notebook_plotting

    warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm in a kernel without ipywidgets
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    setup_notebook_plotting()
    pd.set_option("display.max_colwidth", 80)
    pd.set_option("display.width", 200)
    paths = study_paths(study_dir)
    print(f"study directory: {paths.root}")
    return paths


# ---------------------------------------------------------------- 01: corpus, tokenizer, pretokenized datasets
# prepare_corpus, pretokenize_all, bench_tokenize, ...: datasets.py (imported above)


def load_datasets(paths: StudyPaths) -> dict:
    """The dataset index written by notebook 01 (`pretokenize_all`)."""
    try:
        return json.loads(paths.datasets_json.read_text())
    except OSError:
        raise PretokError("no dataset index: run notebook 01_pretokenize with this study_dir first",
                          paths.datasets_json) from None


def inspect_all(index: Mapping) -> dict[str, str]:
    """`pretok inspect` text of every dataset variant."""
    from ..engine.verify import format_inspect, inspect

    return {name: format_inspect(inspect(v["path"])) for name, v in index["variants"].items()}


def storage_table(index: Mapping) -> list[dict]:
    """One row per dataset variant: documents, tokens, MB on disk, bytes/token, padding share."""
    from ..engine.verify import inspect

    rows = []
    for name, v in index["variants"].items():
        s = inspect(v["path"])["stats"]
        rows.append({"dataset": name, "format": v["format"], "compression": v["compression"] or "-",
                     "documents": s["documents"], "tokens": s["tokens"], "MB": round(s["disk_bytes"] / 1e6, 3),
                     "bytes/token": round(s["bytes_per_token"], 3),
                     "padding": f"{s['padding_fraction']:.1%}" if "padding_fraction" in s else "-"})
    return rows


# ---------------------------------------------------------------- 02: loaders


def bench_loaders(paths: StudyPaths, index: Mapping, micro_batch: int = 8, workers: str = "0,2", batches: int = 200,
                  slow_batches: int = 20, repeats: int = 1, compressions: Sequence[str] | None = None,
                  pace_ms: float = 0.0, paced_batches: int = 8) -> dict:
    """`pretok bench loaders` on the study's datasets (reused from notebook 01: same directory layout; in
    `bench/loaders-data/` where notebook 01's BOS/EOS policy is not the benchmark's, auto/no, which would otherwise
    rebuild the datasets the runs train on): the five data paths at each DataLoader worker count vs the raw-memmap
    ceiling, then the parquet codecs; JSON in `bench/loaders.json`.

    Args:
        paths, index: the study's directories and notebook 01's dataset index.
        micro_batch: samples per batch; workers: DataLoader worker counts (comma separated).
        batches, slow_batches: timed batches for the fast and the on-the-fly paths; repeats: rounds.
        compressions: parquet codecs compared (None: those notebook 01 wrote).
        pace_ms, paced_batches: > 0: each path also called `paced_batches` times once per `pace_ms` (about the
            training runs' step time), for notebook 05's check of the stall model (bench/loaders_paced.py).
    """
    from ..bench.loaders import LoadersBench, run
    from .selfcheck import quiet_targets

    comps = [v["compression"] for v in index["variants"].values() if v["compression"]]
    comps = list(dict.fromkeys(comps)) if compressions is None else list(compressions)
    own = (index.get("bos", "auto"), index.get("eos", "no")) == ("auto", "no")
    with quiet_targets():   # pretok's own targets, not about the data: notebook 02 shows them folded
        return run(LoadersBench(corpus=index["corpus"], tokenizer=index["tokenizer"],
                                workdir=str(paths.data if own else paths.bench / "loaders-data"),
                                seq_len=index["seq_len"], micro_batch=micro_batch, workers=workers,
                                batches=batches, slow_batches=slow_batches, repeats=repeats,
                                read_repeats=max(1, repeats), compressions=",".join(comps),
                                pace_ms=pace_ms, paced_batches=paced_batches,
                                json=str(paths.bench / "loaders.json")))


# ---------------------------------------------------------------- 03, 04: training runs


def run_overrides(index: Mapping, eval_batches: int | None = None) -> dict[str, Any]:
    """Overrides every study run shares: tokenizer, sequence length, the datasets' BOS/EOS policy (for the on-the-fly
    paths, which tokenize as notebook 01 did), validation on the held-out documents' memmap dataset
    (`datasets.eval_path`: never trained on; the same reader for every data path, so losses compare; the padded
    paths also on their own layout: `study_grid` links `own_eval_overrides` to the data path)."""
    over: dict[str, Any] = {"data.tokenizer": index["tokenizer"], "data.seq_len": index["seq_len"],
                            "data.bos": index.get("bos", "auto"), "data.eos": index.get("eos", "no"),
                            "eval.kind": DEFAULT, "eval.path": eval_path(index, DEFAULT)}
    if eval_batches is not None:
        over["eval.batches"] = eval_batches
    return over


def own_eval_overrides(index: Mapping, kind: str) -> dict[str, Any]:
    """The second validation of a data path that is not packed (padded, pretok-padded: one document per row): on
    the held-out documents' pretok-padded dataset, its own layout (`val_loss_own`, beside `val_loss` on packed
    windows, which alone compares a padded run unfairly); none for the packed paths."""
    if kind not in BY_NAME or BY_NAME[kind].packed:
        return {}
    return {"eval.own_kind": PRETOK_PADDED, "eval.own_path": eval_path(index, PRETOK_PADDED)}


def study_grid(index: Mapping, axes: Mapping[str, Sequence[Any]], base: Mapping[str, Any] | None = None,
               prefix: str = "sweep"):
    """A sweep `Grid` over the study's datasets: `data.path` follows the data path (`data` axis or base), and so
    does the padded paths' own-layout validation (`own_eval_overrides`; linked, so the run ids stay as they were)."""
    from ..launch.sweep import ALIASES, Grid

    merged = {**run_overrides(index), **{ALIASES.get(k, k): v for k, v in (base or {}).items()}}
    linked = {"data": {kind: {"data.path": p, **own_eval_overrides(index, kind)}
                       for kind, p in index["paths"].items()}}
    if "data" not in axes and "data.kind" not in axes:
        kind = merged.setdefault("data.kind", DEFAULT)
        merged["data.path"] = index["paths"][kind]
    return Grid(axes={k: list(v) for k, v in axes.items()}, base=merged, linked=linked, prefix=prefix)


def train_one(paths: StudyPaths, index: Mapping, config: str, data_kind: str = DEFAULT, world: int = 1,
              overrides: Mapping[str, Any] | None = None, prefix: str = "train", timeout_s: float | None = None):
    """One training run (as its own process) of `config` on the study's `data_kind` dataset; returns
    `(point, status)`. A completed run with the same id and config is not repeated; one of another config (the
    study's parameters changed since) is run again, like the datasets.

    Args:
        paths, index: the study's directories and dataset index; config: the training config (name or path).
        data_kind: the data path; world: ranks; overrides: dotted config keys; prefix: of the run id.
        timeout_s: stop the run after this long (None: no limit).
    """
    from ..launch.sweep import run_sweep

    [(point, status)] = run_sweep(resolve(config), train_points(index, data_kind, world, overrides, prefix),
                                  paths.runs, timeout_s=timeout_s, changed="rerun")
    return point, status


def train_points(index: Mapping, data_kind: str = DEFAULT, world: int = 1,
                 overrides: Mapping[str, Any] | None = None, prefix: str = "train") -> list:
    """The one point of `train_one`."""
    return study_grid(index, {}, {"data.kind": data_kind, "world": world, **(overrides or {})}, prefix).points()


def run_study_sweep(paths: StudyPaths, index: Mapping, config: str, grids: Iterable[Mapping[str, Sequence[Any]]],
                    base: Mapping[str, Any] | None = None, launcher: str = "local", prefix: str = "sweep",
                    timeout_s: float | None = None, repeats: int = 1) -> list:
    """Every grid in `grids` (axes dicts) on the same base; points shared by two grids run once, `repeats`
    times each in interleaved rounds (`repeated_points`); a grid's own `"repeats"` key (not an axis) sets its
    points' (the most of its grids for a shared point). Returns `(point, status)` for every run.

    Args:
        paths, index: the study's directories and dataset index; config: the training config (name or path).
        grids: axes dicts; base: dotted config keys shared by every point; launcher: local or slurm.
        prefix: of the run ids; timeout_s: per run (None: no limit); repeats: runs per point (> 1: ids -r<k>).
    """
    from ..launch.sweep import run_sweep

    points = repeated_points(sweep_points(index, grids, base, prefix), repeats, point_repeats(index, grids, base,
                                                                                            prefix, repeats))
    record_sweep(paths, prefix, [p.run_id for p in points])  # notebook 05 compares these runs, no older ones
    return run_sweep(resolve(config), points, paths.runs, launcher, timeout_s=timeout_s, changed="rerun")


def sweep_points(index: Mapping, grids: Iterable[Mapping[str, Sequence[Any]]], base: Mapping[str, Any] | None = None,
                 prefix: str = "sweep") -> list:
    """The distinct points of `run_study_sweep`, in order (a point two grids share once)."""
    points, seen = [], set()
    for axes in grids:
        for p in study_grid(index, grid_axes(axes), base, prefix).points():
            if p.run_id not in seen:
                seen.add(p.run_id)
                points.append(p)
    return points


def grid_axes(grid: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep grid's axes: the grid less its `repeats` key."""
    return {k: v for k, v in grid.items() if k != "repeats"}


def point_repeats(index: Mapping, grids: Iterable[Mapping[str, Any]], base: Mapping[str, Any] | None = None,
                  prefix: str = "sweep", repeats: int = 1) -> dict[str, int]:
    """Run id -> repeats of each point of `sweep_points`: its grid's `repeats` key, else `repeats`; the most of
    the grids that share a point."""
    out: dict[str, int] = {}
    for g in grids:
        for p in study_grid(index, grid_axes(g), base, prefix).points():
            out[p.run_id] = max(out.get(p.run_id, 0), int(g.get("repeats", repeats)))
    return out


def repeated_points(points: Sequence[Any], repeats: int, per_point: Mapping[str, int] | None = None) -> list:
    """Each point `repeats` times (`per_point[run_id]` where given), in rounds with the order rotated (A B C,
    B C A, ...: a shared machine drifts slowly, so back-to-back repeats would confound the point with the time);
    round k holds the points repeated more than k times. Ids are suffixed -r<k> when any point repeats, as they
    are when none does."""
    from dataclasses import replace

    from ..bench.repeats import rotated

    counts = [max(1, (per_point or {}).get(p.run_id, repeats)) for p in points]
    if max(counts, default=1) <= 1:
        return list(points)
    out = []
    for k in range(max(counts)):
        now = [(p, c) for p, c in zip(points, counts) if c > k]
        out += [replace(p, repeat=k if c > 1 else None) for p, c in rotated(now, k)]
    return out


def dataset_dirs(paths: StudyPaths) -> list[str]:
    """Every pretokenized dataset of the study (for the storage figure)."""
    try:
        return [v["path"] for v in load_datasets(paths)["variants"].values()]
    except PretokError:
        return []


def require_completed(results: Sequence[tuple[Any, str]], paths: StudyPaths) -> None:
    """Raise (with the end of its launcher.log) if a run did not complete: a notebook cell then fails."""
    from ..launch.sweep import tail

    bad = [p for p, s in results if s == "failed"]
    if bad:
        logs = "\n".join(f"--- {p.run_id}\n{tail(paths.runs / p.run_id / 'launcher.log', 15)}" for p in bad)
        raise PretokError(f"{len(bad)} run(s) failed: {', '.join(p.run_id for p in bad)}\n{logs}")


__all__ = ["FORMATS", "HELDOUT_FORMATS", "KIND_OF", "ROOT", "TRAIN_COMPRESSION", "StudyPaths", "bench_figures",
           "bench_loaders", "bench_tokenize", "data_paths", "dataset_dirs", "eval_path", "findings", "grid_axes",
           "hf_baselines_skipped", "inspect_all", "load_datasets", "notebook_setup", "own_eval_overrides",
           "png_available", "point_repeats", "prepare_corpus", "pretokenize_all", "read_bench", "require_completed",
           "resolve", "run_overrides", "run_study_sweep", "record_sweep", "repeated_points", "select_runs",
           "storage_table", "study_grid", "study_paths", "sweep_points", "sweep_runs", "train_one", "train_points",
           "variant_name"]
