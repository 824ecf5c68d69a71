"""`pretok merge`: join shard outputs (one per `--shard-index`) into one dataset with one manifest.

Shards must agree on everything that defines the data (format, tokenizer, dtype, policy, compression, inputs)
and together cover every unit exactly once. The merged files are byte-identical to an unsharded run.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

from .errors import PretokError
from .formats import checksum
from .formats import memmap as mm
from .formats.manifest import read_manifest, write_manifest
from .pretokenize import MEMMAP_PREFIX, build_manifest

AGREE = ("format", "format_version", "dtype", "policy", "compression")


def _link_or_copy(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)  # data files are immutable: a hard link is a free copy on the same filesystem
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _check_agreement(shards: list[tuple[Path, dict]]) -> None:
    ref_dir, ref = shards[0]
    for d, m in shards[1:]:
        for k in AGREE:
            if m[k] != ref[k]:
                raise PretokError(f"{k} differs from shard {ref_dir} ({m[k]!r} vs {ref[k]!r}); cannot merge", d)
        if m["tokenizer"]["fingerprint"] != ref["tokenizer"]["fingerprint"]:
            raise PretokError(f"tokenizer fingerprint differs from shard {ref_dir}; cannot merge", d)
        strip = lambda inputs: [(i["path"], i["size"]) for i in inputs]  # noqa: E731
        if strip(m["inputs"]) != strip(ref["inputs"]):
            raise PretokError(f"was made from different inputs than {ref_dir}; cannot merge", d)
        if m["shard"]["total_units"] != ref["shard"]["total_units"]:
            raise PretokError(f"plans a different number of units than {ref_dir}; cannot merge", d)


def _check_coverage(shards: list[tuple[Path, dict]]) -> None:
    total = shards[0][1]["shard"]["total_units"]
    count = shards[0][1]["shard"]["num_shards"]
    have = sorted(m["shard"]["shard_index"] for _, m in shards)
    if len(set(have)) != len(have):
        raise PretokError(f"shard indices given twice: {sorted({i for i in have if have.count(i) > 1})}")
    missing = sorted(set(range(count)) - set(have))
    if missing:
        raise PretokError(f"missing shards {missing} of {count}: run them (e.g. resubmit those array tasks) first")
    expect = 0
    for d, m in shards:
        a, b = m["shard"]["units"]
        if a != expect:
            raise PretokError(f"covers units [{a}, {b}), expected to start at {expect}", d)
        expect = b
    if expect != total:
        raise PretokError(f"shards cover units [0, {expect}) of {total}")


def merge_shards(shard_dirs: Sequence[str | os.PathLike], out: str | os.PathLike, overwrite: bool = False) -> dict:
    """Merge finished shard outputs into `out`; returns the merged manifest (written last)."""
    t0 = time.time()
    if not shard_dirs:
        raise PretokError("no shard directories given")
    shards = [(Path(d), read_manifest(d)) for d in shard_dirs]
    shards.sort(key=lambda s: s[1]["shard"]["shard_index"])
    _check_agreement(shards)
    _check_coverage(shards)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise PretokError("exists and is not empty; use --overwrite or another --out", out)
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    ref = shards[0][1]
    records = [dict(p, files=[{"path": f} for f in p["files"]], skipped={}, padding=0, truncated=0, input_bytes=0)
               for _, m in shards for p in m["parts"]]
    if ref["format"] == "memmap":
        res = mm.concat_datasets([d / MEMMAP_PREFIX for d, _ in shards], out / MEMMAP_PREFIX, ref["dtype"])
        files = res["files"]
    else:
        files = []
        for d, m in shards:
            for f in m["files"]:
                _link_or_copy(d / f["path"], out / f["path"])
                files.append(f)
    manifest = build_manifest(ref["format"], ref["tokenizer"], ref["policy"], ref["compression"], records, files,
                              ref["inputs"], {}, list(sys.argv),
                              {"num_shards": 1, "shard_index": 0, "units": [0, ref["shard"]["total_units"]],
                               "total_units": ref["shard"]["total_units"]},
                              {"wall_seconds": round(time.time() - t0, 3), "merged_from": [str(d) for d, _ in shards]},
                              ref["source"])
    for k in ("padding", "truncated", "input_bytes"):  # per-part records of shards do not carry these
        manifest["counts"][k] = sum(m["counts"][k] for _, m in shards)
    skipped: dict[str, int] = {}
    for _, m in shards:
        for k, v in m["counts"]["skipped"].items():
            skipped[k] = skipped.get(k, 0) + v
    manifest["counts"]["skipped"] = skipped
    manifest["inputs"] = _merged_inputs([m for _, m in shards])
    write_manifest(out, manifest)
    return manifest


def _merged_inputs(manifests: list[dict]) -> list[dict]:
    merged = [dict(i) for i in manifests[0]["inputs"]]
    for m in manifests[1:]:
        for dst, src in zip(merged, m["inputs"]):
            dst["checksum"] = checksum.recorded(dst) or checksum.recorded(src)
            dst.pop("sha256", None)
    return merged
