"""report.py: figure files (offline HTML + PNG through kaleido), notebook export, and a real Chromium render."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import nbformat
import numpy as np
import pytest

from pretok_lib.analysis import figures as F
from pretok_lib.analysis.report import (count_rendered_figures, ensure_kernel, export_report, render_check,
                                        save_figure, save_figures)
from pretok_lib.analysis.runs import load_runs


def assert_real_png(path: Path, min_kb: float = 8, min_size: tuple[int, int] = (400, 200)) -> None:
    """A decodable PNG of reasonable size that is not one flat color."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    assert len(data) > min_kb * 1024, f"{path}: only {len(data)} bytes"
    w, h = struct.unpack(">II", data[16:24])  # IHDR
    assert w >= min_size[0] and h >= min_size[1]
    try:
        from PIL import Image
    except ImportError:
        return
    px = np.asarray(Image.open(path).convert("RGB"))
    assert px.shape[:2] == (h, w)
    assert px.std() > 5 and len(np.unique(px.reshape(-1, 3), axis=0)) > 20, f"{path}: (nearly) blank image"


def test_count_rendered_figures() -> None:
    dom = ('<div class="plot-container plotly"><svg class="main-svg"></svg><svg class="main-svg"></svg></div>'
           '<div class="plot-container plotly"></div>'  # JS ran but drew nothing: not counted
           '<div class="plot-container plotly"><div><svg class="main-svg"></svg></div></div>')
    assert count_rendered_figures(dom) == 2
    assert count_rendered_figures("<html><div id='x'></div></html>") == 0


def test_save_figures_html_and_png(tmp_path: Path, study_root: Path) -> None:
    runs = load_runs(study_root)
    figs = {"throughput": F.throughput_figure(runs), "runs": F.status_table_figure(runs),
            "empty": F.scaling_figure([])}
    paths = save_figures(figs, tmp_path / "figs")
    for name, p in paths.items():
        html = p["html"].read_text()
        assert '<script src="http' not in html and len(html) > 1_000_000  # plotly.js embedded: works offline
        assert_real_png(p["png"], min_kb=8 if name != "empty" else 2)
    one = save_figure(F.loss_curves_figure(runs), tmp_path / "figs", "loss", png=False)
    assert one["html"].is_file() and "png" not in one


@pytest.mark.slow
def test_saved_figure_html_renders_offline(tmp_path: Path, study_root: Path) -> None:
    p = save_figure(F.mfu_figure(load_runs(study_root)), tmp_path, "mfu", png=False)["html"]
    assert render_check(p) == 1


NOTEBOOK_CELLS = [
    "from pretok_lib.analysis.report import setup_notebook_plotting\nsetup_notebook_plotting()",
    "from pretok_lib.analysis import load_runs, figures as F\nruns = load_runs({root!r})\n"
    "F.throughput_figure(runs).show()",
    "F.status_table_figure(runs)",
]


@pytest.mark.slow
def test_executed_notebook_report_renders_in_chromium(tmp_path: Path, study_root: Path) -> None:
    from nbconvert.preprocessors import ExecutePreprocessor

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Report test")]
    nb.cells += [nbformat.v4.new_code_cell(c.format(root=str(study_root))) for c in NOTEBOOK_CELLS]
    ExecutePreprocessor(timeout=180, kernel_name=ensure_kernel()).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    nbformat.write(nb, tmp_path / "executed.ipynb")
    paths = export_report(tmp_path / "executed.ipynb", tmp_path / "out")
    assert set(paths) == {"report", "report_nocode"}
    assert "throughput_figure" in paths["report"].read_text()
    assert "throughput_figure" not in paths["report_nocode"].read_text()  # code hidden
    for key, html in paths.items():
        shot = tmp_path / f"{key}.png"
        assert render_check(html, shot) >= 2, key  # both figures drawn by plotly.js, no network
        assert_real_png(shot, min_kb=20, min_size=(1000, 1000))


def test_export_finds_templates_of_a_pip_target_install(tmp_path: Path) -> None:
    """nbconvert installed with `pip install --target DIR` (PYTHONPATH) keeps its templates in DIR/share/jupyter,
    which Jupyter does not search; the export must still find them. Built here from the installed distribution's
    own file list in the --target layout; `python -S` keeps the environment's share/jupyter out of the search."""
    import importlib.metadata as md
    import shutil
    import subprocess
    import sys
    import sysconfig

    dist, site = md.distribution("nbconvert"), tmp_path / "site"
    for f in dist.files:
        src, rel = Path(dist.locate_file(f)).resolve(), Path(*[p for p in f.parts if p != ".."])
        if src.is_file() and rel.parts[0] in ("nbconvert", "share"):
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, site / rel)
    assert (site / "share" / "jupyter" / "nbconvert" / "templates" / "lab").is_dir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# target install")]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    root = Path(__file__).resolve().parents[2]
    code = ("import os, sys; from jupyter_core.paths import jupyter_path; import nbconvert; "
            f"assert nbconvert.__file__.startswith({str(site)!r}), nbconvert.__file__; "
            "assert not any(os.path.isdir(p + '/nbconvert/templates') for p in jupyter_path()); "
            "from pretok_lib.analysis.report import export_report; "
            f"print(sorted(export_report({str(tmp_path / 'nb.ipynb')!r}, {str(tmp_path / 'out')!r})))")
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_PATH", "JUPYTER_DATA_DIR")}
    env.update(PYTHONPATH=os.pathsep.join(map(str, (site, root, sysconfig.get_paths()["purelib"]))),
               HOME=str(tmp_path), JUPYTER_PLATFORM_DIRS="0")
    p = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "report" in p.stdout and "target install" in (tmp_path / "out" / "report.html").read_text()

