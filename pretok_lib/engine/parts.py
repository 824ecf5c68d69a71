"""One unit of input → one committed part: read, tokenize (with the BOS/EOS policy), write, record.

Runs inside a worker process (or inline). Parquet parts are final data files. A memmap part is kept in its
worker's memory with the XXH3-128 of its would-be `.bin` and `.lens` (`HeldPart`) and written straight into
`data.bin`/`data.lens` by that worker once the main process has told where (`memmap_place.write_held`); one past
64 MiB (`KEEP_DEFAULTS`) is streamed to `.pretok/parts/part-N.bin/.lens` instead and placed from there by any worker
(`memmap_place.place_part`), as are the parts a crashed run left.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypedDict

import numpy as np
import xxhash

from ..atomic import atomic_write_json
from ..errors import PretokError, os_error
from ..formats import memmap as mm
from ..formats import parquet as pqf
from ..formats.manifest import Policy
from ..machine import memory
from ..sources import SourceOptions, Stamp, Unit, check_stamps, read_unit
from ..sources.remote import is_url, listed, remember, retries, take_retries

if TYPE_CHECKING:
    from ..tokenizer import TokenizerInfo

STATE = ".pretok"
PART_HASH_KEY = "part_xxh3_128"  # a memmap part record's [XXH3-128 of .bin, of .lens] (hex digests)


@dataclass(frozen=True)
class Job:
    """What a worker needs to turn a unit into a committed part (picklable): the format and its policy, how to
    read the unit, where to write, and the tokenizer (checked by a worker against the one its zygote built)."""

    fmt: str
    policy: Policy  # dtype, BOS/EOS/pad ids; seq_len and row_length for `padded` only
    compression: str  # the parquet formats' codec
    sources: SourceOptions
    out_dir: str
    tokenizer: TokenizerInfo
    objects: tuple = ()  # (URL, size, identity) of the unit's remote inputs as planned: read without a HEAD
    stamps: tuple[Stamp, ...] = ()  # the local inputs' identities as planned (`check_stamps`)

    @functools.cached_property
    def _by_path(self) -> dict[str, Stamp]:
        return {s[0]: s for s in self.stamps}

    def unit_fields(self, unit: Unit) -> tuple[tuple, tuple[Stamp, ...]]:
        """(`objects`, `stamps`) of `unit`: the planned listing of its remote inputs (a worker did not list them)
        and the planned identities of its local ones. Looked up by path: a run over many files has as many stamps,
        and the main process asks once per unit."""
        return listed(unit.paths), self.stamps_of(unit)

    def stamps_of(self, unit: Unit) -> tuple[Stamp, ...]:
        return tuple(self._by_path[p] for p in dict.fromkeys(unit.paths) if p in self._by_path)

    def __getstate__(self) -> dict:  # the lookup is rebuilt where needed, never pickled
        return {k: v for k, v in self.__dict__.items() if k != "_by_path"}


class _PartRecordFields(TypedDict):
    unit: dict  # the Unit's fields
    part: str  # its name, `part-NNNNNN`
    documents: int
    tokens: int  # tokens stored (padded: the kept ones, without padding)
    padding: int
    truncated: int
    input_bytes: int  # text bytes read
    skipped: dict[str, int]  # documents skipped, by reason
    peak_rss_mb: float  # of the worker that wrote it
    files: list[dict]  # parquet: the part's data file record; memmap: none (placed into `data.bin`)


class PartRecord(_PartRecordFields, total=False):
    """A committed part's record, `.pretok/parts/part-NNNNNN.json` (JSON; its presence commits the part): written
    by the worker, read back on a resume, summed into the manifest."""

    part_xxh3_128: list[str]  # memmap only (PART_HASH_KEY): XXH3-128 of the part's .bin and .lens (hex)
    cpu_seconds: float  # CPU the worker (or the main process, with no workers) spent on the part
    remote_retries: int  # remote inputs only: transient errors of the store retried while reading the unit


# ---------------------------------------------------------------- policy: BOS/EOS, dtype


def add_special(ids: np.ndarray, offsets: np.ndarray, bos: int | None, eos: int | None,
                dtype: np.dtype | str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Insert BOS before / EOS after every document of a flat batch, converting to `dtype` (default: ids') in the
    same copy; returns (ids, int64 offsets)."""
    out_dtype = np.dtype(dtype) if dtype is not None else ids.dtype
    extra = (bos is not None) + (eos is not None)
    offsets = offsets.astype(np.int64, copy=False)
    if not extra:
        return ids.astype(out_dtype, copy=False), offsets
    docs = len(offsets) - 1
    new_off = np.zeros(docs + 1, np.int64)
    np.cumsum(np.diff(offsets) + extra, out=new_off[1:])
    out = np.empty(int(new_off[-1]), dtype=out_dtype)
    if bos is not None:
        out[new_off[:-1]] = bos
    if eos is not None:
        out[new_off[1:] - 1] = eos
    if len(ids) >= 512 * docs:  # long documents: one slice copy each beats a boolean mask over every token
        src, dst = offsets.tolist(), (new_off[:-1] + (bos is not None)).tolist()
        for d in range(docs):
            out[dst[d] : dst[d] + src[d + 1] - src[d]] = ids[src[d] : src[d + 1]]
        return out, new_off
    body = np.ones(len(out), dtype=bool)
    if bos is not None:
        body[new_off[:-1]] = False
    if eos is not None:
        body[new_off[1:] - 1] = False
    out[body] = ids
    return out, new_off


