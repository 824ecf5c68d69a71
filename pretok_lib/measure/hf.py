"""`PretokCallback`: measure a `transformers.Trainer` run with `pretok_lib.measure.Run`.

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[PretokCallback("runs/hf-run")])

Timing (transformers >= 4.46 fetches each optimizer step's micro-batches before `on_step_begin`): the data wait of a
step is the time from the end of the previous step (or of its logging, evaluation or checkpoint) to
`on_step_begin`; its compute the time from `on_step_begin` to `on_step_end`; step time = both. Evaluation, logging
and saving count in no step. Tokens are counted by a forward pre-hook on the model (input_ids, attention_mask,
labels of every training micro-batch, `counts.batch_counts`), the step's loss by a forward hook (`outputs.loss`
summed over the micro-batches when the Trainer passes `num_items_in_batch`, else their mean); only the main
process writes.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from .run import Run


def _precision(args: Any) -> str:
    return "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"


def trainer_config(args: Any, model: Any = None) -> dict[str, Any]:
    """The settings of a Trainer run as config.yaml holds them (docs/BYO.md): the training arguments that make
    an experiment, and the model's config."""
    world = max(1, int(getattr(args, "world_size", 1) or 1))
    micro = int(args.per_device_train_batch_size)
    accum = int(args.gradient_accumulation_steps)
    model_cfg = getattr(model, "config", None)
    cfg: dict[str, Any] = {
        "trainer": "transformers.Trainer",
        "train": {"lr": args.learning_rate, "micro_batch": micro, "grad_accum": accum,
                  "global_batch": micro * accum * world, "steps": args.max_steps, "precision": _precision(args),
                  "weight_decay": args.weight_decay, "warmup_steps": args.warmup_steps,
                  "lr_scheduler": str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
                  "max_grad_norm": args.max_grad_norm},
        "data": {"num_workers": args.dataloader_num_workers},
        "run": {"seed": args.seed, "output_dir": args.output_dir},
    }
    if model_cfg is not None and hasattr(model_cfg, "to_dict"):
        keep = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions")
        cfg["model"] = {k: v for k, v in model_cfg.to_dict().items() if k in keep}
    return cfg


class PretokCallback(TrainerCallback):
    """A `transformers.TrainerCallback` writing the Trainer's run as a pretok run directory (docs/RUNS.md).

    Args:
        run_dir: the run directory (default: `<output_dir>/pretok`). config: extra settings merged over the
            Trainer's (`trainer_config`). Other keywords go to `Run` (data_kind, seq_len, target_loss, ...).
    """

    def __init__(self, run_dir: str | os.PathLike | None = None, config: Mapping[str, Any] | None = None,
                 **run_kwargs: Any) -> None:
        self.run_dir, self.extra, self.run_kwargs = run_dir, dict(config or {}), run_kwargs
        self.run: Run | None = None
        self._hooks: list[Any] = []
        self._losses: list[float] = []
        self._summed = False
        self._mark = self._begin = 0.0
        self._in_step = False
        self._warned = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        cfg = trainer_config(args, model)
        for k, v in self.extra.items():
            cfg[k] = {**cfg[k], **v} if isinstance(v, Mapping) and isinstance(cfg.get(k), dict) else v
        run_dir = self.run_dir or os.path.join(args.output_dir, "pretok")
        self.run_kwargs.setdefault("precision", _precision(args))
        self.run = Run(run_dir, cfg, world_size=max(1, int(args.world_size or 1)), rank=int(args.process_index),
                       **self.run_kwargs).start()
        if model is not None:
            self._hooks = [model.register_forward_pre_hook(self._count, with_kwargs=True),
                           model.register_forward_hook(self._keep_loss)]
        self._mark = time.perf_counter()

    def _count(self, module: Any, args: tuple, kwargs: dict) -> None:
        if self.run is None or not self._in_step or not module.training:
            return
        batch = dict(kwargs)
        self._summed = batch.get("num_items_in_batch") is not None   # loss = this micro-batch's sum / the step's
        if args and "input_ids" not in batch:
            batch["input_ids"] = args[0]
        self.run.add_batch(batch)      # a batch it cannot count marks the step (never raises in the forward)

    def _keep_loss(self, module: Any, args: tuple, output: Any) -> None:
        loss = getattr(output, "loss", None) if not isinstance(output, Mapping) else output.get("loss")
        if self._in_step and module.training and loss is not None:
            self._losses.append(float(loss.detach().float().mean()))

    def _resume(self, *_: Any, **__: Any) -> None:
        self._mark = time.perf_counter()   # logging, evaluation and saving ended: the next fetch starts now

    on_epoch_begin = on_evaluate = on_save = on_prediction_step = _resume

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._begin = time.perf_counter()
        if self.run is not None:
            self.run.add_wait(self._begin - self._mark)
            self.run._mark = self._mark   # the step's time starts where its data fetch began
            self.run._paused = 0.0
        self._in_step = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._in_step = False
        if self.run is not None:
            loss = (sum(self._losses) / (1 if self._summed else len(self._losses))) if self._losses else None
            if self.run._counted:
                self.run.step(loss=loss, lr=self._lr)
            else:   # the measurement must not stop the training: say so once, log the step with no tokens
                if not self._warned:
                    warnings.warn("PretokCallback: a training batch has no input_ids to count: its tokens are "
                                  "logged as 0 (docs/BYO.md)", stacklevel=2)
                    self._warned = True
                self.run.step(loss=loss, lr=self._lr, tokens=0)
        self._losses = []
        self._mark = time.perf_counter()

    _lr: float | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kw: Any) -> None:
        logs = logs or {}
        if self.run is not None and "eval_loss" in logs:
            self.run.eval(float(logs["eval_loss"]))
        self._resume()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
        if optimizer is not None and optimizer.param_groups:
            self._lr = float(optimizer.param_groups[0]["lr"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.close("completed" if state.global_step >= 1 else "failed",
                   None if state.global_step >= 1 else "no training step ran")

    def close(self, status: str = "completed", error: str | None = None) -> None:
        """End the run (`on_train_end` does; call it with "failed" and the error if `train()` raised)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.run is not None:
            self.run.finish(status, error)
