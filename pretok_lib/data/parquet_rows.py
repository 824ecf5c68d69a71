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
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import PretokError
from ..formats import checksum
from ..formats import parquet as pqf
from .parquet_pages import leaf_values
from .shared_index import shareable, unshared
from .verify_open import stamp_covers, verify_files

MAX_OPEN_FILES = 32
# see _recycle: buffer reuse relies on CPython's exact reference counts under the GIL
RECOUNT = (sys.implementation.name == "cpython" and sys.version_info < (3, 14)
           and getattr(sys, "_is_gil_enabled", lambda: True)())


def _corrupt(e: Exception, path: Path) -> PretokError:
    return PretokError(f"corrupt parquet data ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})", path)


class ParquetRows:
    """The rows of every part of one output, in manifest order, addressable by global row index.

    `fmt`: "padded" (rows of `row_length` ids + mask) or "token-list" (one document per row). `min_groups`: the
    cache keeps at least this many row groups whatever `cache_mb` says (block order needs a window's worth), and
    at least as many as the last `prefetch` asked for (what a batch spanning several windows reads next)."""

    def __init__(self, root: Path, manifest: dict, fmt: str, *, cache_mb: float = 256, min_groups: int = 2,
                 verify_on_open: bool = False):
        self.root, self.fmt = Path(root), fmt
        self.files = [self.root / f["path"] for f in manifest["files"]]
        self.vocab = int(manifest["tokenizer"]["vocab_size"])  # every id served is checked to lie in [0, vocab)
        self.expected = [checksum.recorded(f) for f in manifest["files"]]
        if verify_on_open:
            verify_files(self.root, manifest)
        self.checked = [verify_on_open or stamp_covers(self.root, manifest)] * len(self.files)
        self._reset()
        counts, files, groups, lengths = [], [], [], []
        self.contract: dict = {}
        self.mask_from_lengths: list[bool] = []
        for fi, path in enumerate(self.files):
            self.contract = pqf.read_contract(path, fmt)
            meta = self._metadata(path)
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                counts.append(rg.num_rows)
                files.append(fi)
                groups.append(g)
            if fmt == pqf.TOKEN_LIST:
                got = pqf.doc_lengths_of(meta, path)
                lengths.append(got if got is not None else self._scan_lengths(fi, meta.num_row_groups))
            else:  # padded: with real-token counts in the footer, masks need not be decoded
                got = pqf.doc_lengths_of(meta, path, pqf.ROW_LENGTHS_KEY)
                self.mask_from_lengths.append(got is not None)
                lengths.append(got if got is not None else np.zeros(meta.num_rows, np.int64))
        self.group_rows = np.asarray(counts, dtype=np.int64)
        self.group_file, self.group_index = np.asarray(files, np.int64), np.asarray(groups, np.int64)
        self.first_row = np.concatenate([[0], np.cumsum(self.group_rows)]).astype(np.int64)
        self.num_rows = int(self.first_row[-1])
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self.cache_bytes, self.min_groups = int(cache_mb * 2**20), max(1, min_groups)

    # -------------------------------------------------------------- per-process state (dropped on fork/pickle)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cache: OrderedDict[int, tuple] = OrderedDict()
        self._cached_bytes = 0
        self._handles: OrderedDict[tuple[int, int], pq.ParquetFile] = OrderedDict()
        self._lock = threading.RLock()  # cache, handles and checks: shared with the read-ahead thread
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future] = {}
        self._asked = 0  # row groups the last `prefetch` asked for: the cache keeps at least as many
        self._spares: list[np.ndarray] = []  # ids buffers of evicted groups, reused by the next decodes
        self.decoded = 0  # row groups decoded by this process (for tests and benchmarks)

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_pool", "_pending")}
        for k in ("_cache", "_handles"):
            state[k] = OrderedDict()
        state["_spares"] = []
        state["_cached_bytes"] = 0
        state["lengths"] = shareable(self.lengths)  # 8 bytes a row: in shared memory when large
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lengths = unshared(self.lengths)
        self._reset()

    def prefetch(self, gids) -> None:
        """Decode these row groups in a background thread (pyarrow decodes without the GIL) into the cache, so a
        later `group()` finds them; only the timing changes, never what is served."""
        if self._pid != os.getpid():
            self._reset()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="pretok-readahead")
        gids = [int(g) for g in gids]
        with self._lock:
            self._asked = len(gids)  # all of them stay while they are read (a batch may span several windows)
            for gid in gids:
                if gid in self._cache:  # needed next: newest, so the eviction takes the windows already read
                    self._cache.move_to_end(gid)
                elif gid not in self._pending:
                    self._pending[gid] = self._pool.submit(self._load, gid)

    def _handle(self, fi: int) -> pq.ParquetFile:
        """An open reader of part `fi` for the calling thread (readers are not shared between threads)."""
        if self._pid != os.getpid():
            self._reset()
        key = (threading.get_ident(), fi)
        h = self._handles.get(key)
        if h is None:
            try:
                h = pq.ParquetFile(self.files[fi])
            except (OSError, pa.ArrowException) as e:
                raise _corrupt(e, self.files[fi]) from None
            self._handles[key] = h
            if len(self._handles) > MAX_OPEN_FILES:
                self._handles.popitem(last=False)  # closed when its last reader is done with it
        self._handles.move_to_end(key)
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
            pqf.check_no_nulls(col, self.files[fi], g)
            out.append(np.diff(col.offsets.to_numpy().astype(np.int64)))
        return np.concatenate(out)

    def group(self, gid: int) -> tuple:
        """Row group `gid` decoded: padded (ids (n, L), mask (n, L) bool); token list (values, offsets)."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            hit = self._cache.get(gid)
            if hit is not None:
                self._cache.move_to_end(gid)
                return hit
            pending = self._pending.get(gid)
        if pending is not None:
            return pending.result()  # a read-ahead error is raised here, where the row is needed
        return self._load(gid)

    def _load(self, gid: int) -> tuple:
        try:
            return self._decode(gid)
        finally:
            with self._lock:
                self._pending.pop(gid, None)

    def _decode(self, gid: int) -> tuple:
        with self._lock:  # the checksum (once per part) and the file handle
            fi, g = int(self.group_file[gid]), int(self.group_index[gid])
            self._check(fi)
            handle = self._handle(fi)
        n, path = int(self.group_rows[gid]), self.files[fi]
        lo = int(self.first_row[gid])
        if self.fmt == pqf.PADDED:
            with_mask = not self.mask_from_lengths[fi]
            L = self.contract["row_length"]
            flat = self._padded_values(handle, fi, g, n * L, ["input_ids", "attention_mask"][: 1 + with_mask])
            rows = flat[0].reshape(-1, L)
            # masks decoded, or (rows, real tokens per row): the mask is that prefix
            entry: tuple = (rows, flat[1].reshape(-1, L) != 0) if with_mask else (rows, self.lengths[lo : lo + n])
        else:  # documents: the values, cut by the lengths known since open (footer, or scanned)
            offsets = np.concatenate([[0], np.cumsum(self.lengths[lo : lo + n])]).astype(np.int64)
            values = self._values(handle, fi, g, "input_ids", int(offsets[-1]))
            if values is None:
                ids = self._read_group(handle, fi, g, ["input_ids"], n).column("input_ids").combine_chunks()
                pqf.check_no_nulls(ids, path, g)
                got = ids.offsets.to_numpy().astype(np.int64)
                if not np.array_equal(got - got[0], offsets):
                    raise PretokError(f"row group {g}: document lengths differ from the footer's "
                                      f"'{pqf.DOC_LENGTHS_KEY}' (corrupt)", path)
                values = ids.flatten().to_numpy(zero_copy_only=False)
            entry = (values, offsets)
        pqf.check_ids(entry[0], self.vocab, path, g)
        with self._lock:
            if gid not in self._cache:
                self._cache[gid] = entry
                self._cached_bytes += sum(a.nbytes for a in entry)
                self.decoded += 1
            while self._cached_bytes > self.cache_bytes and len(self._cache) > max(self.min_groups, self._asked):
                old = self._cache.popitem(last=False)[1]
                self._cached_bytes -= sum(a.nbytes for a in old)
                ids = old[0]
                del old  # the tuple is gone unless a reader still holds it
                self._recycle(ids)
                del ids
        return entry

    def _recycle(self, ids: np.ndarray) -> None:
        """Keep an evicted group's ids buffer for the next decode (fresh memory costs a page fault per 4 kB) when
        nothing else holds it or a view of it: no served sample, no batch being gathered."""
        owner = ids if ids.base is None else ids.base
        # CPython up to 3.13 counts every reference: the caller's and this frame's `ids` and getrefcount's
        # argument; `owner` (when ids is a view of it): ids.base, this frame's and the argument. 3.14 may count
        # fewer, free-threaded builds differ: no reuse there.
        if not (isinstance(owner, np.ndarray) and owner.flags.owndata):  # pyarrow's memory (read-only)
            return
        if RECOUNT and sys.getrefcount(ids) == 3 and (owner is ids or sys.getrefcount(owner) == 3):
            self._spares = ([owner] + self._spares)[:2]

    def _read_group(self, handle: pq.ParquetFile, fi: int, g: int, columns: list[str], n: int) -> pa.Table:
        try:  # one column at a time: pyarrow's threads cost ~2x here
            t = handle.read_row_group(g, columns=columns, use_threads=False)
        except (OSError, pa.ArrowException) as e:
            raise _corrupt(e, self.files[fi]) from None
        if t.num_rows != n:
            raise PretokError(f"row group {g} holds {t.num_rows} rows, its footer says {n}", self.files[fi])
        return t

    def _values(self, handle: pq.ParquetFile, fi: int, g: int, name: str, size: int) -> np.ndarray | None:
        """The `size` leaf values of list column `name` in row group `g`, straight from the pages
        (`parquet_pages.py`: several times faster than Arrow's list rebuild), or None for a layout it does not
        take. The ids are decoded into a spare buffer when there is one."""
        meta, schema = handle.metadata, handle.schema_arrow
        leaves = [meta.schema.column(i).path.split(".")[0] for i in range(meta.num_columns)]
        dtype = np.dtype(schema.field(name).type.value_type.to_pandas_dtype())
        with self._lock:
            spare = self._spares.pop() if name == "input_ids" and self._spares else None
        try:
            got = leaf_values(self.files[fi], meta, g, leaves.index(name), dtype, spare)
        except OSError as e:
            raise _corrupt(e, self.files[fi]) from None
        if got is not None and len(got) != size:
            raise PretokError(f"row group {g} holds {len(got)} values of '{name}', its footer says {size}",
                              self.files[fi])
        return got

    def _padded_values(self, handle: pq.ParquetFile, fi: int, g: int, size: int, columns: list[str]) -> list:
        """The values of these fixed-size-list columns of row group `g` (`size` each): from the pages, or through
        pyarrow for other layouts."""
        out = [self._values(handle, fi, g, name, size) for name in columns]
        if all(v is not None for v in out):
            return out
        t = self._read_group(handle, fi, g, columns, size // self.contract["row_length"])
        out = []
        for c in columns:
            col = t.column(c).combine_chunks()
            pqf.check_no_nulls(col, self.files[fi], g, c)
            out.append(col.flatten().to_numpy(zero_copy_only=False))
        return out

    def locate(self, row: int) -> tuple[int, int]:
        """(row group id, row within it) of global row `row`."""
        gid = int(np.searchsorted(self.first_row, row, side="right")) - 1
        return gid, row - int(self.first_row[gid])

    def padded_row(self, row: int, window: int) -> tuple[np.ndarray, np.ndarray]:
        gid, i = self.locate(row)
        rows, mask = self.group(gid)
        if mask.ndim == 1:
            return rows[i, :window], np.arange(window) < mask[i]
        return rows[i, :window], mask[i, :window]

    def padded_batch(self, rows: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows `rows` (global ids) gathered at once: ids (B, window) int64 and mask (B, window) bool."""
        if self._pid != os.getpid():
            self._reset()
        rows = np.asarray(rows, np.int64)
        gids = np.searchsorted(self.first_row, rows, side="right") - 1
        local = (rows - self.first_row[gids]).tolist()
        ids = np.empty((len(rows), window), np.int64)
        decoded: list[tuple[int, np.ndarray]] = []  # (j, mask) of rows whose group's masks were decoded
        seen: dict[int, tuple] = {}
        for j, (g, i) in enumerate(zip(gids.tolist(), local)):
            e = seen.get(g)
            if e is None:  # once per group and batch; a hit becomes the newest, as in `group` and `prefetch`
                e = seen[g] = self.group(g)
            ids[j] = e[0][i, :window]
            if e[1].ndim == 2:  # files without the footer's row lengths
                decoded.append((j, e[1][i, :window]))
        mask = np.arange(window) < self.lengths[rows][:, None]  # the mask is the real tokens' prefix
        for j, m in decoded:
            mask[j] = m
        return ids, mask

    def doc_slices(self, pieces: list[tuple[int, int, int]]) -> list[np.ndarray]:
        """Tokens [a, b) of each (document, a, b) piece: one vectorised lookup of the row groups for all."""
        docs = np.fromiter((d for d, _, _ in pieces), np.int64, len(pieces))
        gids = np.searchsorted(self.first_row, docs, side="right") - 1
        out, seen = [], {}
        for (d, a, b), g, f in zip(pieces, gids.tolist(), self.first_row[gids].tolist()):
            e = seen.get(g)
            if e is None:
                e = seen[g] = self.group(g)
            o = int(e[1][d - f])
            out.append(e[0][o + a : o + b])
        return out

    def doc_tokens(self, doc: int, a: int, b: int) -> np.ndarray:
        gid, i = self.locate(doc)
        values, offsets = self.group(gid)
        o = int(offsets[i])
        return values[o + a : o + b]
