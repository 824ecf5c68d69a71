"""Random access to the rows of a pretok parquet output with bounded memory: footers at open, row groups on demand.

Opening reads only each part's footer (row counts per row group; for token lists also the per-document lengths
recorded under `pretok.doc_lengths`, or, in files written before that key existed, the list offsets scanned one
row group at a time). A row then maps to (file, row group, offset) and its row group is decoded on first use into
a least-recently-used cache bounded in bytes (`cache_mb`, per process: each DataLoader worker has its own). So
memory is O(cache + documents x a few int64), independent of the token count.

Integrity: parts are only partly read, so a part's manifest checksum is checked once per process, streamed, when
the part is first touched (before any of its rows is served) — unless the files were checked at open
(`verify_on_open`) or a verified stamp (`verify_open.py`) covers them unchanged.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import PretokError
from ..formats import checksum
from ..formats import parquet as pqf
from .verify_open import stamp_covers, verify_files

MAX_OPEN_FILES = 32


def _corrupt(e: Exception, path: Path) -> PretokError:
    return PretokError(f"corrupt parquet data ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})", path)


class ParquetRows:
    """The rows of every part of one output, in manifest order, addressable by global row index.

    `fmt`: "padded" (rows of `row_length` ids + mask) or "token-list" (one document per row). `min_groups`: the
    cache keeps at least this many row groups whatever `cache_mb` says (block order needs a window's worth)."""

    def __init__(self, root: Path, manifest: dict, fmt: str, *, cache_mb: float = 256, min_groups: int = 2,
                 verify_on_open: bool = False):
        self.root, self.fmt = Path(root), fmt
        self.files = [self.root / f["path"] for f in manifest["files"]]
        self.expected = [checksum.recorded(f) for f in manifest["files"]]
        if verify_on_open:
            verify_files(self.root, manifest)
        self.checked = [verify_on_open or stamp_covers(self.root, manifest)] * len(self.files)
        self._reset()
        counts, files, groups, sizes, lengths = [], [], [], [], []
        self.contract: dict = {}
        for fi, path in enumerate(self.files):
            self.contract = pqf.read_contract(path, fmt)
            meta = self._metadata(path)
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                counts.append(rg.num_rows)
                files.append(fi)
                groups.append(g)
                sizes.append(rg.total_byte_size)
            if fmt == pqf.TOKEN_LIST:
                got = pqf.doc_lengths_of(meta, path)
                lengths.append(got if got is not None else self._scan_lengths(fi, meta.num_row_groups))
        self.group_rows = np.asarray(counts, dtype=np.int64)
        self.group_file, self.group_index = np.asarray(files, np.int64), np.asarray(groups, np.int64)
        self.first_row = np.concatenate([[0], np.cumsum(self.group_rows)]).astype(np.int64)
        self.num_rows = int(self.first_row[-1])
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        if fmt == pqf.TOKEN_LIST:
            self.doc_starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        biggest = max(sizes, default=0)
        self.cache_bytes = max(int(cache_mb * 2**20), min_groups * biggest)

    # -------------------------------------------------------------- per-process state (dropped on fork/pickle)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cache: OrderedDict[int, tuple] = OrderedDict()
        self._cached_bytes = 0
        self._handles: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self.decoded = 0  # row groups decoded by this process (for tests and benchmarks)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for k in ("_cache", "_handles"):
            state[k] = OrderedDict()
        state["_cached_bytes"] = 0
        return state

    def _handle(self, fi: int) -> pq.ParquetFile:
        if self._pid != os.getpid():
            self._reset()
        h = self._handles.get(fi)
        if h is None:
            try:
                h = pq.ParquetFile(self.files[fi])
            except (OSError, pa.ArrowException) as e:
                raise _corrupt(e, self.files[fi]) from None
            self._handles[fi] = h
            if len(self._handles) > MAX_OPEN_FILES:
                self._handles.popitem(last=False)[1].close()
        self._handles.move_to_end(fi)
        return h

    # -------------------------------------------------------------- reading

    @staticmethod
    def _metadata(path: Path) -> pq.FileMetaData:
        try:
            return pq.read_metadata(path)
        except (OSError, pa.ArrowException) as e:
            raise _corrupt(e, path) from None

    def _check(self, fi: int) -> None:
        """The part's manifest checksum, once per process, before its first row is served (streamed in bounded
        chunks: flipped bytes in a zstd page often decode without error into wrong tokens)."""
        if self.checked[fi]:
            return
        want, path = self.expected[fi], self.files[fi]
        try:
            ok = not want or checksum.matches(path, want)
        except ValueError:
            raise PretokError(f"unknown checksum algorithm in manifest.json: {want}", path) from None
        except OSError as e:
            raise PretokError(f"cannot read data file listed in manifest.json: {e.strerror or e}", path) from None
        if not ok:
            raise PretokError("checksum differs from manifest.json (corrupted or modified)", path)
        self.checked[fi] = True

    def _read(self, fi: int, g: int) -> pa.Table:
        self._check(fi)
        cols = ["input_ids", "attention_mask"] if self.fmt == pqf.PADDED else ["input_ids"]
        try:
            return self._handle(fi).read_row_group(g, columns=cols)
        except (OSError, pa.ArrowException) as e:
            raise _corrupt(e, self.files[fi]) from None

    def _scan_lengths(self, fi: int, num_groups: int) -> np.ndarray:
        """Document lengths of a token-list part without the footer key: its list offsets, group by group."""
        out = [np.zeros(0, np.int64)]
        for g in range(num_groups):
            col = self._read(fi, g).column("input_ids").combine_chunks()
            out.append(np.diff(col.offsets.to_numpy().astype(np.int64)))
        return np.concatenate(out)

    def group(self, gid: int) -> tuple:
        """Row group `gid` decoded: padded (ids (n, L), mask (n, L) bool); token list (values, offsets)."""
        if self._pid != os.getpid():
            self._reset()
        hit = self._cache.get(gid)
        if hit is not None:
            self._cache.move_to_end(gid)
            return hit
        fi, g = int(self.group_file[gid]), int(self.group_index[gid])
        t = self._read(fi, g)
        n, path = int(self.group_rows[gid]), self.files[fi]
        if t.num_rows != n:
            raise PretokError(f"row group {g} holds {t.num_rows} rows, its footer says {n}", path)
        ids = t.column("input_ids").combine_chunks()
        if self.fmt == pqf.PADDED:
            L = self.contract["row_length"]
            rows = ids.flatten().to_numpy(zero_copy_only=False).reshape(-1, L)
            mask = t.column("attention_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, L)
            entry: tuple = (rows, mask != 0)
        else:
            offsets = ids.offsets.to_numpy().astype(np.int64)
            lo = int(self.first_row[gid])
            if not np.array_equal(np.diff(offsets), self.lengths[lo : lo + n]):
                raise PretokError(f"row group {g}: document lengths differ from the footer's "
                                  f"'{pqf.DOC_LENGTHS_KEY}' (corrupt)", path)
            entry = (ids.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0])
        size = sum(a.nbytes for a in entry)
        self._cache[gid] = entry
        self._cached_bytes += size
        self.decoded += 1
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= sum(a.nbytes for a in old)
        return entry

    def locate(self, row: int) -> tuple[int, int]:
        """(row group id, row within it) of global row `row`."""
        gid = int(np.searchsorted(self.first_row, row, side="right")) - 1
        return gid, row - int(self.first_row[gid])

    def padded_row(self, row: int, window: int) -> tuple[np.ndarray, np.ndarray]:
        gid, i = self.locate(row)
        rows, mask = self.group(gid)
        return rows[i, :window], mask[i, :window]

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        gid, i = self.locate(doc)
        values, offsets = self.group(gid)
        o = int(offsets[i])
        return values[o + a : o + b]
