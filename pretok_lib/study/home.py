"""Where `pretok study` reads its notebooks and configs (the study's home), and what its kernels get to find it.

The home is, first found:
1. `PRETOK_STUDY_HOME` (set by `pretok study` for its notebook kernels, so they resolve as it did);
2. the current project: the current directory or a parent of it holding `notebooks/` with every study notebook
   (a clone, a copy of the project; another clone than the one pretok was installed from is used as it is);
3. the notebooks and configs shipped inside the installed package (`pretok_lib/_project/`, package data of the
   wheel: setup.py);
4. the source tree pretok_lib was imported from (`steps.ROOT`: a checkout run without `pip install`).

The home is only read: a study writes under its `--out` alone (run.py runs the notebooks there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..machine.process_env import environ_set

HOME_ENV = "PRETOK_STUDY_HOME"
NOTEBOOKS = ("01_pretokenize", "02_loader_benchmark", "03_train", "04_sweep", "05_analysis")
PACKAGE = Path(__file__).resolve().parents[1]
BUNDLED = PACKAGE / "_project"  # where the wheel puts notebooks/ and configs/


def is_home(d: Path, names: Sequence[str] = NOTEBOOKS) -> bool:
    """Whether `d/notebooks` holds every study notebook."""
    return all((d / "notebooks" / f"{n}.ipynb").is_file() for n in names)


def current_project(start: Path | None = None) -> Path | None:
    """The current directory, or its nearest parent, that holds the study notebooks; None if none does."""
    here = (start or Path.cwd()).resolve()
    return next((d for d in (here, *here.parents) if is_home(d)), None)


def study_home() -> Path:
    """The directory whose notebooks/ and configs/ the study uses (see the module doc)."""
    from . import steps

    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    return current_project() or (BUNDLED if is_home(BUNDLED) else steps.ROOT)


def default_out(profile: str) -> Path:
    """`runs/study-<profile>` of the current project, else of the current directory (never the install's)."""
    return (current_project() or Path.cwd()).resolve() / "runs" / f"study-{profile}"


@contextmanager
def kernel_environment(home: Path) -> Iterator[None]:
    """The environment the notebook kernels start with: PRETOK_STUDY_HOME, and the directory of this pretok_lib
    first on PYTHONPATH when it is a source tree (the kernels no longer start in it), so they import the same
    code. Restored afterwards."""
    source = PACKAGE.parent
    changes = {HOME_ENV: str(home)}
    if source.name not in ("site-packages", "dist-packages"):
        changes["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))
    with environ_set(changes):
        yield
