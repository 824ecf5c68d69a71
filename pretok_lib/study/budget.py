"""Study runs that fit their time budget whatever the vocabulary (docs/STUDY.md "Time budgets").

A study run stops after the step that passes `train.time_budget_s` (quick: 45 s for notebook 03, 15 s per sweep
point). With a large vocabulary the LM head dominates the step: the quick profile's "tiny" model had 33.5M
parameters with a 129k vocabulary, steps of seconds, sweep points of 68-203 s, each rate a mean over ~2 steps. So
before anything runs, a step's time is estimated (training FLOPs per token x tokens per step, against this
machine's measured matmul peak, `train.hardware.peak_flops`, at `EFFICIENCY` of it), and where the steps a run
needs do not fit its budget the model is made smaller (hidden size halved, embeddings tied) until they do: the
change is applied to the runs' overrides and recorded in study.json (`parameters.model_fit`). A model size the
researcher set (`model.hidden_size` in the overrides) is kept, and the record says it does not fit.

FLOPs alone miss what grows with the vocabulary but is not a matmul (logits, softmax and cross-entropy over
tokens x vocab in fp32, the optimizer over the embedding): measured on AMD EPYC Zen 4 (2 vCPUs), the FLOP estimate
was 0.79-0.94 of a real step with hidden size 128 and 0.36-0.41 of it with hidden 32 (vocab 8k-129k). So `pretok
study` (`refit`) also times the candidate model's training step on this machine (`measure_step`: build it, one
warm-up step, the median of two) wherever the estimate does not already rule the candidate out, and fits by the
measured step (`measured_step_s` in the record).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..train.config import SKIP_STEPS

# share of the measured matmul peak a tiny model's CPU training step reaches: the quick demo's 42.7 GFLOP/s
# (4,524 tokens/s x 9.44 MFLOP/token) is ~10% of the 438 GFLOP/s `peak_flops` measures on its 2-vCPU machine
EFFICIENCY = 0.1
MAX_OVERESTIMATE = 1.35  # the estimate was at most 1/0.79 of a measured step: above budget x this, none is timed
MIN_HEAD_DIM = 8         # the smallest hidden size per attention head the fit goes down to
RUN_KEYS = ("train_overrides", "sweep_base")   # notebook 03's run, notebook 04's points


@dataclass(frozen=True)
class Plan:
    """A run's size: FLOPs per token, tokens per step, the steps it needs (warm-up records + measured steps +
    one), evaluation tokens, and the seconds of a step and of one evaluation at `peak` FLOP/s x EFFICIENCY."""

    flops_per_token: float
    tokens_per_step: int
    steps: int
    eval_tokens: int
    peak: float
    measured_step_s: float | None = None   # a training step timed on this machine (`measure_step`), if any

    @property
    def step_s(self) -> float:
        if self.measured_step_s is not None:
            return self.measured_step_s
        return self.flops_per_token * self.tokens_per_step / (self.peak * EFFICIENCY)

    @property
    def eval_s(self) -> float:   # forward only: a third of a training step's time per token
        return self.step_s / 3 * self.eval_tokens / self.tokens_per_step

    @property
    def needed_s(self) -> float:
        return self.steps * self.step_s + self.eval_s


def plan(model: Mapping[str, Any], vocab: int, seq_len: int, micro_batch: int, grad_accum: int = 1,
         eval_batches: int = 4, skip_steps: int = SKIP_STEPS, peak: float = 1e11) -> Plan:
    """The `Plan` of a run of `model` (keys of train.config.ModelConfig) with a tokenizer of `vocab` tokens."""
    from ..train.flops import config_flops_per_token
    from .measured import MIN_MEASURED_STEPS

    return Plan(config_flops_per_token(model, vocab, seq_len), micro_batch * seq_len * grad_accum,
                skip_steps + MIN_MEASURED_STEPS + 1, eval_batches * micro_batch * seq_len * grad_accum, peak)


Measure = Callable[..., float]   # (model, **sizes) -> seconds of one training step (`measure_step`)


def fit(model: Mapping[str, Any], budget_s: float, fixed: bool = False, measure: Measure | None = None,
        **sizes: Any) -> tuple[dict, Plan]:
    """(the model changes that make a run fit `budget_s`, its `Plan` after them): none when it fits; else
    embeddings tied and the hidden size halved (down to MIN_HEAD_DIM per head) until it fits. `fixed`: the
    researcher set the hidden size, so nothing changes. `measure`: times a candidate's step, which then decides
    (not called where the estimate rules the candidate out). `sizes`: `plan`'s other arguments."""
    def judged(m: Mapping[str, Any]) -> Plan:
        p = plan(m, **sizes)
        if measure is None or p.needed_s > budget_s * MAX_OVERESTIMATE:
            return p
        return replace(p, measured_step_s=measure(m, **sizes))

    now = judged(model)
    if fixed or now.needed_s <= budget_s:
        return {}, now
    heads, hidden = int(model.get("num_heads", 4)), int(model.get("hidden_size", 128))
    changed: dict[str, Any] = {"model.tie_embeddings": True}
    while now.needed_s > budget_s and hidden // 2 >= heads * MIN_HEAD_DIM and (hidden // 2) % heads == 0:
        hidden //= 2
        changed["model.hidden_size"] = hidden
        now = judged({**model, "hidden_size": hidden, "tie_embeddings": True})
    return changed, now


