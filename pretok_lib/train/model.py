"""The model: a Llama-style causal LM from `ModelConfig` (transformers) and its FLOPs per token (the shape rules,
the formula and the peaks: flops.py)."""

from __future__ import annotations

import contextlib

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..errors import PretokError
from .config import ModelConfig
from .flops import flops_per_token, rounded_vocab
from .flops import intermediate_size as _intermediate

__all__ = ["build_model", "count_params", "flops_per_token", "hf_config", "intermediate_size", "matmul_params",
           "model_flops_per_token", "vocab_size_for"]


def vocab_size_for(cfg: ModelConfig, tokenizer_vocab: int) -> int:
    """The embedding size: explicit, or the tokenizer's rounded up to `vocab_multiple` (faster matmuls)."""
    if cfg.vocab_size is not None:
        if cfg.vocab_size < tokenizer_vocab:
            raise PretokError(f"model.vocab_size {cfg.vocab_size} is below the tokenizer's vocab {tokenizer_vocab} "
                              "(its ids would index past the embedding); leave it unset or make it larger")
        return cfg.vocab_size
    return rounded_vocab(tokenizer_vocab, cfg.vocab_multiple)


def intermediate_size(cfg: ModelConfig) -> int:
    return _intermediate(cfg.hidden_size, cfg.intermediate_size)


def hf_config(cfg: ModelConfig, vocab_size: int, seq_len: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=intermediate_size(cfg),
                       num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                       num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=max(seq_len, 2048),
                       initializer_range=cfg.init_std, tie_word_embeddings=cfg.tie_embeddings, use_cache=False,
                       rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def build_model(cfg: ModelConfig, vocab_size: int, seq_len: int, seed: int,
                device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """Weights initialised from `seed` alone (same on every rank and every run of a device type); fp32 master
    weights. On a GPU they are created and initialised there (a 1.5B model takes seconds to initialise on a CPU,
    milliseconds on the GPU), so a GPU run's first weights differ from a CPU run's of the same seed."""
    hf = hf_config(cfg, vocab_size, seq_len)
    hf._attn_implementation = "sdpa"
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if on_gpu else []):
        torch.manual_seed(seed)
        with device if on_gpu else contextlib.nullcontext():
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


def model_flops_per_token(model: torch.nn.Module, cfg: ModelConfig, seq_len: int) -> float:
    return flops_per_token(matmul_params(model), cfg.num_layers, cfg.hidden_size, seq_len)


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
