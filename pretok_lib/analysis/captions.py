"""One-sentence captions of the study's figures (by figure file name, as `figures.all_figures` and the study's
benchmark figures name them), and what a figure measured on CPU cannot show. Rendered under each figure of the
report (`pretok_lib.study.present.show_figure`). Plotly-free."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

CAPTIONS: dict[str, str] = {
    "runs_status": "Every run of the study with its settings, status and main numbers; failed runs red, incomplete "
                   "ones yellow.",
    "throughput": "Training tokens/s and effective tokens/s (labels that count toward the loss) per data path; the "
                  "label on each effective bar is its ratio to the on-the-fly padded path with the same settings.",
    "mfu": "Model FLOPs utilisation per data path: model FLOP/s achieved over the device's peak, whose source is "
           "printed above the bars.",
    "data_stall": "Share of each training step spent waiting for the next batch, per data path.",
    "padding": "Padding (padded paths) or masked labels (packed paths) per data path, as a share of the token "
               "slots the runs trained on after warm-up (a dataset's manifest counts all its rows: another "
               "number).",
    "loss_curves": "Train loss (left) and validation loss (right) against the step, one line per run; failed or "
                   "incomplete runs dashed.",
    "val_loss_by_batch": "Validation loss against the step, one line per run, colored by the global batch size.",
    "ddp_scaling": "Throughput against the number of DDP ranks (left, dotted: linear) and the scaling efficiency "
                   "T(N) / (N x T(1)) (right), per data path.",
    "time_to_target": "Wall time until the validation loss first reaches the target (interpolated; the title gives "
                      "it) per data path, labelled with the speedup over on-the-fly padded: solid bars on packed "
                      "memmap windows, hatched 'own layout' bars on padded rows (padded paths).",
    "storage": "Bytes on disk per stored token of each pretokenized output (label: total size; 'hf-arrow': the "
               "Hugging Face datasets Arrow cache that datasets.map writes, for reference).",
    "tokenization_speedup": "Speedup of pretokenizing over tokenizing on the fly, measured in isolation (tokenize "
                            "benchmark) and in training (effective tokens/s), per pretokenized path.",
    "precision": "Mixed against full precision for otherwise equal runs: effective tokens/s, peak memory, final "
                 "validation loss and perplexity.",
    "stall_prediction": "Data stall predicted per GPU rank from this machine's loader throughput and the target "
                        "model's consumption at its MFU range (left), and the loader's headroom supply / "
                        "consumption (right, below 1 it stalls).",
    "tokenize_throughput": "Tokenization throughput (MB of text per second, log scale) of each method, labelled "
                           "with the speedup over the per-document tokenizer loop.",
    "loader_throughput": "Loader-only effective tokens/s of each data path per DataLoader worker count (log "
                         "scale), against nanoGPT's raw-memmap get_batch (dashed).",
    "compression": "Parquet codecs: bytes on disk per token (left) and warm-cache read tokens/s (right) per "
                   "format.",
    "run_curves": "One run over its steps: loss, tokens/s, data-stall share and learning rate.",
}

# What a figure measured on CPU (gloo, a few cores) cannot show; `{cpus}` is the cores the runs saw.
CPU_NOTES: dict[str, str] = {
    "ddp_scaling": "Measured on CPU: the gloo ranks share the machine's {cpus} cores, so adding a rank adds no "
                   "compute; this is not GPU scaling.",
    "data_stall": "Measured on CPU: the model step is slow, so even slow loaders keep up and the stall is small; "
                  "a GPU step is orders of magnitude faster, see the stall prediction.",
    "throughput": "Measured on CPU: the model step dominates, so data-path differences shrink against what a GPU "
                  "would show; see the stall prediction.",
    "mfu": "Measured on CPU: MFU against this CPU's measured matmul peak, not a GPU's.",
    "run_curves": "Measured on CPU: the data-stall share is small because the model step is slow; see the stall "
                  "prediction.",
    "tokenization_speedup": "Measured on CPU: in training the slow model step hides most of the isolated speedup; "
                            "the stall prediction estimates it for GPUs.",
    "time_to_target": "Measured on CPU: the model step dominates the wall time.",
}
STALL_ANCHOR = "fig-stall_prediction"  # the notebook-05 figure the CPU notes point to


def runs_device(runs: Iterable[Any]) -> dict[str, Any]:
    """Where the runs ran: {"cpu": True when any run's run.json says device "cpu", "cpus": its core count}."""
    infos = [getattr(r, "info", {}) or {} for r in runs]
    cpu = [i for i in infos if i.get("device") == "cpu"]
    return {"cpu": bool(cpu), "cpus": max((int(i["cpus"]) for i in cpu if i.get("cpus")), default=None)}


def caption_text(name: str, cpu: bool = False, cpus: int | None = None) -> str:
    """The caption of figure `name` (plus its CPU note when measured on CPU); a figure without one gets its name."""
    text = CAPTIONS.get(name, f"Figure {name.replace('_', ' ')}.")
    if cpu and name in CPU_NOTES:
        text += " " + CPU_NOTES[name].format(cpus=cpus or "few")
    return text


def caption_html(name: str, cpu: bool = False, cpus: int | None = None) -> str:
    """The caption as an HTML paragraph (class `pretok-caption`); CPU notes link to the stall prediction."""
    text = html.escape(caption_text(name, cpu, cpus))
    if cpu and name in CPU_NOTES and "stall prediction" in text and name != "stall_prediction":
        text = text.replace("the stall prediction", f'<a href="#{STALL_ANCHOR}">the stall prediction</a>', 1)
    label = html.escape(name.replace("_", " "))
    return (f'<p class="pretok-caption" style="margin:0.2em 0 1.6em;color:#333;font-size:0.95em">'
            f"<b>Figure: {label}.</b> {text}</p>")


def details_html(summary: str, body_html: str, open_: bool = False) -> str:
    """A folded block: `<details>` with `summary` (text) over `body_html` (already HTML)."""
    return (f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>\n{body_html}\n"
            f"</details>")


def details_text(summary: str, text: str) -> str:
    """Long printed text folded away: `<details>` with a `<pre>` body."""
    return details_html(summary, f'<pre style="font-size:0.85em">{html.escape(text)}</pre>')
