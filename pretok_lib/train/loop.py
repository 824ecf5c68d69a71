"""The training loop: data → model → AdamW step, timed (data wait vs step), logged, checkpointed, resumable.

The loss of a step is the mean over every effective label of the global batch (all micro-batches of all
ranks): each micro-batch contributes sum(loss) · world / (global effective tokens), so DDP's gradient mean
gives exactly the single-process gradient of the same global batch, whatever the split.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..data import ShardedBatches, make_dataset, make_loader, open_mixture
from ..errors import NonFiniteLoss, PretokError
from . import checkpoint, collector
from .compile import compile_model
from .config import Config
from .distributed import Dist, all_reduce, barrier, broadcast_object
from .evaluation import evaluate, forward_loss_sum, held_out_splits, source_tokenizer
from .hardware import peak_flops, resolve_precision, set_tf32
from .identity import source_fingerprint
from .metrics import MetricsLog, peak_memory_mb
from .model import build_model, model_flops_per_token, vocab_size_for
from .profile import profiled

BUDGET_SPENT = "time_budget_spent"  # Counters.extra: the run ended at this step by train.time_budget_s


@dataclass
class Counters:
    """What the loop carries across a resume (saved in state.pt)."""
    step: int = 0
    wall_s: float = 0.0
    cum_tokens: int = 0
    cum_effective_tokens: int = 0
    samples: int = 0
    extra: dict = field(default_factory=dict)


class StopFlag:
    """Set by SIGTERM / SIGUSR1 (preemption, time limit) / SIGINT (Ctrl-C; torchrun forwards it): the loop
    checkpoints at the end of the step and stops. A second SIGINT stops at once (KeyboardInterrupt; `aborted`
    stays set, since the code it interrupts may turn it into another error). `restore()` puts the previous handlers
    back (an in-process caller keeps its own)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self.aborted = False
        self.previous = {s: signal.signal(s, self._set) for s in self.SIGNALS}

    def _set(self, signum, frame):
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            self.aborted = True
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def tokenizer_record(source, spec: str | None = None) -> dict:
    """The spec (`spec`, the config's data.tokenizer, when given: checked against the data), kind and
    fingerprint of the tokenizer a data source was made with, for run.json and export.py; a spec that is a
    path is made absolute."""
    info = getattr(source, "info", None)
    tok = info.to_dict() if info is not None else source.m["tokenizer"]
    spec = spec or tok.get("spec")
    if spec and os.path.exists(spec):
        spec = os.path.abspath(spec)
    return {"spec": spec, "kind": tok.get("kind"), "fingerprint": tok.get("fingerprint")}


def _endless(loader, data: str | None = None):
    """Batches across epochs; the loader's position moves to the next epoch at each end. A pass from a position at
    the end of an epoch (a checkpoint taken on its last step) is empty: only an empty pass over a whole epoch
    means the data holds less than one global batch."""
    while True:
        pos = getattr(loader, "position", None)
        whole_epoch = pos is None or (pos.consumed == 0 and pos.cursor is None)
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0 and whole_epoch:
            raise PretokError("the training data has fewer samples than one loader batch "
                              "(micro_batch × world size); use a smaller batch or more data", data)


def _optimizer(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    t = cfg.train
    return torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=t.lr, betas=(t.beta1, t.beta2),
                             eps=t.eps, fused=device.type == "cuda")


