"""Where `pretok study` reads and writes (issue 36, item 6). It ran the notebooks of the checkout pretok_lib was
installed from, with that checkout as working directory, and copied the figures into its figures/: started from
another clone it wrote into the install; an installed package (`pip install`) had no notebooks at all.

Now the notebooks and configs come from the current project (a directory holding notebooks/), else from the package
data of the wheel (setup.py), and everything is written under --out. The wheel is built from a copy of the project
(`pip wheel --no-deps`, offline); the studies run stand-in notebooks (a few cells: where they run, which pretok_lib
and config they see, a write relative to their cwd) in a subprocess, as `pretok study` would, and every directory
but --out is compared before and after (names, sizes, mtimes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from pretok_lib.study.run import NOTEBOOKS

from ..conftest import ROOT

pytestmark = pytest.mark.slow

PROJECT_FILES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "pretok_lib", "notebooks", "configs")
REPORT = """\
import json, os
import pretok_lib
from pretok_lib.study import steps
os.makedirs(os.path.join(study_dir, "figures"), exist_ok=True)
open(os.path.join(study_dir, "figures", "f.html"), "w").write("<html></html>")
open("relative.txt", "w").write("written relative to the notebook's working directory")
print("FACTS " + json.dumps({"cwd": os.getcwd(), "lib": pretok_lib.__file__, "mark": MARK,
                             "config": str(steps.resolve("configs/tiny.yaml"))}))
"""


def python() -> str:
    """The python of the `pretok` kernel when it is registered (so the study registers none: it would overwrite
    a shared venv's kernel with another path to the same python), else this one."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return KernelSpecManager().get_kernel_spec("pretok").argv[0]
    except NoSuchKernel:
        return sys.executable


def stand_in_notebooks(d: Path, mark: str) -> None:
    """The five study notebooks as stand-ins: a parameters cell; 01 also reports where it ran (REPORT)."""
    d.mkdir(parents=True, exist_ok=True)
    for name in NOTEBOOKS:
        params = nbformat.v4.new_code_cell('study_dir = ""')
        params.metadata["tags"] = ["parameters"]
        cells = [params] + ([nbformat.v4.new_code_cell(f"MARK = {mark!r}\n" + REPORT)] if name == NOTEBOOKS[0] else [])
        nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                            "display_name": "Python 3"}})
        nbformat.write(nb, str(d / f"{name}.ipynb"))


def snapshot(*dirs: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `dirs` (recursive) with its size and mtime."""
    out = {}
    for d in dirs:
        for p in [d, *d.rglob("*")] if d.exists() else []:
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def study(pythonpath: Path, cwd: Path, out: Path) -> dict:
    """`run_study("smoke", notebooks=["01"], report=False)` in a subprocess of `python()` importing pretok_lib from
    `pythonpath`, in `cwd`; returns the facts notebook 01 printed."""
    code = ("from pretok_lib.study.run import run_study; "
            f"run_study('smoke', out={str(out)!r}, notebooks=['01'], report=False, stream=False, echo=None)")
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PRETOK_STUDY_HOME", None)
    r = subprocess.run([python(), "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    executed = nbformat.read(str(out / "notebooks" / "01_pretokenize.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
    return json.loads(text.split("FACTS ", 1)[1].splitlines()[0])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of a copy of this project (a build in the checkout would write build/ and *.egg-info there)."""
    d = tmp_path_factory.mktemp("wheel")
    for name in PROJECT_FILES:
        src = ROOT / name
        if not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, d / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_project"))
        else:
            (d / "src").mkdir(exist_ok=True)
            shutil.copy2(src, d / "src" / name)
    r = subprocess.run([python(), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        "-w", str(d / "dist"), str(d / "src")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    [whl] = (d / "dist").glob("pretok-*.whl")
    return whl


def test_the_wheel_ships_the_notebooks_and_configs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in NOTEBOOKS:
            member = f"pretok_lib/_project/notebooks/{name}.ipynb"
            assert member in names, sorted(n for n in names if not n.endswith(".py"))
            assert z.read(member) == (ROOT / "notebooks" / f"{name}.ipynb").read_bytes()
        for cfg in (ROOT / "configs").glob("*.yaml"):
            assert z.read(f"pretok_lib/_project/configs/{cfg.name}") == cfg.read_bytes()
        assert "pretok_lib/study/home.py" in names
        assert not any(n.startswith(("notebooks/", "configs/")) for n in names)   # nothing at the top level


def test_an_installed_pretok_runs_its_shipped_notebooks_and_writes_only_under_out(wheel: Path, tmp_path: Path):
    site, here, out = tmp_path / "site", tmp_path / "elsewhere", tmp_path / "study"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)       # a pure-Python wheel installed by hand (pip install --target without pip)
    stand_in_notebooks(site / "pretok_lib" / "_project" / "notebooks", "shipped")
    here.mkdir()
    before = snapshot(site, here)
    facts = study(site, here, out)
    assert facts["mark"] == "shipped" and facts["lib"].startswith(str(site))
    assert facts["config"] == str(site / "pretok_lib" / "_project" / "configs" / "tiny.yaml")
    assert facts["cwd"] == str(out) and (out / "relative.txt").is_file() and (out / "figures" / "f.html").is_file()
    assert snapshot(site, here) == before, "the study wrote outside --out"
    assert json.loads((out / "study.json").read_text())["home"] == str(site / "pretok_lib" / "_project")


def test_a_study_started_in_another_project_runs_that_project_and_writes_only_under_out(tmp_path: Path):
    """The installed pretok is this checkout; the study is started in another clone (its notebooks/ and configs/,
    from a subdirectory of it): it runs that clone's notebooks and configs, and writes nothing into either."""
    project, out = tmp_path / "clone", tmp_path / "study"
    stand_in_notebooks(project / "notebooks", "clone")
    shutil.copytree(ROOT / "configs", project / "configs")
    (project / "sub").mkdir()
    mine = (ROOT / "figures", ROOT / "notebooks", ROOT / "configs")
    before = snapshot(project, *mine)
    facts = study(ROOT, project / "sub", out)
    assert facts["mark"] == "clone" and facts["lib"] == str(ROOT / "pretok_lib" / "__init__.py")
    assert facts["config"] == str(project / "configs" / "tiny.yaml")
    assert facts["cwd"] == str(out) and (out / "relative.txt").is_file() and (out / "figures" / "f.html").is_file()
    assert snapshot(project, *mine) == before, "the study wrote outside --out"
    assert not (ROOT / "runs" / out.name).exists()
