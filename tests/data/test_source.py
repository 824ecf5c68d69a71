"""The sample-source contract (`pretok_lib.data.source`): every data path's source and a mixture state it."""

from __future__ import annotations

import pytest

from pretok_lib.data import open_mixture
from pretok_lib.data.inram import InRamPaddedRows, InRamTokenList
from pretok_lib.data.source import BatchedSource, IndexedSource, PretokenizedSource, Source, StreamingSource

from .helpers import KINDS, PAD_SEQ_LEN, source

SEQ = 32


@pytest.mark.parametrize("kind", KINDS)
def test_every_data_path_states_the_contract(wiki, kind):
    src = source(wiki, kind, SEQ)
    assert isinstance(src, Source) and src.window == SEQ + 1
    if kind == "padding-free":
        assert src.streaming and isinstance(src, StreamingSource) and not isinstance(src, IndexedSource)
    else:
        assert not src.streaming and isinstance(src, IndexedSource) and src.num_samples > 0
    assert isinstance(src, PretokenizedSource) == kind.startswith("pretok-")
    assert isinstance(src, BatchedSource) == (kind == "pretok-padded")  # collates a whole batch in one gather
    ident = src.order_identity()
    # the parquet paths serve the block order, which over <= block_groups row groups is the exact permutation
    assert ident == {"order": "exact"}, ident


def test_in_ram_readers_and_a_mixture_state_the_contract(wiki, pydocs):
    for src in (InRamPaddedRows(wiki.dirs["pretok-padded"], PAD_SEQ_LEN),
                InRamTokenList(wiki.dirs["pretok-token-list"], SEQ)):
        assert isinstance(src, PretokenizedSource) and src.order_identity() == {"order": "exact"}
    mix = open_mixture([(wiki.dirs["pretok-token-list"], 1), (pydocs.dirs["pretok-memmap"], 1)], SEQ)
    assert isinstance(mix, IndexedSource) and not mix.streaming
    ident = mix.order_identity()
    assert ident["order"] == "exact" and ident["mixture_exhausted"] == "epoch"
    assert [{k: d[k] for k in d if k not in ("data", "num_samples", "weight")} for d in ident["mixture"]] == \
        [s.order_identity() for s in mix.sources]  # each dataset's own order
    assert [d["data"] for d in ident["mixture"]] == [s.data_identity() for s in mix.sources]  # and its data
