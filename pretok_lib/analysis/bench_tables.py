"""Tables from the benchmarks and the pretokenized outputs, beside the training runs: the isolated tokenization
speedup (`pretok bench tokenize`: engine vs the on-the-fly tokenizer) next to the in-training one, and the bytes
on disk per stored token of each output (its manifest)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..datapaths import FORMAT_OF as PATH_FORMAT
from ..datapaths import BASELINE, PRETOK_PAIRS
from ..errors import PretokError
from ..formats.manifest import MANIFEST, read_manifest
from .runs import Run

LOOP_PREFIX, MAP_PREFIX, ENGINE_PREFIX = "(a)", "(b)", "(d) engine"


def load_bench(bench: str | Path | dict | None) -> dict | None:
    """A `pretok bench tokenize --json` result (path or already loaded dict); None stays None."""
    if bench is None or isinstance(bench, dict):
        return bench
    return json.loads(Path(bench).read_text())


def isolated_tokenization_speedups(bench: str | Path | dict | None, baseline: str = LOOP_PREFIX
                                   ) -> dict[str, dict[str, Any]]:
    """Per output format: the fastest engine run of the tokenize benchmark vs the on-the-fly tokenizer (default
    (a), the per-document `tok(text)` loop; "(b)" = datasets.map), as a ratio of MB/s (both on the same text)."""
    b = load_bench(bench)
    methods: dict[str, dict] = (b or {}).get("methods", {})
    base = next(((k, r) for k, r in methods.items() if k.startswith(baseline)), None)
    out: dict[str, dict[str, Any]] = {}
    if base is None:
        return out
    for fmt in PATH_FORMAT.values():
        eng = [(k, r) for k, r in methods.items() if k.startswith(f"{ENGINE_PREFIX} {fmt} w") and r.get("mb_per_s")]
        if eng:
            k, r = max(eng, key=lambda kr: kr[1]["mb_per_s"])
            out[fmt] = {"engine": k, "engine_mb_per_s": r["mb_per_s"], "engine_tokens_per_s": r.get("tokens_per_s"),
                        "baseline": base[0], "baseline_mb_per_s": base[1]["mb_per_s"],
                        "baseline_tokens_per_s": base[1].get("tokens_per_s"),
                        "speedup": r["mb_per_s"] / base[1]["mb_per_s"] if base[1].get("mb_per_s") else None}
    return out


def tokenization_speedups(bench: str | Path | dict | None, runs: Iterable[Run],
                          metric: str = "effective_tokens_per_s", skip: int | None = None
                          ) -> list[dict[str, Any]]:
    """Isolated tokenization speedup (benchmark: engine vs on-the-fly tokenizer) next to the in-training speedup
    (`metric` of the pretokenized path / its on-the-fly counterpart of the same layout, same settings otherwise).
    One row per pair and group of runs; a pair with no runs still has its isolated value."""
    from .metrics import path_speedups  # metrics.py names this module's functions too (imported at its end)

    iso = isolated_tokenization_speedups(bench)
    sp = path_speedups(list(runs), BASELINE, metric, skip)
    rows = []
    for pre, otf in PRETOK_PAIRS.items():
        i = iso.get(PATH_FORMAT[pre], {})
        found = False
        for group in dict.fromkeys(r["group"] for r in sp):
            vals = {r["data_kind"]: r["value"] for r in sp if r["group"] == group}
            if pre in vals and otf in vals:
                found = True
                rows.append({"pretok": pre, "on_the_fly": otf, "group": group, "isolated": i.get("speedup"),
                             "training": vals[pre] / vals[otf] if vals[pre] is not None and vals[otf] else None,
                             "pretok_value": vals[pre], "on_the_fly_value": vals[otf], "engine": i.get("engine")})
        if not found and i:
            rows.append({"pretok": pre, "on_the_fly": otf, "group": None, "isolated": i.get("speedup"),
                         "training": None, "pretok_value": None, "on_the_fly_value": None, "engine": i.get("engine")})
    return rows


def _manifest_dirs(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        subs = sorted(d for d in p.iterdir() if (d / MANIFEST).is_file()) if p.is_dir() else []
        out += [p] if (p / MANIFEST).is_file() or not subs else subs
    return out


def storage_rows(dataset_dirs: Iterable[str | Path], bench: str | Path | dict | None = None) -> list[dict[str, Any]]:
    """Bytes on disk and bytes per stored token of pretokenized outputs, from their manifest.json (a directory
    without one is searched one level down, e.g. runs/demo), read by `read_manifest` (checked as every reader
    checks it). With a tokenize benchmark, adds its `datasets.map` + `save_to_disk` output (HF Arrow) for
    reference. Unreadable or invalid outputs give a row with `error`."""
    rows: list[dict[str, Any]] = []
    for d in _manifest_dirs(dataset_dirs):
        row: dict[str, Any] = {"name": d.name, "path": str(d)}
        try:
            m = read_manifest(d)
            c = m["counts"]
            disk = sum(int(f["size"]) for f in m["files"])
            row.update(format=m["format"], compression=m.get("compression"), dtype=m.get("dtype"),
                       documents=c.get("documents"), tokens=c["tokens"], padding=c.get("padding", 0),
                       input_bytes=c.get("input_bytes"), disk_bytes=disk,
                       bytes_per_token=disk / c["tokens"] if c["tokens"] else None, error=None)
        except (PretokError, OSError, ValueError, KeyError, TypeError) as e:
            row.update(format=None, disk_bytes=None, bytes_per_token=None, error=f"{e.__class__.__name__}: {e}")
        rows.append(row)
    b = load_bench(bench)
    hf = next((r for k, r in (b or {}).get("methods", {}).items() if k.startswith(MAP_PREFIX)), None)
    if hf and hf.get("disk_bytes") and hf.get("stored_tokens"):
        rows.append({"name": "datasets.map (HF Arrow)", "path": None, "format": "hf-arrow", "compression": None,
                     "dtype": "int32", "documents": hf.get("documents"), "tokens": hf["stored_tokens"], "padding": 0,
                     "input_bytes": None, "disk_bytes": hf["disk_bytes"],
                     "bytes_per_token": hf["disk_bytes"] / hf["stored_tokens"], "error": None})
    return rows
