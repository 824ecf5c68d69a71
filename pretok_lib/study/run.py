"""`pretok study`: execute notebooks 01-05 with papermill into the study directory, then export one HTML report.

The notebooks and configs come from the study's home (home.py: the current project, else the package data of an
installed pretok); everything is written under the study directory (`--out`), the notebooks' working directory.
Here: which notebooks run with which parameters, and running them; the record and the report: reporting.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PretokError
from ..launch import procs
from .budget import refit
from .home import NOTEBOOKS, default_out, is_home, kernel_environment, study_home
from .kernels import encrypted_kernel_channels
from .measured import study_measures
from .profiles import check_parameters, check_runs, profile_parameters
from .reporting import (  # noqa: F401
    TITLES,
    _ended,
    _now,
    combined_notebook,
    figure_counts,
    png_hint,
    ran,
    read_record,
    remove_report,
    summary,
    write_record,
    write_report,
)
from .steps import ROOT, resolve
from .stopping import Stop as _Stop

NOTEBOOK_DIR = ROOT / "notebooks"  # the source tree's; a study runs its home's (notebook_dir)
_SOURCE_NOTEBOOKS = NOTEBOOK_DIR
KERNEL = "pretok"
# made absolute against the caller's cwd
PATH_PARAMETERS = ("corpus", "tokenizer", "config", "target_config", "gpu_study")


def notebook_dir() -> Path:
    """The notebooks a study runs: its home's (home.study_home), else the source tree's (NOTEBOOK_DIR, which a
    caller may replace)."""
    if NOTEBOOK_DIR == _SOURCE_NOTEBOOKS and is_home(home := study_home()):
        return home / "notebooks"
    return NOTEBOOK_DIR


def select(notebooks: Sequence[str] | None) -> list[str]:
    """Notebook names from prefixes (`01`, `03_train`, ...), in study order."""
    if not notebooks:
        return list(NOTEBOOKS)
    chosen = []
    for want in notebooks:
        hits = [n for n in NOTEBOOKS if n.startswith(want)]
        if len(hits) != 1:
            raise PretokError(f"'{want}' names no single study notebook ({', '.join(NOTEBOOKS)})")
        chosen.append(hits[0])
    return [n for n in NOTEBOOKS if n in chosen]


def declared_parameters(notebook: str | Path) -> set[str]:
    """Names assigned in the notebook's cell tagged `parameters`."""
    import papermill

    return set(papermill.inspect_notebook(str(notebook)))


def execute(name: str, out_dir: Path, params: dict[str, Any], kernel: str, stream: bool,
            ended: Callable[[], None] = lambda: None) -> float:
    """Run one notebook with papermill (cwd: the study directory) into `out_dir/notebooks/<name>.ipynb`;
    `ended()` is called when its execution ends (a cell failed, or the last code cell ran), before papermill shuts
    the kernel down."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    src, dst = notebook_dir() / f"{name}.ipynb", out_dir / "notebooks" / f"{name}.ipynb"
    dst.parent.mkdir(parents=True, exist_ok=True)
    mine = {k: v for k, v in params.items() if k in declared_parameters(src)}
    last = _last_code_cell_id(src)
    t0 = time.monotonic()
    try:
        papermill.execute_notebook(str(src), str(dst), parameters=mine, kernel_name=kernel, cwd=str(out_dir),
                                   progress_bar=False, stdout_file=sys.stdout if stream else None,
                                   stderr_file=sys.stderr if stream else None,
                                   on_cell_error=lambda **_: ended(),
                                   on_cell_executed=lambda cell, **_: last and cell.get("id") == last and ended(),
                                   **encrypted_kernel_channels())
    except PapermillExecutionError as e:
        raise PretokError(f"cell {e.exec_count} failed: {e.ename}: {e.evalue} (executed notebook kept)", dst) from None
    return time.monotonic() - t0


def _last_code_cell_id(notebook: Path) -> str | None:
    """The id of the notebook's last non-empty code cell (nbclient runs no hook for empty ones); None without
    cell ids (nbformat < 4.5): such a notebook's end is then told only by a failing cell."""
    import nbformat

    cells = [c for c in nbformat.read(str(notebook), as_version=4).cells if c.cell_type == "code" and c.source.strip()]
    return cells[-1].get("id") if cells else None


