"""The comparison arms: parameter matching, identity start, FiLM and the additive arm by hand, bad input."""

from __future__ import annotations

import pytest
import torch

from icml26.moda import AdditiveCrossAttention, FiLM, MoDAAdapter, ResidualMLP, SelfAttentionGate, n_params


@pytest.mark.parametrize("embed_dim", [32, 64])
def test_every_arm_has_the_parameters_of_moda(embed_dim):
    moda = MoDAAdapter(embed_dim, num_heads=4, num_layers=2, ff_dim=embed_dim // 4)
    size = n_params(moda)
    assert n_params(SelfAttentionGate(embed_dim, num_heads=4, num_layers=2, ff_dim=embed_dim // 4)) == size
    assert n_params(AdditiveCrossAttention(embed_dim, 4, 2, embed_dim // 4)) == size
    for arm in (ResidualMLP(embed_dim, target_params=size), FiLM(embed_dim, target_params=size)):
        assert abs(n_params(arm) - size) / size < 0.005


def test_residual_arms_start_as_the_identity():
    v, t = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
    for arm in (ResidualMLP(32, hidden=20), FiLM(32, hidden=20), AdditiveCrossAttention(32, 4, 1, 8)):
        torch.testing.assert_close(arm.eval()(v, t), v)


def test_film_by_hand():
    """gamma and beta from the mean of the unpadded instruction tokens, the same for every visual token."""
    film = FiLM(2, hidden=2)
    with torch.no_grad():
        film.net[0].weight.copy_(torch.eye(2))
        film.net[0].bias.zero_()
        film.net[2].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]))
        film.net[2].bias.zero_()
    film.net[1] = torch.nn.Identity()
    v = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    t = torch.tensor([[[2.0, 4.0], [0.0, 2.0], [100.0, 100.0]]])
    pad = torch.tensor([[False, False, True]])
    # mean of the unpadded tokens = (1, 3): dgamma = (1, 0), beta = (0, 3)
    expected = torch.tensor([[[2.0, 5.0], [6.0, 7.0]]])
    torch.testing.assert_close(film(v, t, pad), expected)


def test_additive_arm_reads_the_instruction_and_adds():
    torch.manual_seed(0)
    arm = AdditiveCrossAttention(16, 4, 1, 8).eval()
    torch.nn.init.normal_(arm.mask_head.weight)
    v, t = torch.randn(1, 4, 16), torch.randn(1, 3, 16)
    delta = arm(v, t) - v
    torch.testing.assert_close(delta, arm.mask_head(arm.decoder(tgt=v, memory=t)))
    assert not torch.allclose(arm(v, t), arm(v, t.flip(1).flip(-1)))


def test_text_free_arms_ignore_the_instruction():
    torch.manual_seed(1)
    v, t = torch.randn(2, 4, 16), torch.randn(2, 3, 16)
    mlp = ResidualMLP(16, hidden=8)
    torch.nn.init.normal_(mlp.net[2].weight)
    for arm in (mlp.eval(), SelfAttentionGate(16, num_heads=4, num_layers=1, ff_dim=8).eval()):
        torch.testing.assert_close(arm(v, t), arm(v, torch.randn_like(t)))


def test_arms_refuse_bad_input_like_moda():
    v, t = torch.randn(2, 4, 16), torch.randn(2, 3, 8)
    for arm in (ResidualMLP(16, hidden=4), FiLM(16, hidden=4), AdditiveCrossAttention(16, 4, 1, 8)):
        with pytest.raises(ValueError, match="text has width 8"):
            arm(v, t)
    with pytest.raises(ValueError, match="exactly one"):
        ResidualMLP(16)
    with pytest.raises(ValueError, match="too small"):
        FiLM(16, target_params=10)
