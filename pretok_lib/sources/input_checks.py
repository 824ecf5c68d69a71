"""Checks of the input as a whole: its shape, on a sample at planning time, and how much of it was skipped, at
the end of a run.

A wrong shape (a pretty-printed JSON document given as JSONL, records whose text is under another key) would
otherwise read as an input whose every line is a skipped document: an empty success. It fails before any
tokenizing, naming what was found. At the end, a run that skipped more than `--max-bad-fraction` of its
documents, or read none, fails before its manifest is written; its committed parts are kept, so the same
command with a higher threshold resumes and finishes.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..errors import PretokError
from .remote import is_url
from .streams import jsonl_lines, parse_jsonl_line, without_bom

SAMPLE_LINES = 100  # non-blank lines of each JSONL file read at planning time
SAMPLE_BYTES = 1 << 20  # ... from at most about this many bytes of a plain file
# what each skipped kind (sources/read.py BAD_DOC_KINDS, the manifest's `skipped` keys) means, for the errors
SKIPPED_MEANS = {"null": "the text is null", "missing": "no text key", "nonstring": "the text is not a string",
                 "empty": "the text is empty", "invalid": "not UTF-8, a lone surrogate, or a line not a JSON object"}


def check_shape(files: Sequence, text_column: str) -> None:
    """Fail fast on a JSONL input none of whose first lines is a JSON object, or none of whose first records
    has the key `text_column`; the error names what was found (the keys present, or the first bad line)."""
    jsonl = [f for f in files if f.kind.startswith("jsonl")]
    check = lambda f: _check_jsonl(f.path, f.kind, min(f.size, SAMPLE_BYTES), text_column)  # noqa: E731
    if sum(is_url(f.path) for f in jsonl) > 1:  # remote: 16 samples at a time; the first failing file in order
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(check, jsonl))
        return
    for f in jsonl:
        check(f)


def _check_jsonl(path: str, kind: str, stop: int, key: str) -> None:
    lines, objects, keys, first_bad = 0, 0, Counter(), None
    reader = jsonl_lines(path, kind, 0, stop)
    try:
        for line, pos in reader:
            line = without_bom(line, pos)
            if not line.strip():
                continue
            lines += 1
            rec, why = parse_jsonl_line(line, pos)
            if isinstance(rec, dict):
                if key in rec:
                    return
                objects += 1
                keys.update(rec.keys())  # the keys (update(dict) would add its values as counts)
            elif first_bad is None:
                first_bad = f"byte {pos}: {why or 'a JSON ' + type(rec).__name__ + ', not an object'}"
            if lines >= SAMPLE_LINES:
                break
    finally:
        reader.close()
    if objects:
        found = ", ".join(repr(k) for k, _ in keys.most_common(12)) + (", ..." if len(keys) > 12 else "")
        raise PretokError(f"no key '{key}' in any of the first {objects} records (keys found: {found}); "
                          "use --text-column", path)
    if lines:
        raise PretokError(f"not JSON Lines: none of the first {lines} lines is a JSON object ({first_bad}); "
                          "a JSON document must be given as one object per line", path)


def check_skipped(documents: int, skipped: dict[str, int], max_fraction: float, where: str | None = None) -> None:
    """Fail a run that read no document, or skipped more than `max_fraction` of its documents."""
    bad = sum(skipped.values())
    kinds = ", ".join(f"{k}: {v}" + (f" ({SKIPPED_MEANS[k]})" if k in SKIPPED_MEANS else "")
                      for k, v in sorted(skipped.items()) if v)
    first = "--bad-docs fail stops at the first and says where"
    if documents == 0:
        raise PretokError("no document could be read from the input" + (f" ({bad} skipped: {kinds}; {first})"
                                                                          if bad else " (it holds none)"), where)
    if bad > max_fraction * (documents + bad):
        raise PretokError(f"{bad} of {documents + bad} documents skipped ({kinds}), more than --max-bad-fraction "
                          f"{max_fraction:g}; fix the input (or --text-column/--separator; {first}), or raise "
                          "--max-bad-fraction and rerun to finish (tokenized parts are kept)", where)
