"""MoDA's parameter and FLOP counts against closed forms (hand-derived), at the lab's and the paper's size."""

from __future__ import annotations

import pytest
import torch

from icml26.moda import MoDAAdapter, n_params
from icml26.moda.overhead import PAPER_MODA, moda_flops


def moda_params_by_hand(E, F, L):
    attention = 3 * E * E + 3 * E + E * E + E                  # packed in-projection + out-projection
    layer = 2 * attention + (E * F + F) + (F * E + E) + 3 * 2 * E
    return L * layer + E * E                                   # + the bias-free mask head W


def moda_flops_by_hand(E, F, L, N, M):
    self_attn = 2 * N * E * 3 * E + 2 * 2 * N * N * E + 2 * N * E * E
    cross = 2 * N * E * E + 2 * M * E * 2 * E + 2 * 2 * N * M * E + 2 * N * E * E
    ffn = 2 * 2 * N * E * F
    return L * (self_attn + cross + ffn) + 2 * N * E * E


@pytest.mark.parametrize(("E", "F", "L", "N", "M"), [(64, 16, 2, 4, 10), (32, 8, 1, 9, 3)])
def test_counts_at_the_lab_size(E, F, L, N, M):
    moda = MoDAAdapter(E, num_heads=4, num_layers=L, ff_dim=F)
    assert n_params(moda) == moda_params_by_hand(E, F, L)
    assert moda_flops(moda, N, M, device="cpu") == moda_flops_by_hand(E, F, L, N, M)


def test_counts_at_the_paper_size():
    with torch.device("meta"):
        moda = MoDAAdapter(**PAPER_MODA)
    E, F, L = 4096, 1024, 2
    assert n_params(moda) == moda_params_by_hand(E, F, L) == 302_114_816
    assert moda_flops(moda, 576, 64) == moda_flops_by_hand(E, F, L, 576, 64)


def test_paper_scale_overhead_equals_the_closed_form():
    pytest.importorskip("transformers")
    from icml26.moda.overhead import paper_scale_overhead

    out = paper_scale_overhead(text_tokens=64)
    # CLIP ViT-L/14-336 (577 tokens) + mlp2x projector + LLaMA-3.1-8B (GQA 8/32, MLP 14336, vocab 128256)
    E, inter, V, h, kvh, S = 4096, 14336, 128256, 32, 8, 576 + 64
    kv = E * kvh // h
    llm = 32 * (S * (2 * 2 * E * E + 2 * 2 * E * kv + 3 * 2 * E * inter) + 2 * 2 * S * S * E) + 2 * S * E * V
    D, T = 1024, 577
    vision = 24 * (T * (4 * 2 * D * D + 2 * 2 * D * 4 * D) + 2 * 2 * T * T * D) + 2 * 576 * 3 * 14 * 14 * D
    projector = 2 * 576 * (1024 * 4096 + 4096 * 4096)
    assert out["base_gflops"] * 1e9 == pytest.approx(llm + vision + projector, rel=1e-12)
    assert out["flops_overhead"] == pytest.approx(moda_flops_by_hand(E, 1024, 2, 576, 64) / (llm + vision + projector),
                                                  rel=1e-12)
    vision_params = 24 * (4 * (D * D + D) + D * 4 * D + 4 * D + 4 * D * D + D + 4 * D) + 3 * 14 * 14 * D + D \
        + 577 * D + 2 * 2 * D
    llm_params = 32 * (2 * E * E + 2 * E * kv + 3 * E * inter + 2 * E) + 2 * V * E + E
    projector_params = 1024 * 4096 + 4096 + 4096 * 4096 + 4096
    assert out["base_params"] == vision_params + llm_params + projector_params
    assert out["params_overhead"] == pytest.approx(302_114_816 / out["base_params"], rel=1e-12)
    with pytest.raises(ValueError, match="llm"):
        paper_scale_overhead(llm="gpt-5")
