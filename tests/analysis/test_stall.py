"""stall.py: the stall model's arithmetic, its FLOPs count against the built model, the prediction table, and the
prediction checked against CPU training runs whose loader is made slow on purpose (and one that is fast)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pretok_lib.analysis import stall as S

from ..conftest import ROOT, WIKI_EN

SEQ, MB = 64, 4


# ---------------------------------------------------------------- arithmetic


def test_stall_fraction_both_regimes() -> None:
    assert S.stall_fraction(50.0, 100.0, prefetch=True) == pytest.approx(0.5)   # max(0, 1 - h)
    assert S.stall_fraction(200.0, 100.0, prefetch=True) == 0.0
    assert S.stall_fraction(100.0, 100.0, prefetch=False) == pytest.approx(0.5)  # 1 / (1 + h)
    assert S.stall_fraction(300.0, 100.0, prefetch=False) == pytest.approx(0.25)
    assert S.stall_fraction(0.0, 100.0, prefetch=True) == 1.0


@pytest.mark.parametrize("model", [
    {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
    {"hidden_size": 96, "num_layers": 3, "num_heads": 6, "num_kv_heads": 3, "intermediate_size": 200,
     "tie_embeddings": True},
])
def test_flops_per_token_equals_the_trainers(model: dict) -> None:
    from pretok_lib.train.config import ModelConfig
    from pretok_lib.train.model import build_model, model_flops_per_token, vocab_size_for

    cfg = ModelConfig(**model)
    vocab = vocab_size_for(cfg, 1000)
    built = build_model(cfg, vocab, SEQ, seed=0)
    assert S.config_flops_per_token(model, 1000, SEQ) == model_flops_per_token(built, cfg, SEQ)


def test_study_config_consumption_on_h100() -> None:
    """configs/study.yaml with a 131k vocabulary at seq_len 2048: F = 6·1.241e9 + 12·16·2048·2048."""
    model = yaml.safe_load((ROOT / "configs" / "study.yaml").read_text())["model"]
    f = S.config_flops_per_token(model, 131072, 2048)
    n = 16 * (2 * 2048**2 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 131072 * 2048
    assert f == 6 * n + 12 * 16 * 2048 * 2048
    c = S.consumption(0.4, S.ACCELERATORS["H100 SXM"].bf16_tflops * 1e12, f)
    assert 45_000 < c < 50_000  # tokens/s per GPU


def _bench(cpus: int = 2) -> dict:
    row = lambda kind, w, tps, eff: {"kind": kind, "workers": w, "tokens_per_s": tps,  # noqa: E731
                                     "effective_tokens_per_s": eff}
    return {"seq_len": SEQ, "micro_batch": MB, "environment": {"cpus": cpus}, "loaders": {
        "ref: raw memmap get_batch": row("reference", 0, 5e7, 5e7),
        "padded w0": row("padded", 0, 4e4, 1e4), "padded w2": row("padded", 2, 6e4, 1.5e4),
        "pretok-memmap w0": row("pretok-memmap", 0, 1e8, 1e8)}}


def test_predict_table_by_hand() -> None:
    acc = S.Accelerator("X", 100.0, "test")
    rows = S.predict(_bench(), flops_per_token_=1e9, accelerators=[acc], mfu=(0.4, 0.5))
    by = {(r["path"], r["workers"]): r for r in rows}
    assert set(by) == {("padded", 0), ("padded", 2), ("pretok-memmap", 0)}   # references left out
    r = by[("padded", 0)]   # C = 0.4·1e14/1e9 = 40k .. 50k; no prefetch: C / (C + S)
    assert (r["consumption_low"], r["consumption_high"]) == pytest.approx((4e4, 5e4))
    assert (r["stall_low"], r["stall_high"]) == pytest.approx((0.5, 5 / 9))
    assert r["headroom_low"] == pytest.approx(0.8) and r["effective_share"] == pytest.approx(0.25)
    r = by[("padded", 2)]   # prefetch: max(0, 1 - S/C)
    assert (r["stall_low"], r["stall_high"]) == (0.0, 0.0) and r["headroom_low"] == pytest.approx(1.2)
    assert by[("pretok-memmap", 0)]["stall_high"] < 1e-3
    assert "padded" in S.markdown_table(rows) and S.markdown_table([]).startswith("No loader")


def test_cores_per_rank_scales_worker_rows_only() -> None:
    rows = S.supply_rows(_bench(cpus=2), cores_per_rank=16)
    by = {(r["path"], r["workers"]): r for r in rows}
    assert by[("padded", 2)]["supply"] == pytest.approx(6e4 * 16 / 2) and by[("padded", 2)]["target_workers"] == 16
    assert by[("padded", 0)]["supply"] == 4e4 and by[("padded", 0)]["target_workers"] == 0
    assert S.supply_rows(_bench(cpus=1), cores_per_rank=4)[1]["supply"] == pytest.approx(6e4 * 4)


def test_paced_rows_set_the_supply_without_workers_and_the_main_cost_with_them() -> None:
    """A paced row (next() timed once per step, `--pace-ms`) replaces the back-to-back rate without workers and the
    randint reference's main cost with workers; the other rows keep the model as first built."""
    from pretok_lib.analysis.supply import VIA, target_supply

    b = _bench()
    b["loaders"][VIA.format(2)] = {"kind": "reference", "workers": 2, "tokens_per_s": 1e6}
    b["loaders"]["padded w0"].update(paced_tokens_per_s=2e4)
    b["loaders"]["padded w2"].update(paced_tokens_per_s=5e6)
    t0 = target_supply(b, b["loaders"]["padded w0"])
    assert (t0["supply"], t0["main_per_slot"], t0["paced"]) == (2e4, 0.0, True)
    t2 = target_supply(b, b["loaders"]["padded w2"])
    assert t2["supply"] == 6e4 and t2["main_per_slot"] == pytest.approx(1 / 5e6) and t2["paced"]
    t = target_supply(b, b["loaders"]["pretok-memmap w0"])
    assert (t["supply"], t["paced"]) == (1e8, False)
    plain = {k: v for k, v in b["loaders"]["padded w2"].items() if k != "paced_tokens_per_s"}
    assert target_supply(b, plain)["main_per_slot"] == pytest.approx(1 / 1e6)


