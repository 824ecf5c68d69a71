"""The stall prediction's inputs (`analysis/supply.py`): each on-the-fly loader carried to a target rank as it works
(padding-free: every rank and worker tokenizes the whole stream; padded: workers split the documents), padded at the
target's seq_len, the main-process cost in the prefetch model, the target's vocabulary; checked against CPU training
runs whose loaders are slowed by a sleep per document, at two seq_lens and two worker counts."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.analysis import stall as S
from pretok_lib.analysis import supply as P

from ..conftest import GPT2_JSON
from .test_stall import MB, _train, data  # noqa: F401  (data: the fixture)


def _row(kind: str, w: int, tps: float) -> dict:
    return {"kind": kind, "workers": w, "tokens_per_s": tps, "effective_tokens_per_s": tps}


def _bench(seq_len: int = 256, cpus: int = 2, **rows: float) -> dict:
    """A loader benchmark; keyword `padded_w2=7e5` is the row "padded w2"."""
    loaders = {}
    for key, v in rows.items():
        kind, w = key.rsplit("_w", 1)
        name = P.VIA.format(w) if kind == "via" else f"{kind.replace('_', '-')} w{w}"
        loaders[name] = _row("reference" if kind == "via" else kind.replace("_", "-"), int(w), v)
    return {"seq_len": seq_len, "micro_batch": 4, "environment": {"cpus": cpus}, "loaders": loaders}


# ---------------------------------------------------------------- arithmetic


def test_padding_free_is_not_multiplied_by_cores_and_is_divided_by_ranks() -> None:
    """The issue's case: 72 cores per rank, 16 ranks. Padding-free's every worker tokenizes the whole stream, so
    more workers add nothing and each rank gets 1/16 of one process's rate; padded's workers split the rows."""
    b = _bench(padding_free_w2=134e3 * 16, padded_w2=1e6)
    by = {r["path"]: r for r in S.supply_rows(b, cores_per_rank=72, ranks=16)}
    assert by["padding-free"]["supply"] == pytest.approx(134e3) and by["padding-free"]["sharing"] == "whole stream"
    assert by["padded"]["supply"] == pytest.approx(1e6 * 72 / 2) and by["padded"]["sharing"] == "split"
    # two workers measured on one core: each made half the stream's windows at half speed; T = 2 x measured
    one_core = _bench(cpus=1, padding_free_w2=1e5)
    assert S.supply_rows(one_core, cores_per_rank=8)[0]["supply"] == pytest.approx(2e5)


@settings(max_examples=60, deadline=None)
@given(w=st.integers(0, 8), cores=st.integers(1, 8), k=st.one_of(st.none(), st.integers(1, 128)),
       ranks=st.integers(1, 64))
def test_worker_scale_by_sharing(w: int, cores: int, k: int | None, ranks: int) -> None:
    """Whole stream: never above one process's rate T (measured x W / min(W, cores)) divided by the ranks; split:
    independent of the ranks, k / min(W, cores) with workers and cores given."""
    t = (w / min(w, cores)) if w and k is not None else 1.0
    assert P.worker_scale("padding-free", w, cores, k, ranks) == pytest.approx(t / ranks)
    split = P.worker_scale("padded", w, cores, k, ranks)
    assert split == P.worker_scale("padded", w, cores, k, 1)
    assert split == (pytest.approx(k / min(w, cores)) if w and k is not None else 1.0)


def test_padded_supply_at_the_targets_seq_len_by_hand() -> None:
    """1/S = a/L + b: measured 1e6 slots/s at L=256 with pretok-padded at 2e7 (b = 5e-8 s/slot): a = 256 x 9.5e-7;
    at L=2048: 1/S = 256 x 9.5e-7 / 2048 + 5e-8 = 1.6875e-7. Padding-free and the pretokenized paths keep their
    rate; without the pretokenized row the padded rate is linear in L."""
    b = _bench(padded_w0=1e6, pretok_padded_w0=2e7, padding_free_w0=5e5)
    by = {r["path"]: r for r in S.supply_rows(b, seq_len=2048)}
    assert by["padded"]["supply"] == pytest.approx(1 / 1.6875e-7)
    assert by["padding-free"]["supply"] == 5e5 and by["pretok-padded"]["supply"] == 2e7
    assert S.supply_rows(_bench(padded_w0=1e6), seq_len=2048)[0]["supply"] == pytest.approx(8e6)
    assert S.supply_rows(b, seq_len=256)[0]["supply"] == 1e6 == S.supply_rows(b)[0]["supply"]


@settings(max_examples=60, deadline=None)
@given(supply=st.floats(1e3, 1e8), fixed=st.floats(0.0, 1.0), lb=st.integers(8, 4096), lt=st.integers(8, 8192))
def test_padded_seq_len_model_lies_between_constant_and_linear(supply: float, fixed: float, lb: int, lt: int
                                                               ) -> None:
    """Whatever the per-slot share of the cost, the carried rate lies between the measured one (all per slot)
    and the linear L_t/L_b x measured (all per document)."""
    got = P.at_seq_len("padded", supply, lb, lt, fixed / supply)
    lo, hi = sorted((supply, supply * lt / lb))
    assert lo * (1 - 1e-9) <= got <= hi * (1 + 1e-9)


def test_main_process_cost_in_the_prefetch_model() -> None:
    """With workers, a step waits at least for the main process's share of its batch: stall = mu / (1 + mu) when
    the workers keep up (was exactly 0), max(0, 1 - h) when mu = 0; without workers it plays no part."""
    assert S.stall_fraction(300.0, 100.0, True, main=0.001) == pytest.approx(0.1 / 1.1)   # mu = 0.1
    assert S.stall_fraction(50.0, 100.0, True, main=0.0) == pytest.approx(0.5)
    assert S.stall_fraction(50.0, 100.0, True, main=0.001) == pytest.approx(0.5)          # 1/h - 1 > mu
    assert S.stall_fraction(50.0, 100.0, False, main=0.1) == pytest.approx(2 / 3)
    b = _bench(padded_w2=1e6, via_w2=1e7)
    row = S.supply_rows(b)[0]
    assert row["main_per_slot"] == pytest.approx(1e-7)
    rows = S.predict(b, 1e9, [S.Accelerator("X", 100.0, "test")], (0.4, 0.5))   # C = 4e4..5e4: mu = 4e-3..5e-3
    assert rows[0]["stall_low"] == pytest.approx(4e-3 / 1.004) and rows[0]["stall_high"] > rows[0]["stall_low"]


@settings(max_examples=80, deadline=None)
@given(h=st.floats(0.01, 100.0), mu=st.floats(0.0, 10.0))
def test_prefetch_stall_is_continuous_and_at_least_the_main_share(h: float, mu: float) -> None:
    s = S.stall_fraction(h, 1.0, True, main=mu)
    assert mu / (1 + mu) - 1e-12 <= s < 1
    assert s >= S.stall_fraction(h, 1.0, True) - 1e-12                     # never below the model without it
    assert abs(s - S.stall_fraction(h * (1 + 1e-9), 1.0, True, main=mu)) < 1e-6


def test_target_vocabulary_comes_from_the_target() -> None:
    """Given, else model.vocab_size, else the config's tokenizer, else the benchmark's (said so)."""
    bench = {"tokenizer": {"info": {"vocab_size": 512}}}
    cfg = {"model": {"hidden_size": 64, "num_layers": 2}, "data": {"seq_len": 32}}
    assert S.target_vocab(cfg, 131072, bench) == (131072, "given")
    assert S.target_vocab({**cfg, "model": {"vocab_size": 1000}}, None, bench)[0] == 1000
    v, why = S.target_vocab({**cfg, "data": {"tokenizer": str(GPT2_JSON)}}, None, bench)
    assert v == 50257 and "tokenizer" in why
    v, why = S.target_vocab(cfg, None, bench)
    assert v == 512 and "names none" in why
    p = S.study_prediction(None, {**cfg, "data": {"seq_len": 32, "tokenizer": str(GPT2_JSON)}})
    assert p["vocab"] == 50257 and p["flops_per_token"] == S.config_flops_per_token(cfg["model"], 50257, 32)


# ---------------------------------------------------------------- checked against CPU runs

L1, L2 = 32, 128


def _slow_documents(monkeypatch, delay: float, data: dict) -> None:
    """Tokenizing costs sleep (in DataLoader workers too: they fork), so the supply is set by the sleep, not by how
    busy the CPU is: `delay` s per document for padded (its slots per document are fixed), `delay` x characters /
    the mean characters per document for padding-free (its slots per document are the document's tokens: a cost
    per document would make its supply depend on which documents a stretch of batches holds)."""
    import pyarrow.parquet as pq

    from pretok_lib.data import baselines

    texts = pq.read_table(data["padded"]).column("text").to_pylist()
    mean = sum(map(len, texts)) / len(texts)
    real = baselines._TextDocs.encode

    def per_doc(self, texts):
        time.sleep(delay * len(texts))
        return real(self, texts)

    def per_char(self, texts):
        time.sleep(delay * sum(map(len, texts)) / mean)
        return real(self, texts)

    monkeypatch.setattr(baselines.PaddedText, "encode", per_doc, raising=False)
    monkeypatch.setattr(baselines.PaddingFreeStream, "encode", per_char, raising=False)


def _loader_rate(kind: str, data: dict, seq_len: int, workers: int, n: int = 6, **kw) -> float:  # noqa: F811
    from pretok_lib.bench.loaders import measure
    from pretok_lib.data import make_dataset, make_loader

    ds = make_dataset(kind, str(data[kind]), seq_len, micro_batch=MB, seed=0, shuffle=True,
                      tokenizer=str(data["tokenizer"]), **kw)
    r = measure(lambda: iter(make_loader(ds, num_workers=workers)), n, 2)
    return r["tokens"] / r["seconds"]


def _main_cost_bench(seq_len: int) -> float:
    """The benchmark's randint-via-DataLoader reference with one worker, tokens/s (best of 3)."""
    from pretok_lib.bench.loaders import RandomBatches, measure, via_dataloader

    rates = []
    for _ in range(3):
        r = measure(lambda: via_dataloader(RandomBatches(512, seq_len, MB, 0), 1), 30, 3)
        rates.append(r["tokens"] / r["seconds"])
    return max(rates)


