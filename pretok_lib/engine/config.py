"""`TokenizeConfig`: everything `pretok tokenize` takes, with its defaults — the one place they are declared (the
command line derives its defaults from it). Light to import: the CLI builds its parser from it."""

from __future__ import annotations

import sys
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..cpu_affinity import usable_cpus

if TYPE_CHECKING:
    from ..sources import SourceOptions

FORMATS = ("padded", "token-list", "memmap")


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
    compression: str = "zstd:3"
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

    def part_bytes(self, text_bytes: int) -> int:
        """Text bytes per part: as given, or about 1/32 of the input's text, clamped to [1 MB, 64 MB] — small
        inputs still spread over the workers, large ones resume at 64 MB granularity. Depends on the inputs only."""
        if self.part_mb is not None:
            return max(1, int(self.part_mb * 1e6))
        return int(min(64e6, max(1e6, text_bytes / 32)))

    def source_options(self, text_bytes: int) -> SourceOptions:
        from ..sources import SourceOptions

        return SourceOptions(self.text_column, self.separator, self.bad_docs,
                             self.part_bytes(text_bytes), int(self.batch_mb * 1e6))


def default(name: str) -> Any:
    """The default of `TokenizeConfig.<name>` (a factory's value, e.g. the CPUs this process may use)."""
    f = next(f for f in fields(TokenizeConfig) if f.name == name)
    if f.default_factory is not MISSING:
        return f.default_factory()
    if f.default is MISSING:
        raise KeyError(f"TokenizeConfig.{name} has no default")
    return f.default
