"""Every supported tokenizer kind through the engine: dtype, backend recorded, stored ids = reference ids,
and the memmap output read by Megatron-LM's own IndexedDataset."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.engine.verify import verify
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.tokenizer import backends_for, load_tokenizer, make_encoder

from ..conftest import CL100K_JSON, CL100K_TIKTOKEN, GPT2_JSON, MISTRAL_SP, R50K_TIKTOKEN, TEKKEN, WIKI_FR
from ..engine.test_pretokenize import stored_docs


@pytest.fixture(scope="module")
def fr_corpus(tmp_path_factory):
    docs = [v["extract"] for v in json.loads(WIKI_FR.read_text()).values()][:600]
    docs.append("literal specials stay text: <|endoftext|> <s> </s> [INST] <unk>")
    p = tmp_path_factory.mktemp("fr") / "fr.parquet"
    pq.write_table(pa.table({"text": docs}), p, row_group_size=100)
    return p, docs


CASES = [  # tokenizer, dtype, backend expected to win the check
    (GPT2_JSON, "uint16", "fastokens"),
    (CL100K_JSON, "int32", "fastokens"),
    (R50K_TIKTOKEN, "uint16", "fastokens"),
    (CL100K_TIKTOKEN, "int32", "fastokens"),
    (MISTRAL_SP, "uint16", "sentencepiece"),
    (TEKKEN, "int32", "fastokens"),
]


@pytest.mark.parametrize("tokenizer,dtype,backend", CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_engine_with_each_tokenizer(tmp_path, fr_corpus, tokenizer, dtype, backend):
    path, docs = fr_corpus
    m = run_tokenize(TokenizeConfig(inputs=[str(path)], out=str(tmp_path / "o"), tokenizer=str(tokenizer),
                                    workers=2, progress=False, part_mb=0.1))
    assert m["dtype"] == dtype and m["tokenizer"]["backend"]["backend"] == backend
    info = load_tokenizer(tokenizer)
    ref = make_encoder(info, backends_for(info)[-1])
    ids, offs = ref.encode_batch(docs)
    got = stored_docs(tmp_path / "o")
    bos = m["policy"]["bos_id"]
    assert len(got) == len(docs)
    for i, g in enumerate(got):
        body = g[1:] if bos is not None else g
        assert body.tolist() == ids[offs[i] : offs[i + 1]].tolist()
    specials = got[-1].tolist()[1 if bos is not None else 0 :]
    assert not {info.bos_id, info.eos_id} & set(specials)  # special strings in text are not control ids
    assert verify(tmp_path / "o", sample=8).ok


def test_megatron_reads_engine_output(tmp_path, fr_corpus):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    path, docs = fr_corpus
    run_tokenize(TokenizeConfig(inputs=[str(path)], out=str(tmp_path / "o"), tokenizer=str(TEKKEN), workers=1,
                                progress=False))
    ours = stored_docs(tmp_path / "o")
    ds = IndexedDataset(str(tmp_path / "o" / "data"), multimodal=False, mmap=True)
    assert len(ds) == len(ours) == len(docs)
    assert ds.index.dtype == np.int32
    for i in range(len(ds)):
        assert np.array_equal(ds[i], ours[i])
