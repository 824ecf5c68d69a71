"""Rerunning part of a study (`pretok study --notebooks 05`) into its directory: the report and study.json keep
every notebook of the study, and a rerun that would mix profiles or parameters is refused; paths given to
`pretok study` are relative to the current directory. `execute` is a stand-in that writes a small executed
notebook (the real notebooks run in tests/notebooks/)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest

import pretok_lib.study.run as r
from pretok_lib.cli import main as cli_main
from pretok_lib.errors import PretokError
from pretok_lib.study.run import NOTEBOOKS


class Calls(list):
    """The (notebook, parameters) of each `execute`; `n`: the pass (one per `study` call)."""

    n = 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Each notebook "executed" writes one markdown cell `executed <name> in pass <n>`; returns the calls."""
    calls, clock = Calls(), itertools.count(1)

    def execute(name: str, out_dir: Path, params: dict[str, Any], kernel: str, stream: bool, ended=None) -> float:
        calls.append((name, dict(params)))
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"executed {name} in pass {calls.n}")])
        (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(out_dir / "notebooks" / f"{name}.ipynb"))
        return 2.0

    monkeypatch.setattr(r, "execute", execute)
    monkeypatch.setattr(r, "_now", lambda: f"2026-01-01T00:00:{next(clock):02d}+00:00")  # one tick per call
    monkeypatch.setattr("pretok_lib.analysis.report.ensure_kernel", lambda kernel: kernel)
    return calls


def study(out: Path, calls: Calls, **kw: Any) -> dict:
    calls.n += 1
    return r.run_study(kw.pop("profile", "smoke"), out=out, stream=False, echo=None, publish=None, **kw)


def test_a_partial_rerun_reports_and_records_every_notebook_of_the_study(tmp_path: Path, fake) -> None:
    out = tmp_path / "s"
    first = study(out, fake)
    assert list(first["notebooks"]) == list(NOTEBOOKS)
    record = study(out, fake, notebooks=["05"])
    saved = json.loads((out / "study.json").read_text())
    assert saved["notebooks"] == record["notebooks"]
    assert list(saved["notebooks"]) == list(NOTEBOOKS)              # 01-04 kept, with their timings
    assert {n: (x["status"], x["seconds"], x["run"]) for n, x in saved["notebooks"].items()} == {
        **{n: ("completed", 2.0, first["started"]) for n in NOTEBOOKS[:4]},
        "05_analysis": ("completed", 2.0, record["started"])}
    assert [h["notebooks"] for h in saved["history"]] == [list(NOTEBOOKS), ["05_analysis"]]
    text = (out / "report_nocode.html").read_text()
    for n in NOTEBOOKS[:4]:
        assert f"executed {n} in pass 1" in text, n
    assert "executed 05_analysis in pass 2" in text
    assert f"05_analysis rerun {record['started']}" in text and "ran before an earlier notebook" not in text
    study(out, fake, notebooks=["03"], report=True)                 # 04 and 05 now predate 03's results
    text = (out / "report_nocode.html").read_text()
    assert "executed 01_pretokenize in pass 1" in text and "executed 03_train in pass 3" in text
    assert "04_sweep, 05_analysis ran before an earlier notebook was rerun" in text


def test_a_rerun_that_would_mix_parameters_or_profiles_is_refused(tmp_path: Path, fake) -> None:
    out = tmp_path / "s"
    study(out, fake, parameters={"png": False, "target_mfu": [0.3, 0.4]})
    before = (out / "study.json").read_text()
    refused = {"profile": ({"profile": "quick", "notebooks": ["05"]}, "profile 'smoke'"),
               "full-profile": ({"profile": "quick"}, "profile 'smoke'"),
               "ignored": ({"notebooks": ["05"], "parameters": {"seq_len": 128}}, "none of 05_analysis takes it"),
               "later": ({"notebooks": ["01"], "parameters": {"seq_len": 128}}, "02_loader_benchmark, 03_train"),
               "shared": ({"notebooks": ["04", "05"], "parameters": {"config": "configs/small.yaml"}},
                          "03_train ran with the recorded value")}
    for case, (kw, why) in refused.items():
        with pytest.raises(PretokError, match="profile|mix") as e:
            study(out, fake, **kw)
        assert why in str(e.value), case
    assert len(fake) == 5 and (out / "study.json").read_text() == before  # nothing ran, nothing rewritten
    record = study(out, fake, notebooks=["05"], parameters={"target_mfu": [0.5, 0.6]})
    assert fake[-1][0] == "05_analysis" and fake[-1][1]["png"] is False     # the recorded value, not the profile's
    assert fake[-1][1]["target_mfu"] == [0.5, 0.6] and record["parameters"]["target_mfu"] == [0.5, 0.6]
    assert record["history"][-1]["changed"] == {"target_mfu": [[0.3, 0.4], [0.5, 0.6]]}
    full = study(out, fake, parameters={"seq_len": 128})            # every notebook reruns: changes reported
    assert full["history"][-1]["changed"] == {"seq_len": [64, 128], "png": [False, True],
                                              "target_mfu": [[0.5, 0.6], [0.35, 0.45]]}


def test_executed_notebooks_without_a_record_are_not_mixed_into_a_partial_rerun(tmp_path: Path, fake) -> None:
    out = tmp_path / "s"
    study(out, fake)
    (out / "study.json").unlink()
    with pytest.raises(PretokError, match="no study.json"):
        study(out, fake, notebooks=["05"])
    study(out, fake)                                                 # a full run needs no record