# ---------------------------------------------------------------- prediction vs measurement on this CPU


@pytest.fixture(scope="module")
def data(tmp_path_factory, shared_data) -> dict[str, Path]:
    """Wikipedia summaries and a 512-token BPE trained on them (a small LM head keeps the model fast)."""
    from pretok_lib.demo.corpus import train_default_tokenizer
    from pretok_lib.pretokenize import TokenizeConfig, run_tokenize

    base = tmp_path_factory.mktemp("stall-data")
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:400]
    pq.write_table(pa.table({"text": docs}), base / "docs.parquet")
    tok = train_default_tokenizer(base / "docs.parquet", base / "tok", vocab_size=512)
    run_tokenize(TokenizeConfig(inputs=[str(base / "docs.parquet")], out=str(base / "memmap"),
                                tokenizer=str(tok), format="memmap", workers=0, progress=False))
    return {"padded": base / "docs.parquet", "pretok-memmap": base / "memmap", "tokenizer": tok}


def _throttle(ds, delay: float):
    """Make a dataset sleep `delay` s before each batch (in the DataLoader worker when there is one): a slow loader
    that uses no CPU, so the compute it races against is not disturbed."""
    from pretok_lib.data.loader import ShardedBatches

    class Throttled(ShardedBatches):
        def __iter__(self):
            for b in super().__iter__():
                time.sleep(delay)
                yield b

    ds.__class__ = Throttled
    return ds


