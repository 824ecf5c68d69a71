"""evaluation.py: the held-out splits of a run. A padded run is validated on packed windows (eval.path, the same for
every data path) and on its own layout (eval.own_path: one document per row); both losses land in one val record,
each per effective label, and summary.json carries the own one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pretok_lib.data import make_dataset, make_loader
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.train import load_config, train

from ..conftest import CL100K_JSON, GPT2_JSON
from .conftest import SEQ, TrainData, records, tiny_overrides

EVAL = {"eval.every": 2, "eval.batches": 2, "train.target_loss": 100.0}


def _padded(text: Path, out: Path, tokenizer: Path = GPT2_JSON) -> Path:
    run_tokenize(TokenizeConfig(inputs=[str(text)], out=str(out), tokenizer=str(tokenizer), format="padded",
                                seq_len=SEQ, workers=0, progress=False))
    return out


@pytest.fixture(scope="module")
def val_padded(train_data: TrainData, tmp_path_factory) -> Path:
    """The held-out documents of `train_data.val`, in the padded layout (one document per row)."""
    return _padded(train_data.val.parent / "val.parquet", tmp_path_factory.mktemp("val-padded") / "padded")


def test_a_padded_run_logs_its_own_layout_loss_beside_the_packed_one(train_data, val_padded, tmp_path, one_thread):
    cfg = load_config(None, tiny_overrides(train_data, tmp_path, "pretok-padded", **EVAL, **{
        "eval.path": train_data.val, "eval.own_path": val_padded}))
    assert train(cfg) == 0
    run = tmp_path / "run"
    val = records(run, "val")
    assert [v["step"] for v in val] == [2, 3]
    for v in val:
        assert set(v) == {"kind", "step", "wall_s", "val_loss", "val_ppl", "val_tokens", "val_loss_own",
                          "val_ppl_own", "val_tokens_own"}
        assert math.isfinite(v["val_loss_own"]) and v["val_ppl_own"] == pytest.approx(math.exp(v["val_loss_own"]))
        assert v["val_loss_own"] != pytest.approx(v["val_loss"], rel=1e-3)   # other samples, another layout
    # per effective label: the padded rows' non-pad labels of the first eval.batches batches, not their slots
    rows = make_loader(make_dataset("pretok-padded", val_padded, SEQ, micro_batch=4, shuffle=False))
    batches = [b for _, b in zip(range(EVAL["eval.batches"]), rows)]
    assert val[0]["val_tokens_own"] == sum(b["effective_tokens"] for b in batches) < 2 * 4 * SEQ
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_val_loss_own"] == val[-1]["val_loss_own"] and summary["final_val_loss"] == val[-1]["val_loss"]
    assert summary["time_to_target_own_s"] == val[0]["wall_s"]    # below 100 from the first record
    fingerprint = json.loads((run / "run.json").read_text())["data_fingerprint"]   # a rerun checks both splits
    assert fingerprint["eval_own"] and fingerprint["eval_own"] != fingerprint["eval"]


def test_without_an_own_split_nothing_changes(train_data, tmp_path, one_thread):
    cfg = load_config(None, tiny_overrides(train_data, tmp_path, "pretok-padded", **EVAL,
                                           **{"eval.path": train_data.val}))
    assert train(cfg) == 0
    assert all("val_loss_own" not in v for v in records(tmp_path / "run", "val"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_val_loss_own"] is None and summary["time_to_target_own_s"] is None


def _other_tokenizer(base: Path, train_data: TrainData) -> Path:
    return _padded(train_data.val.parent / "val.parquet", base / "cl100k", CL100K_JSON)


def _too_small(base: Path, train_data: TrainData) -> Path:
    (base / "two.jsonl").write_text('{"text": "one short document"}\n{"text": "and another"}\n')
    return _padded(base / "two.jsonl", base / "two")     # 2 rows: fewer than micro_batch 4


@pytest.mark.parametrize("make, says", [(_other_tokenizer, "tokenized with another tokenizer"),
                                        (_too_small, "yields no batch")])
def test_a_bad_own_split_fails_the_run_in_one_line_naming_it(make, says, train_data, tmp_path, capsys, one_thread):
    own = make(tmp_path, train_data)
    cfg = load_config(None, tiny_overrides(train_data, tmp_path, "pretok-padded", **EVAL, **{
        "eval.path": train_data.val, "eval.own_path": own}))
    assert train(cfg) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]   # not the progress lines
    assert len(err) == 1 and f"{own}: eval.own_path: " in err[0] and says in err[0], err
    assert not (tmp_path / "run" / "summary.json").exists()