def absolute_paths(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """`parameters` with relative PATH_PARAMETERS made absolute against the current directory (the notebooks run
    in the study directory). Kept as given where nothing is found there but a path under the study's home
    (`configs/small.yaml`: home.py) or, for a tokenizer, nothing local at all (a hub name)."""
    out = dict(parameters)
    for key in PATH_PARAMETERS:
        value = out.get(key)
        if isinstance(value, list):   # corpus: several inputs (files, globs)
            out[key] = [_absolute(key, v) for v in value]
        elif isinstance(value, (str, os.PathLike)) and str(value):
            out[key] = _absolute(key, value)
    return out


def _absolute(key: str, value: Any) -> Any:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        return value
    here = Path(value).expanduser().resolve()
    if here.exists() or not (key == "tokenizer" or resolve(Path(value).expanduser()).exists()):
        return str(here)
    return value


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def study_parameters(profile: str, overrides: Mapping[str, Any], names: Sequence[str], previous: dict | None,
                     out_dir: Path, takes: Mapping[str, set[str]]) -> tuple[dict[str, Any], dict[str, list]]:
    """The parameters for running `names` into `out_dir`, and those changed since its record (name: [was, now]).

    With no recorded notebook kept (a first or a full run): the profile's with `overrides`. A partial rerun: the
    recorded parameters with `overrides`. Refused (PretokError) if the record is of another profile, if
    executed notebooks would be kept without a record, or if a changed parameter is taken by no notebook rerun,
    by a kept notebook, or by a rerun notebook that a kept later one built on."""
    fresh = profile_parameters(profile, dict(overrides))
    fresh["study_dir"] = str(out_dir)
    if previous is None:
        others = [n for n in NOTEBOOKS if n not in names and (out_dir / "notebooks" / f"{n}.ipynb").is_file()]
        if others:
            raise PretokError(f"executed notebooks ({', '.join(others)}) but no study.json to tell their "
                              "parameters: rerun every notebook (no --notebooks), or give another --out", out_dir)
        return fresh, {}
    if previous.get("profile", profile) != profile:
        raise PretokError(f"this study directory holds a study of profile '{previous['profile']}' (study.json): "
                          f"rerun it with --profile {previous['profile']}, or give another --out", out_dir)
    was = {k: v for k, v in (previous.get("parameters") or {}).items() if k != "study_dir"}
    kept = [n for n in NOTEBOOKS if n in previous.get("notebooks", {}) and n not in names]
    if not kept:
        return fresh, {k: [was.get(k), _plain(v)] for k, v in fresh.items()
                       if k in was and k != "study_dir" and _plain(v) != was[k]}
    now = {k: fresh[k] for k in overrides}
    changed = {k: [was.get(k), _plain(v)] for k, v in now.items() if _plain(v) != was.get(k)}
    bad = []
    for k, (old, new) in changed.items():
        rerun = [n for n in names if k in takes[n]]
        mixed = [m for m in kept if k in takes[m] or any(NOTEBOOKS.index(m) > NOTEBOOKS.index(n) for n in rerun)]
        if not rerun:
            bad.append(f"{k}={new!r} (recorded {old!r}): none of {', '.join(names)} takes it")
        elif mixed:
            bad.append(f"{k}={new!r} (recorded {old!r}): {', '.join(mixed)} ran with the recorded value or on "
                       "its results")
    if bad:
        raise PretokError("a partial rerun would mix parameters with the notebooks it keeps: " + "; ".join(bad)
                          + ". Rerun those notebooks too, drop the --set, or give another --out", out_dir)
    return {**fresh, **was, **now, "study_dir": str(out_dir)}, changed


def run_study(profile: str = "quick", out: str | Path | None = None, notebooks: Sequence[str] | None = None,
              parameters: dict[str, Any] | None = None, kernel: str = KERNEL, report: bool = True,
              stream: bool = True, echo: Callable[[str], None] | None = print,
              publish: str | Path | None = None) -> dict:
    """Execute the study notebooks in order with `profile`'s parameters (plus `parameters`), write
    `study.json` and the HTML report (`report_nocode.html` for readers, `report.html` with code); returns the
    study record. The first failing notebook stops the study (its partly executed copy is kept and reported).
    Notebooks and configs come from the study's home (home.py); everything is written under `out` (the
    notebooks' working directory; figures in `out/figures`), nothing into the home or the install. `publish`: a
    directory the figures are also copied to, as `publish/<study dir name>/` (None: not copied).
    A rerun of some notebooks keeps the others' records (`study_parameters` says which parameters it takes)
    and reports every notebook of the study.

    Args:
        profile: a name in study.profiles.PROFILES; out: the study dir (None: runs/study-<profile> of the current
            project, else of the current directory; relative: to the current directory).
        notebooks: the subset to run (None: all, in order); parameters: overrides of the profile's values (relative
            paths in PATH_PARAMETERS: to the current directory).
        kernel: the Jupyter kernel; report: write the HTML reports; stream: print the cells' output as they run.
        echo: where progress lines go (None: silent); publish: where figures are copied (None: not copied).
    """
    from ..analysis.report import ensure_kernel

    say = echo or (lambda s: None)
    overrides = dict(parameters or {})
    out_dir = Path(out).expanduser().resolve() if out else default_out(profile)
    names = select(notebooks)
    home, nb_dir = study_home(), notebook_dir()
    missing = [n for n in NOTEBOOKS if not (nb_dir / f"{n}.ipynb").is_file()]
    if missing:
        raise PretokError(f"no study notebook(s) {', '.join(missing)} here: run pretok study in a pretok project "
                          "(with notebooks/), or install pretok from a wheel, which ships them", nb_dir)
    takes = {n: declared_parameters(nb_dir / f"{n}.ipynb") for n in NOTEBOOKS}
    unknown = sorted(set(overrides) - set().union(*takes.values()))
    if unknown:
        raise PretokError(f"no study notebook has parameter(s) {', '.join(unknown)}")
    if "study_dir" in overrides:  # every notebook gets --out's directory: a --set of it was silently dropped
        raise PretokError(f"study_dir is the study directory, --out: give --out {overrides['study_dir']}")
    check_parameters(overrides)          # as given: before a path is resolved (a NUL byte: not taken, one line)
    overrides = absolute_paths(overrides)
    previous = read_record(out_dir)
    params, changed = study_parameters(profile, overrides, names, previous, out_dir, takes)
    fitted = refit(params, say)    # study/budget.py: the runs' model sized for their time budgets
    check_runs(params, names)      # the training runs of notebooks 03 and 04: refused now, not in a cell later
    if fitted:
        say(f"== {fitted}")
    out_dir.mkdir(parents=True, exist_ok=True)
    ensure_kernel(kernel)
    now = _now()
    if changed:
        say("== parameters changed since the recorded study: "
            + "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items()))
    history = [*(previous or {}).get("history", []), {"started": now, "notebooks": names,
                                                      **({"changed": changed} if changed else {})}]
    record: dict[str, Any] = {"profile": profile, "study_dir": str(out_dir), "home": str(home), "parameters": params,
                              "started": now,
                              "notebooks": {n: _ended(r) for n, r in (previous or {}).get("notebooks", {}).items()
                                            if n in NOTEBOOKS and n not in names},
                              "history": history}
    # From here the directory no longer holds the study its old report and record describe: the report goes, and the
    # record says which notebooks are running, so a stop or a kill -9 leaves no complete-looking stale report.
    for n in names:
        record["notebooks"][n] = {"status": "running", "run": now}
    remove_report(out_dir)
    write_record(out_dir, record)
    t0, started = time.monotonic(), time.time()
    failure = None
    stop = _Stop()
    with procs.stop_signals(stop), kernel_environment(home):    # until study.json says where a stop left it
        for name in names:
            stop.done.clear()    # cleared first: a stop that comes now still interrupts this notebook
            if stop.signum:
                failure = procs.Stopped(f"study stopped by {stop.name} before {name}: rerun the same command to "
                                        "continue", out_dir)
                break
            say(f"== pretok study ({profile}): {name}")
            try:
                stop.cuttable = True    # a second stop signal now raises KeyboardInterrupt in here (see _Stop)
                secs = execute(name, out_dir, params, kernel, stream, ended=stop.notebook_ended)
            except BaseException as e:  # after a stop signal, whatever the interrupted kernel or papermill raises
                stop.cuttable = False
                if not (stop.signum or isinstance(e, PretokError)):
                    raise
                failure = e
            finally:
                stop.cuttable = False
            if stop.signum:
                stop.notebook_ended()
                failure = procs.Stopped(f"study stopped by {stop.name} during {name}: the runs it had started "
                                        f"checkpointed and stopped; rerun the same command to continue", out_dir)
                record["notebooks"][name] = {"status": "stopped", "error": str(failure), "run": now,
                                             **({"cut": stop.cut} if stop.cut else {})}
                break
            if failure is not None:
                record["notebooks"][name] = {"status": "failed", "error": str(failure), "run": now}
                break
            record["notebooks"][name] = {"status": "completed", "seconds": round(secs, 1), "run": now}
            write_record(out_dir, record)     # a kill -9 later loses no completed notebook
            say(f"== {name}: done in {secs:.0f} s")
        stop.notebook_ended()
        record["notebooks"] = {n: r for n in NOTEBOOKS if (r := record["notebooks"].get(n))
                               and r.get("status") != "running"}        # not reached, after a failure or a stop
        record.update(finished=_now(), seconds=round(time.monotonic() - t0, 1))
        if stop.signum:      # no report of a study stopped half-way; study.json says where it stopped
            if not isinstance(failure, procs.Stopped):    # after its last notebook
                failure = procs.Stopped(f"study stopped by {stop.name} before its report: rerun the same command to "
                                        "continue", out_dir)
            write_record(out_dir, record)
            raise failure
    record["figures"] = figure_counts(out_dir / "figures", started)
    try:
        record.update(study_measures(out_dir, record.get("parameters") or {}))   # findings, machine (issue 34)
        if report:
            executed = [n for n in record["notebooks"] if (out_dir / "notebooks" / f"{n}.ipynb").is_file()]
            record["report"] = {k: str(v) for k, v in write_report(out_dir, executed, record).items()}
        if publish is not None and (out_dir / "figures").is_dir():
            dest = Path(publish).expanduser().resolve() / out_dir.name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(out_dir / "figures", dest)
            record["published_figures"] = str(dest)
    finally:  # what the notebooks did is recorded even when the report or the copy fails (disk full, ...)
        write_record(out_dir, record)
    say(summary(out_dir, record))
    if failure is not None:
        raise failure
    return record
