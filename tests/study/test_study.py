"""The study's pieces without executing notebooks (tests/notebooks/ executes them): profiles, notebook
selection, grids over the study's datasets, path resolution, and the CLI's parameter checks."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main as cli_main
from pretok_lib.errors import PretokError
from pretok_lib.study import PROFILES, profile_parameters, resolve, run_study
from pretok_lib.study.profiles import world_sizes
from pretok_lib.study.run import NOTEBOOKS, select
from pretok_lib.study.steps import ROOT, StudyPaths, findings, study_grid

from ..conftest import one_line

INDEX = {"corpus": "/c.parquet", "tokenizer": "/tok.json", "seq_len": 64,
         "paths": {"padded": "/c.parquet", "padding-free": "/c.parquet", "pretok-padded": "/d/padded-zstd3",
                   "pretok-token-list": "/d/token-list-zstd3", "pretok-memmap": "/d/memmap"},
         "eval": {"pretok-memmap": "/h/memmap", "pretok-padded": "/h/padded-zstd3"}}   # the held-out documents


def test_profiles_resolve_machine_dependent_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert world_sizes(0) == [1] and world_sizes(1) == [1] and world_sizes(4) == [1, 2, 4]
    assert world_sizes(6) == [1, 2, 4, 6]
    monkeypatch.setattr("pretok_lib.study.profiles.gpu_count", lambda: 4)
    full = profile_parameters("full")
    assert full["sweep_grids"][0]["world"] == [1, 2, 4] and full["sweep_grids"][1]["world"] == [4]
    assert full["train_world"] == 4 and full["workers"] >= 1
    assert PROFILES["full"]["sweep_grids"][0]["world"] == "gpus"  # the table itself is not modified
    quick = profile_parameters("quick", {"corpus_mb": 5.0})
    assert quick["corpus_mb"] == 5.0 and [g["world"] for g in quick["sweep_grids"][:2]] == [[1], [2]]
    with pytest.raises(ValueError, match="unknown study profile"):
        profile_parameters("huge")


def test_select_notebooks() -> None:
    assert select(None) == list(NOTEBOOKS)
    assert select(["05", "01"]) == ["01_pretokenize", "05_analysis"]  # always in study order
    assert select(["03_train"]) == ["03_train"]
    with pytest.raises(PretokError, match="names no single"):
        select(["0"])


def test_study_grid_links_each_data_path_to_its_dataset() -> None:
    grid = study_grid(INDEX, {"data": ["padded", "pretok-memmap"], "world": [1, 2]}, {"train.steps": 5})
    points = grid.points()
    assert [p.run_id for p in points] == ["sweep-padded-w1-s64", "sweep-padded-w2-s64", "sweep-pretok-memmap-w1-s64",
                                          "sweep-pretok-memmap-w2-s64"]
    assert [p.get("data.path") for p in points] == ["/c.parquet"] * 2 + ["/d/memmap"] * 2
    p = points[0]
    assert p.get("data.tokenizer") == "/tok.json" and p.get("eval.path") == "/h/memmap" and p.get("train.steps") == 5
    one = study_grid(INDEX, {}, {"data.kind": "pretok-token-list"}, "train").points()
    assert [(q.run_id, q.get("data.path")) for q in one] == [("train-pretok-token-list-w1-s64", "/d/token-list-zstd3")]


@pytest.mark.parametrize("grid", [{"data": list(INDEX["paths"]), "world": [1, 2]}, {"data.kind": ["padded"]},
                                  {"lr": [1e-3, 3e-4]}])
def test_study_grid_validates_padded_points_on_their_own_layout_too(grid) -> None:
    """Points of a path that is not packed (padded, pretok-padded) get the second validation on the study's
    pretok-padded dataset (eval.own_*), packed ones none; run ids are those of the grid without it."""
    from pretok_lib.datapaths import BY_NAME
    from pretok_lib.launch.sweep import expand_grid, point_problem
    from pretok_lib.study.steps import run_overrides

    for base in ({"train.steps": 5}, {"train.steps": 5, "data.kind": "pretok-padded"}):
        if "data.kind" in grid and "data.kind" in base:
            continue
        points = study_grid(INDEX, grid, base).points()
        for p in points:
            padded = not BY_NAME[p.get("data.kind")].packed
            assert p.get("eval.path") == "/h/memmap"             # the packed held-out split every path shares
            assert p.get("eval.own_path") == ("/h/padded-zstd3" if padded else None), p.run_id
            assert p.get("eval.own_kind") == ("pretok-padded" if padded else None), p.run_id
        plain = expand_grid({**run_overrides(INDEX), "data.kind": "pretok-memmap", **base}, grid,
                            linked={"data": {k: {"data.path": v} for k, v in INDEX["paths"].items()}})
        assert [p.run_id for p in points] == [p.run_id for p in plain]
    ones = [study_grid(INDEX, {}, {"data.kind": k}, "train").points()[0] for k in INDEX["paths"]]   # train_one's
    assert {p.get("eval.own_path") for p in ones} == {None, "/h/padded-zstd3"}
    assert all(point_problem(ROOT / "configs" / "tiny.yaml", p) is None for p in ones)   # the trainer takes them


def test_resolve_is_relative_to_the_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve("configs/tiny.yaml") == ROOT / "configs" / "tiny.yaml"
    assert resolve(tmp_path / "x") == tmp_path / "x"
    assert StudyPaths(tmp_path).runs == tmp_path / "runs"


def test_findings_without_results(tmp_path: Path) -> None:
    assert findings([], StudyPaths(tmp_path)) == "No benchmark results or runs yet."


def test_unknown_parameter_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    with pytest.raises(PretokError, match="no study notebook has parameter"):
        run_study("smoke", out=tmp_path / "s", parameters={"no_such": 1}, echo=None)
    assert not (tmp_path / "s" / "notebooks").exists()
    assert cli_main(["study", "--profile", "smoke", "--out", str(tmp_path / "t"), "--set", "nope=1"]) == 1
    assert "no study notebook has parameter(s) nope" in capsys.readouterr().err


STUDY_SCRIPT = """
import sys
from pathlib import Path
import pretok_lib.study.run as r
r.NOTEBOOK_DIR = Path(sys.argv[1])
r.NOTEBOOKS = ("01_sweep", "02_never")
from pretok_lib.cli import main
sys.exit(main(["study", "--profile", "smoke", "--out", sys.argv[2]]))
"""


def _notebooks(tmp_path: Path, config: Path, runs: Path) -> Path:
    """A study of two notebooks: the first runs a sweep of one 2-rank point of the stand-in trainer (sleeping
    300 s); the second must never run."""
    import nbformat

    d = tmp_path / "nb"
    d.mkdir()
    cell = (f"import os\nos.environ['FAKE_SLEEP_S'] = '300'\nfrom pretok_lib.launch.sweep import expand_grid, run_sweep\n"
            f"run_sweep({str(config)!r}, expand_grid({{}}, {{'world': [2]}}), {str(runs)!r}, "
            f"module='tests.fake_train', echo=None)\n")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]), str(d / "01_sweep.ipynb"))
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"open({str(tmp_path / 'ran-02')!r}, 'w').close()")]), str(d / "02_never.ipynb"))
    return d


@pytest.mark.parametrize("sig", ["SIGTERM"])   # SIGINT takes the same path (tested on the sweep)
def test_a_stopped_study_stops_the_runs_of_its_notebook(tmp_path: Path, sig: str) -> None:
    """`pretok study` stopped by SIGTERM (as `timeout` or a scheduler sends it) or SIGINT while a notebook runs
    a sweep: the signal goes study -> kernel -> sweep -> torchrun -> ranks, the run ends `interrupted`, no
    process is left (the kernel included), the next notebook never runs, the study exits 3 with one line."""
    import json
    import os
    import subprocess
    import sys

    import psutil

    config, runs = tmp_path / "cfg.yaml", tmp_path / "runs"
    config.write_text("data:\n  path: no-data-needed\n  tokenizer: none-needed\ntrain:\n  steps: 1\n")
    nb = _notebooks(tmp_path, config, runs)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", STUDY_SCRIPT, str(nb), str(tmp_path / "study")], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rdir = runs / "sweep-w2"
    end = time.monotonic() + 300           # only catches a hang
    while not all((rdir / f"pid.{r}").is_file() for r in range(2)):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.1)
    time.sleep(0.3)
    family = psutil.Process(proc.pid).children(recursive=True)
    assert len(family) >= 4                      # kernel, torchrun, 2 ranks
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=300)
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert proc.returncode == 3, err
    assert len(errors) == 1 and f"study stopped by {sig} during 01_sweep" in errors[0] and "Traceback" not in err
    _, alive = psutil.wait_procs(family, timeout=120)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    assert json.loads((rdir / "run.json").read_text())["status"] == "interrupted"
    assert not (tmp_path / "ran-02").exists()
    record = json.loads((tmp_path / "study" / "study.json").read_text())
    assert record["notebooks"]["01_sweep"]["status"] == "stopped" and "02_never" not in record["notebooks"]


SLOW_TO_STOP = """
import pathlib, signal, time
got = pathlib.Path({got!r})
signal.signal(signal.SIGINT, lambda signum, frame: got.write_text(str(int(got.read_text() or 0) + 1)))
got.write_text("")
time.sleep(300)
"""


def _study_with_a_first_cell(tmp_path: Path, cell: str, script: str, flag: Path):
    """A study of two notebooks (`cell`, then one marking `ran-02`) started by `script` in a process; returns it
    and its process family once the first cell has written `flag`."""
    import os
    import subprocess
    import sys

    import nbformat
    import psutil

    d = tmp_path / "nb"
    d.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]), str(d / "01_sweep.ipynb"))
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"open({str(tmp_path / 'ran-02')!r}, 'w').close()")]), str(d / "02_never.ipynb"))
    proc = subprocess.Popen([sys.executable, "-c", script, str(d), str(tmp_path / "study")],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 300           # only catches a hang: the kernel starts in seconds
    while not flag.is_file():
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.05)
    return proc, psutil.Process(proc.pid).children(recursive=True)


def test_a_second_stop_signal_stops_at_once_in_one_line_and_study_json_says_stopped(tmp_path: Path) -> None:
    """Two SIGINTs (Ctrl-C twice) while a notebook is slow to stop (here its cell takes SIGINT and goes on, as a sweep
    stopping its runs may): the second one printed a traceback and left study.json saying every notebook was
    `running`. Now: one line, exit 3, the notebook `stopped`, the notebooks never reached not in study.json, no
    process left (the kernel included)."""
    import json

    import psutil

    got = tmp_path / "kernel-got-sigint"
    proc, family = _study_with_a_first_cell(tmp_path, SLOW_TO_STOP.format(got=str(got)), STUDY_SCRIPT, got)
    proc.send_signal(signal.SIGINT)
    end = time.monotonic() + 300
    while not got.read_text():             # the study took the first one: it reached the kernel
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "error: " in err and "study stopped by SIGINT during 01_sweep" in err, err
    _, alive = psutil.wait_procs(family, timeout=120)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    record = json.loads((tmp_path / "study" / "study.json").read_text())
    assert {n: r["status"] for n, r in record["notebooks"].items()} == {"01_sweep": "stopped"}
    assert not (tmp_path / "ran-02").exists()


HANGS_AFTER_STOP = """
import pathlib, signal, subprocess, time
signal.signal(signal.SIGINT, signal.SIG_IGN)      # as a kernel that lost its cell's reply: it never ends the cell
child = subprocess.Popen(["sleep", "{child_s}"]) if {child_s} else None
pathlib.Path({started!r}).write_text("")
time.sleep(300)
"""


@pytest.mark.parametrize("child_s", [0, 6])
def test_a_kernel_that_never_ends_its_notebook_after_a_stop_is_cut(tmp_path: Path, child_s: int) -> None:
    """Seen once in CI: SIGTERM to the study, the sweep stopped its runs, then a repeated SIGINT landed in
    ipykernel's handler outside the cell ("KeyboardInterrupt caught in kernel"), the cell's reply was lost and the
    study waited for it for ever. Injected here as a kernel that takes no SIGINT: once it has no child process left
    (a run still stopping is waited for) for CUT_AFTER_S, the study cuts the notebook: exit 3 in one line,
    `stopped` with the reason in study.json, no process left, the next notebook never run."""
    import json

    import psutil

    started = tmp_path / "started"
    script = "import pretok_lib.study.stopping as s; s.CUT_AFTER_S = 2.0\n" + STUDY_SCRIPT
    proc, family = _study_with_a_first_cell(tmp_path, HANGS_AFTER_STOP.format(child_s=child_s, started=str(started)),
                                            script, started)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 3 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "study stopped by SIGTERM during 01_sweep" in err, err
    assert took >= 2.0 + (child_s - 1 if child_s else 0), took   # not before the child ended (its start: < 1 s)
    _, alive = psutil.wait_procs(family, timeout=120)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    record = json.loads((tmp_path / "study" / "study.json").read_text())
    assert list(record["notebooks"]) == ["01_sweep"] and record["notebooks"]["01_sweep"]["status"] == "stopped"
    assert "had no process left" in record["notebooks"]["01_sweep"]["cut"]
    assert not (tmp_path / "ran-02").exists()


@pytest.mark.parametrize("turned_into", [RuntimeError, ImportError, OSError, PretokError])
def test_a_stop_signal_turned_into_another_error_still_stops_the_study(tmp_path: Path, monkeypatch, capsys,
                                                                       turned_into: type) -> None:
    """A SIGTERM while a notebook runs, after which papermill or the interrupted kernel raises an error of its
    own (not papermill's cell failure): the study still ends stopped (one line, exit 3, study.json `stopped`), the
    next notebook never runs; the same error without a signal keeps its usual outcome."""
    import json
    import os

    import nbformat

    import pretok_lib.study.run as r

    d = tmp_path / "nb"
    d.mkdir()
    for name in ("01_first", "02_never"):
        nbformat.write(nbformat.v4.new_notebook(), str(d / f"{name}.ipynb"))
    ran: list[str] = []

    def execute(name, out_dir, params, kernel, stream, ended=None):
        ran.append(name)
        os.kill(os.getpid(), signal.SIGTERM)   # the study's handler remembers it and interrupts the kernel
        time.sleep(0.2)
        raise turned_into("kernel died")

    monkeypatch.setattr(r, "NOTEBOOK_DIR", d)
    monkeypatch.setattr(r, "NOTEBOOKS", ("01_first", "02_never"))
    monkeypatch.setattr(r, "execute", execute)
    monkeypatch.setattr(r.procs, "forward", lambda sig, pids: None)  # no kernel here to interrupt
    monkeypatch.setattr("pretok_lib.analysis.report.ensure_kernel", lambda kernel: None)
    args = ["study", "--profile", "smoke", "--out", str(tmp_path / "s")]
    assert cli_main(args) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "study stopped by SIGTERM during 01_first" in err, err
    assert ran == ["01_first"]
    saved = json.loads((tmp_path / "s" / "study.json").read_text())
    assert saved["notebooks"] == {"01_first": {"status": "stopped", "error": err.split("error: ", 1)[1].strip(),
                                               "run": saved["started"]}}

    def failing(*a, **kw):
        raise turned_into("bad")

    monkeypatch.setattr(r, "execute", failing)
    if turned_into is PretokError:
        assert cli_main(args) == 1
    else:
        with pytest.raises(turned_into):
            r.run_study("smoke", out=tmp_path / "t", echo=None, report=False, publish=None)


@pytest.mark.parametrize("fails,ids", [(True, True), (False, True), (False, False)],
                         ids=["a-cell-fails", "it-completes", "it-completes-without-cell-ids"])
def test_the_end_of_a_notebook_is_told_while_its_kernel_still_runs(fails: bool, ids: bool, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """The stop handler stops interrupting the kernel at `ended` (the interrupted cell failed, or the last cell ran
    although a stop came): it must come before papermill shuts the kernel down (a SIGINT landing in a kernel that
    shuts down prints its traceback under the study's one line; seen once in `make test` under a CPU held to
    1.38 cores), and once: not after each cell. A notebook without cell ids (nbformat 4.4; papermill gives its copy
    ids the source does not have) has no last cell to recognise: never `ended` early, only by a failure."""
    import nbformat

    from pretok_lib.launch import procs
    from pretok_lib.analysis.report import ensure_kernel
    from pretok_lib.study import run as study_run

    cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("raise ValueError('boom')" if fails
                                                                          else "y = 2"),
             nbformat.v4.new_code_cell("z = 3"), nbformat.v4.new_code_cell(""), nbformat.v4.new_markdown_cell("end")]
    nb = nbformat.v4.new_notebook(cells=cells)
    if not ids:
        nb.nbformat_minor = 4
        for c in nb.cells:
            del c["id"]
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    monkeypatch.setattr(study_run, "NOTEBOOK_DIR", tmp_path)
    ensure_kernel(study_run.KERNEL)
    others = set(procs.children())  # this test process's other children (of other tests), not the kernel
    kernels_at_end: list[set] = []
    with pytest.raises(PretokError, match="ValueError: boom") if fails else contextlib.nullcontext():
        study_run.execute("nb", tmp_path / "out", {}, study_run.KERNEL, False,
                          ended=lambda: kernels_at_end.append(set(procs.children()) - others))
    assert len(kernels_at_end) == (1 if ids else 0) and all(kernels_at_end) and not set(procs.children()) - others


def test_a_stop_after_the_notebook_ended_sends_no_sigint_and_one_before_stops_at_its_end(monkeypatch) -> None:
    """Told by events, not sleeps: the interrupting thread has ended (joined) when no more SIGINT can come, and none
    comes after `notebook_ended` returns (it and each SIGINT hold one lock)."""
    from pretok_lib.study import run as study_run

    sent: list[int] = []
    monkeypatch.setattr(study_run.procs, "forward", lambda sig, pids: sent.append(sig))
    monkeypatch.setattr(study_run.procs, "children", lambda: [])
    after = study_run._Stop()
    after.notebook_ended()
    after(signal.SIGTERM, None)
    after.thread.join(timeout=300)
    assert not after.thread.is_alive() and after.signum == signal.SIGTERM and sent == []
    before = study_run._Stop()
    before(signal.SIGTERM, None)
    deadline = time.monotonic() + 300                # only catches a hang
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent[:1] == [signal.SIGINT]
    before.notebook_ended()
    n = len(sent)
    before.thread.join(timeout=300)
    assert not before.thread.is_alive() and len(sent) == n


def test_the_kernel_channels_are_encrypted_and_its_start_is_quiet(tmp_path: Path, monkeypatch, capfd) -> None:
    """ipykernel >= 7.4 warns on every start over plain TCP (5 times a study); the study's kernels get CurveZMQ keys
    from jupyter_client instead, and where pyzmq cannot do Curve they start as before."""
    import nbformat
    import zmq

    from pretok_lib.analysis.report import ensure_kernel
    from pretok_lib.study import kernels
    from pretok_lib.study import run as study_run

    code = "from ipykernel.connect import get_connection_info\nprint(sorted(get_connection_info(unpack=True)))"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), str(tmp_path / "nb.ipynb"))
    monkeypatch.setattr(study_run, "NOTEBOOK_DIR", tmp_path)
    ensure_kernel(study_run.KERNEL)
    study_run.execute("nb", tmp_path / "out", {}, study_run.KERNEL, False)
    out = nbformat.read(str(tmp_path / "out" / "notebooks" / "nb.ipynb"), as_version=4).cells[-1].outputs
    assert "'curve_secretkey'" in out[0]["text"], out
    assert "without encryption" not in capfd.readouterr().err
    monkeypatch.setattr(zmq, "has", lambda capability: False)
    assert kernels.encrypted_kernel_channels() == {}


def test_every_notebook_parameter_has_a_meaning_that_every_profile_fits(tmp_path: Path) -> None:
    from pretok_lib.study.profiles import PARAMETERS, check_parameters, check_runs
    from pretok_lib.study.run import NOTEBOOK_DIR, declared_parameters

    declared = set().union(*(declared_parameters(NOTEBOOK_DIR / f"{n}.ipynb") for n in NOTEBOOKS))
    assert declared == set(PARAMETERS)
    for name in PROFILES:
        check_parameters(PROFILES[name])
        params = profile_parameters(name)
        check_parameters(params)
        check_runs({**params, "study_dir": str(tmp_path)}, NOTEBOOKS)


# What a 0 means where a parameter takes it; no other parameter takes 0, and none a negative or non-finite number.
ZERO_MEANS = {"workers": "every CPU", "train_world": "every GPU", "loader_workers": "batches made in the loop",
              "target_loss": "a loss of 0", "loader_pace_ms": "no paced calls"}
_NUMBERS = st.one_of(st.integers(-3, 3), st.floats(-2, 2), st.sampled_from([math.nan, math.inf, -math.inf, 10**6]))
_SCALARS = st.one_of(_NUMBERS, st.booleans(), st.none(), st.text(max_size=6),
                     st.sampled_from(["zstd:3", "zstd:99", "lz4", "0,2", "0,-2", " 1 ", "local", "ssh", "padded",
                                      "a/b", "", "configs/tiny.yaml"]))
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3), st.dictionaries(st.text(max_size=4), _SCALARS,
                                                                               max_size=2))


@settings(max_examples=600, deadline=None)
@given(name=st.sampled_from(sorted(PROFILES["quick"])), value=_VALUES)
def test_every_parameter_takes_only_values_of_its_meaning(name: str, value) -> None:
    """Each parameter, any value: taken by one rule (`takes`: shape, finite numbers in range, valid text) or
    refused in one line naming it. By meaning: no negative or non-finite number anywhere, 0 only where it means
    something (ZERO_MEANS), non-integral numbers nowhere a count is due (`seq_len=2.5`)."""
    from pretok_lib.study.profiles import PARAMETERS, check_parameters, takes

    try:
        check_parameters({name: value})
        taken = True
    except PretokError as e:
        taken = False
        assert str(e).startswith("notebook parameter(s) not taken: ") and f"{name}={value!r}" in str(e)
        assert "\n" not in str(e)
    assert taken == takes(name, value)
    numbers = [v for v in (value if isinstance(value, list) else [value])
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if taken and numbers:
        assert all(math.isfinite(v) and v >= 0 for v in numbers), (name, value)
        assert 0 not in numbers or name in ZERO_MEANS, (name, value)
        if "count" in " ".join(filter(None, PARAMETERS[name].shapes)):
            assert all(isinstance(v, int) for v in numbers), (name, value)


@pytest.mark.parametrize("values,problem", [
    ({"seq_len": 0}, "seq_len=0"), ({"workers": -1}, "workers=-1"), ({"micro_batch": 0}, "micro_batch=0"),
    ({"seq_len": 2.5}, "seq_len=2.5"), ({"corpus_mb": 0}, "corpus_mb=0"), ({"vocab_size": 100}, "vocab_size=100"),
    ({"compressions": ["zstd:99"]}, "compressions=['zstd:99']"), ({"loader_workers": "0,-2"}, "loader_workers"),
    ({"train_data_kind": "parquet"}, "train_data_kind"), ({"launcher": "ssh"}, "launcher='ssh'"),
    ({"target_mfu": [0.4, 1.5]}, "target_mfu"), ({"sweep_prefix": "a/b"}, "sweep_prefix"),
    ({"train_overrides": {"train.steps": 0}},
     "notebook 03_train would start run train-pretok-memmap-w1-s64 of a config its trainer refuses: train.steps"),
    ({"train_overrides": {"train.lrr": 1}}, "unknown config key 'train.lrr'"),
    ({"sweep_grids": [{"lr": [1e-3, -1]}]}, "04_sweep would start run sweep-pretok-memmap-w1-lr-1-s64 of a config"),
    ({"sweep_grids": [{"world": [0]}]}, "world size must be a whole number >= 1 (got 0)"),
    ({"sweep_grids": [{"data": ["parquet"]}]}, "data.kind 'parquet' is not one of"),
    ({"sweep_base": {"data.seq_len": 0}}, "data.seq_len must be >= 1"),
    ({"config": "no-such.yaml"}, "no-such.yaml: config: config file not found"),
    ({"target_config": "no-such.yaml"}, "no-such.yaml: target_config: config file not found"),
])
def test_a_parameter_it_cannot_take_is_one_line_before_anything_runs(tmp_path: Path, capsys, values: dict,
                                                                     problem: str) -> None:
    """`pretok study --set seq_len=0` (or workers=-1) failed in notebook 01's cell 16 s later and still wrote
    reports; a sweep axis value the trainer refuses failed in notebook 04 after the runs before it: every parameter,
    and every training run's config it makes, is checked first: one line, exit 1, no notebook run, nothing written."""
    import pretok_lib.study.run as r

    ran: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(r, "execute", lambda name, *a, **kw: ran.append(name) or 1.0)
        mp.setattr("pretok_lib.analysis.report.ensure_kernel", lambda kernel: kernel)
        sets = [f"--set={k}={json.dumps(v)}" for k, v in values.items()]
        assert cli_main(["study", "--profile", "smoke", "--out", str(tmp_path / "s"), *sets]) == 1
    one_line(capsys.readouterr().err, problem)
    assert ran == [] and not (tmp_path / "s").exists()


_RUNNABLE = sorted(set(PROFILES["quick"]) - {"study_dir", "config", "target_config", "train_overrides",
                                              "sweep_grids", "sweep_base"})   # those: the cases above


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(_RUNNABLE), _VALUES, min_size=1, max_size=3))
@example({"tokenizer": "\x00"})  # found by this test: a NUL byte in a path raised os.path's ValueError
def test_a_study_runs_with_what_its_parameters_take_and_refuses_the_rest_first(tmp_path_factory, values) -> None:
    """Any --set values: a study whose values are all taken runs every notebook; one value not taken is one line
    before anything runs or is written."""
    from pretok_lib.study.profiles import takes

    fits = all(takes(k, v) for k, v in values.items())
    out = tmp_path_factory.mktemp("s") / "study"
    ran: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("pretok_lib.study.run.execute", lambda *a, **kw: ran.append(a[0]) or 1.0)
        mp.setattr("pretok_lib.study.run.write_report", lambda *a, **kw: {})
        mp.setattr("pretok_lib.analysis.report.ensure_kernel", lambda kernel: kernel)
        if fits:
            run_study("smoke", out=out, parameters=values, stream=False, echo=None, publish=None)
            assert ran == list(NOTEBOOKS)
        else:
            with pytest.raises(PretokError, match="not taken") as e:
                run_study("smoke", out=out, parameters=values, stream=False, echo=None, publish=None)
            assert "\n" not in str(e.value) and ran == [] and not out.exists()


def test_study_dir_is_given_by_out_not_set(tmp_path: Path) -> None:
    """`--set study_dir=X` was silently replaced by --out's directory: refused, naming --out."""
    with pytest.raises(PretokError, match="give --out /x"):
        run_study("smoke", out=tmp_path / "s", parameters={"study_dir": "/x"}, echo=None, publish=None)
    assert not (tmp_path / "s").exists()
