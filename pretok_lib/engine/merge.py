"""`pretok merge`: join shard outputs (one per `--shard-index`) into one dataset with one manifest.

Shards must agree on everything that defines the data (format, tokenizer, dtype, policy, compression, inputs and
their checksums, how the inputs were planned and read; `seq_len` only for padded) and together cover every unit
exactly once, each part reading on where the one before it ended. The merged files are byte-identical to
an unsharded run. Every shard file is checked against the checksum its manifest records while it is copied
(hashed as its bytes stream through, not re-read), so a damaged shard is refused, not merged under a fresh
checksum. The output holds its lock (beside it) for the whole merge; it may not be, lie inside or contain one of
the shards; an interrupted merge (no manifest.json) is started over by rerunning the same command.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

from ..errors import PretokError, os_error
from ..formats import checksum
from ..formats import memmap as mm
from ..formats import parquet as pqf
from ..formats.manifest import read_manifest, write_manifest
from .finalize import build_manifest, sum_skipped
from .outdir import output_lock, refuse_overlap, remove_output, resolve_output
from .parts import unit_breaks
from .run import MEMMAP_PREFIX, input_checksum

AGREE = ("format", "format_version", "dtype", "policy", "compression")
SOURCE_AGREE = ("text_column", "separator", "part_bytes", "batch_bytes")  # bad_docs: in the policy (AGREE)


MERGING = ".pretok/merging"  # marks an output as a merge in progress (a rerun may start it over)


def _link_or_copy(src: Path, dst: Path, expect: str | None) -> None:
    """`src` as `dst` (through a temp name), checked against its recorded checksum `expect` on the way: a hard
    link (data files are immutable: a free copy on the same file system) is hashed once; a copy is hashed as
    its bytes stream through."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    algorithm = checksum.algorithm_of(expect) if expect else checksum.ALGORITHM
    try:
        os.link(os.path.realpath(src), tmp)  # the file itself: Linux link(2) would link a symlink, not its target
        ok = not expect or checksum.of_file(tmp, algorithm) == expect
    except OSError:
        h = checksum.hasher(algorithm)
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            while block := fin.read(8 << 20):
                fout.write(block)
                h.update(block)
            fout.flush()
            os.fsync(fout.fileno())
        ok = not expect or checksum.value(h, algorithm) == expect
    if not ok:
        tmp.unlink()
        raise PretokError(mm.CORRUPT, src)
    os.replace(tmp, dst)


def same_inputs(a: list[dict], b: list[dict]) -> bool:
    """The same input paths and sizes, and the same checksum wherever both shards recorded one: a shard hashes only
    the inputs its own units read (the others are None in its manifest), so shards of several inputs, or shards
    with no units at all, record different subsets. Checksums by different algorithms (shards of different pretok
    versions) are each checked against the input where it can be read, else not compared."""
    if [(i["path"], i["size"]) for i in a] != [(i["path"], i["size"]) for i in b]:
        return False
    for i, j in zip(a, b):
        x, y = checksum.recorded(i), checksum.recorded(j)
        if x is None or y is None or x == y:
            continue
        if checksum.algorithm_of(x) == checksum.algorithm_of(y):
            return False
        if os.path.exists(i["path"]) and any(input_checksum(i["path"], checksum.algorithm_of(v)) != v for v in (x, y)):
            return False
    return True


def _check_agreement(shards: list[tuple[Path, dict]]) -> None:
    ref_dir, ref = shards[0]
    for d, m in shards[1:]:
        for k in AGREE:  # policies as read_manifest gives them: seq_len only where it defines the bytes (padded)
            if m[k] != ref[k]:
                a, b = m[k], ref[k]
                if isinstance(a, dict) and isinstance(b, dict):
                    f = next(f for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f))
                    k, a, b = f"{k}.{f}", a.get(f), b.get(f)
                raise PretokError(f"{k} differs from shard {ref_dir} ({a!r} vs {b!r}); cannot merge", d)
        if m["tokenizer"]["fingerprint"] != ref["tokenizer"]["fingerprint"]:
            raise PretokError(f"tokenizer fingerprint differs from shard {ref_dir}; cannot merge", d)
        if not same_inputs(m["inputs"], ref["inputs"]):
            raise PretokError(f"was made from different inputs than {ref_dir}; cannot merge", d)
        if m["shard"]["total_units"] != ref["shard"]["total_units"]:
            raise PretokError(f"plans a different number of units than {ref_dir}; cannot merge", d)
        if m["shard"]["num_shards"] != ref["shard"]["num_shards"]:
            raise PretokError(f"is one of {m['shard']['num_shards']} shards, {ref_dir} one of "
                              f"{ref['shard']['num_shards']}; cannot merge", d)
        for k in SOURCE_AGREE:  # how the inputs were planned into units and read
            if m["source"].get(k) != ref["source"].get(k):
                raise PretokError(f"source.{k} differs from shard {ref_dir} ({m['source'].get(k)!r} vs "
                                  f"{ref['source'].get(k)!r}); cannot merge", d)


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
        if a == b:  # no unit (more shards than units): recorded as [0, 0) wherever its slice lay; nothing to place
            continue
        if a != expect:
            raise PretokError(f"covers units [{a}, {b}), expected to start at {expect}", d)
        expect = b
    if expect != total:
        raise PretokError(f"shards cover units [0, {expect}) of {total}")
    breaks = unit_breaks([p for _, m in shards for p in m["parts"]])
    if breaks:
        raise PretokError(f"the shards were planned differently ({breaks[0]}): documents would be read twice or "
                          "never; cannot merge")


