"""Smoke test of `pretok bench loaders`: every path and reference measured, fractions and file sizes plausible."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pretok_lib.bench.loaders import CEIL, COMPRESSIONS, RAND, VIA, add_args, main
from pretok_lib.data import KINDS
from tests.conftest import GPT2_JSON


def test_bench_loaders_smoke(tmp_path: Path, shared_data: Path) -> None:
    out, work = tmp_path / "b.json", tmp_path / "w"
    p = argparse.ArgumentParser()
    add_args(p)
    args = p.parse_args(["--mb", "1", "--seq-len", "64", "--micro-batch", "4", "--workers", "0,1", "--batches", "8",
                         "--slow-batches", "3", "--warmup", "2", "--repeats", "2", "--read-repeats", "1",
                         "--tokenizer", str(GPT2_JSON), "--workdir", str(work), "--json", str(out)])
    returned = main(args)
    res = json.loads(out.read_text())
    assert res["loaders"].keys() == returned["loaders"].keys()
    rows = res["loaders"]
    paths = {f"{k} w{w}" for k in KINDS for w in (0, 1)}
    assert paths | {CEIL, RAND, VIA.format(1)} == rows.keys(), sorted(rows)
    for name, r in rows.items():
        assert r["tokens_per_s"] > 0 and r["batches_per_s"] > 0, name
        assert r["tokens"] == r["batches"] * 4 * 64, name  # every batch is micro_batch x seq_len input slots
        assert 0 < r["effective_tokens"] <= r["tokens"], name
    for w in (0, 1):
        for kind in ("padded", "pretok-padded"):
            assert 0 < rows[f"{kind} w{w}"]["padding_fraction"] < 1, (kind, w)
        for kind in ("padding-free", "pretok-token-list", "pretok-memmap"):
            r = rows[f"{kind} w{w}"]
            assert r["padding_tokens"] == 0 and 0 <= r["masked_fraction"] <= 0.1, (kind, w)
    assert rows[CEIL]["x_ceiling"] == 1.0 and rows["padded w0"]["x_padded"] == 1.0

    comp = {(c["format"], c["compression"]): c for c in res["compression"]}
    assert comp.keys() == {(f, c) for f in ("padded", "token-list") for c in COMPRESSIONS}
    for (fmt, c), r in comp.items():
        assert r["read_s"] > 0 and r["read_tokens_per_s"] > 0 and r["loader_tokens_per_s"] > 0, (fmt, c)
        assert r["stored_tokens"] == comp[(fmt, "none")]["stored_tokens"], (fmt, c)  # same tokens, other codec
    for fmt in ("padded", "token-list"):
        assert comp[(fmt, "zstd:22")]["disk_bytes"] <= comp[(fmt, "zstd:3")]["disk_bytes"] < \
            comp[(fmt, "none")]["disk_bytes"], fmt

    assert {t["target"] for t in res["targets"] if t["primary"]} == {
        "pretok-memmap w0 / raw memmap ceiling (in-process)", "pretok-memmap w0 / padded w0",
        next(t["target"] for t in res["targets"] if t["target"].startswith("pretok-memmap best"))}
    assert all(t["value"] > 0 for t in res["targets"])
    # two interleaved rounds: every row keeps both rates and their estimate; targets are paired-round ratios
    for name, r in rows.items():
        assert len(r["tokens_per_s_all"]) == 2 and r["tokens_per_s"] == max(r["tokens_per_s_all"]), name
        assert r["estimate"]["n"] == 2 and r["estimate"]["interval"] == sorted(r["tokens_per_s_all"]), name
        assert r["probe"]["run"].startswith(name)
    for t in res["targets"]:
        assert t["n"] == 2 and t["interval"][0] <= t["value"] <= t["interval"][1] and isinstance(t["resolved"], bool)
    assert res["machine"]["probed_runs"] == 2 * len(rows)
    assert res["environment"]["cpus"] >= 1 and res["seq_len"] == 64 and res["micro_batch"] == 4


def test_an_unknown_path_is_one_line_before_anything_runs(tmp_path):
    from pretok_lib.bench.loaders import LoadersBench, run
    from pretok_lib.errors import PretokError

    with pytest.raises(PretokError, match="--paths 'memmap': choose among"):
        run(LoadersBench(paths="memmap", workdir=str(tmp_path)))
    assert not any(tmp_path.iterdir())
