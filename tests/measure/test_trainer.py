"""PretokCallback with a real transformers.Trainer on CPU (a tiny Llama built from a config, no hub): the run
directory holds every step with the tokens, padding and loss the Trainer saw, and loads beside the project's runs."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate: pip install -e '.[byo]'")
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

from pretok_lib.analysis import load_runs, summary_table  # noqa: E402
from pretok_lib.analysis.runs_report import build_report  # noqa: E402
from pretok_lib.measure import PretokCallback  # noqa: E402
from tests.analysis.helpers import simple_run  # noqa: E402

SEQ, MICRO, ACCUM, STEPS = 16, 4, 2, 6


EVAL_TOKEN = 63   # the evaluation rows' token (training rows use 5..54): tells their batches apart


class Docs(torch.utils.data.Dataset):
    """Documents of 3-15 tokens (training), or full rows of EVAL_TOKEN (evaluation)."""

    def __init__(self, eval_: bool = False) -> None:
        self.eval = eval_

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        if self.eval:
            return {"input_ids": torch.full((SEQ,), EVAL_TOKEN)}
        return {"input_ids": torch.full((3 + i % 13,), 5 + i % 50)}


class Collate:
    """Right-pads to SEQ and keeps every batch it made (num_workers 0: in this process)."""

    def __init__(self) -> None:
        self.made: list[dict] = []

    def __call__(self, rows: list[dict]) -> dict:
        ids = torch.zeros(len(rows), SEQ, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(rows):
            ids[j, :len(r["input_ids"])], mask[j, :len(r["input_ids"])] = r["input_ids"], 1
        batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        self.made.append(batch)
        return batch


def test_trainer_run_is_measured_and_loads_beside_project_runs(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    collate = Collate()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=MICRO,
                             per_device_eval_batch_size=MICRO, gradient_accumulation_steps=ACCUM, logging_steps=1,
                             eval_strategy="steps", eval_steps=3, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0)
    logged: list[float] = []
    cb = PretokCallback(tmp_path / "runs" / "hf-trainer", seq_len=SEQ)
    trainer = Trainer(model=model, args=args, train_dataset=Docs(), eval_dataset=Docs(True), data_collator=collate,
                      callbacks=[cb])
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    recs = [json.loads(x) for x in (tmp_path / "runs" / "hf-trainer" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    made = [b for b in collate.made if not (b["input_ids"] == EVAL_TOKEN).any()]   # training batches, in order
    train_batches = [made[i:i + ACCUM] for i in range(0, ACCUM * STEPS, ACCUM)]
    for r, pair in zip(train, train_batches):
        pad = sum(int((b["attention_mask"] == 0).sum()) for b in pair)
        assert r["tokens"] == MICRO * ACCUM * SEQ and r["samples"] == (r["step"]) * MICRO * ACCUM
        assert r["padding_frac"] == pytest.approx(pad / r["tokens"])
        assert 0 <= r["data_stall"] < 1 and r["step_time_s"] >= r["data_wait_s"]
    assert [r["loss"] for r in train] == pytest.approx(logged, rel=1e-3)
    assert len([r for r in recs if r["kind"] == "val"]) == 2
    simple_run(tmp_path / "runs", "project-run", tokens_per_s=1000.0)
    rows = {r["run_id"]: r for r in summary_table(load_runs(tmp_path / "runs"))}
    assert rows["hf-trainer"]["status"] == "completed" and rows["project-run"]["status"] == "completed"
    assert rows["hf-trainer"]["global_batch"] == MICRO * ACCUM and rows["hf-trainer"]["seq_len"] == SEQ
    assert rows["hf-trainer"]["steps"] == STEPS and rows["hf-trainer"]["final_val_loss"] is not None
    page = build_report(tmp_path / "runs", tmp_path / "report")["report"].read_text()   # pretok report
    assert 'data-run-id="hf-trainer"' in page and 'data-run-id="project-run"' in page



class _Vision(torch.nn.Module):
    def forward(self, pixel_values=None):
        return {"loss": pixel_values.mean()}


def test_a_batch_without_input_ids_warns_once_and_never_stops_training(tmp_path):
    from types import SimpleNamespace

    args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=1, world_size=1,
                           learning_rate=0.1, max_steps=2, weight_decay=0.0, warmup_steps=0, lr_scheduler_type="linear",
                           max_grad_norm=1.0, dataloader_num_workers=0, seed=0, output_dir=str(tmp_path),
                           process_index=0, bf16=False, fp16=False)
    model = _Vision().train()
    cb = PretokCallback(tmp_path / "runs" / "vision")
    cb.on_train_begin(args, None, None, model=model)
    with pytest.warns(UserWarning, match="no input_ids to count"):
        for _ in range(2):
            cb.on_step_begin(args, None, None)
            model(pixel_values=torch.ones(2, 3))
            cb.on_step_end(args, None, None)
    cb.on_train_end(args, SimpleNamespace(global_step=2), None)
    recs = [json.loads(x) for x in (tmp_path / "runs" / "vision" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["tokens"], r["loss"]) for r in recs] == [(0, 1.0), (0, 1.0)]
    assert json.loads((tmp_path / "runs" / "vision" / "run.json").read_text())["status"] == "completed"
