"""`TokenizeConfig`: everything `pretok tokenize` takes, with its defaults — the one place they are declared (the
command line derives its defaults from it). Light to import: the CLI builds its parser from it."""

from __future__ import annotations

import math
import sys
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..formats import FORMATS, TRAIN_COMPRESSION
from ..machine.cpu_affinity import usable_cpus

if TYPE_CHECKING:
    from ..sources import SourceOptions

CHOICES = {"dtype": ("auto", "uint16", "int32"), "bos": ("auto", "yes", "no"), "eos": ("yes", "no"),
           "bad_docs": ("skip", "fail")}  # the values these settings take (the command line's choices too)


MAX_PART_BYTES = 64_000_000  # the largest part the plan cuts (from 64 GB of memmap input on)
MIN_PART_BYTES = {"memmap": 8_000_000}  # the smallest part the plan cuts (other formats: 1 MB); see part_bytes
FLOOR_PART_BYTES = 1_000_000  # the smallest part any format's plan cuts, in any version
PARTS_MEMMAP = 1024   # memmap: parts per input between the floor and the cap; ~3.5 per worker on a 288-core node
PARTS_PARQUET = 32    # token-list, padded: each part is an output file


@dataclass
class TokenizeConfig:
    """Everything `pretok tokenize` takes; the fields in `output_key` determine the output bytes."""

    inputs: list[str]
    out: str
    tokenizer: str
    format: str = "memmap"
    seq_len: int = 2048  # padded rows hold seq_len + 1 tokens; no other format depends on it
    workers: int = field(default_factory=usable_cpus)
    text_column: str = "text"
    separator: str | None = None
    compression: str = TRAIN_COMPRESSION
    dtype: str = "auto"
    bos: str = "auto"  # auto (if the tokenizer has one) | yes | no
    eos: str = "no"
    bad_docs: str = "skip"
    max_bad_fraction: float = 0.1  # not in the output key: a rerun with another threshold resumes
    backend: str | None = None
    num_shards: int = 1
    shard_index: int = 0
    part_mb: float | None = None  # None: auto from the total input size (see `part_bytes`)
    batch_mb: float = 1.0  # ~1 MB of text per encode call: faster than 4 MB (cache locality), less memory
    overwrite: bool = False
    progress: bool = True
    command: list[str] = field(default_factory=lambda: list(sys.argv))

    def check(self) -> None:
        """Refuse, in one line naming the option, any setting the run could not honour (a batch of 0 bytes read
        nothing and lost documents; nan and inf, negative worker counts, codec levels out of range)."""
        from ..errors import PretokError

        def number(name: str, value, low: float, whole: bool = False, high: float = math.inf) -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (whole and value != int(value)) or not low <= value <= high:
                kind = "a whole number" if whole else "a finite number"
                bound = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
                raise PretokError(f"--{name.replace('_', '-')} must be {kind} {bound} (got {value!r})")

        if self.format not in FORMATS:
            raise PretokError(f"unknown --format {self.format} (choose from {', '.join(FORMATS)})")
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                raise PretokError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)} "
                                  f"(got {getattr(self, name)!r})")
        number("seq_len", self.seq_len, 1, whole=True)
        number("workers", self.workers, 0, whole=True)
        number("num_shards", self.num_shards, 1, whole=True)
        number("shard_index", self.shard_index, 0, whole=True, high=self.num_shards - 1)
        number("max_bad_fraction", self.max_bad_fraction, 0, high=1)
        number("batch_mb", self.batch_mb, 1e-6)       # at least one byte per read
        if self.part_mb is not None:
            number("part_mb", self.part_mb, 1e-6)
        if self.format != "memmap":
            from ..formats.parquet import parse_compression

            parse_compression(self.compression)

    def part_bytes(self, text_bytes: int) -> int:
        """Text bytes per part: as given, or a share of the input's text clamped to [floor, 64 MB]: 1/PARTS_MEMMAP
        for memmap, whose parts become one file, at least 8 MB (a unit costs a worker ~1 ms beyond its bytes,
        and the main process a message and a placement: 2 MB units made 1 GB on 2 workers ~1.2x slower than 8 MB ones,
        docs/BENCHMARKS.md); >= 288 units from 2.3 GB on, ~3.5 a worker of a 288-core node from 8 GB on, and large
        inputs resume at 64 MB granularity. 1/PARTS_PARQUET, at least 1 MB, for the parquet formats, where each
        part is a file of the output. Depends on the inputs and the format only (never on the workers: the bytes
        must not)."""
        if self.part_mb is not None:
            return max(1, int(self.part_mb * 1e6))
        share = PARTS_MEMMAP if self.format == "memmap" else PARTS_PARQUET
        return int(min(MAX_PART_BYTES, max(MIN_PART_BYTES.get(self.format, FLOOR_PART_BYTES), text_bytes / share)))

    def planned_part_bytes(self, text_bytes: int, recorded: int | None) -> int:
        """`part_bytes`, or with no `--part-mb` (and no `--overwrite`) the size an existing output was planned with
        (`recorded`), if a default plan could have chosen it ([1 MB, 64 MB], any version): an output planned under
        another default is then resumed, or found complete, as it was planned, not refused as another config. A
        size outside (a `--part-mb` given then, or a manifest not ours) is not adopted."""
        if self.part_mb is None and not self.overwrite and recorded is not None \
                and FLOOR_PART_BYTES <= recorded <= MAX_PART_BYTES:
            return recorded
        return self.part_bytes(text_bytes)

    def source_options(self, text_bytes: int, recorded_part_bytes: int | None = None) -> SourceOptions:
        """How the inputs are read; `recorded_part_bytes`: see `planned_part_bytes`."""
        from ..sources import SourceOptions

        return SourceOptions(self.text_column, self.separator, self.bad_docs,
                             self.planned_part_bytes(text_bytes, recorded_part_bytes), int(self.batch_mb * 1e6))


def default(name: str) -> Any:
    """The default of `TokenizeConfig.<name>` (a factory's value, e.g. the CPUs this process may use)."""
    f = next(f for f in fields(TokenizeConfig) if f.name == name)
    if f.default_factory is not MISSING:
        return f.default_factory()
    if f.default is MISSING:
        raise KeyError(f"TokenizeConfig.{name} has no default")
    return f.default
