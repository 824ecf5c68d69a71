"""slurm/notebook.sbatch on a real SLURM: papermill runs a notebook with a parameters YAML in the venv kernel,
as a job step (srun) inside PRETOK_CONTAINER, then nbconvert writes the HTML with and without code; a failing
notebook fails the job."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from pretok_lib.launch import slurm

from ..conftest import ROOT
from .helpers import SLURM, job_logs, wait_ok

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SECRET_CODE = "answer = factor * 2  # code-only marker"


def make_notebook(path: Path, fail: bool = False) -> None:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"},
                                            "language_info": {"name": "python"}})
    params = nbformat.v4.new_code_cell("factor = 1\nlabel = 'default'")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A test report"), params,
                nbformat.v4.new_code_cell(SECRET_CODE + "\nprint(f'{label}: {answer}')"),
                nbformat.v4.new_code_cell("import os, sys\nopen('side-effect.txt', 'w').write(os.getcwd())\n"
                                          "print('prefix', sys.prefix)"),
                nbformat.v4.new_code_cell("print('step', os.environ.get('SLURM_STEP_ID'), "
                                          "os.environ.get('PRETOK_TEST_CONTAINER'))"),
                nbformat.v4.new_code_cell("from ipykernel.connect import get_connection_info\n"
                                          "print('connection', sorted(get_connection_info(unpack=True)))")]
    if fail:
        nb.cells.append(nbformat.v4.new_code_cell("raise RuntimeError('boom from the notebook')"))
    nbformat.write(nb, path)


def test_notebook_job_executes_and_exports_html(slurm_cluster, tmp_path):
    make_notebook(tmp_path / "report.ipynb")
    make_notebook(tmp_path / "broken.ipynb", fail=True)
    (tmp_path / "params.yaml").write_text("factor: 21\nlabel: from-yaml\n")
    # A "container" that only sets a variable: the kernel must run inside it, in a job step (srun), not the batch step
    ok = slurm.submit(SLURM / "notebook.sbatch", ["report.ipynb", "out", "params.yaml"], cwd=tmp_path,
                      env={"PRETOK_CONTAINER": "env PRETOK_TEST_CONTAINER=yes",
                           "PRETOK_PYTHON": str(ROOT / ".venv" / "bin" / "python")})
    bad = slurm.submit(SLURM / "notebook.sbatch", ["broken.ipynb", "out-broken"], cwd=tmp_path)
    wait_ok([ok], tmp_path)
    assert slurm.wait([bad], timeout=120)[bad] == "FAILED", job_logs(tmp_path)

    executed = nbformat.read(tmp_path / "out" / "report.ipynb", as_version=4)
    outputs = [o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert "from-yaml: 42\n" in outputs
    assert "step 0 yes\n" in outputs, outputs   # papermill ran as the job's first srun step, in the container
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    prefix = [Path(o[len("prefix "):].strip()).resolve() for o in outputs if o.startswith("prefix ")]
    assert prefix == [(ROOT / ".venv").resolve()], outputs  # the venv's kernel (`pretok`) ran it (a linked venv too)
    # on channels encrypted with CurveZMQ (`--engine pretok`), so ipykernel did not warn of plain TCP
    assert any(o.startswith("connection") and "'curve_secretkey'" in o for o in outputs), outputs
    assert "without encryption" not in job_logs(tmp_path)
    assert (tmp_path / "side-effect.txt").read_text() == str(tmp_path)  # cwd = the job's working directory
    full = (tmp_path / "out" / "report.html").read_text()
    hidden = (tmp_path / "out" / "report.no-input.html").read_text()
    for html in (full, hidden):
        assert "from-yaml: 42" in html and "A test report" in html
    assert "code-only marker" in full and "code-only marker" not in hidden

    # The failed notebook is still written and exported, with the error in it.
    broken = json.loads((tmp_path / "out-broken" / "broken.ipynb").read_text())
    assert "boom from the notebook" in json.dumps(broken)
    assert (tmp_path / "out-broken" / "broken.html").exists()