def _dataset(kind: str, data: dict, delay: float):
    from pretok_lib.data import make_dataset

    ds = make_dataset(kind, str(data[kind]), SEQ, micro_batch=MB, seed=0, shuffle=True, tokenizer=str(data["tokenizer"]))
    return _throttle(ds, delay) if delay else ds


def _supply(kind: str, data: dict, delay: float, workers: int) -> float:
    """The loader alone, as `pretok bench loaders` times it: tokens/s of collated batches, the best of its repeats
    (a parallel test process only ever slows a timing; 30 fast batches take milliseconds, so one timing of them
    once came out at half the loader's rate). A slowed loader's time is its delay: one timing."""
    from pretok_lib.bench.loaders import measure
    from pretok_lib.data import make_loader

    loader = make_loader(_dataset(kind, data, delay), num_workers=workers)
    rates = []
    for _ in range(1 if delay else 3):
        r = measure(lambda: iter(loader), 30 if not delay else 12, 2)
        rates.append(r["tokens"] / r["seconds"])
    return max(rates)


def _train(kind: str, data: dict, delay: float, workers: int, runs: Path, monkeypatch, steps: int = 24,
           seq_len: int = SEQ, **extra) -> list:
    from pretok_lib import data as data_mod
    from pretok_lib.train import loop
    from pretok_lib.train.config import load_config
    from pretok_lib.train.metrics import read_records
    from pretok_lib.train.run import train

    real = data_mod.make_dataset
    monkeypatch.setattr(loop, "make_dataset", lambda *a, **k: _throttle(real(*a, **k), delay) if delay
                        else real(*a, **k))
    rid = f"{kind}-d{delay:.3f}-w{workers}-s{seq_len}"
    over = {"run.dir": str(runs), "run.id": rid, "model.hidden_size": 64, "model.num_layers": 2,
            "model.num_heads": 4, "model.num_kv_heads": 2, "data.kind": kind, "data.path": str(data[kind]),
            "data.tokenizer": str(data["tokenizer"]), "data.seq_len": seq_len, "data.micro_batch": MB,
            "data.num_workers": workers, "train.steps": steps, "train.warmup_steps": 2, "train.precision": "fp32",
            "log.tensorboard": False, "checkpoint.every": 0, "hardware.peak_tflops": 1.0, **extra}
    assert train(load_config(None, [f"{k}={v}" for k, v in over.items()])) == 0
    return read_records(runs / rid / "metrics.jsonl")