# ---------------------------------------------------------------- one unit → one committed part


def unit_breaks(parts: list[dict]) -> list[str]:
    """Where a manifest's parts do not read an input end to end: a part that goes on with the input of the part
    before it starts where that one ended (or at 0: the same input listed again). Catches shards planned with
    other settings merged together (documents read twice or never)."""
    breaks, prev = [], None
    for part in parts:
        u = part["unit"]
        if prev is not None and u["paths"] == prev["paths"] and u["start"] not in (prev["stop"], 0):
            breaks.append(f"{part['part']} reads {u['paths'][0]} from {u['start']}, but the part before it ended "
                          f"at {prev['stop']}")
        prev = u
    return breaks


def part_name(index: int) -> str:
    return f"part-{index:06d}"


class _ChecksummedPart(mm.PartWriter):
    """A memmap part (`.bin` + `.lens` under .pretok/parts) with the XXH3-128 of each file's bytes: checked when a
    rerun finds the part (or its placed copy) after a crash, and the `.bin`'s is its leaf of the `data.bin`
    checksum. Not fsynced: data lost by a power cut fails that check and the part is redone. Takes ids already
    range-checked and in the part's little-endian dtype (`process_unit` checks them against the vocabulary once)."""

    def __init__(self, prefix: Path, dtype: str):
        super().__init__(prefix, dtype, fsync=False)
        self._hash_bin, self._hash_lens = xxhash.xxh3_128(), xxhash.xxh3_128()

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        assert tokens.dtype == self.dtype and tokens.flags.c_contiguous
        lens = np.ascontiguousarray(lengths, dtype=np.dtype("<i4"))
        self._hash_bin.update(tokens)
        self._hash_lens.update(lens)
        self._append(tokens, lens)

    def hashes(self) -> list[str]:
        """XXH3-128 (hex) of the `.bin` and `.lens` bytes written so far."""
        return [self._hash_bin.hexdigest(), self._hash_lens.hexdigest()]


# What a worker keeps in memory of the memmap parts it tokenized: a part of more than KEEP_PART_MB MiB (ids +
# lengths) is spilled to its files; a worker keeping more than KEEP_PARTS parts or KEEP_MB MiB waits for their
# placements before it takes another task (`zygote._worker`). Each can be set in the environment as PRETOK_<name>
# (machines short of memory; the tests of the spill and wait paths).
KEEP_DEFAULTS = {"KEEP_PART_MB": 64, "KEEP_PARTS": 32, "KEEP_MB": 128}


def keep_limit(name: str) -> int:
    """KEEP_DEFAULTS[name] or PRETOK_<name> from the environment (a whole number >= 0), in bytes for the *_MB ones."""
    raw = os.environ.get(f"PRETOK_{name}")
    try:
        value = KEEP_DEFAULTS[name] if raw is None else int(raw)
        if value < 0:
            raise ValueError
    except ValueError:
        raise PretokError(f"PRETOK_{name}={raw!r} in the environment is not a whole number >= 0") from None
    return value << 20 if name.endswith("_MB") else value


