"""The grid of a sweep: points (world size + config overrides), their readable run ids, the expansion of axes,
base and linked overrides (`expand_grid`, `Grid`), and the check of every point's config before any runs."""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import PretokError
from ..train import strict_yaml
from .sweep_values import numbers, yaml_scalar

# Short axis names -> the trainer's config keys (any dotted key works as an axis too). "world" is the number of
# processes, a launcher setting rather than a config key.
ALIASES = {"data": "data.kind", "micro_batch": "data.micro_batch", "mb": "data.micro_batch",
           "precision": "train.precision", "lr": "train.lr", "seq_len": "data.seq_len"}
WORLD = "world"
# How the keys above appear in a run id, in this order: sweep-pretok-memmap-w2-mb4-bf16-lr3e-4-s256
_ID_PARTS = (("data.kind", ""), (WORLD, "w"), ("data.micro_batch", "mb"), ("train.precision", ""),
             ("train.lr", "lr"), ("data.seq_len", "s"))


@dataclass(frozen=True)
class Point:
    """One grid point: the number of processes and the config overrides (dotted key -> value, in order)."""

    world: int
    overrides: tuple[tuple[str, Any], ...]
    varying: tuple[str, ...] = ()  # keys (and "world") that an axis set, in axis order
    prefix: str = "sweep"
    repeat: int | None = None  # a repeated measurement of the same point: run id suffix -r<k>

    def get(self, key: str, default: Any = None) -> Any:
        key = ALIASES.get(key, key)
        if key == WORLD:
            return self.world
        return next((v for k, v in reversed(self.overrides) if k == key), default)

    def cli_overrides(self) -> list[str]:
        """`key=value` arguments of the trainer (values in YAML, which it parses)."""
        return [f"{k}={yaml_scalar(v)}" for k, v in self.overrides]

    @property
    def run_id(self) -> str:
        return run_id(self)

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "world": self.world, "overrides": dict(self.overrides),
                "varying": list(self.varying), "prefix": self.prefix, "repeat": self.repeat}


def _num_text(v: Any) -> str:
    """Compact, unambiguous text of a value in a run id: 0.0003 -> 3e-4, 1.5e-05 -> 1.5e-5, 256 -> 256."""
    if isinstance(v, float) and not math.isfinite(v):    # nan, inf: the point's config check then refuses them
        return str(v)
    if isinstance(v, float) and not v.is_integer():
        mant, exp = f"{v:.6e}".split("e")
        mant = mant.rstrip("0").rstrip(".")
        e = int(exp)
        return mant if e == 0 else f"{mant}e{e}"
    if isinstance(v, float):
        return str(int(v))
    return str(v)


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+_-]+", "_", text).strip("_") or "x"


def run_id(point: Point) -> str:
    """Readable id from the point alone, e.g. `sweep-pretok-memmap-w2-mb4-bf16-lr3e-4-s256`: the well-known keys
    (when set) in a fixed order, then every other axis as `<last key part><value>`."""
    parts = [point.prefix]
    known = {k for k, _ in _ID_PARTS}
    for key, tag in _ID_PARTS:
        v = point.get(key)
        if v is not None:
            parts.append(tag + _clean(_num_text(v)))
    for key in point.varying:
        if key not in known:
            parts.append(_clean(key.rsplit(".", 1)[-1]) + _clean(_num_text(point.get(key))))
    if point.repeat is not None:
        parts.append(f"r{point.repeat}")
    return "-".join(parts)


Linked = Mapping[str, Mapping[Any, Mapping[str, Any]]] | Callable[[dict], Mapping[str, Any]]


