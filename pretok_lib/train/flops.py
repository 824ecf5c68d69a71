"""MFU's two terms, declared once and torch-free (the trainer, the stall prediction and the study budget read them
here): the model's shape rules and training FLOPs per token, and the accelerators' datasheet peaks.

    F = 6·N + 12·L·H·S   training FLOPs per token (forward + backward; N matmul parameters, L layers, H hidden,
                         S seq_len): 6·N for the weights, 12·L·H·S for the attention scores and their weighted sum
                         (PaLM appendix B; causal masking not discounted, as is customary)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ModelConfig

# ---------------------------------------------------------------- model shape and FLOPs


def intermediate_size(hidden: int, explicit: int | None = None) -> int:
    """The MLP width the trainer builds: explicit, or Llama's 8/3·hidden rounded up to a multiple of 64."""
    return explicit or -(-(8 * hidden // 3) // 64) * 64


def rounded_vocab(tokenizer_vocab: int, multiple: int) -> int:
    """The tokenizer's vocabulary rounded up to `multiple` (the embedding size when `model.vocab_size` is unset)."""
    m = max(1, multiple)
    return -(-tokenizer_vocab // m) * m


def matmul_params(hidden: int, layers: int, heads: int, kv_heads: int, vocab: int, intermediate: int | None = None
                  ) -> int:
    """Parameters in matmuls per token of the trainer's Llama model (attention q/k/v/o, SwiGLU, LM head; not the
    input embedding nor norms), computed from the config: equals `train.model.matmul_params` of the built model."""
    kv = hidden // heads * kv_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate_size(hidden, intermediate)
    return layers * per_layer + vocab * hidden


def flops_per_token(n_matmul_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6·N + 12·L·H·S (module docstring)."""
    return 6.0 * n_matmul_params + 12.0 * num_layers * hidden_size * seq_len


def config_flops_per_token(model: Mapping[str, Any], vocab: int, seq_len: int, vocab_multiple: int | None = None
                           ) -> float:
    """F for a config's `model` section (keys of `ModelConfig`, its defaults where missing) and a tokenizer
    vocabulary (rounded up to `vocab_multiple` like the trainer, unless `model.vocab_size` is set)."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    cfg = ModelConfig(**{k: v for k, v in model.items() if k in names})
    hidden, layers = int(cfg.hidden_size), int(cfg.num_layers)
    multiple = cfg.vocab_multiple if vocab_multiple is None or "vocab_multiple" in model else vocab_multiple
    v = cfg.vocab_size or rounded_vocab(vocab, int(multiple))
    n = matmul_params(hidden, layers, int(cfg.num_heads), int(cfg.num_kv_heads), int(v), cfg.intermediate_size)
    return flops_per_token(n, layers, hidden, seq_len)


# ---------------------------------------------------------------- accelerator peaks


@dataclass(frozen=True)
class Accelerator:
    """Dense (no sparsity) tensor-core peaks of one device in TFLOP/s, from its vendor datasheet (`source`).
    `match`: the substring of `torch.cuda.get_device_name()` that names it (default: `name`)."""

    name: str
    bf16_tflops: float
    source: str
    fp16_tflops: float | None = None
    tf32_tflops: float | None = None   # fp32 matmuls on TF32 tensor cores (no TF32: the fp32 matrix figure)
    match: str = ""

    @property
    def key(self) -> str:
        return self.match or self.name

    def tflops(self, precision: str) -> float | None:
        """The peak for a run's precision (fp32: TF32)."""
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.tf32_tflops}.get(precision)


_NV = "NVIDIA {} datasheet (nvidia.com/en-us/data-center): "
_HALF = "; dense = half the with-sparsity figures"
# Matched in this order by substring of the device name, so a name that contains another (GH200 ⊃ H200,
# H200 NVL ⊃ H200, A100 ⊃ A10, L40S ⊃ L40 ⊃ L4) comes first.
ACCELERATOR_TABLE: tuple[Accelerator, ...] = (
    Accelerator("GB200", 2500.0, _NV.format("GB200 NVL72") + "FP16/BF16 Tensor Core 5 PFLOPS, TF32 2.5 PFLOPS "
                "per GPU with sparsity" + _HALF, 2500.0, 1250.0),
    Accelerator("B200", 2250.0, _NV.format("HGX B200") + "FP16/BF16 Tensor Core 4.5 PFLOPS, TF32 2.25 PFLOPS per "
                "GPU with sparsity" + _HALF, 2250.0, 1125.0),
    Accelerator("GH200", 989.0, _NV.format("GH200 Grace Hopper") + "H100 GPU, BF16/FP16 1,979 TFLOPS, TF32 989 "
                "TFLOPS with sparsity" + _HALF, 989.0, 494.5),
    Accelerator("H200 NVL", 835.5, _NV.format("H200") + "H200 NVL: BF16/FP16 Tensor Core 1,671 TFLOPS, TF32 835 "
                "TFLOPS with sparsity" + _HALF, 835.5, 417.5),
    Accelerator("H200", 989.0, _NV.format("H200") + "H200 SXM: BF16/FP16 Tensor Core 1,979 TFLOPS, TF32 989 TFLOPS "
                "with sparsity" + _HALF, 989.0, 494.5),
    Accelerator("H100 PCIe", 756.0, _NV.format("H100") + "H100 PCIe: BF16/FP16 Tensor Core 1,513 TFLOPS, TF32 756 "
                "TFLOPS with sparsity" + _HALF, 756.0, 378.0),
    Accelerator("H100 NVL", 835.0, _NV.format("H100") + "H100 NVL: BF16/FP16 Tensor Core 1,671 TFLOPS, TF32 835 "
                "TFLOPS with sparsity" + _HALF, 835.0, 417.5),
    Accelerator("H100 SXM", 989.0, _NV.format("H100") + "H100 SXM5: BF16/FP16 Tensor Core 1,979 TFLOPS, TF32 989 "
                "TFLOPS with sparsity" + _HALF, 989.0, 494.5, match="H100"),
    Accelerator("A100", 312.0, _NV.format("A100") + "BF16/FP16 Tensor Core 312 TFLOPS, TF32 156 TFLOPS (dense)",
                312.0, 156.0),
    Accelerator("L40S", 362.05, _NV.format("L40S") + "BF16/FP16 Tensor Core 362.05 TFLOPS, TF32 183 TFLOPS "
                "(dense; 733 / 366 with sparsity)", 362.05, 183.0),
    Accelerator("L40", 181.05, _NV.format("L40") + "BF16/FP16 Tensor Core 181.05 TFLOPS, TF32 90.5 TFLOPS (dense)",
                181.05, 90.5),
    Accelerator("L4", 121.0, _NV.format("L4") + "BF16/FP16 Tensor Core 242 TFLOPS, TF32 120 TFLOPS with sparsity"
                + _HALF, 121.0, 60.0),
    Accelerator("A10G", 70.0, "AWS EC2 G5 (NVIDIA A10G) specifications: BF16/FP16 Tensor Core 70 TFLOPS, TF32 35 "
                "TFLOPS (dense)", 70.0, 35.0),
    Accelerator("A10", 125.0, _NV.format("A10") + "BF16/FP16 Tensor Core 125 TFLOPS, TF32 62.5 TFLOPS (dense; 250 / "
                "125 with sparsity)", 125.0, 62.5),
    Accelerator("V100", 125.0, _NV.format("V100") + "Tensor Core (FP16) 125 TFLOPS, FP32 15.7 TFLOPS (SXM2); no bf16 "
                "or TF32 tensor cores: bf16 lists the FP16 figure, TF32 the FP32 one", 125.0, 15.7),
    Accelerator("MI300X", 1307.0, "AMD Instinct MI300X datasheet (amd.com): BF16/FP16 1,307.4 TFLOPS, TF32 653.7 "
                "TFLOPS (dense)", 1307.0, 653.7),
    Accelerator("MI250X", 383.0, "AMD Instinct MI250X datasheet (amd.com): BF16/FP16 383 TFLOPS, FP32 matrix 95.7 "
                "TFLOPS (no TF32)", 383.0, 95.7),
)
ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in ACCELERATOR_TABLE}


def match_accelerator(device_name: str) -> Accelerator | None:
    """The first table row whose `key` is a substring of a device name (`torch.cuda.get_device_name()`)."""
    return next((a for a in ACCELERATOR_TABLE if a.key in device_name), None)
