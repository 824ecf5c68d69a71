"""`pretok report RUNS_DIR`: a hand-made custom sweep and a run measured with pretok_lib.measure become one report
(figures, findings, every run id); a failed run is on the first screen; bad input is one line, nothing written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pretok_lib.cli import main
from pretok_lib.measure import Run

from ..conftest import one_line
from .helpers import simple_run


def _sweep(root: Path) -> Path:
    """A custom sweep's runs dir: two data paths, a repeat, one failed point, and a run of your own trainer."""
    simple_run(root, "mysweep-padded-w1", kind="padded", tokens_per_s=1000.0, eff_frac=0.5, data_stall=0.003)
    simple_run(root, "mysweep-pretok-memmap-w1", kind="pretok-memmap", tokens_per_s=1500.0, eff_frac=1.0)
    simple_run(root, "mysweep-pretok-memmap-w1-r1", kind="pretok-memmap", tokens_per_s=1550.0, eff_frac=1.0, seed=1)
    simple_run(root, "mysweep-padded-w2", kind="padded", tokens_per_s=900.0, n=3, status="failed",
               error="RuntimeError: out of memory in my model", world_size=2)
    with Run(root / "my-trainer", {"train": {"lr": 1e-3}}, seq_len=64) as m:
        for _ in m.batches(np.ones((6, 4, 64), dtype=np.int64)):
            m.step(loss=3.0)
    return root


def test_report_of_a_custom_sweep_and_a_byo_run(tmp_path, capsys):
    root = _sweep(tmp_path / "runs")
    assert main(["report", str(root), "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    ids = ["mysweep-padded-w1", "mysweep-pretok-memmap-w1", "mysweep-pretok-memmap-w1-r1", "mysweep-padded-w2",
           "my-trainer"]
    table = page[page.index('<section id="runs">'):]
    assert all(f'data-run-id="{i}"' in table for i in ids)
    first = page[:page.index("<h2>Figures</h2>")]         # the first screen: failures, then the findings
    assert "1 of 5 runs did not complete" in first and "out of memory in my model" in first
    assert '<section id="findings">' in first and 'data-key="packing"' in first
    assert "pretok-memmap / pretok-padded" not in first and "effective tokens/s" in first
    figs = re.findall(r'<h3 id="fig-([a-z_]+)">', page)
    assert {"throughput", "data_stall", "padding", "loss_curves"} <= set(figs)
    assert page.count("plotly.js v") <= 2 and (tmp_path / "rep" / "figures" / "throughput.html").is_file()
    assert "my-trainer" in (tmp_path / "rep" / "figures" / "throughput.html").read_text()
    assert "report of the runs" in capsys.readouterr().out


def test_report_defaults_into_the_runs_dir_and_reruns(tmp_path):
    root = _sweep(tmp_path / "runs")
    assert main(["report", str(root)]) == 0
    assert main(["report", str(root)]) == 0          # its own output is not taken for a run
    assert (root / "report" / "report.html").is_file() and (root / "report" / "figures").is_dir()


@pytest.mark.parametrize("case", ["missing", "empty", "bad-bench"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    root = tmp_path / "runs"
    args = ["report", str(root), "--out", str(tmp_path / "rep")]
    if case != "missing":
        root.mkdir()
    if case == "bad-bench":
        simple_run(root, "a", tokens_per_s=1.0)
        (tmp_path / "b.json").write_text("[1, 2]")
        args += ["--bench", str(tmp_path / "b.json")]
    assert main(args) != 0
    want = {"missing": f"{root}: no such runs directory", "empty": f"{root}: holds no runs",
            "bad-bench": f"{tmp_path / 'b.json'}: not a `pretok bench tokenize --json` result"}[case]
    one_line(capsys.readouterr().err, prefix=f"pretok: error: {want}")
    assert not (tmp_path / "rep").exists()
