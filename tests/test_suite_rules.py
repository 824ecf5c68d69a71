"""The suite's own conventions, each with one home in tests/conftest.py: every test that mounts a file system carries
`needs_root` (as non-root it skips with a reason instead of failing in `mount`), and the one-line error contract is
asserted by `one_line`, not by copies of it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .conftest import needs_root, one_line

TESTS = Path(__file__).resolve().parent
MOUNTS = {"mount", "umount"}


def _test_files() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(TESTS.rglob("*.py"))}


def _mounts_itself(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and n.value in MOUNTS for n in ast.walk(fn))


def _called(fn: ast.AST) -> set[str]:
    return {n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}


def _functions(files: dict[Path, ast.Module]) -> list[tuple[Path, ast.FunctionDef]]:
    return [(p, n) for p, tree in files.items() for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _marked(fn: ast.FunctionDef, tree: ast.Module) -> bool:
    marks = [ast.unparse(d) for d in fn.decorator_list]
    marks += [ast.unparse(n.value) for n in tree.body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)]
    return any("needs_root" in m for m in marks)


def mounting_tests() -> list[tuple[Path, ast.FunctionDef, bool]]:
    """(file, test, carries needs_root) for each test that mounts, itself or through helpers of any test file."""
    files = _test_files()
    functions = _functions(files)
    helpers = {fn.name for _, fn in functions if not fn.name.startswith("test_") and _mounts_itself(fn)}
    while True:  # helpers calling helpers
        more = {fn.name for _, fn in functions if not fn.name.startswith("test_") and _called(fn) & helpers}
        if more <= helpers:
            break
        helpers |= more
    return [(p, fn, _marked(fn, files[p])) for p, fn in functions
            if fn.name.startswith("test_") and (_mounts_itself(fn) or _called(fn) & helpers)]


def test_every_test_that_mounts_needs_root() -> None:
    found = mounting_tests()
    assert len(found) >= 10, found  # the disk-full and read-only suites are seen (engine, train, export, data, ...)
    unmarked = [f"{p.relative_to(TESTS)}::{fn.name}" for p, fn, marked in found if not marked]
    assert not unmarked, f"mounting without @needs_root (tests/conftest.py): {unmarked}"


def test_the_root_guard_has_one_home() -> None:
    """A root condition on a test is `needs_root`; no file declares its own."""
    assert needs_root.mark.name == "skipif" and "needs root" in needs_root.mark.kwargs["reason"]
    own = [p.relative_to(TESTS) for p in TESTS.rglob("*.py") if p.name != "conftest.py"
           and re.search(r"skipif\(\s*os\.geteuid\(\)", p.read_text())]
    assert not own, own


# A copy of the one-line check: a count of one line and that line's start, the CLI's prefix, in one assert.
COPY = re.compile(r"len\(\w+\) == 1 and \w+\[0\]\.startswith\(f?\"pretok: ")


def test_one_line_errors_are_asserted_by_one_helper() -> None:
    copies = [p.relative_to(TESTS) for p in TESTS.rglob("*.py")
              if p.name != "conftest.py" and COPY.search(p.read_text())]
    assert not copies, f"assert one-line errors with tests/conftest.py's one_line: {copies}"
    assert one_line("\npretok: error: x: bad\n\n", "x:", "bad") == "pretok: error: x: bad"
    for bad in ("pretok: error: a\npretok: error: b", "Traceback (most recent call last):\n  ...", "pretok: note: a"):
        try:
            one_line(bad)
        except AssertionError:
            continue
        raise AssertionError(f"one_line accepted {bad!r}")
