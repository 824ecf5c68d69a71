"""The original study's two on-the-fly baselines: tokenize text when it is needed, every epoch.

- `PaddedText` (`padded`): one document per sample, tokenized when fetched, truncated/padded to seq_len + 1
  (the study's `ParquetDataset`).
- `PaddingFreeStream` (`padding-free`): documents streamed in the epoch's order, tokenized, concatenated (BOS at
  each document start) and cut into seq_len + 1 windows (the study's `IterableParquetDataset`). Window k is
  only known after tokenizing everything before it, so every rank and DataLoader worker tokenizes the whole
  stream and keeps its own windows: exact sharding without a pre-pass costs redundant tokenization, which is
  part of what this baseline measures. Resume is O(1) from a (document, token offset) cursor.

Both read documents with the engine's readers and policy, so their tokens equal the pretokenized formats'.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ..datapaths import window
from ..engine.parts import add_special
from ..formats import checksum
from ..sources import SourceOptions, expand_inputs, plan_units, read_unit
from ..tokenizer import backends_for, load_tokenizer, make_encoder
from ..tokenizer.specials import policy_id
from .order import epoch_permutation
from .packing import Sample
from .source import EXACT


class _TextDocs:
    """All documents of the inputs (loaded as Python strings once) and the tokenizer with the engine's policy."""

    streaming = False

    def __init__(self, inputs: Sequence[str], tokenizer: str, text_column: str = "text", bos: str = "auto",
                 eos: str = "no", backend: str | None = None, separator: str | None = None):
        opts = SourceOptions(text_column=text_column, separator=separator)
        self.texts = [t for u in plan_units(expand_inputs(list(inputs)), opts) for b in read_unit(u, opts)
                      for t in b.texts]
        self.info = load_tokenizer(tokenizer)
        self.backend = backend or backends_for(self.info)[-1]  # default: the reference implementation
        self.bos, self.eos = policy_id(self.info, "bos", bos), policy_id(self.info, "eos", eos)  # as pretok tokenize
        pad = self.info.pad_id if self.info.pad_id is not None else self.info.eos_id
        self.pad = pad if pad is not None else 0
        self._encoder = None
        self._data_id: str | None = None

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self._encoder is None:  # built lazily: inside each DataLoader worker
            self._encoder = make_encoder(self.info, self.backend)
        ids, offs = self._encoder.encode_batch(texts)
        return add_special(ids, offs, self.bos, self.eos)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_encoder": None}

    def order_identity(self) -> dict:
        return dict(EXACT)

    def data_identity(self) -> str:
        """The data served: a hash of the documents read (in input order) and of what turns them into tokens
        (tokenizer fingerprint, BOS, EOS); computed once. Loader states of other data are refused."""
        if self._data_id is None:
            h = checksum.hasher()
            h.update(f"{self.info.fingerprint}|{self.bos}|{self.eos}|{len(self.texts)}\n".encode())
            for t in self.texts:
                b = t.encode("utf-8")
                h.update(len(b).to_bytes(8, "little"))
                h.update(b)
            self._data_id = checksum.value(h)
        return self._data_id


class PaddedText(_TextDocs):
    """`padded`: sample k of an epoch is document perm[k], tokenized now, truncated/padded to seq_len + 1."""

    def __init__(self, inputs, seq_len: int, tokenizer: str, seed: int = 0, shuffle: bool = True, **kw):
        super().__init__(inputs, tokenizer, **kw)
        self.window, self.seed, self.shuffle = window(seq_len), seed, shuffle
        self.num_samples = len(self.texts)
        self._perm: tuple[int, np.ndarray] | None = None

    def sample(self, epoch: int, k: int) -> Sample:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle))
        ids, _ = self.encode([self.texts[int(self._perm[1][k])]])
        row = np.full(self.window, self.pad, dtype=np.int64)
        n = min(len(ids), self.window)
        row[:n] = ids[:n]
        return Sample(row, mask=np.arange(self.window) < n)


class PaddingFreeStream(_TextDocs):
    """`padding-free`: a stream of windows over the documents in the epoch's order, tokenized as it goes."""

    streaming = True

    def __init__(self, inputs, seq_len: int, tokenizer: str, seed: int = 0, shuffle: bool = True, **kw):
        super().__init__(inputs, tokenizer, **kw)
        self.window, self.seed, self.shuffle = window(seq_len), seed, shuffle

    def windows(self, epoch: int, cursor: tuple[int, int] | None) -> Iterator[tuple[Sample, tuple[int, int]]]:
        """Yield (window, cursor after it) from `cursor` = (document position in the epoch order, token offset)."""
        order = epoch_permutation(len(self.texts), self.seed, epoch, self.shuffle)
        pos, i = cursor or (0, 0)
        buf: list[np.ndarray] = []
        starts: list[int] = []
        have = 0
        while pos < len(order):
            full, _ = self.encode([self.texts[int(order[pos])]])
            if i == 0 and have > 0:
                starts.append(have)  # a document begins inside this window
            while i < len(full):
                take = min(len(full) - i, self.window - have)
                buf.append(full[i : i + take])
                have, i = have + take, i + take
                if have == self.window:
                    lens = np.diff(np.array([0, *starts, self.window], dtype=np.int64))
                    yield (Sample(np.concatenate(buf).astype(np.int64), starts=np.array(starts, np.int64),
                                  doc_lens=lens), (pos, i) if i < len(full) else (pos + 1, 0))
                    buf, starts, have = [], [], 0
            pos, i = pos + 1, 0
