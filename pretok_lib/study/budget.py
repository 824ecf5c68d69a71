"""Study runs that fit their time budget whatever the vocabulary (docs/STUDY.md "Time budgets").

A study run stops after the step that passes `train.time_budget_s` (quick: 45 s for notebook 03, 15 s per sweep
point). With a large vocabulary the LM head dominates the step: the quick profile's "tiny" model had 33.5M
parameters with a 129k vocabulary, steps of seconds, sweep points of 68-203 s, each rate a mean over ~2 steps. So
before anything runs, a step's time is estimated (training FLOPs per token x tokens per step, against this
machine's measured matmul peak, `train.hardware.peak_flops`, at `EFFICIENCY` of it), and where the steps a run
needs do not fit its budget the model is made smaller (hidden size halved, embeddings tied) until they do: the
change is applied to the runs' overrides and recorded in study.json (`parameters.model_fit`). A model size the
researcher set (`model.hidden_size` in the overrides) is kept, and the record says it does not fit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# share of the measured matmul peak a tiny model's CPU training step reaches: the quick demo's 42.7 GFLOP/s
# (4,524 tokens/s x 9.44 MFLOP/token) is ~10% of the 438 GFLOP/s `peak_flops` measures on its 2-vCPU machine
EFFICIENCY = 0.1
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

    @property
    def step_s(self) -> float:
        return self.flops_per_token * self.tokens_per_step / (self.peak * EFFICIENCY)

    @property
    def eval_s(self) -> float:   # forward only: a third of the training FLOPs
        return self.flops_per_token / 3 * self.eval_tokens / (self.peak * EFFICIENCY)

    @property
    def needed_s(self) -> float:
        return self.steps * self.step_s + self.eval_s


def plan(model: Mapping[str, Any], vocab: int, seq_len: int, micro_batch: int, grad_accum: int = 1,
         eval_batches: int = 4, skip_steps: int = 2, peak: float = 1e11) -> Plan:
    """The `Plan` of a run of `model` (keys of train.config.ModelConfig) with a tokenizer of `vocab` tokens."""
    from ..analysis.stall import config_flops_per_token
    from .measured import MIN_MEASURED_STEPS

    return Plan(config_flops_per_token(model, vocab, seq_len), micro_batch * seq_len * grad_accum,
                skip_steps + MIN_MEASURED_STEPS + 1, eval_batches * micro_batch * seq_len * grad_accum, peak)


def fit(model: Mapping[str, Any], budget_s: float, fixed: bool = False, **sizes: Any) -> tuple[dict, Plan]:
    """(the model changes that make a run fit `budget_s`, its `Plan` after them): none when it fits; else
    embeddings tied and the hidden size halved (down to MIN_HEAD_DIM per head) until it fits. `fixed`: the
    researcher set the hidden size, so nothing changes. `sizes`: `plan`'s other arguments."""
    now = plan(model, **sizes)
    if fixed or now.needed_s <= budget_s:
        return {}, now
    heads, hidden = int(model.get("num_heads", 4)), int(model.get("hidden_size", 128))
    changed: dict[str, Any] = {"model.tie_embeddings": True}
    while now.needed_s > budget_s and hidden // 2 >= heads * MIN_HEAD_DIM and (hidden // 2) % heads == 0:
        hidden //= 2
        changed["model.hidden_size"] = hidden
        now = plan({**model, "hidden_size": hidden}, **sizes)
    return changed, now


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
    from ..sweep import ALIASES
    from ..train.config import load_config

    keys = {ALIASES.get(k, k): v for k, v in overrides.items()}
    items = [f"{k}={json.dumps(v)}" for k, v in keys.items() if "." in k and not k.startswith(("run.", "data.path"))]
    try:
        return load_config(path, [*items, f"data.seq_len={seq_len}"])
    except PretokError:
        return None   # check_runs names the problem