def test_study_paths_are_relative_to_the_current_directory(tmp_path: Path, fake, monkeypatch) -> None:
    """`pretok study --out mystudy --set corpus=... --set tokenizer=...` from a directory other than the checkout:
    the notebooks (cwd: the repository) get absolute paths of the caller's directory."""
    root, cwd = tmp_path / "checkout", tmp_path / "here"
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "mine.yaml").write_text("train: {}\n")
    (cwd / "data").mkdir(parents=True)
    (cwd / "data" / "c.parquet").write_bytes(b"")
    (cwd / "tok.json").write_text("{}")
    monkeypatch.setattr("pretok_lib.study.steps.ROOT", root)      # a broken resolution writes there, not the repo
    monkeypatch.chdir(cwd)
    fake.n = 1
    args = ["study", "--profile", "smoke", "--out", "mystudy", "--notebooks", "01", "03",
            "--set", "corpus=data/c.parquet", "--set", "tokenizer=tok.json", "--set", "config=configs/mine.yaml"]
    assert cli_main(args) == 0
    assert (cwd / "mystudy" / "notebooks" / "01_pretokenize.ipynb").is_file() and not (root / "mystudy").exists()
    params = fake[0][1]
    assert params["study_dir"] == str(cwd / "mystudy")
    assert params["corpus"] == str(cwd / "data" / "c.parquet") and params["tokenizer"] == str(cwd / "tok.json")
    assert params["config"] == "configs/mine.yaml"                 # only in the checkout: as given, as before
    assert r.absolute_paths({"tokenizer": "gpt2", "corpus": "", "corpus_mb": 2, "config": "nope.yaml"}) == {
        "tokenizer": "gpt2", "corpus": "", "corpus_mb": 2, "config": str(cwd / "nope.yaml")}
    assert r.profile_parameters("smoke")["config"] == "configs/tiny.yaml"  # the profiles' defaults unchanged


@pytest.mark.parametrize("ending", ["stopped", "failed", "crashed"])
@pytest.mark.parametrize("at", range(len(NOTEBOOKS)))
@pytest.mark.parametrize("subset", [None, ["03", "04", "05"]])
def test_a_rerun_that_ends_early_leaves_no_report_of_the_previous_study(tmp_path: Path, fake, monkeypatch,
                                                                        ending: str, at: int, subset) -> None:
    """A complete study rerun (whole, or a part) into its directory and ended at a notebook (a stop signal, a cell
    failing, a crash or kill -9 that records nothing): the previous report, which described notebooks now rerun,
    is gone unless this run wrote its own, and study.json calls no notebook completed that did not complete;
    notebooks never reached are not in it. A stopped rerun kept the old complete report beside a record saying
    `stopped`."""
    import os
    import signal
    import time

    out = tmp_path / "s"
    study(out, fake)
    names = r.select(subset)
    if NOTEBOOKS[at] not in names:
        return
    ran: list[str] = []
    real = r.execute

    def execute(name, out_dir, params, kernel, stream, ended=None):
        ran.append(name)
        if name != NOTEBOOKS[at]:
            return real(name, out_dir, params, kernel, stream, ended)
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("partial")]),
                       str(out_dir / "notebooks" / f"{name}.ipynb"))
        if ending == "stopped":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            raise RuntimeError("kernel interrupted")
        if ending == "failed":
            raise PretokError("cell 3 failed: boom (executed notebook kept)")
        raise KeyboardInterrupt  # stands for a crash or a kill -9: nothing after it runs

    monkeypatch.setattr(r, "execute", execute)
    monkeypatch.setattr(r.procs, "forward", lambda sig, pids: None)  # no kernel here to interrupt
    fake.n += 1
    with pytest.raises((PretokError, KeyboardInterrupt)):
        r.run_study("smoke", out=out, notebooks=subset, stream=False, echo=None, publish=None)
    saved = json.loads((out / "study.json").read_text())
    status = {n: x["status"] for n, x in saved["notebooks"].items()}
    here = ran.index(NOTEBOOKS[at])
    assert {n: status[n] for n in ran[:here]} == dict.fromkeys(ran[:here], "completed")
    assert status[NOTEBOOKS[at]] == {"stopped": "stopped", "failed": "failed", "crashed": "running"}[ending]
    never = [n for n in names if n not in ran]
    assert all(status.get(n) in (None, "running") for n in never), status
    if ending == "crashed":
        assert all(status[n] == "running" for n in never)
    reports = [out / "report.html", out / "report_nocode.html"]
    if ending == "failed":   # this run's own report: the notebooks it ran, the failed one included
        assert "partial" in reports[1].read_text()
    else:
        assert not any(p.exists() for p in reports)
    if ending == "crashed":  # the next partial rerun takes the notebook cut by the kill as stopped
        later = [n for n in NOTEBOOKS if n not in names[here:]]
        monkeypatch.setattr(r, "execute", real)
        fake.n += 1
        record = r.run_study("smoke", out=out, notebooks=[n[:2] for n in names[here + 1:]] or ["05"],
                             stream=False, echo=None, publish=None)
        assert all(record["notebooks"][n]["status"] != "running" for n in record["notebooks"]), later


def test_a_report_that_cannot_be_written_still_leaves_the_record(tmp_path: Path, fake, monkeypatch) -> None:
    """The notebooks ran, then the report failed (disk full, findings that cannot be computed): study.json is the
    study's final record (when it finished, no report); it was left as written while the notebooks ran."""
    import errno

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(r, "write_report", full)
    with pytest.raises(OSError):
        study(tmp_path / "s", fake)
    saved = json.loads((tmp_path / "s" / "study.json").read_text())
    assert {n: x["status"] for n, x in saved["notebooks"].items()} == dict.fromkeys(NOTEBOOKS, "completed")
    assert saved["finished"] and saved["seconds"] is not None and "report" not in saved
