"""A weighted mixture of pretokenized datasets as one sample source (docs/MIXTURES.md).

    src = open_mixture([("runs/code/memmap", 0.3), ("runs/web/memmap", 0.7)], seq_len=1024, seed=0)
    ds = ShardedBatches(src, micro_batch=8)          # sharded, resumable, elastic: like one dataset

The mixture stream assigns each position to a dataset with `blend.Blend` (Megatron's greedy rule, periodic);
the g-th sample a dataset contributes is that dataset's own g-th sample in its own order (its epoch
permutation, the one training on it alone would see). When a dataset runs out (`exhausted`):
- `epoch`: it wraps into its next epoch (its next permutation); a mixture epoch is sum(num_samples) samples and
  the stream, and every dataset's count, continues across mixture epochs;
- `stop`: the mixture epoch ends just before the first sample a dataset no longer has; the next mixture epoch
  restarts the stream with every dataset in its next epoch.
The source of a position is O(1) arithmetic, so ShardedBatches' sharding and O(1) resume apply unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

from ..datapaths import BY_NAME, KIND_OF_FORMAT, PARQUET_KINDS
from ..errors import PretokError
from ..formats.manifest import data_identity, read_manifest
from .blend import Blend
from .content import content_fingerprint, content_key
from .packing import Sample
from .source import EXACT, PretokenizedSource

EXHAUSTED = ("epoch", "stop")
# format -> "packed" or "padded": padded rows cannot be batched with packed windows
FAMILY = {f: BY_NAME[k].layout for f, k in KIND_OF_FORMAT.items()}


class MixtureSource:
    """Pretokenized sources (`source.PretokenizedSource`) blended by `weights`; itself an indexed source."""

    streaming = False

    def __init__(self, sources: Sequence[PretokenizedSource], weights: Sequence[float], exhausted: str = "epoch",
                 names: Sequence[str] | None = None):
        if exhausted not in EXHAUSTED:
            raise PretokError(f"data.mixture_exhausted '{exhausted}' is not one of {', '.join(EXHAUSTED)}")
        if len(sources) != len(weights) or not sources:
            raise PretokError(f"a mixture needs one weight per dataset (got {len(sources)} datasets, "
                              f"{len(weights)} weights)")
        first = sources[0]
        if len({s.window for s in sources}) != 1 or len({(s.seed, s.shuffle) for s in sources}) != 1:
            raise ValueError("the sources of a mixture must share seq_len, seed and shuffle")
        try:
            self.blend = Blend(weights)
        except ValueError as e:
            raise PretokError(str(e)) from None
        self.sources, self.weights, self.exhausted = list(sources), [float(w) for w in weights], exhausted
        self.names = list(names) if names is not None else [str(s.path) for s in sources]
        self.sizes = [int(s.num_samples) for s in sources]
        self.window, self.seed, self.shuffle = first.window, first.seed, first.shuffle
        self.m = first.m  # tokenizer facts (vocab, fingerprint): the same for every dataset, checked on open
        for name, size in zip(self.names, self.sizes):
            if size == 0:
                raise PretokError(f"holds no sample of seq_len + 1 = {self.window} tokens: nothing to mix", name)
        if exhausted == "epoch":
            self.num_samples = sum(self.sizes)
        else:  # the first position whose dataset has no sample left in this epoch
            self.num_samples = min(self.blend.position_of(j, n) for j, n in enumerate(self.sizes))

    def locate(self, epoch: int, k: int) -> tuple[int, int, int]:
        """(dataset j, its epoch, its sample index) of mixture position `k` of `epoch`."""
        if self.exhausted == "stop":
            j, g = self.blend.locate(k)
            return j, epoch, g
        j, g = self.blend.locate(epoch * self.num_samples + k)
        e, i = divmod(g, self.sizes[j])
        return j, e, i

    def prepare(self, epoch: int) -> None:
        """Each dataset's index for the epoch it is in where this mixture epoch begins, built before the DataLoader
        starts its workers (they share it: `shared_index.py`); a dataset that wraps later builds its next one
        where it is read."""
        if self.exhausted == "stop":
            epochs = [epoch] * len(self.sources)
        else:
            epochs = [c // n for c, n in zip(self.blend.counts(epoch * self.num_samples), self.sizes)]
        for source, e in zip(self.sources, epochs):
            source.prepare(e)

    def sample(self, epoch: int, k: int) -> Sample:
        j, e, i = self.locate(epoch, k)
        return dataclasses.replace(self.sources[j].sample(e, i), origin=j)

    def legacy_order_identity(self) -> dict:
        """The order identity loader states saved before 2026-11-27 recorded (each dataset by its manifest's
        checksum): such a state still resumes on the very same outputs."""
        new = self.order_identity()
        return {**new, "mixture": [{**{k: v for k, v in e.items() if k != "data"},
                                    "manifest": s.m.get("manifest_sha256")}
                                   for e, s in zip(new["mixture"], self.sources)]}

    def order_identity(self) -> dict:
        """What makes this order this order (a loader state is refused on any other): every dataset by its data
        identity (format, dtype, file checksums: a moved copy, or the same input tokenized again to the same bytes,
        resumes) and size, the rational weights, the policy."""
        return {**EXACT, "mixture": [{"data": data_identity(s.m), "num_samples": n,
                                      "weight": [p, self.blend.Q], **s.order_identity()}
                            for s, n, p in zip(self.sources, self.sizes, self.blend.p)],
                "mixture_exhausted": self.exhausted}


def open_mixture(entries: Sequence[tuple[str | os.PathLike, float]], seq_len: int, *, tokenizer: str | None = None,
                 seed: int = 0, shuffle: bool = True, exhausted: str = "epoch",
                 verify_on_open: bool = False, **order_kw) -> MixtureSource:
    """The mixture of `(path, weight)` pretokenized outputs. Each dataset's format comes from its manifest; all
    must share the tokenizer (and match `tokenizer` when given) and the format family (padded rows cannot be
    batched with packed windows): otherwise a one-line PretokError naming the offending manifest. `order_kw`
    (order, block_groups, cache_mb) go to the parquet datasets' readers (`make_source`)."""
    from . import make_source

    if not entries:
        raise PretokError("data.mixture is empty: list {path, weight} entries")
    sources, first, manifests = [], None, []
    for i, (path, _) in enumerate(entries):
        m = read_manifest(path)
        where = Path(path) / "manifest.json"
        same = _same_content(entries, manifests, path, m)
        if same is not None:  # its samples would come twice, back to back (one order per dataset)
            raise PretokError(f"holds the same data (token ids) as the mixture's dataset {entries[same][0]} (the same "
                              "output, a copy, or the same input tokenized again, maybe in another format or "
                              "dtype): give it once, with the sum of the weights", where)
        manifests.append(m)
        if first is None:
            first = (path, m)
        else:
            p0, m0 = first
            fp, fp0 = m["tokenizer"]["fingerprint"], m0["tokenizer"]["fingerprint"]
            if fp != fp0:
                raise PretokError(f"was tokenized with {m['tokenizer']['spec']} ({fp[:19]}…), the mixture's first "
                                  f"dataset {p0} with {m0['tokenizer']['spec']} ({fp0[:19]}…): a mixture needs "
                                  f"one tokenizer", where)
            if FAMILY[m["format"]] != FAMILY[m0["format"]]:
                raise PretokError(f"holds format '{m['format']}' ({FAMILY[m['format']]}), the mixture's first "
                                  f"dataset {p0} '{m0['format']}' ({FAMILY[m0['format']]}): padded rows and packed "
                                  f"windows cannot share a batch", where)
        sources.append(make_source(KIND_OF_FORMAT[m["format"]], path, seq_len, tokenizer=tokenizer, seed=seed,
                                   shuffle=shuffle, verify_on_open=verify_on_open,
                                   **(order_kw if KIND_OF_FORMAT[m["format"]] in PARQUET_KINDS else {})))
    return MixtureSource(sources, [w for _, w in entries], exhausted, names=[str(p) for p, _ in entries])


def _same_content(entries: Sequence[tuple], manifests: list[dict], path, m: dict) -> int | None:
    """The index of an earlier dataset holding the same documents' ids as `path` (manifest `m`): byte-identical
    files (`data_identity`), else the same ids in another format, dtype or layout (`content_fingerprint`, read only
    for datasets whose manifests agree on tokenizer and counts)."""
    ident = data_identity(m)
    for j, mj in enumerate(manifests):
        if data_identity(mj) == ident:
            return j
    candidates = [j for j, mj in enumerate(manifests) if content_key(mj) == content_key(m)]
    if candidates:
        mine = content_fingerprint(path, m)
        for j in candidates:
            if content_fingerprint(entries[j][0], manifests[j]) == mine:
                return j
    return None
