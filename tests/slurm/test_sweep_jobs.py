"""`run_sweep(launcher="slurm")` on a real SLURM (CPU, gloo): one slurm/train.sbatch job per grid point, output
appended to runs/<id>/launcher.log, completed points skipped on the next call (no new job)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretok_lib.sweep import expand_grid, run_sweep

from ..conftest import ROOT
from ..test_sweep import tiny_config  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

if not (ROOT / "pretok_lib" / "train" / "__main__.py").exists():
    pytest.skip("pretok_lib.train is not there yet", allow_module_level=True)


def test_sweep_on_slurm(slurm_cluster, tiny_config: Path, tmp_path: Path) -> None:  # noqa: F811
    runs, lines = tmp_path / "runs", []
    grid = expand_grid({"train.steps": 2}, {"world": [1, 2]}, prefix="slurm")
    res = run_sweep(tiny_config, grid, runs, "slurm", echo=lines.append)
    logs = "\n".join((runs / p.run_id / "launcher.log").read_text() for p, _ in res)
    assert [(p.run_id, s) for p, s in res] == [("slurm-w1", "completed"), ("slurm-w2", "completed")], logs
    for p, _ in res:
        rec = json.loads((runs / p.run_id / "launcher.json").read_text())["attempts"][-1]
        assert rec["launcher"] == "slurm" and rec["job_state"] == "COMPLETED" and rec["job_id"].isdigit()
        assert json.loads((runs / p.run_id / "run.json").read_text())["world_size"] == p.world
        log = (runs / p.run_id / "launcher.log").read_text()
        assert log.startswith("\n=== ") and "completed" in log  # the sweep's header, then the job's own output
    assert sum("submitted" in line for line in lines) == 2
    lines.clear()
    assert [s for _, s in run_sweep(tiny_config, grid, runs, "slurm", echo=lines.append)] == ["skipped", "skipped"]
    assert not any("submitted" in line for line in lines)