def run_threads(params: Mapping[str, Any], key: str) -> int:
    """Torch threads of one rank of the run `key` on this machine's CPU, as the trainer sets them: notebook 04's
    points share the cores by the sweep's largest world size (`sweep.sweep_threads`), notebook 03's run by its own
    (`train_world`; 0: one rank per GPU, one here)."""
    from ..machine.cpu_affinity import usable_cpus

    if key == "sweep_base":
        worlds = [w for g in params.get("sweep_grids") or [] if isinstance(g, Mapping)
                  for w in (g.get("world") if isinstance(g.get("world"), list) else [1]) if isinstance(w, int)]
        world = max(worlds, default=1)
    else:
        world = int(params.get("train_world") or 1)
    return max(1, usable_cpus() // max(1, world))


def measure_step(model: Mapping[str, Any], vocab: int, seq_len: int, micro_batch: int, grad_accum: int = 1,
                 precision: str = "auto", threads: int | None = None, **_: Any) -> float:
    """Seconds of one training step (forward, backward, AdamW; `grad_accum` micro-batches) of `model` (keys of
    train.config.ModelConfig) on random tokens, on this machine's first GPU or its CPU, in the run's precision:
    the median of 2 after a warm-up step (so the compiled kernels and allocator caches are warm, as in a run).
    `threads`: torch's CPU threads while timing (the run's rank has as many; restored after)."""
    import contextlib
    import statistics
    import time

    import torch

    from ..train.config import ModelConfig
    from ..train.hardware import autocast_dtype, resolve_precision
    from ..train.model import build_model, vocab_size_for

    cfg = ModelConfig(**{k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    used = resolve_precision(precision, device).used
    dtype = autocast_dtype(used)
    v = vocab_size_for(cfg, vocab)
    net = build_model(cfg, v, seq_len, 0, device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randint(0, vocab, (micro_batch, seq_len), device=device)
    cast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    times, before = [], torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(grad_accum):
                with cast():
                    loss = net(input_ids=x, labels=x).loss
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    return statistics.median(times[1:])


def tokenizer_vocab(params: Mapping[str, Any]) -> int | None:
    """The study tokenizer's vocabulary: the given tokenizer's (None when it cannot be loaded here), else the
    BPE's `vocab_size`."""
    if not params.get("tokenizer"):
        return int(params.get("vocab_size") or 0) or None
    from ..tokenizer import load_tokenizer

    try:
        return load_tokenizer(params["tokenizer"]).vocab_size
    except Exception:   # noqa: BLE001 - not loadable here (a hub name offline, ...): notebook 01 says why
        return None


def _config(path: Any, overrides: Mapping[str, Any], seq_len: int):
    from ..errors import PretokError
    from ..launch.sweep import ALIASES
    from ..train.config import load_config

    keys = {ALIASES.get(k, k): v for k, v in overrides.items()}
    items = [f"{k}={json.dumps(v)}" for k, v in keys.items() if "." in k and not k.startswith(("run.", "data.path"))]
    try:
        return load_config(path, [*items, f"data.seq_len={seq_len}"])
    except PretokError:
        return None   # check_runs names the problem


def fit_runs(params: dict[str, Any], peak: float | None = None, measure: Measure | None = None
             ) -> dict[str, Any] | None:
    """Fit the runs of notebooks 03 and 04 (`RUN_KEYS`) that have a `train.time_budget_s` to it: the model
    changes (one model for both: the smaller) are added to each overrides mapping of `params` that does not set
    them (those of an earlier fit, `params["model_fit"]`, are taken back first, so a rerun's merged parameters are
    fitted afresh); returns the record for study.json (None when no run has a budget or nothing is known to size
    it by). `measure`: times candidate models' steps (`fit`); each model and size is timed once."""
    from dataclasses import asdict

    from .steps import resolve

    before = params.get("model_fit") or {}     # a fit made before (a rerun's record): taken back, redone
    prior = {k: {**(before.get("changed") or {}), **((before.get("runs") or {}).get(k, {}).get("changed") or {})}
             for k in RUN_KEYS}
    runs = {k: _taken_back(params[k], prior[k], (before.get("runs") or {}).get(k)) for k in RUN_KEYS
            if isinstance(params.get(k), dict) and isinstance(params[k].get("train.time_budget_s"), (int, float))}
    config = resolve(params.get("config") or "")
    if not runs or not config.is_file() or not (vocab := tokenizer_vocab(params)):
        return None
    peak = peak or machine_peak()
    sized: dict[str, tuple[dict, dict, bool]] = {}    # run: (its model, plan's sizes, model size set by the researcher)
    changes: list[dict] = []
    timed: dict[str, float] = {}

    def once(m: Mapping[str, Any], **sz: Any) -> float:   # 03's and 04's runs share a model: timed once
        key = json.dumps([m, sz], sort_keys=True, default=str)
        if key not in timed:
            timed[key] = measure(m, **sz)
        return timed[key]

    how: dict[str, dict[str, Any]] = {}   # run: the precision and torch threads its step is timed with
    for key, over in runs.items():
        cfg = _config(config, over, int(params.get("seq_len") or 256))
        if cfg is None:
            return None
        sized[key] = (asdict(cfg.model), {"vocab": vocab, "seq_len": cfg.data.seq_len,
                                          "micro_batch": cfg.data.micro_batch, "grad_accum": cfg.train.grad_accum,
                                          "eval_batches": cfg.eval.batches, "skip_steps": cfg.log.skip_steps,
                                          "peak": peak}, "model.hidden_size" in over)
        how[key] = {"precision": cfg.train.precision, "threads": run_threads(params, key)}
        timer = (lambda m, _h=how[key], **sz: once(m, **_h, **sz)) if measure else None
        changes.append(fit(sized[key][0], float(over["train.time_budget_s"]), sized[key][2], timer,
                           **sized[key][1])[0])
    halved = [c["model.hidden_size"] for c in changes if "model.hidden_size" in c]
    change = {} if not any(changes) else {"model.tie_embeddings": True,   # one model for both notebooks: the smaller
                                          **({"model.hidden_size": min(halved)} if halved else {})}
    record: dict[str, Any] = {}
    for key, (model, sizes, fixed) in sized.items():
        mine = {} if fixed else {k: v for k, v in change.items() if k not in runs[key]}
        params[key] = {**runs[key], **mine}
        before = plan(model, **sizes)
        final = {**model, **{k.removeprefix("model."): v for k, v in mine.items()}}
        after = plan(final, **sizes)
        step = timed.get(json.dumps([final, {**how[key], **sizes}], sort_keys=True, default=str))
        if step is None and measure is not None:    # the one model of both runs, not timed for this run's budget
            step = once(final, **how[key], **sizes)
        if step is not None:
            after = replace(after, measured_step_s=step)
        budget = float(runs[key]["train.time_budget_s"])
        extra: dict[str, Any] = {}
        if not fixed and after.needed_s > budget:   # the smallest model does not fit: fewer samples a step, else time
            after, extra = _fewer_samples_or_more_time(final, budget, sizes, runs[key],
                                                       (lambda m, _h=how[key], **sz: once(m, **_h, **sz))
                                                       if measure else None)
            params[key].update(extra)
            step = after.measured_step_s
        record[key] = {"budget_s": runs[key]["train.time_budget_s"], "steps_needed": before.steps,
                       "estimated_s_before": round(before.needed_s, 2), "estimated_s": round(after.needed_s, 2),
                       "fits": after.needed_s <= float(extra.get("train.time_budget_s", budget)),
                       **({"measured_step_s": round(step, 3)} if step is not None else {}),
                       **({"changed": extra} if extra else {}),
                       **({"kept": "model.hidden_size set in the overrides"} if fixed else {})}
    return {"vocab": vocab, "peak_flops": peak, "efficiency": EFFICIENCY, "changed": change, "runs": record}


def _taken_back(over: Mapping[str, Any], prior: Mapping[str, Any], record: Mapping[str, Any] | None) -> dict:
    """A run's overrides without what an earlier fit added (`prior`), its recorded budget restored."""
    out = {o: v for o, v in over.items() if o not in prior or prior[o] != v}
    if "train.time_budget_s" in prior and record and over.get("train.time_budget_s") == prior["train.time_budget_s"]:
        out["train.time_budget_s"] = record["budget_s"]
    return out


def _fewer_samples_or_more_time(model: Mapping[str, Any], budget_s: float, sizes: Mapping[str, Any],
                                over: Mapping[str, Any], measure: Measure | None) -> tuple[Plan, dict[str, Any]]:
    """For a run whose smallest model still does not fit `budget_s` (a large vocabulary on a small CPU: the logits
    of every token over the vocabulary dominate): halve `data.micro_batch` (down to 1, unless the overrides set
    it) until the steps it needs fit, else raise its `train.time_budget_s` to what they need (x1.2, whole
    seconds), so its rates rest on the measured steps the findings need rather than on none (a quick study with
    DeepSeek-V3's 128,815-token vocabulary on 2 vCPUs stopped every sweep point after 2 measured steps: no packing
    gain, no speedup in training). Returns the run's plan after it and the overrides changed."""
    import math

    extra: dict[str, Any] = {}
    mb = int(sizes["micro_batch"])

    def judged(sz: Mapping[str, Any]) -> Plan:
        p = plan(model, **sz)
        return replace(p, measured_step_s=measure(model, **sz)) if measure else p

    now = judged(sizes)
    while now.needed_s > budget_s and mb > 1 and "data.micro_batch" not in over and "micro_batch" not in over:
        mb //= 2
        extra["data.micro_batch"] = mb
        now = judged({**sizes, "micro_batch": mb})
    if now.needed_s > budget_s:
        extra["train.time_budget_s"] = math.ceil(now.needed_s * 1.2)
    return now, extra


def refit(params: dict[str, Any], echo: Callable[[str], None] | None = None) -> str:
    """`fit_runs` on the parameters a study runs with (a partial rerun's: the recorded ones with `--set`), its
    record in `params["model_fit"]`; the line that says what it changed or found ("" when nothing). `echo`: a line
    before each step timed (a large vocabulary's take seconds each)."""
    def measure(model: Mapping[str, Any], **sizes: Any) -> float:
        if echo:
            echo(f"== timing a training step of the runs' model (hidden {model.get('hidden_size')}, vocabulary "
                 f"{sizes.get('vocab'):,}) against their time budgets")
        return MEASURE(model, **sizes)

    if fitted := fit_runs(params, measure=measure):
        params["model_fit"] = fitted
    else:
        params.pop("model_fit", None)
    return fit_text(fitted)


MEASURE: Measure = measure_step   # what `refit` times steps with (tests put a stand-in here)


def fit_text(record: Mapping[str, Any] | None) -> str:
    """One line on what the budget check changed or found (empty when every run fits unchanged)."""
    if not record:
        return ""
    late = [f"{k} needs ~{r['estimated_s']:.0f} s of its {r['budget_s']:g} s" for k, r in record["runs"].items()
            if not r["fits"]]
    more = [f"{k}: " + ", ".join(f"{o}={v}" for o, v in r["changed"].items()) for k, r in record["runs"].items()
            if r.get("changed")]
    parts = []
    if record["changed"]:
        changed = ", ".join(f"{k}={v}" for k, v in record["changed"].items())
        parts.append(f"model made smaller to fit the runs' time budgets with a {record['vocab']:,}-token vocabulary: "
                     + changed)
    if more:
        parts.append("the smallest model still needed more than the time budget, so (for rates over at least "
                     "3 measured steps) " + "; ".join(more))
    if late:
        parts.append("does not fit its time budget (rates rest on few steps; raise train.time_budget_s or lower "
                     "seq_len / micro_batch): " + "; ".join(late))
    return "; ".join(parts)


def machine_peak() -> float:
    """FLOP/s the trainer's MFU divides by on this machine (first GPU, else the CPU's measured matmul peak)."""
    import torch

    from ..train.hardware import peak_flops

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return peak_flops(device, "fp32", None)[0]