class HeldPart:
    """A memmap part kept in memory until its offsets are known (`memmap_place.write_held` writes it there): no part
    files to create, write, copy and delete per unit. Its hashes are those its files would have. Past `limit` bytes
    it spills: what it holds and the rest are streamed to its files (`_ChecksummedPart`), `spilled` is set, and the
    part is then placed from its files (`place_part`) like one a crashed run left."""

    def __init__(self, prefix: Path, dtype: str, limit: int | None = None):
        self.prefix, self.dtype = prefix, mm._write_dtype(dtype)
        self.limit = keep_limit("KEEP_PART_MB") if limit is None else limit
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (tokens, int32 lengths) as added
        self.nbytes = 0
        self.spilled: _ChecksummedPart | None = None

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Like `_ChecksummedPart.add`: ids already range-checked, in the part's little-endian dtype."""
        if self.spilled is not None:
            self.spilled.add(tokens, lengths)
            return
        assert tokens.dtype == self.dtype and tokens.flags.c_contiguous
        lens = np.ascontiguousarray(lengths, dtype=np.dtype("<i4"))
        self.chunks.append((tokens, lens))
        self.nbytes += tokens.nbytes + lens.nbytes
        if self.nbytes > self.limit:
            self.spilled = _ChecksummedPart(self.prefix, self.dtype.name)
            for t, n in self.chunks:
                self.spilled.add(t, n)
            self.chunks, self.nbytes = [], 0

    def close(self) -> None:
        if self.spilled is not None:
            self.spilled.close()

    def abort(self) -> None:
        self.chunks, self.nbytes = [], 0
        if self.spilled is not None:
            self.spilled.abort()

    def hashes(self) -> list[str]:
        """XXH3-128 (hex) of what the part's `.bin` and `.lens` hold (as `_ChecksummedPart.hashes`)."""
        if self.spilled is not None:
            return self.spilled.hashes()
        out = []
        for ext in (".bin", ".lens"):
            h = xxhash.xxh3_128()
            for buf in self.buffers(ext):
                h.update(buf)
            out.append(h.hexdigest())
        return out

    def buffers(self, ext: str) -> list[np.ndarray]:
        """What the part's `.bin` (ext ".bin") or `.lens` would hold, as the arrays added."""
        return [c[0] if ext == ".bin" else c[1] for c in self.chunks]


def part_hashes(record: PartRecord) -> list[str] | None:
    """A memmap part record's [.bin, .lens] hashes, or None (missing, or a record of an earlier version)."""
    hashes = record.get(PART_HASH_KEY)
    ok = isinstance(hashes, list) and len(hashes) == 2 and all(isinstance(h, str) for h in hashes)
    return hashes if ok else None


def part_files_intact(prefix: Path, record: PartRecord, itemsize: int) -> bool:
    """Whether a memmap part's files exist with the sizes and XXH3-128 hashes its record states."""
    hashes = part_hashes(record)
    if hashes is None:
        return False
    expected = ((".bin", record["tokens"] * itemsize, hashes[0]), (".lens", record["documents"] * 4, hashes[1]))
    for ext, size, h in expected:
        path = prefix.with_name(prefix.name + ext)
        if not path.is_file() or path.stat().st_size != size or xxhash.xxh3_128_hexdigest(path.read_bytes()) != h:
            return False
    return True


def _open_part(job: Job, unit: Unit):
    name = part_name(unit.index)
    if job.fmt == "memmap":
        return HeldPart(Path(job.out_dir) / STATE / "parts" / name, job.policy["dtype"])
    pol = job.policy  # token-list rows have no fixed length: its schema ignores seq_len
    schema = pqf.schema_for(job.fmt, pol["dtype"], pol.get("seq_len", 0), pol["pad_id"])
    return pqf.ParquetPartWriter(Path(job.out_dir) / f"{name}.parquet", schema, job.compression)


