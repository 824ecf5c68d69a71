"""Model construction, FLOPs per token (hand-checked on the original study's model), learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from pretok_lib.train.config import ModelConfig, load_config
from pretok_lib.train.loop import lr_factor
from pretok_lib.train.model import build_model, flops_per_token, matmul_params, vocab_size_for

from ..conftest import ROOT


def test_flops_per_token_of_the_study_model_by_hand():
    cfg = load_config(ROOT / "configs" / "study.yaml", ["data.path=x"])
    m = cfg.model
    with torch.device("meta"):
        model = build_model(m, 131072, 2048, seed=0, device="meta")
    # By hand: per layer q,o 2048x2048; k,v 2048x(4 heads x 128); MLP 3 x 2048x8192; untied LM head 131072x2048.
    per_layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192
    n = 16 * per_layer + 131072 * 2048
    assert n == 1_241_513_984
    assert matmul_params(model) == n
    expected = 6 * n + 12 * 16 * 2048 * 2048        # 6N + 12·L·H·S
    assert flops_per_token(matmul_params(model), m.num_layers, m.hidden_size, 2048) == expected
    # MFU of, e.g., 4 GH200 at 10k tokens/s/device: 8.25e13 / 9.89e14
    assert expected == pytest.approx(8.254e9, rel=1e-3)
    assert expected * 10_000 / 989e12 == pytest.approx(0.08346, rel=1e-3)


def test_tied_embeddings_count_the_head_once():
    cfg = ModelConfig(hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, tie_embeddings=True)
    model = build_model(cfg, 1000, 32, seed=0)
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert matmul_params(model) == per_layer + 1000 * 64


def test_same_seed_same_weights_and_vocab_rounding():
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    a, b, c = (build_model(cfg, 100, 16, seed=s) for s in (3, 3, 4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert vocab_size_for(cfg, 50257) == 50304 and vocab_size_for(cfg, 64) == 64


def test_lr_schedule_warmup_cosine_constant():
    cfg = load_config(None, ["data.path=x", "train.steps=110", "train.warmup_steps=10", "train.min_lr_ratio=0.1"])
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.55)                 # half-way down the cosine
    assert lr_factor(110, cfg) == pytest.approx(0.1)
    cfg.train.schedule = "constant"
    assert lr_factor(100, cfg) == 1.0


def test_a_vocab_below_the_tokenizers_is_one_line_naming_the_key():
    """It was a ValueError: a traceback from `pretok train` (exit 1) instead of the config's one line (exit 2)."""
    from pretok_lib.errors import PretokError

    with pytest.raises(PretokError, match=r"^model.vocab_size 1000 is below the tokenizer's vocab 50257"):
        vocab_size_for(ModelConfig(vocab_size=1000), 50257)
