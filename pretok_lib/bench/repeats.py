"""Repeats for the benchmarks (docs/MEASURING.md): variants run in interleaved rounds with the order rotated each
round (A B C, B C A, ...), every run inside a machine probe; medians with intervals, and ratios from paired
rounds with their own intervals, as JSON and as table text."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..analysis.uncertainty import Estimate, estimate, paired_ratio
from ..machine.probe import Probe, machine


def rotated(items: Sequence[Any], k: int) -> list[Any]:
    """`items` rotated left by `k` (round k's order)."""
    if not items:
        return []
    k %= len(items)
    return [*items[k:], *items[:k]]


def probed(name: str, fn: Callable[[], dict], probe: bool = True) -> dict:
    """`fn()`'s result with the machine probe of its run under "probe" (none when `probe` is False)."""
    if not probe:
        return fn()
    with Probe(name) as p:
        r = fn()
    return {**r, "probe": p.result}


def rounds(variants: Sequence[str], repeats: int, run: Callable[[str, int], dict], probe: bool = True
           ) -> dict[str, list[dict]]:
    """Every variant's results over `repeats` interleaved rounds, rotated (round k starts at variant k)."""
    out: dict[str, list[dict]] = {v: [] for v in variants}
    for k in range(max(1, repeats)):
        for v in rotated(list(variants), k):
            out[v].append(probed(f"{v}#{k}", lambda v=v, k=k: run(v, k), probe))
    return out


def est_dict(e: Estimate | None, null: float | None = None) -> dict | None:
    """An estimate as JSON, with whether it excludes `null` and the repeats that would make it."""
    if e is None:
        return None
    d = {**e.to_dict(), "halfwidth": e.halfwidth}
    if null is not None:
        d.update(null=null, resolved=e.resolved(null), repeats_to_resolve=e.repeats_to_resolve(null))
    return d


def threshold_resolved(d: Mapping | None, need: float) -> bool:
    """Whether an estimate (`est_dict`) decides a target's threshold: its interval wholly on one side of `need`,
    from >= 2 samples (one sample has no interval: the noise decides)."""
    return bool(d) and d["n"] >= 2 and not d["interval"][0] <= need <= d["interval"][1]


def sample_estimates(samples: Mapping[str, Sequence[float | None]]) -> dict[str, dict | None]:
    """Per name: the median and interval of its samples."""
    return {k: est_dict(estimate(v)) for k, v in samples.items()}


def ratio_estimate(num: Sequence[float | None], den: Sequence[float | None], null: float = 1.0) -> dict | None:
    """num/den from paired rounds (round i's over round i's), with its interval and resolved flag."""
    return est_dict(paired_ratio(num, den), null)


def text(d: Mapping | None, fmt: str = ".3g", null_word: str = "") -> str:
    """'median [lo, hi] n=k', and ', not resolved (±x%)' when the interval holds its null."""
    if not d:
        return "-"
    lo, hi = d["interval"]
    s = f"{d['median']:{fmt}} [{lo:{fmt}}, {hi:{fmt}}] n={d['n']}"
    if d.get("resolved") is False:
        need = d.get("repeats_to_resolve")
        s += f", not resolved (±{d['halfwidth']:.0%}" + (f", ~{need} repeats)" if need else ")")
    return s


def probes_of(results: Mapping[str, Sequence[Mapping]]) -> dict:
    """The machine summary (`machine_probe.machine`) over every probed run in `results`."""
    return machine(r["probe"] for rs in results.values() for r in rs if r.get("probe"))
