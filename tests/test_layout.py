"""The package's layout (issue 38): the root holds the command line, errors, atomic writes, the public tokenize API
and the data-path registry; every other module sits in the package of its stage, and docs/ARCHITECTURE.md lists
every module."""

from __future__ import annotations

import re
from pathlib import Path

import pretok_lib

PKG = Path(pretok_lib.__file__).parent
ROOT_MODULES = {"cli.py", "exits.py", "errors.py", "atomic.py", "pretokenize.py", "datapaths.py"}


def test_the_root_holds_only_the_entry_points_and_the_shared_contracts() -> None:
    assert {p.name for p in PKG.glob("*.py")} - {"__init__.py"} == ROOT_MODULES


def test_architecture_lists_every_module() -> None:
    text = (PKG.parent / "docs" / "ARCHITECTURE.md").read_text()
    layout = text[text.index("pretok_lib/ "): text.index("notebooks/ ")]
    named = set(re.findall(r"\b(\w+\.py)\b", layout))
    missing = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts
                     and p.name not in named)
    assert not missing, f"docs/ARCHITECTURE.md does not list: {missing}"


# The tests mirror the package: each folder under tests/ is a package of pretok_lib or one of the end-to-end suites,
# and a test file at tests/ root tests a root module or the suite itself (a test of sources/ sits in tests/sources/).
END_TO_END = {"remote", "slurm", "notebooks"}
ROOT_TESTS = {"test_cli.py", "test_bad_input.py", "test_datapaths.py", "test_portability.py",  # root modules; off Linux
              "test_layout.py", "test_fact_homes.py", "test_suite_rules.py", "test_suite_timing.py"}  # the house


def test_the_tests_mirror_the_package() -> None:
    tests = PKG.parent / "tests"
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    folders = {p.parent.name for p in tests.glob("*/__init__.py")}
    assert folders - packages - END_TO_END == set(), "a tests/ folder that is no package of pretok_lib"
    assert {p.name for p in tests.glob("test_*.py")} == ROOT_TESTS