def merge_shards(shard_dirs: Sequence[str | os.PathLike], out: str | os.PathLike, overwrite: bool = False) -> dict:
    """Merge finished shard outputs into `out`; returns the merged manifest (written last)."""
    t0 = time.time()
    if not shard_dirs:
        raise PretokError("no shard directories given")
    shards = [(Path(d), read_manifest(d)) for d in shard_dirs]
    shards.sort(key=lambda s: s[1]["shard"]["shard_index"])
    _check_agreement(shards)
    _check_coverage(shards)
    if shards[0][1]["format"] != "memmap":  # memmap shards are opened (validated) by concat_datasets
        for d, m in shards:
            for f in m["files"]:
                pqf.read_contract(d / f["path"], m["format"])  # a parquet part of this format, not merged blind
    out = resolve_output(out)
    refuse_overlap(out, [d for d, _ in shards], "shard")
    try:
        with output_lock(out):
            return _merge(shards, out, overwrite, t0)
    except OSError as e:  # disk full, read-only file system, ...: one line naming the file (else the output)
        raise os_error(e, out) from None


def _merge(shards: list[tuple[Path, dict]], out: Path, overwrite: bool, t0: float) -> dict:
    if out.with_name(f".{out.name}.removing").exists():
        shutil.rmtree(out.with_name(f".{out.name}.removing"))
    if out.exists() and any(out.iterdir()):
        interrupted = not (out / "manifest.json").exists() and (
            (out / MERGING).exists() or [p.name for p in out.iterdir()] == [".pretok"])
        if not (overwrite or interrupted):
            raise PretokError("exists and is not empty; use --overwrite or another --out", out)
        remove_output(out)
    (out / MERGING).parent.mkdir(parents=True, exist_ok=True)
    (out / MERGING).touch()
    ref = shards[0][1]
    records = [dict(p, files=[{"path": f} for f in p["files"]], skipped={}, padding=0, truncated=0, input_bytes=0)
               for _, m in shards for p in m["parts"]]
    if ref["format"] == "memmap":
        expect = [{Path(f["path"]).suffix[1:]: checksum.recorded(f) for f in m["files"]}
                  | {"bin_leaves": next((f.get("leaves") for f in m["files"] if f["path"].endswith(".bin")), None)}
                  for _, m in shards]
        res = mm.concat_datasets([d / MEMMAP_PREFIX for d, _ in shards], out / MEMMAP_PREFIX, ref["dtype"],
                                 expect=expect)
        files = res["files"]
    else:
        files = []
        for d, m in shards:
            for f in m["files"]:
                _link_or_copy(d / f["path"], out / f["path"], checksum.recorded(f))
                files.append(f)
    manifest = build_manifest(ref["format"], ref["tokenizer"], ref["policy"], ref["compression"], records, files,
                              ref["inputs"], {}, list(sys.argv),
                              {"num_shards": 1, "shard_index": 0, "units": [0, ref["shard"]["total_units"]],
                               "total_units": ref["shard"]["total_units"]},
                              {"wall_seconds": round(time.time() - t0, 3), "merged_from": [str(d) for d, _ in shards]},
                              ref["source"])
    for k in ("padding", "truncated", "input_bytes"):  # per-part records of shards do not carry these
        manifest["counts"][k] = sum(m["counts"][k] for _, m in shards)
    manifest["counts"]["skipped"] = sum_skipped(m["counts"]["skipped"] for _, m in shards)
    manifest["inputs"] = _merged_inputs([m for _, m in shards])
    write_manifest(out, manifest)
    shutil.rmtree(out / ".pretok", ignore_errors=True)
    return manifest


def _merged_inputs(manifests: list[dict]) -> list[dict]:
    merged = [dict(i) for i in manifests[0]["inputs"]]
    for m in manifests[1:]:
        for dst, src in zip(merged, m["inputs"]):
            dst["checksum"] = checksum.recorded(dst) or checksum.recorded(src)
            dst.pop("sha256", None)
    return merged
