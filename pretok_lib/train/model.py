"""The model: a Llama-style causal LM from `ModelConfig` (transformers), its FLOPs per token and MFU peak table."""

from __future__ import annotations

import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .config import ModelConfig

# Dense peak TFLOP/s per device for bf16/fp16 tensor-core math (fp32 runs use the TF32 figure where one
# exists). Vendor datasheets, without sparsity. Matched by substring of torch.cuda.get_device_name().
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "GH200": {"bf16": 989.0, "fp32": 494.5},
    "H200": {"bf16": 989.0, "fp32": 494.5},
    "H100 PCIe": {"bf16": 756.0, "fp32": 378.0},
    "H100": {"bf16": 989.0, "fp32": 494.5},
    "A100": {"bf16": 312.0, "fp32": 156.0},
    "L40S": {"bf16": 362.0, "fp32": 183.0},
    "L4": {"bf16": 121.0, "fp32": 60.0},
    "A10G": {"bf16": 70.0, "fp32": 35.0},
    "V100": {"bf16": 125.0, "fp32": 15.7},
    "MI300X": {"bf16": 1307.0, "fp32": 653.7},
    "MI250X": {"bf16": 383.0, "fp32": 95.7},
}


def vocab_size_for(cfg: ModelConfig, tokenizer_vocab: int) -> int:
    """The embedding size: explicit, or the tokenizer's rounded up to `vocab_multiple` (faster matmuls)."""
    if cfg.vocab_size is not None:
        if cfg.vocab_size < tokenizer_vocab:
            raise ValueError(f"model.vocab_size {cfg.vocab_size} < tokenizer vocab {tokenizer_vocab}")
        return cfg.vocab_size
    m = max(1, cfg.vocab_multiple)
    return -(-tokenizer_vocab // m) * m


def intermediate_size(cfg: ModelConfig) -> int:
    return cfg.intermediate_size or -(-(8 * cfg.hidden_size // 3) // 64) * 64


def hf_config(cfg: ModelConfig, vocab_size: int, seq_len: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=intermediate_size(cfg),
                       num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                       num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=max(seq_len, 2048),
                       initializer_range=cfg.init_std, tie_word_embeddings=cfg.tie_embeddings, use_cache=False,
                       rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def build_model(cfg: ModelConfig, vocab_size: int, seq_len: int, seed: int,
                device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """Weights initialised from `seed` alone (same on every rank and every run); fp32 master weights."""
    hf = hf_config(cfg, vocab_size, seq_len)
    hf._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(hf)
    return model.to(device)


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in a matmul per token: all but the input embedding table (and norms, which
    are O(hidden)). With tied embeddings the output projection still counts once."""
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    n = sum(p.numel() for name, p in model.named_parameters() if p.dim() >= 2 and p is not emb)
    if out is emb:  # tied: the LM head matmul is real compute
        n += out.numel()
    return n


def flops_per_token(n_matmul_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6·N for the weights plus 12·L·H·S for attention scores
    and their weighted sum (PaLM appendix B; causal masking not discounted, as is customary)."""
    return 6.0 * n_matmul_params + 12.0 * num_layers * hidden_size * seq_len


def model_flops_per_token(model: torch.nn.Module, cfg: ModelConfig, seq_len: int) -> float:
    return flops_per_token(matmul_params(model), cfg.num_layers, cfg.hidden_size, seq_len)


def measured_matmul_flops(device: torch.device, precision: str, seconds: float = 0.3) -> float:
    """FLOP/s of a large square matmul in the run's precision on this device: the practical peak used for
    MFU where no datasheet figure applies (CPUs)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    n = 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        reps += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 2.0 * n**3 * reps / (time.perf_counter() - start)


def peak_flops(device: torch.device, precision: str, override_tflops: float | None) -> tuple[float, str]:
    """(per-device peak FLOP/s for MFU, where it came from): the override, this GPU's datasheet entry, or a
    measured matmul peak (CPUs and unknown GPUs)."""
    if override_tflops:
        return override_tflops * 1e12, "hardware.peak_tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in PEAK_TFLOPS.items():
            if key in name:
                return peaks["fp32" if precision == "fp32" else "bf16"] * 1e12, f"datasheet {key}"
    with torch.random.fork_rng(devices=[]):
        return measured_matmul_flops(device, precision), "measured 1024x1024 matmul"


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