def test_prediction_brackets_cpu_runs_of_slowed_on_the_fly_loaders(data, tmp_path, monkeypatch) -> None:  # noqa: F811
    """The loaders measured once as the benchmark does (seq_len L1, one worker, one core), carried by the model to
    each run's seq_len and worker count. Each run's stall (sleep-bound supply, compute measured in the run) must
    lie within 0.15 of the bracket the model gives with the run's mean compute and with each step's own (they part
    when some steps wait and others do not; prefetched batches carry some of a slow step's slack over: the truth
    lies between). Padding-free's two-worker run is at L2: at L1 one document's sleep spans several steps, so near
    balance its supply comes in bursts the model's steady rates do not see (CI once measured 0.244 where 0.055-0.092
    was predicted). Measured here beside a CPU hog, 4 runs: every run within 0.02 of its bracket; padding-free at two
    workers at L1 within 0.05 (predicted 0.10-0.45 as the load varied). The old inputs missed by more: padding-free
    at two workers doubled (0.50 predicted where 0.79 was measured), padded at L2 at L1's rate (0.94, 0.75)."""
    import torch

    torch.set_num_threads(1)
    data = {**data, "padding-free": data["padded"]}
    quick = {"checkpoint.export": False}
    fast = _train("pretok-memmap", data, 0.0, 0, tmp_path / "fast", monkeypatch, steps=10, seq_len=L2, **quick)
    compute = MB * L2 / S.measured_rates(fast, 4)["consumption"]   # s per step at L2
    delay = 1.5 * compute   # padded at L2: 4 documents per batch, 6x the compute per worker
    _slow_documents(monkeypatch, delay, data)
    bench = {"seq_len": L1, "micro_batch": MB, "environment": {"cpus": 1}, "loaders": {
        "padded w1": _row("padded", 1, _loader_rate("padded", data, L1, 1)),
        "padding-free w1": _row("padding-free", 1, _loader_rate("padding-free", data, L1, 1, n=12)),
        P.VIA.format(1): _row("reference", 1, _main_cost_bench(L1))}}
    checks = []
    for kind, seq, w in (("padded", L1, 1), ("padded", L1, 2), ("padded", L2, 1), ("padded", L2, 2),
                         ("padding-free", L2, 2), ("padding-free", L2, 1)):
        row = next(r for r in S.supply_rows(bench, cores_per_rank=w, seq_len=seq) if r["path"] == kind)
        recs = _train(kind, data, 0.0, w, tmp_path / f"{kind}-{seq}-{w}", monkeypatch, steps=20, seq_len=seq,
                      **quick)
        c = S.check_run(recs, row["supply"], w, 8, row["main_per_slot"])
        lo, hi = sorted((c["predicted_stall"], c["predicted_stall_per_step"]))
        checks.append((kind, seq, w, round(lo, 3), round(c["data_stall"], 3), round(hi, 3)))
    print("(path, seq_len, workers, predicted from the mean compute / per step, measured):", checks)
    bad = [c for c in checks if not c[3] - 0.15 <= c[4] <= c[5] + 0.15]
    assert not bad, checks
    assert sum(c[4] > 0.25 for c in checks) >= 3, checks   # the slowdown made real stalls to predict


def test_padding_free_supply_per_rank_falls_with_the_ranks(data, monkeypatch) -> None:  # noqa: F811
    """Loader-only: rank 0 of 2 gets half the padding-free windows of a single rank at the same tokenizing speed,
    and all of padded's (its documents are split): as `target_supply` carries them."""
    _slow_documents(monkeypatch, 0.02, data)  # well above the per-batch costs that do not scale with the ranks
    data = {**data, "padding-free": data["padded"]}
    pf1, pf2 = (_loader_rate("padding-free", data, L1, 0, n=8, rank=0, world=n) for n in (1, 2))
    pd1, pd2 = (_loader_rate("padded", data, L1, 0, n=4, rank=0, world=n) for n in (1, 2))
    bench = {"seq_len": L1, "environment": {"cpus": 1},
             "loaders": {"padding-free w0": _row("padding-free", 0, pf1), "padded w0": _row("padded", 0, pd1)}}
    by = {r["path"]: r["supply"] for r in S.supply_rows(bench, ranks=2)}
    assert 0.7 < pf2 / by["padding-free"] < 1.3 and 0.7 < pd2 / by["padded"] < 1.3, (pf1, pf2, pd1, pd2)