def expand_grid(base_overrides: Mapping[str, Any] | None, axes: Mapping[str, Sequence[Any]], *,
                linked: Linked | None = None, prefix: str = "sweep") -> list[Point]:
    """Every combination of `axes` (first axis varies slowest) on top of `base_overrides`.

    Axis names are dotted config keys, an alias (`data`, `micro_batch`/`mb`, `precision`, `lr`, `seq_len`) or
    `world` (processes per run; default 1 or `base_overrides["world"]`). `linked` adds overrides that follow a
    value, e.g. `{"data": {"padded": {"data.path": "corpus.parquet"}}}`, or is a function of the point's
    overrides returning more of them. Raises if two points would get the same run id."""
    base = {ALIASES.get(k, k): v for k, v in (base_overrides or {}).items()}
    world0 = _world(base.pop(WORLD, 1))
    names = [ALIASES.get(k, k) for k in axes]
    if len(set(names)) != len(names):
        raise PretokError(f"sweep: an axis is given twice ({', '.join(axes)})")
    values = [list(v) for v in axes.values()]
    for n, v in zip(names, values):
        if not v:
            raise PretokError(f"sweep: axis '{n}' has no values")
    link = {ALIASES.get(k, k): v for k, v in linked.items()} if isinstance(linked, Mapping) else None
    points, seen = [], {}
    for combo in itertools.product(*values):
        over = dict(base)
        world = world0
        for n, v in zip(names, combo):
            if n == WORLD:
                world = _world(v)
            else:
                over[n] = v
        extra: dict = {}
        if callable(linked):
            extra = dict(linked(dict(over)))
        elif link:
            for n, table in link.items():
                key_v = world if n == WORLD else over.get(n)
                if key_v in table:
                    extra.update({ALIASES.get(k, k): x for k, x in table[key_v].items()})
        over.update(extra)
        p = Point(world, tuple(over.items()), tuple(names), prefix)
        if p.run_id in seen:
            raise PretokError(f"sweep: grid points {seen[p.run_id]} and {combo} both get run id {p.run_id}")
        seen[p.run_id] = combo
        points.append(p)
    return points


def _world(v: Any) -> int:
    """A world size: a whole number >= 1 (`world=1.5` was run as 1, `world=two` was a traceback)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PretokError(f"sweep: world size must be a whole number >= 1 (got {v!r})")
    return v


def check_points(config: str | os.PathLike, points: Iterable[Point], runs_dir: str | os.PathLike = "runs") -> None:
    """Every point's config loaded and checked as its run will load it (train/config.py: keys, types, ranges,
    cross-field rules), before any point runs: an invalid axis value or setting (`seq_len=0`, `train.lrr=1`) was
    launched as a real run and failed there, after the points before it ran. One line naming the point."""
    for p in points:
        problem = point_problem(config, p, runs_dir)
        if problem:
            raise PretokError(f"sweep point {p.run_id}: {problem} (no point was run)", config)


def point_problem(config: str | os.PathLike, point: Point, runs_dir: str | os.PathLike = "runs") -> str | None:
    """Why the trainer would refuse the config of `point` (the file `config` with its overrides), or None."""
    from ..train.config import load_config

    try:
        load_config(config, [*point.cli_overrides(), f"run.id={point.run_id}", f"run.dir={runs_dir}"])
    except PretokError as e:
        text = str(e)
        return text[len(e.path) + 2:] if e.path == os.fspath(config) and text.startswith(f"{e.path}: ") else text
    return None


@dataclass
class Grid:
    """A sweep definition: base overrides, axes, linked overrides and the run-id prefix (also from YAML:
    `{prefix: .., base: {..}, axes: {..}, linked: {..}}`)."""

    axes: dict[str, list] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)
    linked: dict[str, dict] = field(default_factory=dict)
    prefix: str = "sweep"

    def points(self) -> list[Point]:
        return expand_grid(self.base, self.axes, linked=self.linked or None, prefix=self.prefix)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> Grid:
        try:
            d = numbers(strict_yaml.load(Path(path).read_text()) or {})
        except (OSError, yaml.YAMLError) as e:
            raise PretokError(f"cannot read sweep grid ({str(e).splitlines()[0]})", path) from None
        unknown = set(d) - {"axes", "base", "linked", "prefix"}
        if unknown or not isinstance(d.get("axes", {}), dict):
            raise PretokError(f"a grid is a mapping with axes/base/linked/prefix (unknown: {sorted(unknown)})", path)
        return cls(axes=d.get("axes", {}), base=d.get("base", {}), linked=d.get("linked", {}),
                   prefix=d.get("prefix", "sweep"))


def sweep_table(results: Sequence[tuple[Point, str]]) -> list[dict]:
    """One flat row per point (run id, status, every override): for a DataFrame or a printed table."""
    return [{"run_id": p.run_id, "status": s, "world": p.world, **{k: v for k, v in p.overrides}}
            for p, s in results]
