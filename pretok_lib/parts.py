"""One unit of input → one committed part: read, tokenize (with the BOS/EOS policy), write, record.

Runs inside a worker process (or inline). Parquet parts are final data files; memmap parts are streamed to
`.pretok/parts/part-N.bin/.lens` with the sha256 of their token bytes, for the main process to append in order.
"""

from __future__ import annotations

import hashlib
import resource
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import PretokError
from .formats import memmap as mm
from .formats import parquet as pqf
from .formats.manifest import atomic_write_json
from .sources import SourceOptions, Unit, read_unit

STATE = ".pretok"


@dataclass(frozen=True)
class Job:
    """What a worker needs to turn a unit into a committed part (picklable)."""

    fmt: str
    dtype: str
    seq_len: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    compression: str
    sources: SourceOptions
    out_dir: str
    vocab_size: int


# ---------------------------------------------------------------- policy: BOS/EOS, dtype


def add_special(ids: np.ndarray, offsets: np.ndarray, bos: int | None, eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Insert BOS before / EOS after every document of a flat batch; returns (ids, offsets)."""
    extra = (bos is not None) + (eos is not None)
    if not extra:
        return ids, offsets.astype(np.int64, copy=False)
    lens = np.diff(offsets).astype(np.int64) + extra
    new_off = np.concatenate([[0], np.cumsum(lens)])
    out = np.empty(int(new_off[-1]), dtype=ids.dtype)
    body = np.ones(len(out), dtype=bool)
    if bos is not None:
        out[new_off[:-1]] = bos
        body[new_off[:-1]] = False
    if eos is not None:
        out[new_off[1:] - 1] = eos
        body[new_off[1:] - 1] = False
    out[body] = ids
    return out, new_off



# ---------------------------------------------------------------- one unit → one committed part


def part_name(index: int) -> str:
    return f"part-{index:06d}"


class _HashedPart(mm.PartWriter):
    """A memmap part (`.bin` + `.lens` under .pretok/parts) that also hashes its token bytes as written."""

    def __init__(self, prefix: Path, dtype: str):
        super().__init__(prefix, dtype)
        self.le, self.sha = np.dtype(dtype).newbyteorder("<"), hashlib.sha256()

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        if tokens.size and int(tokens.max()) > np.iinfo(self.le).max:
            raise PretokError(f"token id {int(tokens.max())} does not fit {self.le}")
        data = np.ascontiguousarray(tokens, dtype=self.le)
        self.sha.update(data.data)
        super().add(data, lengths)


def _open_part(job: Job, unit: Unit):
    name = part_name(unit.index)
    if job.fmt == "memmap":
        return _HashedPart(Path(job.out_dir) / STATE / "parts" / name, job.dtype)
    schema = pqf.schema_for(job.fmt, job.dtype, job.seq_len, job.pad_id)
    return pqf.ParquetPartWriter(Path(job.out_dir) / f"{name}.parquet", schema, job.compression)


def process_unit(unit: Unit, encoder, job: Job, report: Callable[[int, int, int], None]) -> dict:
    """Read, tokenize and write one unit as a part, committed by its record (`.pretok/parts/part-N.json`).
    Memmap parts are then appended in order to the one `.bin` by the main process (`MemmapAppender`)."""
    writer = _open_part(job, unit)
    counts = {"documents": 0, "tokens": 0, "padding": 0, "truncated": 0, "input_bytes": 0}
    skipped: dict[str, int] = {}
    for batch in read_unit(unit, job.sources):
        for k, v in batch.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
        counts["input_bytes"] += batch.text_bytes
        if not batch.texts:
            report(batch.text_bytes, 0, 0)
            continue
        ids, offsets = encoder.encode_batch(batch.texts)
        if ids.size and int(ids.max()) >= job.vocab_size:
            raise PretokError(f"tokenizer produced id {int(ids.max())} >= vocab size {job.vocab_size}", unit.paths[0])
        ids, offsets = add_special(ids, offsets, job.bos_id, job.eos_id)
        n, t = len(offsets) - 1, int(offsets[-1])
        if job.fmt == "memmap":
            writer.add(ids, np.diff(offsets).astype(np.int32))
        elif job.fmt == "token-list":
            writer.write(pqf.tokenlist_table(ids, offsets, writer.writer.schema), t)
        else:
            table, st = pqf.padded_table(ids, offsets, writer.writer.schema)
            writer.write(table, n * (job.seq_len + 1))
            counts["padding"] += st.padding
            counts["truncated"] += st.truncated
            t -= st.truncated  # padded rows store the kept tokens only
        counts["documents"] += n
        counts["tokens"] += t
        report(batch.text_bytes, n, t)
    result = writer.close()
    peak_rss_mb = _peak_rss_mb()
    record = {"unit": asdict(unit), **counts, "skipped": skipped, "peak_rss_mb": round(peak_rss_mb, 1),
              "files": [result] if job.fmt != "memmap" else [], "part": part_name(unit.index)}
    if job.fmt == "memmap":
        record["part_sha256"] = "sha256:" + writer.sha.hexdigest()
    atomic_write_json(Path(job.out_dir) / STATE / "parts" / f"{part_name(unit.index)}.json", record)
    return record


def _peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM; ru_maxrss would include what a spawned child inherited)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
