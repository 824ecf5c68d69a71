"""In-order, crash-safe appending of finished parts into one Megatron `.bin` (the memmap format's write path).

Workers return each part's tokens, lengths and the sha256 of its token bytes; the main process appends them
in unit order to `OUT/data.bin.tmp` and `OUT/.pretok/data.lens`, hashing as it goes, and commits every part by
atomically rewriting `.pretok/append.json` ({"parts", "bin_bytes", "lens_bytes", "part_sha256"}). After a kill
the files are truncated back to the committed sizes, the committed prefix is re-read and checked part by part
against `part_sha256` (so data lost by a power cut is detected and redone, without an fsync per part), and the
run continues with the next part: no part files and no final copy of the token data. `finish` fsyncs, writes
the `.idx` from the lengths and renames `.bin` then `.idx`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .formats import memmap as mm
from .formats.manifest import atomic_write_json


class MemmapAppender:
    """Appends parts in the order given by `unit_order`; `committed` is how many are safely in the files."""

    def __init__(self, out: Path, state: Path, prefix: str, dtype: str, unit_order: list[int]):
        self.out, self.state, self.prefix, self.dtype = out, state, prefix, dtype
        self.order, self.pending = unit_order, {}
        self.bin_path, self.lens_path = out / f"{prefix}.bin.tmp", state / f"{prefix}.lens"
        self.commit_path = state / "append.json"
        st = json.loads(self.commit_path.read_text()) if self.commit_path.exists() else {}
        if st.get("order") != unit_order:  # a fresh run (or another plan): start from nothing
            st = {"parts": 0, "part_sha256": [], "part_sizes": [], "part_docs": []}
        self.part_sha, self.part_sizes, self.part_docs = st["part_sha256"], st["part_sizes"], st["part_docs"]
        self.bin = open(self.bin_path, "r+b" if self.bin_path.exists() else "w+b")
        self.lens = open(self.lens_path, "r+b" if self.lens_path.exists() else "w+b")
        self.sha = hashlib.sha256()
        self.committed = self._intact_prefix(st["parts"])
        del self.part_sha[self.committed :], self.part_sizes[self.committed :], self.part_docs[self.committed :]
        self.bin_bytes, self.lens_bytes = sum(self.part_sizes), 4 * sum(self.part_docs)
        for fh, size in ((self.bin, self.bin_bytes), (self.lens, self.lens_bytes)):
            fh.truncate(size)
            fh.seek(size)

    def _intact_prefix(self, parts: int) -> int:
        """How many committed parts are intact on disk; their bytes are fed into the running sha256."""
        for k in range(parts):
            part, whole, left = hashlib.sha256(), self.sha.copy(), self.part_sizes[k]
            while left and (block := self.bin.read(min(64 << 20, left))):
                part.update(block)
                whole.update(block)
                left -= len(block)
            if left or "sha256:" + part.hexdigest() != self.part_sha[k]:
                return k  # lost or damaged (e.g. a power cut before writeback): redo from this part on
            self.sha = whole
        return parts

    def committed_units(self) -> list[int]:
        return self.order[: self.committed]

    def add(self, unit_index: int, tokens: np.ndarray, lengths: np.ndarray, sha256: str) -> None:
        """Take a finished part (its token bytes' sha256 computed by the worker); append every part now in order."""
        self.pending[unit_index] = (tokens, lengths, sha256)
        while self.committed < len(self.order) and self.order[self.committed] in self.pending:
            tok, lens, digest = self.pending.pop(self.order[self.committed])
            data = np.ascontiguousarray(tok, dtype=np.dtype(self.dtype).newbyteorder("<")).data
            self.bin.write(data)
            self.sha.update(data)
            self.lens.write(np.ascontiguousarray(lens, dtype="<i4").data)
            self.bin_bytes, self.lens_bytes = self.bin.tell(), self.lens.tell()
            self.part_sha.append(digest)
            self.part_sizes.append(data.nbytes)
            self.part_docs.append(len(lens))
            self.committed += 1
            for fh in (self.bin, self.lens):
                fh.flush()
            atomic_write_json(self.commit_path, {"order": self.order, "parts": self.committed,
                                                 "part_sha256": self.part_sha, "part_sizes": self.part_sizes,
                                                 "part_docs": self.part_docs}, fsync=False)

    def finish(self) -> list[dict]:
        """Write the index, rename .bin then .idx into place; returns both files' records."""
        assert self.committed == len(self.order), "finish() before every part was appended"
        for fh in (self.bin, self.lens):
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        final_bin = self.out / f"{self.prefix}.bin"
        os.replace(self.bin_path, final_bin)
        idx = mm.write_index(self.lens_path, self.out / f"{self.prefix}.idx", self.dtype)
        return [{"path": final_bin.name, "size": self.bin_bytes, "sha256": "sha256:" + self.sha.hexdigest()}, idx]

    def close(self) -> None:
        for fh in (self.bin, self.lens):
            if not fh.closed:
                fh.close()
