"""A training run end to end, in-process: every data path, the run directory contract, TensorBoard, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pretok_lib.data import KINDS
from pretok_lib.train import load_config, train
from pretok_lib.train.compile import KIND_NAME
from pretok_lib.train.run import rank_threads

from ..conftest import CL100K_JSON
from .conftest import SEQ, records, run_cli, tiny_overrides

TRAIN_KEYS = {"kind", "step", "wall_s", "loss", "lr", "grad_norm", "step_time_s", "data_wait_s", "data_stall",
              "tokens", "effective_tokens", "padding_frac", "masked_frac", "tokens_per_s", "tokens_per_s_per_device",
              "effective_tokens_per_s", "mfu", "peak_mem_mb", "cum_tokens", "cum_effective_tokens", "samples"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_data_path_trains_and_writes_the_run_contract(kind, train_data, tmp_path):
    cfg = load_config(None, tiny_overrides(train_data, tmp_path, kind, **{
        "eval.path": train_data.val, "eval.every": 2, "eval.batches": 2, "train.target_loss": 100.0,
        "log.tensorboard": True}))
    assert train(cfg) == 0
    run = tmp_path / "run"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["world_size"] == 1 and info["backend"] is None
    assert info["versions"]["torch"] and info["flops_per_token"] > 0 and info["peak_flops"] > 0
    from pretok_lib.machine.environment import cpu_model
    assert info["device_name"] == info["cpu_model"] == cpu_model() and info["git_dirty"] in (True, False, None)
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["kind"] == kind
    rec = records(run)
    assert [r["step"] for r in rec] == [1, 2, 3] and set(rec[0]) == TRAIN_KEYS
    for r in rec:
        assert math.isfinite(r["loss"]) and r["tokens"] == 4 * SEQ
        useful = r["tokens"] * (1 - r["padding_frac"] - r["masked_frac"])   # a padded row loses its last label
        assert useful - 4 <= r["effective_tokens"] <= useful + 1e-6
        assert 0 <= r["data_stall"] < 1 and r["data_wait_s"] <= r["step_time_s"]
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["step_time_s"])
        assert 0 < r["mfu"] < 1
    assert rec[-1]["cum_tokens"] == 3 * 4 * SEQ and rec[-1]["samples"] == 12
    if kind in ("padded", "pretok-padded"):          # short Wikipedia summaries: padding, no crossings
        assert sum(r["padding_frac"] for r in rec) > 0 and rec[0]["masked_frac"] == 0
    else:                                            # packed: no padding, document crossings masked
        assert rec[0]["padding_frac"] == 0 and sum(r["masked_frac"] for r in rec) > 0
    val = records(run, "val")
    assert [v["step"] for v in val] == [2, 3] and val[0]["val_ppl"] == pytest.approx(math.exp(val[0]["val_loss"]))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3 and summary["data_kind"] == kind
    assert summary["time_to_target_s"] == val[0]["wall_s"]      # the first val record is below 100
    assert summary["final_val_loss"] == val[-1]["val_loss"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000003"]
    if kind == "pretok-memmap":                     # the tracker holds the same numbers
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run / "tb"))
        acc.Reload()
        assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3]
        assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([r["loss"] for r in rec], rel=1e-6)
        assert [e.step for e in acc.Scalars("val/val_loss")] == [2, 3]


def test_completed_run_is_not_repeated_and_overwrite_restarts(train_data, tmp_path, capsys):
    o = tiny_overrides(train_data, tmp_path, **{"train.steps": 2})
    assert train(load_config(None, o)) == 0
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert train(load_config(None, o + ["data.num_workers=1"])) == 0    # same run, completed: left alone
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    capsys.readouterr()
    assert train(load_config(None, o + ["train.steps=5"])) == 2        # another run's results would pass as its
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a run of another config (train.steps: 2 -> 5)" in err[0], err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    rec = tmp_path / "run" / "run.json"  # an interrupted attempt is not resumed under another config either
    rec.write_text(json.dumps({**json.loads(rec.read_text()), "status": "interrupted"}))
    assert train(load_config(None, o + ["train.lr=0.01"])) == 2
    assert "train.lr: 0.0003 -> 0.01" in capsys.readouterr().err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    (tmp_path / "run" / "launcher.log").write_text("a sweep's log of its attempts\n")
    (tmp_path / "run" / "launcher.json").write_text('{"attempts": [1]}\n')
    assert train(load_config(None, o + ["train.steps=4", "run.overwrite=true"])) == 0
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2, 3, 4]
    # the launcher's records stay (the sweep writes into its log while this attempt runs): everything else went
    assert (tmp_path / "run" / "launcher.log").read_text() == "a sweep's log of its attempts\n"
    assert (tmp_path / "run" / "launcher.json").read_text() == '{"attempts": [1]}\n'


def test_grad_accumulation_equals_the_larger_micro_batch(train_data, tmp_path):
    base = tiny_overrides(train_data, tmp_path, "pretok-padded", **{"train.steps": 3})
    assert train(load_config(None, base + ["run.id=a", "data.micro_batch=8"])) == 0
    assert train(load_config(None, base + ["run.id=b", "data.micro_batch=4", "train.grad_accum=2"])) == 0
    a, b = records(tmp_path / "a"), records(tmp_path / "b")
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-5)
    assert [r["grad_norm"] for r in b] == pytest.approx([r["grad_norm"] for r in a], rel=1e-4)
    assert [r["effective_tokens"] for r in b] == [r["effective_tokens"] for r in a]


def test_activation_checkpointing_and_bf16_fp16(train_data, tmp_path):
    base = tiny_overrides(train_data, tmp_path, **{"train.steps": 2})
    assert train(load_config(None, base + ["run.id=plain"])) == 0
    assert train(load_config(None, base + ["run.id=ckpt", "train.activation_checkpointing=true"])) == 0
    plain, ckpt = records(tmp_path / "plain"), records(tmp_path / "ckpt")
    assert [r["loss"] for r in ckpt] == pytest.approx([r["loss"] for r in plain], rel=1e-5)
    for prec in ("bf16", "fp16"):
        assert train(load_config(None, base + [f"run.id={prec}", f"train.precision={prec}"])) == 0
        low = records(tmp_path / prec)
        assert low[0]["loss"] == pytest.approx(plain[0]["loss"], rel=0.02)    # same model, lower precision


def test_dataset_tokenizer_mismatch_fails_clearly(train_data, tmp_path):
    p = run_cli(tiny_overrides(train_data, tmp_path, **{"data.tokenizer": CL100K_JSON}), check=False)
    assert p.returncode == 2
    assert "not the requested tokenizer" in p.stderr and p.stderr.count("error:") == 1
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and "not the requested tokenizer" in info["error"]
    assert not (tmp_path / "run" / "summary.json").exists()


def test_cli_rejects_unknown_key_with_one_line(train_data, tmp_path):
    p = run_cli(tiny_overrides(train_data, tmp_path) + ["train.lerning_rate=1"], check=False)
    assert p.returncode == 2 and "unknown config key 'train.lerning_rate'" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_loss_fails_the_run_at_that_step(train_data, tmp_path, monkeypatch, bad):
    """A NaN / inf loss (divergence, fp16 overflow, a miscompiled kernel) stops the run as failed with one line,
    instead of training on and reporting garbage as completed."""
    import pretok_lib.train.loop as loop

    real, calls = loop.forward_loss_sum, []

    def poisoned(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        return out * bad if len(calls) >= 2 else out  # from the second step on (one micro-batch per step)

    monkeypatch.setattr(loop, "forward_loss_sum", poisoned)
    base = tiny_overrides(train_data, tmp_path, **{"train.steps": 4, "eval.every": 100})
    assert train(load_config(None, base)) == 1
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith(f"loss is {bad} at step 2 ")
    assert "\n" not in info["error"] and not (tmp_path / "run" / "summary.json").exists()
    assert all(math.isfinite(r["loss"]) for r in records(tmp_path / "run"))  # no garbage record written


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_gradient_stops_the_run_before_the_update(train_data, tmp_path, monkeypatch, bad):
    """A gradient that overflows while the step's loss is finite (a bf16/fp32 overflow in the backward pass): the
    optimizer made the weights NaN, the loss was checked only after it, so a checkpoint at that step kept NaN
    weights; the run failed one step later and every rerun resumed from them and failed again. Now the run stops
    at that step before the update; the checkpoints hold finite weights and a rerun without the fault completes."""
    import torch

    import pretok_lib.train.loop as loop

    real, poison = loop.Trainer.step, [True]

    def step(self, batches):
        if self.progress.step == 1 and poison[0]:            # the second step
            hook = next(self.model.parameters()).register_hook(lambda g: g * bad)
            try:
                return real(self, batches)
            finally:
                hook.remove()
        return real(self, batches)

    monkeypatch.setattr(loop.Trainer, "step", step)
    base = tiny_overrides(train_data, tmp_path, **{"train.steps": 4, "checkpoint.every": 1, "checkpoint.keep": 4})
    assert train(load_config(None, base)) == 1
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith("gradient norm is nan at step 2 "), info["error"]
    assert [r["step"] for r in records(tmp_path / "run")] == [1]
    ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == ["step_00000001"]
    assert all(torch.isfinite(v).all() for v in torch.load(ckpts[0] / "model.pt").values())
    poison[0] = False
    assert train(load_config(None, base)) == 0
    assert all(math.isfinite(r["loss"]) for r in records(tmp_path / "run"))


def test_torch_compile_trains_like_eager(train_data, tmp_path):
    from torch._inductor import config as inductor_config

    base = tiny_overrides(train_data, tmp_path, **{"train.steps": 2})
    assert train(load_config(None, base + ["run.id=eager"])) == 0
    # the CPU flags pick Inductor's vector ISA, without its g++ dry-compile of each one (tests/train/test_compile.py)
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        assert train(load_config(None, base + ["run.id=compiled", "train.compile=true"])) == 0
    eager, compiled = records(tmp_path / "eager"), records(tmp_path / "compiled")
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=1e-4)
    assert compiled[0]["step_time_s"] > compiled[1]["step_time_s"]        # step 1 paid for the compilation
    cache = json.loads((tmp_path / "compiled" / "run.json").read_text())["inductor_cache"]
    assert KIND_NAME.fullmatch(Path(cache).name) and Path(cache).is_dir()   # this CPU kind's own cache


@given(usable=st.integers(1, 256), ranks=st.integers(1, 32),
       requested=st.one_of(st.none(), st.integers(-2, 512), st.sampled_from(["", "x", "4"])),
       current=st.one_of(st.none(), st.integers(1, 512)))
def test_rank_threads_never_oversubscribe_the_cores(usable: int, ranks: int, requested, current) -> None:
    """Issue 34: ranks x torch threads <= usable cores at every world size, 1 rank included (oversubscribed OpenMP
    cost 7x); a requested count (the sweep's one count per rank) is kept when it fits."""
    t = rank_threads(usable, ranks, requested, current)
    assert t >= 1 and (t * ranks <= usable or t == 1)
    if isinstance(requested, int) and 1 <= requested and requested * ranks <= usable:
        assert t == requested
