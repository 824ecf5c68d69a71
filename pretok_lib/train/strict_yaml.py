"""YAML as pretok reads every config a user writes (training configs, sweep grids, `--set` and dotted overrides):
PyYAML's safe loader, except that a mapping giving the same key twice is an error naming both lines (PyYAML lets
the last one win, silently: `train:` twice dropped the first section's settings)."""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping gives one key twice; `str()` is one line: `line 7: duplicate key 'lr' (first on line 3)`."""

    def __init__(self, key: Any, line: int, first: int):
        super().__init__(None, None, f"line {line}: duplicate key {key!r} (first on line {first})")
        self.key, self.line, self.first = key, line, first

    def __str__(self) -> str:
        return self.problem


class StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader refusing duplicate mapping keys (also in nested and flow mappings)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *base` may be overridden by design
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:   # an unhashable key: SafeLoader's own error follows
                    continue
                if first is not None:
                    raise DuplicateKeyError(key, line, first)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """`yaml.safe_load(text)`, refusing duplicate keys (DuplicateKeyError, a yaml.YAMLError)."""
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
