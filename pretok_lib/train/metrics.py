"""What a run logs (docs/RUNS.md): metrics.jsonl records, TensorBoard scalars, memory, and the run summary
(importable without torch: `pretok_lib.measure` writes the same summary)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import atomic_write_text
from ..machine.memory import peak_rss_mb
from .crossing import number, records_crossing

if TYPE_CHECKING:
    import torch


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory allocated (CUDA) or this process's peak RSS (CPU), in MB."""
    import torch  # here: summarize() and read_records() serve torch-free callers too (pretok_lib.measure)

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mb()


MAX_STEP = 2 ** 62


def valid_step(step: object) -> bool:
    """A step is a non-negative int (not a bool, not a float) below MAX_STEP."""
    return isinstance(step, int) and not isinstance(step, bool) and 0 <= step < MAX_STEP


NOT_JSON, NOT_RECORD = "not JSON", "not a record"  # why a metrics.jsonl line is no record (`parse_line`)


def parse_line(raw: bytes) -> dict | str:
    """One line of a metrics.jsonl: its record (a JSON object with a valid step), or why it is none (NOT_JSON: not
    UTF-8 JSON, e.g. half-written; NOT_RECORD)."""
    try:
        rec = json.loads(raw.decode())   # UTF-8 only: json.loads(bytes) would guess UTF-16/32 from NULs
    except (ValueError, RecursionError):   # UnicodeDecodeError is a ValueError
        return NOT_JSON
    return rec if isinstance(rec, dict) and valid_step(rec.get("step")) else NOT_RECORD


def read_records(path: Path, kind: str | None = None) -> list[dict]:
    """The records of a metrics.jsonl in file order (only those of `kind` if given): JSON objects with a valid step.
    Safe on a log being written and on a damaged one: a half-written last line, a line that is not UTF-8 or JSON
    and a JSON value that is not a record are left out (`analysis.runs.read_metrics` also reports them)."""
    if not path.is_file():
        return []
    recs = (parse_line(raw) for raw in path.read_bytes().split(b"\n"))
    return [r for r in recs if isinstance(r, dict) and (kind is None or r.get("kind") == kind)]


class MetricsLog:
    """Appends records to metrics.jsonl (flushed per record) and mirrors scalars to TensorBoard and the trackers of
    `log.tracking` (`tracking.open_trackers`: objects with log(record) and close(status))."""

    def __init__(self, run_dir: Path, resume_step: int, tensorboard: bool, trackers: list | None = None):
        self.path = run_dir / "metrics.jsonl"
        # A resumed run repeats the steps after its checkpoint: drop their old records so the log has each
        # step once (and equals an uninterrupted run's).
        kept = [r for r in read_records(self.path) if r["step"] <= resume_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.fh = open(self.path, "a")
        self.tb = None
        self.trackers = list(trackers or [])
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=resume_step + 1 if resume_step else None)

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        for t in self.trackers:
            t.log(record)
        if self.tb is not None:
            prefix = record["kind"]
            for k, v in record.items():
                if k not in ("kind", "step") and isinstance(v, (int, float)):
                    self.tb.add_scalar(f"{prefix}/{k}", v, record["step"])
                elif isinstance(v, list):  # per mixture dataset: one scalar each
                    for i, x in enumerate(v):
                        self.tb.add_scalar(f"{prefix}/{k}/{i}", x, record["step"])

    def close(self, status: str = "completed") -> None:
        """Close the log; the trackers end their runs with `status` (completed, interrupted, failed)."""
        self.fh.close()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
        for t in self.trackers:
            t.close(status)
        self.trackers = []


def _per_time(records: list[dict], key: str) -> float | None:
    """A per-step rate as the total rate: weighted by the steps' times (Σ tokens / Σ step time for tokens/s)."""
    xs = [(r[key], r["step_time_s"]) for r in records if r.get(key) is not None and r.get("step_time_s")]
    return sum(v * t for v, t in xs) / sum(t for _, t in xs) if xs else None


def summarize(records: list[dict], skip: int, target_loss: float | None, settings: dict) -> dict:
    """The run summary from its records (the analysis recomputes the same from metrics.jsonl): rates are totals
    over the steps after `skip` (Σ tokens / Σ step time; data stall Σ wait / Σ step time), not per-step means;
    times to target interpolated between the records around the crossing (`crossing.crossing`, as the analysis):
    on val_loss (train loss without one), and on val_loss_own (eval.own_path) when logged."""
    train = [r for r in records if r["kind"] == "train"]
    val = [r for r in records if r["kind"] == "val"]
    own = [r for r in val if "val_loss_own" in r]
    steady = train[skip:] if len(train) > skip else train
    tts = tts_own = None
    if target_loss is not None:
        has_val = any(math.isfinite(number(r.get("val_loss"))) for r in val)
        tts = records_crossing(val, "val_loss", target_loss)[0] if has_val else \
            records_crossing(train, "loss", target_loss)[0]
        tts_own = records_crossing(val, "val_loss_own", target_loss)[0] if own else None
    return {
        "steps": train[-1]["step"] if train else 0,
        "final_loss": train[-1]["loss"] if train else None,
        "final_val_loss": val[-1]["val_loss"] if val else None,
        "final_val_ppl": val[-1]["val_ppl"] if val else None,
        "final_val_loss_own": own[-1]["val_loss_own"] if own else None,
        **{k: _per_time(steady, k) for k in ("tokens_per_s", "effective_tokens_per_s", "data_stall", "mfu")},
        "peak_mem_mb": max((r["peak_mem_mb"] for r in train), default=None),
        "wall_s": records[-1]["wall_s"] if records else 0.0,
        "target_loss": target_loss, "time_to_target_s": tts, "time_to_target_own_s": tts_own, **settings,
    }


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")

