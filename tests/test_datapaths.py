"""The data-path registry is the one list every layer reads: the loaders, the config check, the benchmarks, the
analysis and the study agree with it, and none of them imports torch to know it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

from pretok_lib import datapaths
from pretok_lib.datapaths import FORMAT_OF, KINDS, ON_THE_FLY, PACKED, PRETOK_PAIRS, PRETOKENIZED

from .conftest import ROOT


def test_registry_facts() -> None:
    assert KINDS == ("padded", "padding-free", "pretok-padded", "pretok-token-list", "pretok-memmap")
    assert set(ON_THE_FLY) | set(PRETOKENIZED) == set(KINDS) and not set(ON_THE_FLY) & set(PRETOKENIZED)
    assert set(FORMAT_OF) == set(PRETOKENIZED) and set(FORMAT_OF.values()) == {"padded", "token-list", "memmap"}
    for kind, base in PRETOK_PAIRS.items():  # a pretokenized path is compared with the baseline of its layout
        assert base in ON_THE_FLY and (kind in PACKED) == (base in PACKED)
    assert sorted(["pretok-memmap", "x", "padded"], key=datapaths.rank) == ["padded", "pretok-memmap", "x"]
    assert datapaths.global_batch(8, 2, 4) == 64 and datapaths.window(1024) == 1025


def test_every_layer_reads_the_registry() -> None:
    import pretok_lib.data as data
    from pretok_lib.analysis import stall
    from pretok_lib.bench import loaders
    from pretok_lib.study import profiles, steps

    assert data.KINDS is KINDS and stall.PATHS == KINDS and list(profiles.PATHS) == list(KINDS)
    assert loaders.FORMAT_OF is FORMAT_OF and set(steps.KIND_OF.values()) == set(PRETOKENIZED)
    assert set(steps.data_paths("c.parquet", {"memmap": "m", "token-list-zstd3": "t", "padded-zstd3": "p"})) == set(KINDS)


def test_registry_is_torch_free() -> None:
    code = "import sys, pretok_lib.datapaths, pretok_lib.train.run_record, pretok_lib.analysis.runs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# ---------------------------------------------------------------- the registry is the one place kinds are written

_NAMED = re.compile(r"kind|baseline|path")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _is_kind(node: ast.AST, kinds: tuple[str, ...]) -> bool:
    return isinstance(node, ast.Constant) and node.value in kinds


def kind_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals that name a data path, docstrings aside. A kind that is not also a format name is flagged
    wherever it is written (alone, or leading a key such as "pretok-memmap w0"); "padded", also a format and a word,
    where it is used as a kind: beside another kind in a literal collection, compared with or passed as a
    kind / baseline / path, or the default of such a parameter."""
    ambiguous = tuple(k for k in KINDS if k in FORMAT_OF.values())
    plain = tuple(k for k in KINDS if k not in ambiguous)
    skip, out = _docstrings(tree), []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip and \
                any(n.value == k or n.value.startswith(k + " ") for k in plain):
            out.append((n.lineno, n.value))
        elif isinstance(n, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            items = [*n.keys, *n.values] if isinstance(n, ast.Dict) else n.elts
            if any(_is_kind(e, ambiguous) for e in items) and sum(_is_kind(e, KINDS) for e in items) > 1:
                out.append((n.lineno, ast.unparse(n)[:60]))
        elif isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if any(_is_kind(e, ambiguous) for e in sides) and _NAMED.search(ast.unparse(n)):
                out.append((n.lineno, ast.unparse(n)[:60]))
        elif isinstance(n, ast.keyword) and n.arg and _NAMED.search(n.arg) and _is_kind(n.value, ambiguous):
            out.append((n.lineno, f"{n.arg}={n.value.value}"))
        elif isinstance(n, ast.arguments):
            args = [*n.posonlyargs, *n.args]
            pairs = [*zip(args[len(args) - len(n.defaults):], n.defaults), *zip(n.kwonlyargs, n.kw_defaults)]
            out += [(d.lineno, f"{a.arg}={d.value}") for a, d in pairs
                    if d is not None and _NAMED.search(a.arg) and _is_kind(d, ambiguous)]
        elif isinstance(n, ast.Call) and "speedup" in ast.unparse(n.func):
            out += [(a.lineno, a.value) for a in n.args if _is_kind(a, ambiguous)]
    return out


def test_kind_literals_live_in_the_registry() -> None:
    """A data path's name is written in datapaths.py only: the rest reads the registry (or its named constants),
    so a sixth path is one registry row. Notebooks: their code cells, except the `parameters` cell, whose values
    are literals by papermill's design and pinned to the quick profile (tests/notebooks)."""
    found = {}
    for path in sorted((ROOT / "pretok_lib").rglob("*.py")):
        if path.name != "datapaths.py" and (hits := kind_literals(ast.parse(path.read_text()))):
            found[path.relative_to(ROOT).as_posix()] = hits
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code" and "parameters" not in cell.get("metadata", {}).get("tags", []):
                src = "".join(cell["source"])
                try:
                    tree = ast.parse("\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))))
                except SyntaxError:
                    continue
                if hits := kind_literals(tree):
                    found[f"{nb.name} cell {i}"] = hits
    assert not found, found


def test_the_literal_check_catches_each_form() -> None:
    code = '''
KIND = "pretok-memmap"
KEY = f"pretok-memmap w{0}"
PAIR = ("padded", "padding-free")
ok = kind == "padded"
def f(runs, baseline="padded"): ...
g(data_kind="padded")
path_speedups(runs, "padded", "x")
FMT = "padded"           # a format: not flagged
x = fmt == "padded"      # not flagged
'''
    lines = sorted({line for line, _ in kind_literals(ast.parse(code))})
    assert lines == [2, 3, 4, 5, 6, 7, 8]


def test_each_path_reader_colour_and_layout() -> None:
    for p in datapaths.REGISTRY:
        assert isinstance(p.reader_class(), type) and p.reader_class().__name__ == p.reader.split(":")[1]
        assert p.inram_reader is None or p.row_groups and isinstance(datapaths.load(p.inram_reader), type)
        assert re.fullmatch(r"#[0-9a-f]{6}", p.colour) and p.layout in ("packed", "padded")
        assert p.row_groups == (p.name in datapaths.PARQUET_KINDS)
    assert len(set(datapaths.COLOURS.values())) == len(KINDS)
    assert datapaths.BASELINE in ON_THE_FLY and datapaths.DEFAULT in PRETOKENIZED
    assert all(k in PRETOKENIZED for k in datapaths.STUDY_PRETOKENIZED)
    for packed, padded in datapaths.PACKING_PAIRS:
        assert packed in PACKED and padded not in PACKED
