"""Smoke test of `pretok bench tokenize`: every method measured, ids identical, token counts consistent."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from pretok_lib.bench.tokenize import CEIL, LOOP, MAP, ceil_name, phase_name
from pretok_lib.cli import build_parser
from pretok_lib.formats.memmap import MemmapDataset

GPT2_EOT = 50256


def test_bench_tokenize_smoke(tmp_path: Path, shared_data: Path, capsys) -> None:
    out, work = tmp_path / "b.json", tmp_path / "w"
    args = build_parser().parse_args(
        ["bench", "tokenize", "--mb", "1", "--loop-mb", "0.25", "--rss-scan", "0.25,0.5,2", "--workers", "2",
         "--repeat", "2",
         "--json", str(out), "--workdir", str(work),
         "--tokenizer", str(shared_data / "tokenizers" / "gpt2" / "tokenizer.json")])
    returned = args.fn(args) or json.loads(out.read_text())  # the CLI wrapper drops main()'s return value
    res = json.loads(out.read_text())
    assert res["methods"].keys() == returned["methods"].keys()
    m = res["methods"]
    engine = {f"(d) engine {fmt} w{w}" for fmt in ("memmap", "token-list", "padded") for w in (1, 2)}
    assert {LOOP, MAP, CEIL, ceil_name(2)} | engine == m.keys(), sorted(m)
    for name, r in m.items():
        for key in ("docs_per_s", "tokens_per_s", "mb_per_s"):
            assert r[key] > 0, (name, key, r[key])
    for name in (LOOP, MAP, CEIL):
        assert m[name]["ids_identical"] is True, name
        assert 0 < m[name]["peak_rss_mb"] < 4000, name

    corpus, ceil, eng = res["corpus"], m[CEIL], m["(d) engine memmap w2"]
    assert 0.75e6 < corpus["text_bytes"] <= 1e6 and 0 < corpus["prefix_bytes"] <= 0.25e6
    # (a) and (b) ran on the same prefix and counted the same tokens; the ceiling and the engine on the whole corpus
    assert m[LOOP]["documents"] == m[MAP]["documents"] == corpus["prefix_documents"] < corpus["documents"]
    assert m[LOOP]["tokens"] == m[MAP]["tokens"] > 0
    assert ceil["documents"] == eng["documents"] == m[ceil_name(2)]["documents"] == corpus["documents"]
    assert m[ceil_name(2)]["tokens"] == ceil["tokens"]  # two processes on disjoint batches: every token once
    for name in (CEIL, ceil_name(2), *engine):  # --repeat 2: the fastest of two timings
        assert len(m[name]["all_seconds"]) == 2
        assert m[name]["seconds"] == pytest.approx(min(m[name]["all_seconds"]), abs=1e-3)
    # targets comparing memmap w1/w2 and the ceilings pair them within each round, then take the median
    rounds, e1, e2 = res["rounds"], "(d) engine memmap w1", "(d) engine memmap w2"
    assert len(rounds) == 2 and all(set(r) == {CEIL, ceil_name(2), e1, e2, phase_name(e1), phase_name(e2), LOOP}
                                    for r in rounds)
    # the rounds as estimates: every method's MB/s with its interval over both rounds, the paired ratios, the
    # machine probe of every timed run (10: 5 methods x 2 rounds); a speedup below 1 is an invalid measurement
    rep = res["repeats"]
    assert rep["rounds"] == 2 and all(e["n"] == 2 for e in rep["mb_per_s"].values())
    for e in [*rep["mb_per_s"].values(), *rep["ratios"].values()]:
        assert e["interval"][0] <= e["median"] <= e["interval"][1]
    sc = res["scaling"]      # issue 37: where the CPU goes and the predictions at 16, 72, 288 cores
    assert sc["method"] == e2 and sc["n"] == 2 and sc["workers_s_per_gb"] > 0 and 0 < sc["serial_fraction"] < 1
    assert set(sc["predicted_gb_per_s"]) == {"16", "72", "288"} and sc["fitted_rounds"] == 2
    # the largest scan input again in 64 MB units: 2 MB is one unit either way, so per unit and per byte stay unfitted
    assert res["coarse_run"]["mb"] == 2 and res["coarse_run"]["units"] >= 1 and sc["per_unit"] is None
    assert "predicted throughput, GB/s" in capsys.readouterr().out
    iso = rep["ratios"][f"isolated tokenization speedup: {e2} / {LOOP}"]
    assert iso["median"] == pytest.approx(statistics.median(
        (corpus["text_bytes"] / r[e2]) / (corpus["prefix_bytes"] / r[LOOP]) for r in rounds))
    assert any("slower in isolation" in w for w in rep["invalid"]) == (iso["median"] < 1)
    assert res["machine"]["probed_runs"] == 10 and isinstance(res["machine"]["quiet"], bool)
    assert all("interval" in t and "resolved" in t for t in res["targets"]
               if t["target"].startswith(("engine memmap w1 /", "engine memmap speedup",
                                          "engine memmap w2 / in-memory")))
    for name in (e1, e2):  # the fastest run's tokenizing phase is one of the rounds' (from its manifest)
        assert m[name]["timeline"]["tokenize_seconds"] in [r[phase_name(name)] for r in rounds]
    gain = sum(r[CEIL] / r[ceil_name(2)] for r in rounds) / 2  # the median of two
    # the speedup target: the tokenizing phase (steady state, as the ceiling is timed), paired within each round
    steady = next(t for t in res["targets"] if t["target"] == "engine memmap speedup w1 -> w2, steady state")
    # a round whose tokenizing phase is too short to time (one batch: 0 s at the manifest's ms) gives no ratio
    paired = [r[phase_name(e1)] / r[phase_name(e2)] for r in rounds if r[phase_name(e1)] and r[phase_name(e2)]]
    assert steady["value"] == (pytest.approx(statistics.median(paired)) if paired else None)
    need = 0.8 * min(2, gain)
    assert steady["need"] == f">= {need:.3g}"
    assert steady["pass"] is (None if steady["value"] is None else steady["value"] >= need)
    whole = next(t for t in res["targets"] if t["target"].startswith("engine memmap speedup w1 -> w2, end to end"))
    assert whole["value"] == pytest.approx(sum(r[e1] / r[e2] for r in rounds) / 2) and whole["pass"] is None
    timeline = eng["timeline"]  # where the engine's wall time went, from its manifest
    assert all(timeline[k] >= 0 for k in ("startup_seconds", "tokenize_seconds", "finish_seconds"))
    assert sum(timeline.values()) <= eng["manifest_wall_seconds"] + 0.01
    assert eng["policy"]["bos_id"] == GPT2_EOT and eng["policy"]["eos_id"] is None
    assert eng["engine_tokens"] == ceil["tokens"] + corpus["documents"]  # the engine adds one BOS per document
    for name in engine:  # every format tokenized every text token (padded counts kept + truncated)
        assert m[name]["tokens"] == ceil["tokens"], name

    ds = MemmapDataset(Path(eng["out"]) / "data")
    assert len(ds) == corpus["documents"] and ds.num_tokens == eng["engine_tokens"]
    assert int(ds[0][0]) == GPT2_EOT
    for name in engine:
        assert (Path(m[name]["out"]) / "manifest.json").is_file(), name
        assert m[name]["bytes_per_token"] > 0 and 0 < m[name]["peak_rss_mb"] < 4000, name
    assert 2.0 <= eng["bytes_per_token"] < 2.2  # uint16 tokens + a small index

    scan = res["rss_scan"]
    assert [s["mb"] for s in scan] == [0.25, 0.5, 2.0]
    assert all(s["peak_rss_mb"] > 0 and s["mb_per_s"] > 0 for s in scan)
    rss = {t["target"]: t for t in res["targets"] if t["target"].startswith("worker peak RSS")}
    flat = rss["worker peak RSS 2 MB / 0.5 MB input (flat once caches are full)"]  # largest vs <= a quarter of it
    assert flat["value"] == pytest.approx(scan[2]["peak_rss_mb"] / scan[1]["peak_rss_mb"]) and flat["need"] == "<= 1.1"
    filling = rss["worker peak RSS 2 MB / 0.25 MB input (caches filling)"]
    assert filling["pass"] is None
    assert filling["value"] == pytest.approx(scan[2]["peak_rss_mb"] / scan[0]["peak_rss_mb"])
    ids_target = next(t for t in res["targets"] if t["target"].startswith("(b) ids identical"))
    assert ids_target["pass"] is True
    assert res["environment"]["cpus"] >= 1 and res["tokenizer"]["backends"][0] == ceil["backend"]
    assert res["environment"]["cpu_model"]
    # the engine near the machine's ceiling: every format at w2 against the measured 2-core ceiling (memmap paired
    # by round), memmap w1 against the 1-core one, and the start-up of the slowest engine method
    by = {t["target"]: t for t in res["targets"]}
    for fmt in ("memmap", "token-list", "padded"):
        t = by[f"engine {fmt} w2 / in-memory ceiling on 2 cores, measured"]
        want = (sum(r[ceil_name(2)] / r[e2] for r in rounds) / 2 if fmt == "memmap"
                else m[f"(d) engine {fmt} w2"]["mb_per_s"] / m[ceil_name(2)]["mb_per_s"])
        assert t["value"] == pytest.approx(want) and t["need"] == ">= 0.7" and t["pass"] is (t["value"] >= 0.7)
        # each format's stage bound, timed on one pinned core in a child, beside it, and the share of it reached
        b = res["stage_bounds"][fmt]
        assert len(b["rounds"]) == 2 and b["stages"]["encode"] > 0 and b["total"] > b["stages"]["encode"]
        assert 0 < b["bound"]["interval"][0] <= b["bound"]["median"] <= b["bound"]["interval"][1] and b["alone"] > 0
        assert f"stage bound {b['bound']['median']:.2f}" in t["note"]
        share = by[f"engine {fmt} w2 / its stage bound (share of what any engine could reach)"]
        assert share["value"] == pytest.approx(t["value"] / b["bound"]["median"]) and share["pass"] is None
    assert set(res["stage_bounds"]) == {"memmap", "token-list", "padded"}
    w1 = by["engine memmap w1 / in-memory ceiling on 1 core"]
    assert w1["value"] == pytest.approx(sum(r[CEIL] / r[e1] for r in rounds) / 2) and w1["need"] == ">= 0.8"
    start = by["engine start-up s (to the first batch tokenized), slowest engine method"]
    assert start["value"] == max(m[k]["timeline"]["startup_seconds"] for k in engine) and start["need"] == "<= 0.3"