def _median_step_stall(recs: list[dict], skip: int) -> float:
    """The median of the logged steps' data stall after `skip`: robust to the few steps whose fetch a parallel
    test process preempted (one such step stalls 0.3-0.5)."""
    steps = sorted(r["data_stall"] for r in [r for r in recs if r.get("kind") == "train"][skip:])
    return steps[len(steps) // 2]


def test_prediction_matches_measured_stall_on_cpu(data, tmp_path, monkeypatch) -> None:
    """Consumption C from the run (slots / compute time), supply S from the loader timed apart; the predicted
    stall must match the stall the run logged: ~0 for the pretokenized path, substantial for a loader slowed to
    a sixth of the model's speed, without workers (C/(C+S)) and with a prefetching worker (1 - S/C)."""
    import torch

    torch.set_num_threads(1)
    skip = 8  # the warm-up and, with a worker, the batches it prefetched before the first step
    fast = _train("pretok-memmap", data, 0.0, 0, tmp_path, monkeypatch)
    c = S.check_run(fast, _supply("pretok-memmap", data, 0.0, 0), 0, skip)
    # both small and in agreement: the loader's supply measured apart is far above the model's consumption (140-250x
    # usually; once 31x in `make test`, a prediction of 0.031 beside a measured mean of 0.035, so the bound is not
    # 0.02). The measured side is taken as the median step: a fetch of a few ms that a parallel test process
    # preempts is one step at a stall of 0.3-0.5, which moves the mean of 16 steps by 0.02-0.03 (means of 0.039
    # and 0.056 measured in `make test` against predictions of 0.007 and 0.004), a scheduling floor, not the model.
    # A loader that cannot keep up stalls every step, and so the median (0.010-0.015 measured with four busy
    # processes beside this one).
    median = _median_step_stall(fast, skip)
    assert c["predicted_stall"] < 0.1 and median < 0.05, (c, median)   # the supply measured apart: >= 9x the
    # consumption (31x at worst measured under load, 140-250x usually); the bound is not a speed ratio closer than
    # that, since the two are measured at different moments of a machine whose load changes

    # a batch takes 15x as long to load as to compute (stall 15/16, 14/15): still a real stall when the compute
    # measured above slows down up to 11x under other load (a parallel test process, a busy machine). At 6x, one
    # `make test` saw a 4.5x slower compute with a worker: stall 0.246, predicted 0.242 (the model held, the
    # premise of a large stall did not).
    delay = 15 * SEQ * MB / c["consumption"]
    for workers in (0, 1):
        recs = _train("pretok-memmap", data, delay, workers, tmp_path, monkeypatch)
        c = S.check_run(recs, _supply("pretok-memmap", data, delay, workers), workers, skip)
        assert c["data_stall"] > 0.25, c        # the slowdown made a real stall (compute speed varies here)
        assert abs(c["predicted_stall"] - c["data_stall"]) < 0.1, c

    # a real path: the on-the-fly padded baseline tokenizing in the training process (a few % of the step here).
    # How fast the tokenizer runs between training steps against how fast it runs apart depends on the load of the
    # moment (its caches evicted by the compute, other processes preempting it: 2.7-2.9x slower in the run under
    # load, the bound that then failed on a busier machine), so nothing here compares the two speeds. The mechanism
    # is checked instead, in the run's own conditions: tokenizing has a cost (a stall is predicted from the supply
    # measured apart and seen in the run), and without workers nothing overlaps it, so the model's no-prefetch stall
    # C / (C + S) with the supply the run itself saw (slots / data wait) is the run's share of time waiting for data;
    # the prefetching formula (1 - S/C) is not.
    recs = _train("padded", data, 0.0, 0, tmp_path, monkeypatch, steps=16)
    c = S.check_run(recs, _supply("padded", data, 0.0, 0), 0, 4)
    assert c["predicted_stall"] > 0.005 and _median_step_stall(recs, 4) > 0, c
    train = [r for r in recs if r.get("kind") == "train"][4:]
    waited = sum(r["data_wait_s"] for r in train) / sum(r["step_time_s"] for r in train)
    in_run = S.check_run(recs, c["in_run_supply"], 0, 4)
    assert in_run["predicted_stall"] == pytest.approx(waited, rel=1e-6), (in_run, waited)
    assert S.stall_fraction(c["in_run_supply"], c["consumption"], True) != pytest.approx(waited, rel=0.05)


def test_study_prediction_and_figure(tmp_path: Path) -> None:
    from pretok_lib.analysis.figures import stall_prediction_figure

    bench = {**_bench(), "tokenizer": {"info": {"vocab_size": 1000}}}
    cfg = {"model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}, "data": {"seq_len": 32}}
    p = S.study_prediction(bench, cfg, mfu=(0.35, 0.45), accelerators=["H100 SXM", "A10"])
    assert p["vocab"] == 1000 and p["seq_len"] == 32
    assert p["flops_per_token"] == S.config_flops_per_token(cfg["model"], 1000, 32)
    assert len(p["rows"]) == 2 * 3 and "max(0, 1 - h)" in p["markdown"] and "| padded | 2 |" in p["markdown"]
    fig = stall_prediction_figure(p["rows"])
    assert len(fig.data) == 2 * 3 and list(fig.data[0].x) == ["H100 SXM", "A10"]
    json.loads(fig.to_json())
    empty = stall_prediction_figure(S.study_prediction(None, cfg)["rows"])
    assert not empty.data and "no loader" in empty.layout.annotations[0].text


def test_check_study_runs_pairs_runs_with_the_benchmark(tmp_path: Path) -> None:
    """Only completed runs whose path, workers, seq_len and micro-batch the benchmark measured are checked."""
    from pretok_lib.analysis.runs import load_runs

    from .helpers import simple_run

    # helpers: data_wait = stall · step_time; padded runs use 2 workers, the others 0
    simple_run(tmp_path, "a", kind="pretok-memmap", tokens_per_s=1000.0, data_stall=0.0, micro_batch=MB)
    simple_run(tmp_path, "b", kind="padded", tokens_per_s=1000.0, data_stall=0.5, micro_batch=MB)
    simple_run(tmp_path, "c", kind="padded", tokens_per_s=1000.0, data_stall=0.5, micro_batch=MB + 1)
    simple_run(tmp_path, "d", kind="padded", tokens_per_s=1000.0, data_stall=0.5, micro_batch=MB, status="failed")
    checks = {c["run_id"]: c for c in S.check_study_runs(load_runs(tmp_path), _bench())}
    assert set(checks) == {"a", "b"}
    b = checks["b"]   # compute = half the step: C = 2000 slots/s; benchmark w2: S = 60k -> no stall predicted
    assert b["consumption"] == pytest.approx(2000.0) and b["data_stall"] == pytest.approx(0.5)
    assert b["predicted_stall"] == 0.0 and b["workers"] == 2
    assert checks["a"]["predicted_stall"] == pytest.approx(1 / (1 + 1e8 / 1000.0))
    assert "| b | padded | 2 |" in S.check_markdown(list(checks.values()))
    assert S.check_study_runs(load_runs(tmp_path), None) == []
    for c in checks.values():   # the check: predicted and measured intervals, as built (no paced rows)
        k = c["check"]
        assert c["model"] == "back_to_back" and k["interval"][0] <= c["predicted_stall"] <= k["interval"][1]
        mlo, mhi = k["measured_interval"]
        assert mlo <= c["data_stall"] <= mhi
        assert k["inside"] == (k["interval"][0] <= c["data_stall"] <= k["interval"][1])
        assert k["agrees"] == (mlo <= k["interval"][1] and k["interval"][0] <= mhi)
    line = next(x for x in S.check_markdown(list(checks.values())).splitlines() if x.startswith("| b |"))
    assert "| 0.00% [0.00%, 0.00%] | 50.0% [50.0%, 50.0%] | no: off by +50.00% |" in line


def test_paced_rows_leave_the_prediction_as_built() -> None:
    """The prediction for GPUs takes back-to-back rates whether or not the benchmark paced its paths: the paced
    rows feed the check against runs (stall_check.py) until a GPU's runs say which version is right."""
    paced = _bench()
    for r in paced["loaders"].values():
        r.update(pace_s=0.2, paced_batches=8, paced_tokens_per_s=r["tokens_per_s"] / 10,
                 paced_rate_interval=[r["tokens_per_s"] / 11, r["tokens_per_s"] / 9])
    acc = [S.Accelerator("X", 100.0, "test")]
    assert S.predict(paced, 1e9, acc) == S.predict(_bench(), 1e9, acc)


def test_a_paced_benchmark_checks_the_runs_from_back_to_back_to_paced(tmp_path: Path) -> None:
    """With paced rows (`--pace-ms`), the check spans the two versions of the model (`either`): a run whose
    stall lies between the back-to-back and the paced prediction is inside it, and outside each alone."""
    from pretok_lib.analysis.runs import load_runs

    from .helpers import simple_run

    simple_run(tmp_path, "a", kind="pretok-memmap", tokens_per_s=1000.0, data_stall=0.1, micro_batch=MB)
    bench = _bench()
    # back to back S = 1e8 predicts ~0; paced at S = C/3 predicts C/(C + S) = 3/4 (its slow end, S = C/3.3:
    # 3.3/4.3): the measured 10% lies between
    c_run = S.check_study_runs(load_runs(tmp_path), bench)[0]
    bench["loaders"]["pretok-memmap w0"].update(paced_tokens_per_s=c_run["consumption"] / 3,
                                                paced_rate_interval=[c_run["consumption"] / 3.3,
                                                                     c_run["consumption"] / 2.7])
    c = S.check_study_runs(load_runs(tmp_path), bench)[0]
    assert c["model"] == "either" and c["check"]["inside"]
    assert c["check"]["interval"][0] < 0.01 and c["check"]["interval"][1] == pytest.approx(3.3 / 4.3, rel=0.01)
    assert c_run["check"]["inside"] is False and "from back to back to paced" in S.check_markdown([c])


# (MFU range, supply per workers) on an accelerator of 100 TFLOP/s and F = 1e9 FLOPs/token: C = MFU · 1e5 tokens/s.
# Each case has rows whose stall is not linear over the range (w0: C / (C + S); w2 crossing S = C or above it).
MID_CASES = {
    "crosses the kink": ((0.2, 0.6), {0: 4e4, 2: 4e4}),    # w2: stall 0 .. 1/3, at C = 4e4: 0 (not 1/6)
    "all stalled": ((0.35, 0.45), {0: 1e4, 2: 2e4}),
    "wide range": ((0.1, 0.9), {0: 5e4, 2: 3e4}),
}


@pytest.mark.parametrize("case", sorted(MID_CASES))
def test_stall_bar_is_the_stall_at_the_mid_mfu(case: str) -> None:
    from pretok_lib.analysis.figures import stall_prediction_figure

    mfu, supply = MID_CASES[case]
    bench = {"seq_len": SEQ, "micro_batch": MB, "environment": {"cpus": 4}, "loaders": {
        f"padded w{w}": {"kind": "padded", "workers": w, "tokens_per_s": s, "effective_tokens_per_s": s}
        for w, s in supply.items()}}
    rows = S.predict(bench, 1e9, [S.Accelerator("X", 100.0, "test")], mfu)
    c_mid = (mfu[0] + mfu[1]) / 2 * 1e5
    want = {w: max(0.0, 1 - s / c_mid) if w else c_mid / (c_mid + s) for w, s in supply.items()}
    assert {r["workers"]: r["stall_mid"] for r in rows} == pytest.approx(want)
    assert {r["workers"]: S.mid_stall(r) for r in rows} == pytest.approx(want)
    assert any(abs(want[r["workers"]] - (r["stall_low"] + r["stall_high"]) / 2) > 1e-3 for r in rows)
    bars = [t for t in stall_prediction_figure(rows).data if t.type == "bar"][::2]   # left panel: stall
    for bar, r in zip(bars, rows, strict=True):
        assert bar.y[0] == pytest.approx(want[r["workers"]])
        assert bar.y[0] + bar.error_y.array[0] == pytest.approx(r["stall_high"])   # whiskers: the range's ends
        assert bar.y[0] - bar.error_y.arrayminus[0] == pytest.approx(r["stall_low"])


def test_non_finite_numbers_in_stall_tables() -> None:
    check = {"run_id": "r", "path": "padded", "workers": 0, "consumption": float("inf"), "supply": 1e9,
             "predicted_stall": float("nan"), "data_stall": 0.5}
    line = S.check_markdown([check]).splitlines()[2]
    assert "| inf | 1G | - | 50.0% |" in line and "infG" not in line


@pytest.mark.parametrize("mfu", [(0.0, 0.4), (-0.1, 0.4), (0.35, 1.5), (float("nan"), 0.4)])
def test_an_mfu_range_outside_zero_to_one_is_one_line(mfu) -> None:
    """An MFU of 0 divided by zero (a traceback in notebook 05); above 1 is impossible."""
    from pretok_lib.errors import PretokError

    with pytest.raises(PretokError, match=r"must lie in \(0, 1\]"):
        S.predict({}, 1e9, mfu=mfu)
