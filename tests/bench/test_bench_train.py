"""Smoke test of `pretok bench train`: the paths asked for train, the table's ratios follow from the runs' logs.
Three of the five paths (a padded and a packed baseline's pretokenized pair, and the baseline), two repeats each: the
bench's logic is the same for every path, and every path trains in tests/train and tests/data."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.bench.train import PACKED, PRETOK, add_args, main, measure_run
from tests.conftest import GPT2_JSON, WIKI_EN


PATHS = ("padded", "pretok-padded", "pretok-memmap")


def test_bench_train_smoke(tmp_path: Path, shared_data: Path, capsys) -> None:
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:200]
    corpus = tmp_path / "wiki.parquet"
    pq.write_table(pa.table({"text": docs}), corpus)
    out = tmp_path / "b.json"
    p = argparse.ArgumentParser()
    add_args(p)
    args = p.parse_args(["--corpus", str(corpus), "--tokenizer", str(GPT2_JSON), "--workdir", str(tmp_path / "w"),
                         "--steps", "4", "--skip", "1", "--seq-len", "256", "--micro-batch", "4",
                         "--set", "model.hidden_size=64", "checkpoint.export=false", "--json", str(out),
                         "--repeats", "2", "--paths", ",".join(PATHS)])
    main(args)
    res = json.loads(out.read_text())
    assert list(res["results"]) == list(PATHS)
    for kind, r in res["results"].items():
        assert r["steps"] == 4 and r["measured_steps"] == 3, kind
        # two runs per path, ids with a repeat suffix; the table's number is their median
        assert [s["run_id"] for s in r["samples"]] == [f"{kind}-r0", f"{kind}-r1"] and r["too_short"] == []
        again = [measure_run(Path(s["run_dir"]), 1)["effective_tokens_per_s"] for s in r["samples"]]
        assert r["effective_tokens_per_s"] == pytest.approx(sum(again) / 2)
        e = r["estimates"]["effective_tokens_per_s"]
        assert e["n"] == 2 and e["interval"] == pytest.approx(sorted(again))
        assert 0 <= r["data_stall"] < 1
        assert all(s["probe"]["run"].startswith(kind) for s in r["samples"])
    # interleaved and rotated: round 0 in path order, round 1 starting at the second path
    starts = sorted((s["probe"]["run"], s["run_dir"]) for r in res["results"].values() for s in r["samples"])
    assert len(starts) == 2 * len(PATHS) and res["machine"]["probed_runs"] == 2 * len(PATHS)
    rs = res["results"]
    assert rs["padded"]["padding_frac"] > 0.3 and rs["pretok-padded"]["padding_frac"] > 0.3   # short summaries
    assert all(rs[k]["padding_frac"] == 0 for k in PACKED if k in rs)
    names = [t["target"] for t in res["targets"]]
    assert len(names) == len(set(PACKED) & set(PATHS)) + len(set(PRETOK) & set(PATHS)) == 3
    for t in res["targets"]:   # every target is an estimate: median, interval, n, resolved against its threshold
        assert t["n"] == 2 and t["interval"][0] <= t["value"] <= t["interval"][1] and isinstance(t["resolved"], bool)
    table = capsys.readouterr().out
    ratio = rs["pretok-memmap"]["effective_tokens_per_s"] / rs["padded"]["effective_tokens_per_s"]
    assert "medians over 2 runs per path, interleaved" in table
    assert f"{ratio:.2f}x" in table and "x padded (eff)" in table


def test_a_run_below_the_minimum_of_measured_steps_is_too_short_to_measure() -> None:
    """A run a budget cut below the minimum of measured steps gives no number: not in the medians, named."""
    from pretok_lib.bench.train import summarize, table

    def run(i: int, used: int, eff: float) -> dict:
        return {"kind": "padded", "run_id": f"padded-r{i}", "steps": used + 1, "measured_steps": used,
                "precision": "fp32", "precision_reason": "", "peak_source": "", "run_dir": f"d{i}",
                "tokens_per_s": eff, "effective_tokens_per_s": eff, "data_stall": 0.0, "padding_frac": 0.5,
                "masked_frac": 0.0, "mfu": None, "step_time_s": 1.0, "data_wait_s": 0.0, "final_loss": 9.0}

    r = summarize([run(0, 2, 1000.0), run(1, 5, 10.0), run(2, 6, 12.0)], min_steps=3)
    assert r["too_short"] == ["padded-r0"] and r["effective_tokens_per_s"] == 11.0
    assert r["estimates"]["effective_tokens_per_s"]["n"] == 2
    none = summarize([run(0, 1, 1000.0)], min_steps=3)
    assert none["effective_tokens_per_s"] is None and "too short to measure" in table({"padded": none})
