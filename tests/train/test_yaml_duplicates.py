"""Every YAML a user writes for pretok (a training config, a sweep grid, a dotted override or `--set` value)
refuses a key given twice in one mapping, naming both lines; PyYAML's safe_load let the last one win silently
(`train:` twice dropped the first section's settings). Generated: random nested configs, one key repeated at a
random depth, in block or flow style."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.train import strict_yaml
from pretok_lib.errors import PretokError
from pretok_lib.launch.sweep import Grid, parse_value
from pretok_lib.train.config import load_config

names = st.text("abcdefghij_", min_size=1, max_size=6)
scalars = st.one_of(st.integers(-5, 5), st.booleans(), st.none(), st.text("xyz", max_size=3))
trees = st.recursive(st.dictionaries(names, scalars, min_size=1, max_size=4),
                     lambda inner: st.dictionaries(names, st.one_of(scalars, inner), min_size=1, max_size=4),
                     max_leaves=12)


def _paths(tree: dict, prefix=()) -> list[tuple]:
    """Every mapping of `tree` as the key path to it."""
    out = [prefix]
    for k, v in tree.items():
        if isinstance(v, dict):
            out += _paths(v, (*prefix, k))
    return out


def _with_duplicate(tree: dict, path: tuple, flow: bool) -> tuple[str, int, int]:
    """`tree` as YAML whose mapping at `path` gives its first key again at its end: (text, line of the repeat,
    line of the first)."""
    node = tree
    for k in path:
        node = node[k]
    key = next(iter(node))
    dumped_key = yaml.safe_dump({key: 0}, default_flow_style=True).strip()[1:-4]    # `key` as YAML writes it
    if flow:  # one line: `{..., key: value, key: 0, ...}`
        node[key], original = {"__dup__": 1}, node[key]
        marked = yaml.safe_dump(tree, default_flow_style=True, sort_keys=False, width=1 << 20)
        node[key] = original
        value = yaml.safe_dump(original, default_flow_style=True, width=1 << 20).strip().removesuffix("\n...")
        return marked.replace("{__dup__: 1}", f"{value}, {dumped_key}: 0", 1), 1, 1
    lines = yaml.safe_dump(tree, default_flow_style=False, sort_keys=False).splitlines()
    indent = " " * (2 * len(path))
    start = next(n for n, line in enumerate(lines) if line.startswith(f"{indent}{dumped_key}:"))
    end = start + 1   # past the mapping's last entry (and its nested lines)
    while end < len(lines) and lines[end].startswith(indent):
        end += 1
    lines.insert(end, f"{indent}{dumped_key}: 0")
    return "\n".join(lines) + "\n", end + 1, start + 1


@settings(max_examples=80, deadline=None, derandomize=True)
@given(trees, st.data(), st.booleans())
def test_a_key_given_twice_is_refused_naming_both_lines(tree, data, flow):
    assert strict_yaml.load(yaml.safe_dump(tree)) == yaml.safe_load(yaml.safe_dump(tree))   # no duplicate: as before
    path = data.draw(st.sampled_from(_paths(tree)))
    text, line, first = _with_duplicate(tree, path, flow)
    with pytest.raises(strict_yaml.DuplicateKeyError) as e:
        strict_yaml.load(text)
    if not flow:
        assert (e.value.line, e.value.first) == (line, first), text
    assert str(e.value) == f"line {e.value.line}: duplicate key {e.value.key!r} (first on line {e.value.first})"


SECTIONED = "train:\n  lr: 0.001\nmodel:\n  hidden_size: 64\ntrain:\n  steps: 5\n"


def test_every_config_loader_refuses_duplicates_with_one_line(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(SECTIONED)
    with pytest.raises(PretokError) as e:
        load_config(cfg)
    assert str(e.value) == f"{cfg}: not valid YAML (line 5: duplicate key 'train' (first on line 1))"
    cfg.write_text("train:\n  lr: 0.001\n  steps: 5\n  lr: 0.01\n")
    with pytest.raises(PretokError, match="line 4: duplicate key 'lr' \\(first on line 2\\)"):
        load_config(cfg)
    with pytest.raises(PretokError, match="duplicate key 'path'"):
        load_config(None, ["data.mixture=[{path: a, weight: 1, path: b}]"])
    grid = tmp_path / "grid.yaml"
    grid.write_text("axes:\n  lr: [0.1, 0.2]\naxes:\n  mb: [1]\n")
    with pytest.raises(PretokError, match="line 3: duplicate key 'axes'"):
        Grid.from_yaml(grid)
    with pytest.raises(PretokError, match="duplicate key 'a'"):
        parse_value("{a: 1, a: 2}")
    assert strict_yaml.load("base: &b {x: 1}\nd:\n  <<: *b\n  x: 2\n")["d"] == {"x": 2}   # a merge key overridden
