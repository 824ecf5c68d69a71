"""Read back what W&B wrote offline (`<dir>/wandb/offline-run-*/run-<id>.wandb`), for the tests: its records in
LevelDB's log framing (32 KiB blocks; per chunk crc32c(4) length(2, little-endian) type(1): 1 full, 2 first,
3 middle, 4 last) after a 7-byte ":W&B" header, each a wandb_internal_pb2.Record. wandb >= 0.20 ships no reader."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK, HEADER, FILE_HEADER = 32768, 7, 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data, out, pos, parts = path.read_bytes(), [], FILE_HEADER, b""
    assert data[:4] == b":W&B", path
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:              # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        if kind == 0 and length == 0:
            break
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(parts)
            out.append(r)
    return out


def _finished(path: Path, wait_s: float = 60.0) -> list:
    """The records of one finished run. `run.finish()` returns before W&B's service has flushed the file (seen: only
    the 7-byte header right after it, the rest a moment later), so wait for its `run` and `exit` records."""
    deadline = time.monotonic() + wait_s
    while True:
        rs = records(path)
        kinds = {r.WhichOneof("record_type") for r in rs}
        if {"run", "exit"} <= kinds or time.monotonic() > deadline:
            assert {"run", "exit"} <= kinds, f"{path}: no run/exit record {wait_s:.0f} s after finish: {sorted(kinds)}"
            return rs
        time.sleep(0.1)


def _files(run_dir: Path) -> list[list]:
    """The records of each offline run under `run_dir`, in the order the runs started."""
    runs = [_finished(f) for f in run_dir.glob("wandb/offline-run-*/run-*.wandb")]

    def started(rs: list) -> tuple[int, int]:
        r = next(r for r in rs if r.WhichOneof("record_type") == "run")
        return r.run.start_time.seconds, r.run.start_time.nanos

    return sorted(runs, key=started)


def history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{key: [(step, value), ...]} over every offline run directory of `run_dir` (a resumed run has one per start)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for rs in _files(run_dir):
        for r in rs:
            if r.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for k, v in items.items():
                    if not k.startswith("_"):
                        out.setdefault(k, []).append((int(items.get("_step", r.history.step.num)), v))
    return out


def of_kind(run_dir: Path, kind: str) -> list:
    """The records of one type (`run`, `config`, `summary`, `exit`, ...) over the offline runs of `run_dir`."""
    return [r for rs in _files(run_dir) for r in rs if r.WhichOneof("record_type") == kind]
