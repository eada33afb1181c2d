"""MoDAAdapter against a literal float64 reference, finite differences and its invariants; bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from icml26.moda import MoDAAdapter, SelfAttentionGate
from icml26.moda.reference import moda_forward


def inputs(B=2, N=5, M=4, E=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(B, N, E, generator=g, dtype=dtype)
    t = torch.randn(B, M, E, generator=g, dtype=dtype)
    pad = torch.zeros(B, M, dtype=torch.bool)
    pad[-1, M // 2:] = True
    return v, t, pad


def adapter(cls=MoDAAdapter, seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"num_heads": 4, "num_layers": 2, "ff_dim": 8, **kw}
    return cls(16, **kw).double().eval()


@pytest.mark.parametrize("bias", [None, 0.7])
@pytest.mark.parametrize("use_pad", [True, False])
def test_matches_the_literal_reference(bias, use_pad):
    m = adapter(gate_bias_init=bias, seed=1)
    v, t, pad = inputs(seed=2)
    pad = pad if use_pad else None
    out = m(v, t, pad)
    ref, gate = moda_forward(m.state_dict(), v.numpy(), t.numpy(), None if pad is None else pad.numpy(),
                             num_heads=4, num_layers=2)
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.last_mask.detach().numpy(), gate, rtol=0, atol=1e-12)


def test_text_free_gate_matches_the_reference_and_ignores_the_text():
    m = adapter(SelfAttentionGate, seed=3, num_layers=1)
    v, t, pad = inputs(seed=4)
    ref, _ = moda_forward(m.state_dict(), v.numpy(), t.numpy(), pad.numpy(), num_heads=4, num_layers=1,
                          memory="visual")
    np.testing.assert_allclose(m(v, t, pad).detach().numpy(), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(m(v, t, pad), m(v, torch.randn_like(t), None))


def test_official_layout_and_init():
    """State-dict names and shapes of the official module (nn.TransformerDecoder + bias-free mask_head, Xavier)."""
    m = MoDAAdapter(64, num_heads=4, num_layers=2, ff_dim=16)
    keys = set(m.state_dict())
    assert "mask_head.weight" in keys and "mask_head.bias" not in keys
    assert "decoder.layers.1.multihead_attn.in_proj_weight" in keys and "decoder.layers.2.norm1.weight" not in keys
    bound = math.sqrt(6.0 / (64 + 64))  # Xavier-uniform
    w = m.mask_head.weight.detach()
    assert float(w.abs().max()) <= bound and float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.1)
    assert m.decoder.layers[0].norm_first is False  # post-LN, as nn.TransformerDecoderLayer's default


def test_gate_starts_near_one_half_and_the_bias_option_moves_it():
    v, t, _ = inputs(B=4, N=16, M=6, E=16, seed=5)
    with torch.no_grad():
        assert float(adapter()(v, t).div(v).mean()) == pytest.approx(0.5, abs=0.05)
        gate = adapter(gate_bias_init=2.0).gate(v, t)
    assert float(gate.mean()) == pytest.approx(1 / (1 + math.exp(-2.0)), abs=0.05)
    assert bool(((gate > 0) & (gate < 1)).all())


def test_padding_is_ignored():
    """Appending padded tokens (masked) leaves the output unchanged; unmasked, they change it."""
    m = adapter(seed=6)
    v, t, _ = inputs(B=1, M=3, seed=7)
    longer = torch.cat([t, torch.randn(1, 4, 16, dtype=t.dtype)], dim=1)
    pad = torch.tensor([[False] * 3 + [True] * 4])
    torch.testing.assert_close(m(v, longer, pad), m(v, t), rtol=0, atol=1e-12)
    assert not torch.allclose(m(v, longer), m(v, t))


def test_the_gate_depends_on_the_instruction_per_token_and_channel():
    m = adapter(seed=8)
    v, t, _ = inputs(B=1, seed=9)
    g1, g2 = m.gate(v, t), m.gate(v, t.flip(-1))
    assert (g1 - g2).abs().max() > 1e-3
    assert g1.std(dim=1).min() > 0 and g1.std(dim=2).min() > 0  # varies across tokens and across channels


def test_gradients_match_finite_differences():
    m = adapter(seed=10, num_layers=1, gate_bias_init=0.3)
    v, t, pad = inputs(B=2, N=3, M=3, seed=11)
    v.requires_grad_(True)
    t.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: m(a, b, pad), (v, t))


def test_aux_loss_is_off_by_default_and_is_the_mean_mask_when_on():
    v, t, _ = inputs(seed=12)
    m = adapter()
    m(v, t)
    assert float(m.aux_loss()) == 0.0
    m = adapter(sparsity_lambda=1e-3)
    assert float(m.aux_loss()) == 0.0  # before any call
    with torch.no_grad():
        m(v, t)
    assert float(m.aux_loss()) == pytest.approx(1e-3 * float(m.last_mask.abs().mean()), rel=1e-12)


def test_config_dict_rebuilds_the_module():
    m = MoDAAdapter(32, num_heads=4, num_layers=1, ff_dim=8, gate_bias_init=1.5, sparsity_lambda=0.01)
    clone = MoDAAdapter(**m.config_dict())
    clone.load_state_dict(m.state_dict())
    v, t = torch.randn(2, 3, 32), torch.randn(2, 4, 32)
    torch.testing.assert_close(clone.eval()(v, t), m.eval()(v, t))


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda v, t: (v, t[..., :8], None), ValueError, "text has width 8 but visual has width 16"),
    (lambda v, t: (v[..., :8], t[..., :8], None), ValueError, "visual has width 8 but the adapter"),
    (lambda v, t: (v, t[:, :0], None), ValueError, "text is empty"),
    (lambda v, t: (v, t, torch.ones(t.shape[:2], dtype=torch.bool)), ValueError, "all padding in rows"),
    (lambda v, t: (v, t, torch.zeros(2, 3, dtype=torch.bool)), ValueError, "text_padding_mask must have shape"),
    (lambda v, t: (v, t, torch.zeros(t.shape[:2])), TypeError, "text_padding_mask must be boolean"),
    (lambda v, t: (v, t[:1], None), ValueError, "batch size"),
    (lambda v, t: (v[0], t, None), ValueError, "visual must have shape"),
    (lambda v, t: (v.long(), t, None), TypeError, "visual must be floating point"),
    (lambda v, t: (v, t.numpy(), None), TypeError, "text must be a torch.Tensor"),
    (lambda v, t: (v.index_fill(1, torch.tensor([0]), float("nan")), t, None), ValueError, "visual holds NaN"),
    (lambda v, t: (v, t.index_fill(1, torch.tensor([0]), float("inf")), None), ValueError, "text holds NaN or Inf"),
])
def test_bad_input_is_refused(make, error, match):
    v, t, _ = inputs()
    with pytest.raises(error, match=match):
        adapter()(*make(v, t))


def test_one_padding_row_is_named():
    v, t, pad = inputs(B=3)
    pad[1] = True
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        adapter()(v, t, pad)


def test_integer_zero_one_masks_are_accepted():
    v, t, pad = inputs()
    m = adapter()
    torch.testing.assert_close(m(v, t, pad.long()), m(v, t, pad))


@pytest.mark.parametrize("kw", [dict(embed_dim=0), dict(embed_dim=10, num_heads=4), dict(num_layers=0),
                                dict(dropout=1.0), dict(gate_bias_init=float("inf")), dict(sparsity_lambda=-1.0),
                                dict(ff_dim=2.5)])
def test_bad_constructor_arguments(kw):
    args = {"embed_dim": 16, "num_heads": 4, **kw}
    with pytest.raises(ValueError, match=next(iter(kw)).split("_")[0]):
        MoDAAdapter(**args)