def process_unit(unit: Unit, encoder, job: Job, report: Callable[[int, int, int], None]
                 ) -> tuple[PartRecord, HeldPart | None]:
    """Read, tokenize and write one unit as a part, committed by its record (`.pretok/parts/part-N.json`); returns
    the record and, for a memmap part kept in memory, the part (None: it is in its files, or not memmap). Memmap
    parts are then placed into the one `.bin` at the offset the main process hands out (`memmap_place`). A failure
    removes the part's temp files; an OSError of the output side (disk full, ...) becomes one line naming it."""
    where = Path(job.out_dir) / (f"{STATE}/parts/{part_name(unit.index)}.bin" if job.fmt == "memmap"
                                 else f"{part_name(unit.index)}.parquet")
    try:
        writer = _open_part(job, unit)
    except OSError as e:
        raise os_error(e, where) from None
    try:
        record = _write_part(unit, encoder, job, report, writer)
        return record, writer if isinstance(writer, HeldPart) and writer.spilled is None else None
    except (OSError, PretokError) as e:
        writer.abort()
        check_stamps(job.stamps_of(unit))  # a read that failed because the input changed (cut, removed): say so
        if isinstance(e, PretokError):
            raise
        raise os_error(e, where) from None
    except BaseException:
        writer.abort()
        raise


def _write_part(unit: Unit, encoder, job: Job, report: Callable[[int, int, int], None], writer) -> PartRecord:
    counts = {"documents": 0, "tokens": 0, "padding": 0, "truncated": 0, "input_bytes": 0}
    skipped: dict[str, int] = {}
    mark, cpu0 = retries(), memory.cpu_seconds()
    remember(job.objects)
    pol, vocab_size = job.policy, job.tokenizer.vocab_size
    stamps = job.stamps_of(unit)
    check_stamps(stamps)  # the input is the one planned when the part starts reading it, and still when it ends
    for batch in read_unit(unit, job.sources):
        for k, v in batch.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
        counts["input_bytes"] += batch.text_bytes
        if not batch.texts:
            report(batch.text_bytes, 0, 0)
            continue
        ids, offsets = encoder.encode_batch(batch.texts)
        if ids.size and int(ids.max()) >= vocab_size:
            raise PretokError(f"tokenizer produced id {int(ids.max())} >= vocab size {vocab_size}", unit.paths[0])
        ids, offsets = add_special(ids, offsets, pol["bos_id"], pol["eos_id"],
                                   writer.dtype if job.fmt == "memmap" else np.dtype(pol["dtype"]))
        n, t = len(offsets) - 1, int(offsets[-1])
        if job.fmt == "memmap":
            writer.add(ids, np.diff(offsets))
        elif job.fmt == "token-list":
            writer.write(pqf.tokenlist_table(ids, offsets, writer.writer.schema), t, np.diff(offsets))
        else:
            table, st = pqf.padded_table(ids, offsets, writer.writer.schema)
            writer.write(table, n * pol["row_length"], np.minimum(np.diff(offsets), pol["row_length"]))
            counts["padding"] += st.padding
            counts["truncated"] += st.truncated
            t -= st.truncated  # padded rows store the kept tokens only
        counts["documents"] += n
        counts["tokens"] += t
        report(batch.text_bytes, n, t)
    result = writer.close()
    check_stamps(stamps)  # before the commit record: a part read from a changed input is never committed
    peak_rss_mb = memory.peak_rss_mb()
    record = PartRecord(unit=asdict(unit), **counts, skipped=skipped, peak_rss_mb=round(peak_rss_mb, 1),
                        files=[result] if job.fmt != "memmap" else [], part=part_name(unit.index))
    if job.fmt == "memmap":
        record[PART_HASH_KEY] = writer.hashes()
    record["cpu_seconds"] = round(memory.cpu_seconds() - cpu0, 4)
    if any(is_url(p) for p in unit.paths):  # transient errors of the store retried while reading this unit
        record["remote_retries"] = take_retries(mark)
    # the commit record; a memmap part is checked by its hashes on a rerun, so neither it nor its data is fsynced
    atomic_write_json(Path(job.out_dir) / STATE / "parts" / f"{part_name(unit.index)}.json", record,
                      fsync=job.fmt != "memmap")
    return record
