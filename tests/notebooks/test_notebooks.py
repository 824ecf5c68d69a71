"""The study notebooks: committed clean (no outputs, a `parameters` cell, the project kernel), executed end to end
by papermill with the smoke profile's tiny parameters (`run_study`), resumable, reported as HTML that renders in
a real browser; and JupyterLab starts with the notebooks and the project kernel."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
import yaml

from pretok_lib.launch.procs import stop_tree
from pretok_lib.study import NOTEBOOKS, run_study
from pretok_lib.study.profiles import PROFILES
from pretok_lib.study.run import KERNEL, NOTEBOOK_DIR, declared_parameters

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_committed_clean(name: str) -> None:
    nb = nbformat.read(str(NOTEBOOK_DIR / f"{name}.ipynb"), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), "the first code cell must be tagged `parameters`"
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    assert nb.metadata["kernelspec"]["name"] == KERNEL
    assert all(c.get("id") for c in nb.cells), "cell ids (nbformat 4.5): the study tells a notebook's end by its last"
    assert "study_dir" in declared_parameters(NOTEBOOK_DIR / f"{name}.ipynb")
    for profile, params in PROFILES.items():  # every profile sets every parameter a notebook declares
        assert declared_parameters(NOTEBOOK_DIR / f"{name}.ipynb") - {"study_dir"} <= set(params), (profile, name)
    import papermill

    for key, p in papermill.inspect_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb")).items():
        if key != "study_dir":  # opened in JupyterLab, a notebook runs the quick profile
            assert ast.literal_eval(p["default"]) == PROFILES["quick"][key], (name, key)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("study") / "study-smoke"
    t0 = time.monotonic()
    record = run_study("smoke", out=out, stream=False, echo=None, publish=out.parent / "published")
    record["test_seconds"] = time.monotonic() - t0
    return out, record


@pytest.mark.slow
def test_smoke_study_executes_every_notebook(smoke) -> None:
    out, record = smoke
    assert {n: r["status"] for n, r in record["notebooks"].items()} == dict.fromkeys(NOTEBOOKS, "completed")
    assert json.loads((out / "study.json").read_text())["profile"] == "smoke"
    published = out.parent / "published" / "study-smoke"
    assert record["published_figures"] == str(published)
    assert sorted(p.name for p in published.iterdir()) == sorted(p.name for p in (out / "figures").iterdir())
    for name in NOTEBOOKS:
        nb = nbformat.read(str(out / "notebooks" / f"{name}.ipynb"), as_version=4)
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert injected and f"study_dir = \"{out}\"" in injected[0].source, name
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert not errors, name
    index = json.loads((out / "data" / "datasets.json").read_text())
    assert set(index["paths"]) == {"padded", "padding-free", "pretok-padded", "pretok-token-list", "pretok-memmap"}
    assert set(index["variants"]) == {"memmap", "token-list-none", "token-list-zstd3", "padded-none", "padded-zstd3"}
    assert all((Path(v["path"]) / "manifest.json").is_file() for v in index["variants"].values())
    assert set(index["eval"]) == {"pretok-memmap", "pretok-padded"}   # the held-out documents (issue 36)
    for d in (out / "runs").iterdir():   # every run validates on them, none trains on them
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        assert cfg["eval"]["path"] == index["eval"]["pretok-memmap"] != cfg["data"]["path"], d.name
        assert cfg["eval"].get("own_path") in (None, index["eval"]["pretok-padded"]), d.name
    printed = "".join(o.get("text", "") for n in NOTEBOOKS for c in nbformat.read(
        str(out / "notebooks" / f"{n}.ipynb"), as_version=4).cells if c.cell_type == "code" for o in c.outputs)
    assert not re.search(r"\[(PASS|FAIL)\] ", printed)   # pretok's own targets: not in the user's output
    tok = json.loads((out / "bench" / "tokenize.json").read_text())
    assert any(k.startswith("(a)") for k in tok["methods"]) and any(k.startswith("(d)") for k in tok["methods"])
    loaders = json.loads((out / "bench" / "loaders.json").read_text())
    assert {r["kind"] for r in loaders["loaders"].values()} >= {"padded", "pretok-memmap", "reference"}
    paced = {n: r for n, r in loaders["loaders"].items() if r["kind"] != "reference"}   # for notebook 05's check
    assert all(r["paced_batches"] == 3 and r["pace_s"] == 0.02 and r["paced_tokens_per_s"] > 0 for r in paced.values())
    shown = "".join(o.get("data", {}).get("text/markdown", "") for c in nbformat.read(
        str(out / "notebooks" / "05_analysis.ipynb"), as_version=4).cells if c.cell_type == "code" for o in c.outputs)
    assert "from back to back to paced" in shown and "agree?" in shown   # the model checked on the runs
    runs = {d.name: json.loads((d / "run.json").read_text())["status"] for d in (out / "runs").iterdir()}
    assert runs == dict.fromkeys(["train-pretok-memmap-w1-s64", "sweep-padded-w1-s64", "sweep-pretok-memmap-w1-s64",
                                  "sweep-pretok-memmap-w2-s64"], "completed")
    figs = out / "figures"
    for name in ("throughput", "data_stall", "loss_curves", "ddp_scaling", "storage", "tokenize_throughput",
                 "loader_throughput"):
        assert (figs / f"{name}.html").stat().st_size > 1000 and (figs / f"{name}.png").stat().st_size > 1000, name


@pytest.mark.slow
def test_smoke_report_renders(smoke) -> None:
    from pretok_lib.analysis.report import find_chromium, render_check

    out, record = smoke
    full, nocode = out / "report.html", out / "report_nocode.html"
    assert Path(record["report"]["report_nocode"]) == nocode
    text = nocode.read_text()
    assert "notebook_setup" in full.read_text() and "notebook_setup" not in text  # code hidden
    for title in ("1. Pretokenize", "2. Loader-only", "3. One training run", "4. The sweep", "5. Analysis"):
        assert title in text, title
    assert text.count("plotly.js v") <= 2  # the bundle is embedded once, not once per notebook
    assert_reads_like_a_paper(text, out)
    try:
        find_chromium()
    except RuntimeError:
        pytest.skip("no Chromium to render the report")
    shot = out / "first_screen.png"
    drawn = render_check(nocode, screenshot_path=shot, window=(1280, 900))
    assert drawn >= 15 and drawn == text.count('class="pretok-caption"')  # every figure drew its SVG
    assert_not_blank(shot, (1280, 900))


def assert_reads_like_a_paper(text: str, out: Path) -> None:
    """The readers' report opens with the findings in numbers, each linked to its figure; every figure has a
    caption; long printouts are folded; CPU figures say what CPU runs cannot show."""
    start = text.index('<section id="findings">')
    block = text[start:text.index("</section>", start)]
    assert start < text.index('id="01_pretokenize"')      # before the first notebook: the first screen
    values = re.findall(r'class="finding-value">(.*?)</td>', block, re.S)
    assert len(values) == 6 and all(re.search(r"\d", v) and "not measured" not in v for v in values), values
    assert "75%" in block                                   # the original study's figure beside ours
    for target in re.findall(r'href="#(fig-[\w-]+)"', block):
        assert f'id="{target}"' in text, target           # each finding links to its figure
    figures = text.count('class="plotly-graph-div"')
    assert figures >= 15 and text.count('class="pretok-caption"') == figures
    assert text.count("<details>") >= 3 and "pretok inspect of every output" in text
    assert "Printed output," in text                       # the benchmark printouts folded
    devices = {json.loads((d / "run.json").read_text()).get("device") for d in (out / "runs").iterdir()}
    if "cpu" in devices:
        assert "this is not GPU scaling" in text and 'href="#fig-stall_prediction"' in text


def assert_not_blank(png: Path, size: tuple[int, int]) -> None:
    """A screenshot of the given size with text on it: enough dark pixels and many grey levels."""
    from PIL import Image

    with Image.open(png) as im:
        assert im.size == size
        grey = im.convert("L")
        hist = grey.histogram()
    dark = sum(hist[:200]) / (size[0] * size[1])
    assert dark > 0.01 and sum(1 for h in hist if h) > 50, (dark, png)


@pytest.mark.slow
def test_rerun_skips_completed_runs(smoke) -> None:
    out, _ = smoke
    record = run_study("smoke", out=out, notebooks=["04"], stream=False, echo=None, report=False, publish=None)
    # the study's record keeps every notebook; 04's says this command reran it
    assert list(record["notebooks"]) == list(NOTEBOOKS) and record["notebooks"]["04_sweep"]["run"] == record["started"]
    nb = nbformat.read(str(out / "notebooks" / "04_sweep.ipynb"), as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "3 grid points, 3 already completed, 0 to run" in printed
    attempts = json.loads((out / "runs" / "sweep-pretok-memmap-w2-s64" / "launcher.json").read_text())["attempts"]
    assert len(attempts) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET", body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=10) as r:
        text = r.read()
    return json.loads(text) if text else {}


async def _run_cell(ws_url: str, code: str) -> str:
    """Execute `code` over the server's websocket bridge (the path JupyterLab's frontend takes); its stdout."""
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(ws_url)
    msg_id = secrets.token_hex(16)
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": secrets.token_hex(16),
              "version": "5.3", "date": ""}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True}
    await ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                       "channel": "shell", "buffers": []}))
    while True:
        msg = json.loads(await ws.read_message())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("stream", "error"):
            ws.close()
            return msg["content"].get("text") or str(msg["content"])


@pytest.mark.slow
def test_jupyterlab_lists_notebooks_and_runs_the_kernel_on_encrypted_channels(tmp_path: Path) -> None:
    """`make lab` as a user gets it: the notebooks, the `pretok` kernel, and (with the config `make lab` writes into
    the venv, here into a prefix of its own) a kernel whose channels carry Curve keys, reached through the server's
    websocket, with no warning of plain TCP in the server's log."""
    from pretok_lib.analysis.report import ensure_kernel
    from pretok_lib.study.kernels import configure_lab

    ensure_kernel(KERNEL)
    jupyter = Path(sys.executable).parent / "jupyter"
    if not jupyter.exists() and not shutil.which("jupyter"):
        pytest.skip("jupyter not installed")
    port, token = _free_port(), secrets.token_hex(16)
    configure_lab(tmp_path / "prefix")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTER_CONFIG_PATH": str(tmp_path / "prefix" / "etc" / "jupyter")}
    cmd = [str(jupyter if jupyter.exists() else shutil.which("jupyter")), "lab", "--no-browser", "--ip", "127.0.0.1",
           "--port", str(port), f"--IdentityProvider.token={token}", "--allow-root", f"--ServerApp.root_dir={ROOT}"]
    proc = subprocess.Popen(cmd, stdout=(tmp_path / "lab.log").open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "lab.log").read_text()
                time.sleep(0.3)
        listing = _get(f"{base}/api/contents/notebooks?token={token}")
        names = {c["name"] for c in listing["content"]}
        assert {f"{n}.ipynb" for n in NOTEBOOKS} <= names
        specs = _get(f"{base}/api/kernelspecs?token={token}")
        assert KERNEL in specs["kernelspecs"]
        with pytest.raises(urllib.error.HTTPError):  # the token is required
            _get(f"{base}/api/contents/notebooks")
        kernel = _get(f"{base}/api/kernels?token={token}", "POST", {"name": KERNEL})
        ws_url = f"ws://127.0.0.1:{port}/api/kernels/{kernel['id']}/channels?token={token}"
        probe = "from ipykernel.connect import get_connection_info\nprint(sorted(get_connection_info(unpack=True)))"
        printed = asyncio.run(asyncio.wait_for(_run_cell(ws_url, probe), timeout=90))
        assert "'curve_secretkey'" in printed, printed
        _get(f"{base}/api/kernels/{kernel['id']}?token={token}", "DELETE")
    finally:
        stop_tree(proc, grace_s=15)
    assert "without encryption" not in (tmp_path / "lab.log").read_text()


def test_analysis_notebook_runs_on_an_empty_study(tmp_path: Path) -> None:
    """Notebook 05 alone on a study directory with no runs and no benchmarks (e.g. opened in JupyterLab before the
    study ran) executes every cell: empty tables and figures, no KeyError."""
    record = run_study("smoke", out=tmp_path / "empty", notebooks=["05"], stream=False, echo=None, report=False,
                       publish=None)
    assert {n: r["status"] for n, r in record["notebooks"].items()} == {"05_analysis": "completed"}, record
    executed = nbformat.read(str(tmp_path / "empty" / "notebooks" / "05_analysis.ipynb"), as_version=4)
    assert not [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