def lr_factor(step: int, cfg: Config) -> float:
    """Multiplier of the peak lr for 0-based optimizer step `step`: linear warmup, then cosine or constant."""
    t = cfg.train
    if step < t.warmup_steps:
        return (step + 1) / t.warmup_steps
    if t.schedule == "constant":
        return 1.0
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class Trainer:
    """One run: set up from `cfg` on this rank, `run()` until cfg.train.steps or a stop signal."""

    def __init__(self, cfg: Config, d: Dist, run_dir: Path, log: "callable"):
        self.cfg, self.d, self.run_dir, self.log = cfg, d, run_dir, log
        c = cfg
        # `auto` resolved once (rank 0's choice for every rank); config.yaml records the precision used.
        self.precision = broadcast_object(resolve_precision(c.train.precision, d.device))
        c.train.precision = self.precision.used
        torch.manual_seed(c.run.seed)
        src_kw = dict(seed=c.run.seed, shuffle=c.data.shuffle, text_column=c.data.text_column, bos=c.data.bos,
                      eos=c.data.eos, separator=c.data.separator,   # on-the-fly baselines only
                      tokenizer=c.data.tokenizer,   # baselines need it; pretokenized data is checked against it
                      verify_on_open=c.data.verify_on_open, order=c.data.order, block_groups=c.data.block_groups,
                      cache_mb=c.data.cache_mb)
        if c.data.mixture:
            for k in ("text_column", "bos", "eos", "separator"):   # a mixture is of pretokenized datasets
                del src_kw[k]
            mix = open_mixture([(e.path, e.weight) for e in c.data.mixture], c.data.seq_len,
                               exhausted=c.data.mixture_exhausted, **src_kw)
            self.dataset = ShardedBatches(mix, c.data.micro_batch, d.rank, d.world)
        else:
            self.dataset = make_dataset(c.data.kind, c.data.path, c.data.seq_len, micro_batch=c.data.micro_batch,
                                        rank=d.rank, world=d.world, **src_kw)
        self.mixture = len(c.data.mixture)  # datasets whose tokens are counted apart (0: not a mixture)
        tok_vocab, fingerprint = source_tokenizer(self.dataset.source)
        self.loader = make_loader(self.dataset, num_workers=c.data.num_workers)
        self.held_out = held_out_splits(c, d, fingerprint)   # eval.path, then eval.own_path (evaluation.py)
        self.vocab = vocab_size_for(c.model, tok_vocab)
        model = build_model(c.model, self.vocab, c.data.seq_len, c.run.seed, d.device)
        self.flops_per_token = model_flops_per_token(model, c.model, c.data.seq_len)
        self.matmul_precision = set_tf32(d.device, c.train.tf32)
        self.peak, self.peak_source = peak_flops(d.device, c.train.precision, c.hardware.peak_tflops, c.train.tf32)
        if c.train.activation_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):      # transformers >= 5.x
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model
        self.optimizer = _optimizer(model, c, d.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, c))
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=c.train.precision == "fp16")
        self.progress = Counters()
        self.resumed_from = None
        self._resume()
        net = model
        if d.backend is not None:
            net = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
        self.inductor_cache = None
        if c.train.compile:
            net, self.inductor_cache = compile_model(net)
        self.net = net

    def facts(self) -> dict:
        """Model and throughput facts recorded in run.json."""
        return {"params": sum(p.numel() for p in self.model.parameters()), "vocab_size": self.vocab,
                "global_batch": self.cfg.global_batch(self.d.world),
                "flops_per_token": self.flops_per_token, "peak_flops": self.peak, "peak_source": self.peak_source,
                "precision": self.precision.used, "precision_requested": self.precision.requested,
                "precision_reason": self.precision.reason, "matmul_precision": self.matmul_precision,
                "resumed_from_step": self.resumed_from, "inductor_cache": self.inductor_cache,
                "tokenizer": tokenizer_record(self.dataset.source, self.cfg.data.tokenizer),
                "data_fingerprint": {"train": source_fingerprint(self.dataset.source), "eval": None, "eval_own": None,
                                     **{f"eval{h.suffix}": source_fingerprint(h.dataset.source)
                                        for h in self.held_out}}}

    def _resume(self) -> None:
        if not self.cfg.checkpoint.resume:
            # Starting over: an older attempt's checkpoints go now, not at this run's first save (which prunes them as
            # later steps), or a kill before that save left them for the next resume, which mixed the two runs.
            ckpts = self.run_dir / "checkpoints"
            if self.d.is_main and ckpts.exists():
                with checkpoint.names_path(ckpts):
                    shutil.rmtree(ckpts)
            return
        found = checkpoint.load_newest(self.run_dir / "checkpoints", self.model, self.optimizer, self.d.device,
                                       self.log if self.d.is_main else lambda msg: None)
        if found is None:
            return
        path, state = found
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.loader.load_state_dict(state["loader"])
        self.progress = Counters(**state["progress"])
        self.resumed_from = self.progress.step
        checkpoint.set_rng_state(state["rng"])
        if self.d.is_main:  # once, not once per rank
            self.log(f"resumed from {path} (step {self.progress.step})")

    def save(self) -> None:
        p = self.progress
        state = {"scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                 "loader": self.loader.state_dict(), "progress": p.__dict__, "world_size": self.d.world}
        if self.d.is_main:
            path = checkpoint.save(self.run_dir / "checkpoints", p.step, self.model, self.optimizer, state,
                                   self.cfg.checkpoint.keep)
            self.log(f"checkpoint {path}")
        barrier()

    def evaluate(self) -> dict:
        """The losses of the held-out splits (evaluation.evaluate): val_loss, and val_loss_own with eval.own_path."""
        return evaluate(self.net, self.held_out, self.cfg, self.d.device)

    def step(self, batches) -> dict:
        """One optimizer step over grad_accum micro-batches; returns this rank's raw measurements."""
        c, d = self.cfg, self.d
        t0 = time.perf_counter()
        micro, wait, dropped = [], 0.0, 0
        while len(micro) < c.train.grad_accum:
            t = time.perf_counter()
            batch = next(batches)
            wait += time.perf_counter() - t
            if micro and batch["epoch"] != micro[0]["epoch"]:
                # The epoch ended within this step: its last micro-batches, fewer than one accumulation, are dropped
                # like an epoch's remainder under one loader batch, so a step never spans two epochs and any split
                # of the global batch (micro-batch x ranks x accumulation) trains on the same samples.
                dropped += 1
                if dropped > 1:   # a whole epoch without one step's worth of micro-batches
                    raise PretokError(f"the training data has fewer samples than one global batch "
                                      f"({c.global_batch(d.world)} = micro_batch x world size x grad_accum); use "
                                      f"a smaller batch or more data", self._data_path())
                micro = []
            micro.append(batch)
        counts = torch.tensor([[b[k] for k in ("tokens", "effective_tokens", "padding_tokens", "masked_tokens")]
                               for b in micro], dtype=torch.float64).sum(0)
        if self.mixture:  # per dataset: input tokens, then effective tokens (labels that count)
            by_source = torch.zeros(2, self.mixture, dtype=torch.float64)
            for b in micro:
                width, eff = b["input_ids"].shape[1], (b["labels"] != -100).sum(1).to(torch.float64)
                by_source[0].index_add_(0, b["origin"], torch.full_like(eff, width))
                by_source[1].index_add_(0, b["origin"], eff)
            counts = torch.cat([counts, by_source.flatten()])
        global_eff = float(all_reduce(counts[1:2].clone())[0])
        scale = d.world / max(global_eff, 1.0)
        loss_sum = 0.0
        for i, batch in enumerate(micro):
            last = i == len(micro) - 1
            sync = contextlib.nullcontext() if last or d.backend is None else self.net.no_sync()
            with sync:
                ls = forward_loss_sum(self.net, batch, d.device, c.train.precision)
                self.scaler.scale(ls * scale).backward()
            loss_sum += ls.item()
        self.scaler.unscale_(self.optimizer)
        clip = c.train.grad_clip if c.train.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        lr = self.optimizer.param_groups[0]["lr"]
        if not math.isfinite(grad_norm) and not self.scaler.is_enabled():
            # Before the update (fp16's scaler skips such a step itself): with it, the weights became NaN while this
            # step's loss was still finite, and a checkpoint at this step kept them, so every rerun resumed from
            # NaN weights and failed again. The norm is global (DDP reduced the gradients): every rank stops here.
            what = f"loss is {loss_sum}" if not math.isfinite(loss_sum) else f"gradient norm is {grad_norm}"
            raise self.non_finite(f"{what} at step {self.progress.step + 1}", lr, "before updating the weights")
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if d.device.type == "cuda":
            torch.cuda.synchronize(d.device)
        return {"loss_sum": loss_sum, "counts": counts, "wait": wait, "time": time.perf_counter() - t0,
                "lr": lr, "grad_norm": grad_norm, "global_eff": global_eff}

    def non_finite(self, what: str, lr: float, when: str = "") -> NonFiniteLoss:
        """The error that fails the run at a NaN / infinite loss or gradient norm (`what`: which, at which step)."""
        c = self.cfg
        return NonFiniteLoss(f"{what} (precision {c.train.precision}{', torch.compile' if c.train.compile else ''}, "
                             f"lr {lr:.2e}); the run stops{' ' + when if when else ''}, its last checkpoint kept")

    def record(self, m: dict) -> dict:
        """The metrics.jsonl record of a step: sums over ranks, times as the slowest rank's."""
        d, p = self.d, self.progress
        sums = all_reduce(torch.cat([torch.tensor([m["loss_sum"]], dtype=torch.float64), m["counts"]]))
        times = all_reduce(torch.tensor([m["time"], m["wait"]], dtype=torch.float64), dist.ReduceOp.MAX)
        loss_sum, tokens, eff, padding, masked = (float(x) for x in sums[:5])
        step_time, wait = float(times[0]), float(times[1])
        tps = tokens / step_time
        return {"kind": "train", "step": p.step, "wall_s": round(p.wall_s, 4), "loss": loss_sum / max(eff, 1.0),
                "lr": m["lr"], "grad_norm": m["grad_norm"], "step_time_s": step_time, "data_wait_s": wait,
                "data_stall": wait / step_time, "tokens": int(tokens), "effective_tokens": int(eff),
                "padding_frac": padding / tokens, "masked_frac": masked / tokens, "tokens_per_s": tps,
                "tokens_per_s_per_device": tps / d.world, "effective_tokens_per_s": eff / step_time,
                "mfu": self.flops_per_token * tps / d.world / self.peak,
                "peak_mem_mb": peak_memory_mb(d.device), "cum_tokens": p.cum_tokens,
                "cum_effective_tokens": p.cum_effective_tokens, "samples": p.samples,
                **({"source_tokens": [int(x) for x in sums[5:5 + self.mixture]],
                    "source_effective_tokens": [int(x) for x in sums[5 + self.mixture:]]} if self.mixture else {})}

    def run(self, metrics: MetricsLog | None, stop: StopFlag) -> str:
        """Train to cfg.train.steps; 'completed', or 'interrupted' after a stop signal (checkpoint saved)."""
        self.net.train()
        batches = _endless(self.loader, self._data_path())
        with collector.scheduled(self.cfg.train.gc_every) as after_step:
            return self._steps(metrics, stop, batches, after_step)

    def _data_path(self) -> str | None:
        """The training data's path for an error line (None for a mixture or several text inputs)."""
        path = self.cfg.data.path
        return path if isinstance(path, str) and path and not self.cfg.data.mixture else None

    def _steps(self, metrics: MetricsLog | None, stop: StopFlag, batches, after_step) -> str:
        c, d, p = self.cfg, self.d, self.progress
        started, wall0 = time.perf_counter(), p.wall_s
        global_batch = c.global_batch(d.world)
        if p.extra.get(BUDGET_SPENT):   # resumed from the checkpoint of the step that ended the run: nothing to do
            return "completed"
        while p.step < c.train.steps:
            with profiled(p.step + 1 == c.log.profile_step, self.run_dir / f"profile-step{p.step + 1}", d):
                m = self.step(batches)
            p.step += 1
            p.wall_s = wall0 + time.perf_counter() - started
            p.samples += global_batch
            # train.time_budget_s: every rank stops after the step that passes it (never within the warm-up steps)
            budget = c.train.time_budget_s
            spent = budget is not None and p.wall_s >= budget and p.step > c.log.skip_steps + 1
            flag = all_reduce(torch.tensor([1.0 if stop.signum else 0.0, 1.0 if spent else 0.0]))
            last = p.step == c.train.steps or bool(flag[1])
            if flag[1]:  # in this step's checkpoint: a run killed before it recorded its end resumes to that end
                p.extra[BUDGET_SPENT] = True
            logging = p.step % c.log.every == 0 or last or bool(flag[0])
            rec = self.record(m)  # every step: the cumulative counters must be global and exact
            if not math.isfinite(rec["loss"]):
                raise self.non_finite(f"loss is {rec['loss']} at step {p.step}", rec["lr"])
            p.cum_tokens += rec["tokens"]
            p.cum_effective_tokens += rec["effective_tokens"]
            rec.update(cum_tokens=p.cum_tokens, cum_effective_tokens=p.cum_effective_tokens)
            if self.mixture:  # cumulative tokens per dataset of the mixture, in data.mixture's order
                for key in ("source_tokens", "source_effective_tokens"):
                    cum = [a + b for a, b in zip(p.extra.get(f"cum_{key}", [0] * self.mixture), rec[key])]
                    p.extra[f"cum_{key}"] = rec[f"cum_{key}"] = cum
            if logging and metrics is not None:
                with checkpoint.names_path(metrics.path):
                    metrics.write(rec)
            if logging and d.is_main and (p.step % max(1, c.log.every * 10) == 0 or last or p.step == 1):
                self.log(f"step {p.step}/{c.train.steps} loss {rec['loss']:.4f} lr {rec['lr']:.2e} "
                         f"{rec['tokens_per_s']:,.0f} tok/s stall {rec['data_stall']:.1%}")
            evaluated = bool(self.held_out) and (p.step % c.eval.every == 0 or last)
            if evaluated:
                v = self.evaluate()
                if metrics is not None:
                    with checkpoint.names_path(metrics.path):
                        metrics.write({"kind": "val", "step": p.step, "wall_s": round(p.wall_s, 4), **v})
                if d.is_main:
                    own = f" (own layout {v['val_loss_own']:.4f})" if "val_loss_own" in v else ""
                    self.log(f"step {p.step} val loss {v['val_loss']:.4f} ppl {v['val_ppl']:.2f}{own}")
            saved = bool(flag[0] or (last and c.checkpoint.at_end) or
                         (c.checkpoint.every and p.step % c.checkpoint.every == 0))
            if saved:
                self.save()
            if last:    # also when a stop signal came during the last step: nothing is left to resume
                break
            if flag[0]:
                return "interrupted"
            after_step(p.step, evaluated or saved)
        return "completed"
