"""Figures to files, executed notebooks to self-contained HTML, and a real-browser check that a report renders.

Offline rendering: saved figures embed plotly.js (`include_plotlyjs=True`); notebooks call
`setup_notebook_plotting()` so every figure output carries HTML that nbconvert keeps and that renders without
network (the plotly.js bundle is emitted once, with the first figure). PNGs come from kaleido 1.x, which drives
a Chromium (Debian's `chromium` is found on PATH; `BROWSER_PATH` overrides).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping

import plotly.graph_objects as go
import plotly.io as pio

NOTEBOOK_RENDERER = "plotly_mimetype+notebook"  # JupyterLab renders the mimetype, nbconvert keeps the HTML
PNG_WIDTH, PNG_HEIGHT = 1100, 520
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                  "--no-first-run", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--hide-scrollbars")


def setup_notebook_plotting(renderer: str = NOTEBOOK_RENDERER) -> None:
    """Make figures shown in a notebook survive nbconvert and render offline: the "notebook" renderer inlines
    plotly.js (once) and each figure's HTML; JupyterLab uses the plotly mimetype. Call it in the notebook's first
    code cell (it prints nothing)."""
    pio.renderers.default = renderer
    pio.templates.default = "plotly_white"


def find_chromium() -> str:
    """Path of a Chromium/Chrome binary: `BROWSER_PATH` if set, else the first of CHROMIUM_NAMES on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).is_file():
        return env
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    raise RuntimeError("no Chromium found: install it (apt-get install chromium) or set BROWSER_PATH")


def _kaleido_env() -> None:
    """Point kaleido (choreographer) at the system Chromium unless BROWSER_PATH is already set."""
    if not os.environ.get("BROWSER_PATH"):
        try:
            os.environ["BROWSER_PATH"] = find_chromium()
        except RuntimeError:
            pass  # kaleido may still find its own Chrome


def _sized(fig: go.Figure) -> dict[str, int]:
    wide = any(t.type == "table" for t in fig.data)  # tables need room for their columns
    return {"width": fig.layout.width or (1600 if wide else PNG_WIDTH), "height": fig.layout.height or PNG_HEIGHT}


def save_figure(fig: go.Figure, out_dir: str | Path, name: str, png: bool = True, scale: float = 1.0
                ) -> dict[str, Path]:
    """Write `name.html` (plotly.js embedded: opens offline) and `name.png` (kaleido) into `out_dir`."""
    return save_figures({name: fig}, out_dir, png, scale)[name]


def save_figures(figs: Mapping[str, go.Figure], out_dir: str | Path, png: bool = True, scale: float = 1.0
                 ) -> dict[str, dict[str, Path]]:
    """`save_figure` for many figures; the PNGs are rendered by one browser session (much faster)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, dict[str, Path]] = {}
    for name, fig in figs.items():
        paths[name] = {"html": out / f"{name}.html"}
        fig.write_html(paths[name]["html"], include_plotlyjs=True, full_html=True)
    if png and figs:
        _kaleido_env()
        names = list(figs)
        for n in names:
            paths[n]["png"] = out / f"{n}.png"
        pio.write_images([figs[n] for n in names], [paths[n]["png"] for n in names], format="png",
                         width=[_sized(figs[n])["width"] for n in names],
                         height=[_sized(figs[n])["height"] for n in names], scale=scale)
    return paths


def export_report(executed_ipynb: str | Path, out_dir: str | Path, name: str = "report") -> dict[str, Path]:
    """An executed notebook as `<name>.html` (code and outputs) and `<name>_nocode.html` (outputs only), both
    self-contained when the notebook called `setup_notebook_plotting()`."""
    import nbformat
    from nbconvert import HTMLExporter

    from ..atomic import atomic_write_text

    _find_nbconvert_templates()
    nb = nbformat.read(str(executed_ipynb), as_version=4)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, exclude in (("report", False), ("report_nocode", True)):
        exporter = HTMLExporter(exclude_input=exclude, exclude_input_prompt=exclude, exclude_output_prompt=exclude)
        body, _ = exporter.from_notebook_node(nb)
        paths[key] = out / (f"{name}.html" if key == "report" else f"{name}_nocode.html")
        atomic_write_text(paths[key], body)
    return paths


def _find_nbconvert_templates() -> None:
    """nbconvert installed with `pip install --target DIR` (PYTHONPATH; common on clusters and bare GPU nodes) keeps
    its templates in DIR/share/jupyter, which Jupyter does not search: add that folder to JUPYTER_PATH."""
    import nbconvert
    from jupyter_core.paths import jupyter_path

    data = Path(nbconvert.__file__).resolve().parents[1] / "share" / "jupyter"
    if (data / "nbconvert" / "templates").is_dir() and str(data) not in jupyter_path():
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [os.environ.get("JUPYTER_PATH"), str(data)]))


def count_rendered_figures(dom: str) -> int:
    """Plotly figures in a rendered DOM: plot containers holding at least one `<svg class="main-svg"` (plotly
    draws 2-3 such SVGs per figure, and none when its JavaScript did not run)."""
    chunks = re.split(r'class="plot-container plotly"', dom)[1:]
    return sum('class="main-svg"' in c for c in chunks)


def _chromium(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="pretok-chromium-") as profile:
        cmd = [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def render_check(html_path: str | Path, screenshot_path: str | Path | None = None, budget_ms: int = 20000,
                 window: tuple[int, int] = (1280, 1600), timeout: float = 120.0) -> int:
    """Open `html_path` in real headless Chromium (no network needed), let its JavaScript run for `budget_ms` of
    virtual time, and return how many plotly figures rendered (see `count_rendered_figures`). With
    `screenshot_path`, also save a PNG of the first `window` pixels of the page."""
    url = Path(html_path).resolve().as_uri()
    common = [f"--window-size={window[0]},{window[1]}", f"--virtual-time-budget={budget_ms}"]
    dom = _chromium([*common, "--dump-dom", url], timeout)
    if dom.returncode != 0:
        raise RuntimeError(f"chromium failed on {html_path} (exit {dom.returncode}): {dom.stderr[-2000:]}")
    if screenshot_path is not None:
        shot = Path(screenshot_path).resolve()
        shot.parent.mkdir(parents=True, exist_ok=True)
        res = _chromium([*common, f"--screenshot={shot}", url], timeout)
        if res.returncode != 0 or not shot.is_file():
            raise RuntimeError(f"chromium screenshot of {html_path} failed: {res.stderr[-2000:]}")
    return count_rendered_figures(dom.stdout)


def ensure_kernel(name: str = "pretok") -> str:
    """A Jupyter kernel `name` running this Python (installed into sys.prefix if missing); returns its name."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(name)
        if os.path.abspath(spec.argv[0]) == os.path.abspath(sys.executable):  # not resolved: venv python is a link
            return name
    except NoSuchKernel:
        pass
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", name,
                    "--display-name", f"Python ({name})"], check=True, capture_output=True)
    return name
