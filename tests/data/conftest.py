"""Session fixtures for the data-path tests: two small real corpora (in tmp) and their three pretokenized outputs.

- `wiki`: the first 240 English Wikipedia vital-article summaries (short documents) written as parquet.
- `pydocs`: the first 60 Python-docs documents (long, markup-heavy), as JSONL (an engine input as it is).

Each is pretokenized with GPT-2 into padded (seq_len 128), token-list and memmap; the on-the-fly baselines read
the same text file. Nothing from ../shared/data is copied into the repository (only into pytest's tmp dirs).
"""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

from ..conftest import GPT2_JSON, PYDOCS_JSONL, WIKI_EN
from .helpers import PAD_SEQ_LEN, Corpus


def _pretokenize(name: str, text: Path, base: Path) -> Corpus:
    dirs = {}
    for fmt in ("padded", "token-list", "memmap"):
        out = base / fmt
        run_tokenize(TokenizeConfig(inputs=[str(text)], out=str(out), tokenizer=str(GPT2_JSON), format=fmt,
                                    seq_len=PAD_SEQ_LEN, workers=0, progress=False))
        dirs[f"pretok-{fmt}"] = out
    return Corpus(name, text, dirs)


@pytest.fixture(scope="session")
def wiki(tmp_path_factory, shared_data) -> Corpus:
    base = tmp_path_factory.mktemp("wiki")
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:240]
    path = base / "wiki.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=100)
    return _pretokenize("wiki", path, base)


@pytest.fixture(scope="session")
def pydocs(tmp_path_factory, shared_data) -> Corpus:
    base = tmp_path_factory.mktemp("pydocs")
    path = base / "pydocs.jsonl"
    with PYDOCS_JSONL.open() as src:
        path.write_text("".join(line for _, line in zip(range(60), src)))
    return _pretokenize("pydocs", path, base)


@pytest.fixture(scope="session", params=["wiki", "pydocs"])
def corpus(request) -> Corpus:
    return request.getfixturevalue(request.param)


@pytest.fixture
def start_method(request):
    """The global start method DataLoader workers use (torch takes Python's default), restored afterwards."""
    before = mp.get_start_method()
    mp.set_start_method(request.param, force=True)
    yield request.param
    mp.set_start_method(before, force=True)
