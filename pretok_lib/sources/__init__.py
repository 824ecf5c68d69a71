"""Input readers: parquet / JSONL(.gz, .zst) / plain text / HF datasets on disk → planned units → batches of texts.

The input is cut into *units* before any tokenization: consecutive parquet row groups, newline-aligned byte
ranges of a JSONL file, whole compressed files, groups of text files, row ranges of an HF dataset. The plan
depends only on the inputs and the part size, never on the worker count, so every unit becomes one numbered
output part and outputs are identical for any number of workers and shards.

- `inputs.py`: `expand_inputs` → `InputFile`s; `SourceOptions`, `Unit`, `DocBatch`;
- `plan.py`: `plan_units`, `shard_units`, `estimate_text_bytes` (parquet footers, byte offsets);
- `read.py`: `read_unit` (one `Reader` per input kind), `sample_texts`; `read_ahead.py`: a worker's next unit's
  first row group, decoded while it encodes the current one.
"""

from __future__ import annotations

from .inputs import (JSONL_SUFFIXES, TEXT_SUFFIXES, DocBatch, InputFile, SourceOptions, Stamp, Unit, check_stamps,
                     compile_separator, expand_inputs)
from .plan import (SPLIT_ROW_GROUP_BYTES, _parquet_file, _text_column_index, estimate_text_bytes, plan_units,
                   shard_units)
from .read import BAD_DOC_KINDS, Reader, _byte_lengths, read_unit, sample_texts

__all__ = ["BAD_DOC_KINDS", "JSONL_SUFFIXES", "SPLIT_ROW_GROUP_BYTES", "TEXT_SUFFIXES", "DocBatch", "InputFile",
           "Reader", "SourceOptions", "Stamp", "Unit", "check_stamps", "compile_separator", "estimate_text_bytes",
           "expand_inputs", "plan_units", "read_unit", "sample_texts", "shard_units"]
