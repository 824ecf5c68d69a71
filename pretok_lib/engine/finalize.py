"""The end of a run: the skipped-document budget checked, then manifest.json assembled and written last (also a
merge's, `build_manifest`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .. import __version__
from ..formats.manifest import FORMAT_VERSIONS, Policy, write_manifest
from ..machine.environment import environment
from ..sources import SourceOptions, Unit
from ..sources.input_checks import check_skipped
from ..sources.remote import retries
from ..tokenizer import TokenizerInfo
from .boundaries import document_boundaries
from .config import TokenizeConfig
from .parts import PartRecord


@dataclass(frozen=True)
class Plan:
    """What a run settled before tokenizing: its settings, output, tokenizer, policy, this shard's units (of
    `total_units` in all), the inputs' records and when it started (`time.time()`)."""

    cfg: TokenizeConfig
    sopts: SourceOptions
    out: Path
    info: TokenizerInfo
    policy: Policy
    mine: list[Unit]
    inputs: list[dict]
    total_units: int
    t0: float


def finalize(plan: Plan, choice, records: dict[int, PartRecord], hashes: dict, files: list[dict] | None,
              timeline: dict) -> dict:
    """Check the skipped-document budget, then write this run's manifest.json (last); returns it. `choice`: the
    backend chosen (with the evidence); `records`: each unit's committed part record, by unit index; `hashes`: the
    inputs' checksums by path; `files`: the memmap data files' records, or None for parquet (the parts' own
    files); `timeline`: start-up, tokenize and finish seconds, CPU accounts."""
    cfg, sopts, out, info, policy, mine = plan.cfg, plan.sopts, plan.out, plan.info, plan.policy, plan.mine
    inputs, total_units, t0 = plan.inputs, plan.total_units, plan.t0
    ordered = [records[u.index] for u in mine]
    if mine:  # no manifest over an input read badly: too many documents skipped, or none read
        check_skipped(sum(r["documents"] for r in ordered), sum_skipped(r["skipped"] for r in ordered),
                      cfg.max_bad_fraction, cfg.inputs[0] if len(cfg.inputs) == 1 else _most_skipped(mine, ordered))
    if files is None:
        files = [f for r in ordered for f in r["files"]]
    manifest = build_manifest(cfg.format, info.to_dict() | {"backend": choice.to_dict()}, policy,
                              cfg.compression, ordered, files, inputs, hashes, cfg.command,
                              {"num_shards": cfg.num_shards, "shard_index": cfg.shard_index,
                               "units": [mine[0].index, mine[-1].index + 1] if mine else [0, 0],
                               "total_units": total_units},
                              {"wall_seconds": round(time.time() - t0, 3), **timeline, "workers": cfg.workers,
                               "worker_peak_rss_mb": max((r.get("peak_rss_mb", 0) for r in ordered), default=0),
                               **_retry_counts(inputs, ordered)},
                              {"text_column": cfg.text_column, "separator": cfg.separator,
                               "bad_docs": cfg.bad_docs, "max_bad_fraction": cfg.max_bad_fraction,
                               "part_bytes": sopts.part_bytes,
                               "batch_bytes": sopts.batch_bytes})
    write_manifest(out, manifest)
    return manifest


def sum_skipped(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Skipped documents by reason, summed over parts or shards."""
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def _retry_counts(inputs: list[dict], records: list[PartRecord]) -> dict:
    """Transient errors of remote stores retried: while planning and checking (this process) and while reading
    each part (kept with its record across a resume). Absent for local inputs."""
    if not any("version" in i for i in inputs):
        return {}
    return {"remote_retries": retries() + sum(r.get("remote_retries", 0) for r in records)}


def _most_skipped(units: list[Unit], records: list[PartRecord]) -> str | None:
    """The input file holding the most skipped documents (named in the error of a run that skipped too many)."""
    per_file: dict[str, int] = {}
    for u, r in zip(units, records):
        if len(u.paths) == 1:  # a unit of many files (small text files) cannot say which one
            per_file[u.paths[0]] = per_file.get(u.paths[0], 0) + sum(r["skipped"].values())
    worst = max(per_file, key=per_file.get, default=None)
    return worst if worst and per_file[worst] else None


def build_manifest(fmt: str, tokenizer: dict, policy: Policy, compression: str, records: list[PartRecord], files: list,
                   inputs: list, hashes: dict, command: list[str], shard: dict, run: dict, source: dict) -> dict:
    """Assemble the manifest of a finished output (one shard or a merge of shards).

    Args:
        fmt: the format.
        tokenizer: the tokenizer's identity and the backend chosen (`TokenizerInfo.to_dict()` + `backend`).
        policy: the resolved policy.
        compression: the parquet codec (recorded as None for memmap).
        records: the part records in unit order (their counts are summed; each is listed in `parts`).
        files: the data files' records (path, size, checksum).
        inputs, hashes: the input files' records and their checksums by path (missing: None).
        command: the command line that made it.
        shard: which units of how many this output holds.
        run: timings and resources of the run.
        source: how the inputs were read (text column, separator, bad documents, part and batch sizes).
    """
    counts = {k: sum(r[k] for r in records) for k in ("documents", "tokens", "padding", "truncated", "input_bytes")}
    counts["skipped"] = sum_skipped(r["skipped"] for r in records)
    first = 0
    parts = []
    for r in records:
        parts.append({"part": r["part"], "unit": r["unit"], "first_document": first, "documents": r["documents"],
                      "tokens": r["tokens"], "files": [f["path"] for f in r["files"]]})
        first += r["documents"]
    return {"format": fmt, "format_version": FORMAT_VERSIONS[fmt], "dtype": policy["dtype"], "policy": policy,
            "compression": compression if fmt != "memmap" else None, "tokenizer": tokenizer, "counts": counts,
            "files": files, "parts": parts, "shard": shard, "source": source,
            "boundaries": document_boundaries(fmt, policy, counts),
            "inputs": [dict(i, checksum=hashes.get(i["path"])) for i in inputs],
            "tool": {"name": "pretok", "version": __version__}, "created": datetime.now(timezone.utc).isoformat(),
            "command": command, "run": run, "environment": environment()}