def fit_runs(params: dict[str, Any], peak: float | None = None) -> dict[str, Any] | None:
    """Fit the runs of notebooks 03 and 04 (`RUN_KEYS`) that have a `train.time_budget_s` to it: the model
    changes (one model for both: the smaller) are added to each overrides mapping of `params` that does not set
    them (those of an earlier fit, `params["model_fit"]`, are taken back first, so a rerun's merged parameters are
    fitted afresh); returns the record for study.json (None when no run has a budget or nothing is known to size
    it by)."""
    from dataclasses import asdict

    from .steps import resolve

    prior = (params.get("model_fit") or {}).get("changed") or {}   # a fit made before (a rerun's record): redone
    runs = {k: {o: v for o, v in params[k].items() if o not in prior or prior[o] != v} for k in RUN_KEYS
            if isinstance(params.get(k), dict) and isinstance(params[k].get("train.time_budget_s"), (int, float))}
    config = resolve(params.get("config") or "")
    if not runs or not config.is_file() or not (vocab := tokenizer_vocab(params)):
        return None
    peak = peak or machine_peak()
    sized: dict[str, tuple[dict, dict, bool]] = {}    # run: (its model, plan's sizes, model size set by the researcher)
    changes: list[dict] = []
    for key, over in runs.items():
        cfg = _config(config, over, int(params.get("seq_len") or 256))
        if cfg is None:
            return None
        sized[key] = (asdict(cfg.model), {"vocab": vocab, "seq_len": cfg.data.seq_len,
                                          "micro_batch": cfg.data.micro_batch, "grad_accum": cfg.train.grad_accum,
                                          "eval_batches": cfg.eval.batches, "skip_steps": cfg.log.skip_steps,
                                          "peak": peak}, "model.hidden_size" in over)
        changes.append(fit(sized[key][0], float(over["train.time_budget_s"]), sized[key][2], **sized[key][1])[0])
    halved = [c["model.hidden_size"] for c in changes if "model.hidden_size" in c]
    change = {} if not any(changes) else {"model.tie_embeddings": True,   # one model for both notebooks: the smaller
                                          **({"model.hidden_size": min(halved)} if halved else {})}
    record: dict[str, Any] = {}
    for key, (model, sizes, fixed) in sized.items():
        mine = {} if fixed else {k: v for k, v in change.items() if k not in runs[key]}
        params[key] = {**runs[key], **mine}
        before = plan(model, **sizes)
        after = plan({**model, **{k.removeprefix("model."): v for k, v in mine.items()}}, **sizes)
        record[key] = {"budget_s": runs[key]["train.time_budget_s"], "steps_needed": before.steps,
                       "estimated_s_before": round(before.needed_s, 2), "estimated_s": round(after.needed_s, 2),
                       "fits": after.needed_s <= runs[key]["train.time_budget_s"],
                       **({"kept": "model.hidden_size set in the overrides"} if fixed else {})}
    return {"vocab": vocab, "peak_flops": peak, "efficiency": EFFICIENCY, "changed": change, "runs": record}


def refit(params: dict[str, Any]) -> str:
    """`fit_runs` on the parameters a study runs with (a partial rerun's: the recorded ones with `--set`), its
    record in `params["model_fit"]`; the line that says what it changed or found ("" when nothing)."""
    if fitted := fit_runs(params):
        params["model_fit"] = fitted
    else:
        params.pop("model_fit", None)
    return fit_text(fitted)


def fit_text(record: Mapping[str, Any] | None) -> str:
    """One line on what the budget check changed or found (empty when every run fits unchanged)."""
    if not record:
        return ""
    late = [f"{k} needs ~{r['estimated_s']:.0f} s of its {r['budget_s']:g} s" for k, r in record["runs"].items()
            if not r["fits"]]
    parts = []
    if record["changed"]:
        changed = ", ".join(f"{k}={v}" for k, v in record["changed"].items())
        parts.append(f"model made smaller to fit the runs' time budgets with a {record['vocab']:,}-token vocabulary: "
                     + changed)
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
