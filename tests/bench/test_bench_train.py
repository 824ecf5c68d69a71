"""Smoke test of `pretok bench train`: all five paths train, the table's ratios follow from the runs' logs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.bench.train import PACKED, PRETOK, add_args, main, measure_run
from pretok_lib.data import KINDS
from tests.conftest import GPT2_JSON, WIKI_EN


def test_bench_train_smoke(tmp_path: Path, shared_data: Path, capsys) -> None:
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:200]
    corpus = tmp_path / "wiki.parquet"
    pq.write_table(pa.table({"text": docs}), corpus)
    out = tmp_path / "b.json"
    p = argparse.ArgumentParser()
    add_args(p)
    args = p.parse_args(["--corpus", str(corpus), "--tokenizer", str(GPT2_JSON), "--workdir", str(tmp_path / "w"),
                         "--steps", "4", "--skip", "1", "--seq-len", "256", "--micro-batch", "4",
                         "--set", "model.hidden_size=64", "checkpoint.export=false", "--json", str(out)])
    main(args)
    res = json.loads(out.read_text())
    assert list(res["results"]) == list(KINDS)
    for kind, r in res["results"].items():
        assert r["steps"] == 4 and r["measured_steps"] == 3, kind
        again = measure_run(Path(r["run_dir"]), 1)
        assert again["effective_tokens_per_s"] == pytest.approx(r["effective_tokens_per_s"])
        assert 0 <= r["data_stall"] < 1
    rs = res["results"]
    assert rs["padded"]["padding_frac"] > 0.3 and rs["pretok-padded"]["padding_frac"] > 0.3   # short summaries
    assert all(rs[k]["padding_frac"] == 0 for k in PACKED)
    names = [t["target"] for t in res["targets"]]
    assert len(names) == len(PACKED) + len(PRETOK)
    table = capsys.readouterr().out
    ratio = rs["pretok-memmap"]["effective_tokens_per_s"] / rs["padded"]["effective_tokens_per_s"]
    assert f"{ratio:.2f}x" in table and "x padded (eff)" in table
