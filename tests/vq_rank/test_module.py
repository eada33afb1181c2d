"""Effective rank and the codebook regulariser against literal references, finite differences and hand values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from icml26.vq_rank import (
    CodebookRegularizer,
    EffectiveRankCallback,
    SimVQQuantizer,
    VectorQuantizer,
    codebook_decorrelation_loss,
    codebook_of,
    effective_rank,
    spectral_report,
)
from icml26.vq_rank.reference import gram_offdiag, roy_vetterli


def test_effective_rank_matches_the_reference_and_hand_values():
    rng = np.random.default_rng(0)
    C = rng.normal(size=(50, 8)) @ np.diag([5, 4, 3, 2, 1, 0.5, 0.1, 0.01])
    assert effective_rank(torch.tensor(C)) == pytest.approx(roy_vetterli(C), rel=1e-10)
    assert effective_rank(torch.tensor(C), center=False) == pytest.approx(roy_vetterli(C, center=False), rel=1e-10)
    # a flat spectrum of rank r gives exactly r under every definition
    flat = torch.zeros(10, 6)
    flat[:4, :4] = torch.eye(4)
    for kind in ("roy_vetterli", "participation_ratio", "stable_rank"):
        assert effective_rank(flat, center=False, kind=kind) == pytest.approx(4.0)
    # singular values (2, 1): p = (2/3, 1/3); participation ratio (4 + 1)^2 / (16 + 1); stable rank 5 / 4
    two = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    assert effective_rank(two, center=False) == pytest.approx(math.exp(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))))
    assert effective_rank(two, center=False, kind="participation_ratio") == pytest.approx(25 / 17)
    assert effective_rank(two, center=False, kind="stable_rank") == pytest.approx(5 / 4)


def test_effective_rank_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        effective_rank(torch.ones(1, 4))
    with pytest.raises(ValueError, match="NaN"):
        effective_rank(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="kind"):
        effective_rank(torch.eye(3), kind="entropy")
    with pytest.raises(ValueError, match="2-D"):
        effective_rank(torch.ones(3))
    with pytest.raises(TypeError):
        effective_rank(np.eye(3))


def test_spectral_report():
    C = torch.zeros(20, 4)
    C[:, 0] = torch.linspace(-3, 3, 20)
    C[:, 1] = 0.15 * torch.linspace(-3, 3, 20).flip(0) ** 2  # about 5 % of the variance
    report = spectral_report(C, features=torch.randn(30, 4), used=torch.arange(10))
    assert report["dims_90"] == 1.0 and report["dims_99"] == 2.0 and report["used_codes"] == 10.0
    with pytest.raises(ValueError, match="3 codes for 4 dimensions"):
        spectral_report(torch.randn(3, 4))


def test_regulariser_matches_the_reference_and_its_gradient():
    rng = np.random.default_rng(1)
    C = rng.normal(size=(12, 5))
    assert float(codebook_decorrelation_loss(torch.tensor(C))) == pytest.approx(gram_offdiag(C), rel=1e-12)
    x = torch.tensor(C, requires_grad=True)
    assert torch.autograd.gradcheck(codebook_decorrelation_loss, (x,))
    # rows that are coordinate axes: G = diag, so the penalty is 0 even for an axis-aligned *low-rank* codebook
    axes = torch.zeros(6, 4)
    axes[:3, 0] = 1.0
    axes[3:, 1] = 2.0
    assert float(codebook_decorrelation_loss(axes)) == 0.0
    assert effective_rank(axes) < 2.0 + 1e-9


def test_wrapper_adds_weighted_penalty_and_reaches_the_simvq_projection():
    torch.manual_seed(0)
    inner = SimVQQuantizer(codebook_size=32, dim=6)
    wrapped = CodebookRegularizer(inner, weight=0.5)
    z = torch.randn(10, 6)
    _, _, base_loss = inner(z)
    _, _, loss = wrapped(z)
    penalty = codebook_decorrelation_loss(inner.effective_codebook()).detach()
    assert loss.item() == pytest.approx(base_loss.item() + 0.5 * penalty.item(), rel=1e-6)
    loss.backward()
    assert inner.projection.weight.grad is not None and inner.projection.weight.grad.abs().sum() > 0
    assert wrapped.last_penalty == pytest.approx(float(penalty))


def test_works_with_vector_quantize_pytorch_and_rejects_ema():
    vqp = pytest.importorskip("vector_quantize_pytorch")
    learnable = vqp.VectorQuantize(dim=8, codebook_size=16, learnable_codebook=True, ema_update=False)
    _, _, loss = CodebookRegularizer(learnable, weight=1e-2)(torch.randn(2, 5, 8))
    loss.backward()
    assert learnable.codebook.shape == (16, 8)
    simvq = vqp.SimVQ(dim=8, codebook_size=16)
    CodebookRegularizer(simvq, weight=1e-2)(torch.randn(2, 5, 8))[2].backward()
    with pytest.raises(ValueError, match="no gradient"):
        CodebookRegularizer(vqp.VectorQuantize(dim=8, codebook_size=16), weight=1e-2)


@pytest.mark.parametrize("weight", [-1.0, float("nan"), "0.1"])
def test_bad_weight(weight):
    with pytest.raises(ValueError, match="weight"):
        CodebookRegularizer(VectorQuantizer(8, 4), weight=weight)


def test_vector_quantizer_nearest_code_and_straight_through():
    torch.manual_seed(0)
    vq = VectorQuantizer(codebook_size=16, dim=3)
    z = torch.randn(20, 3, requires_grad=True)
    q, idx, loss = vq(z)
    brute = torch.cdist(z.detach(), vq.embed.detach()).argmin(1)
    assert torch.equal(idx, brute)
    torch.testing.assert_close(q, vq.embed[idx])
    q.sum().backward()
    torch.testing.assert_close(z.grad, torch.ones_like(z))  # straight-through: d quantized / d z = I
    assert loss.item() > 0


def test_callback_records_erank():
    cb = EffectiveRankCallback(every=2)
    vq = VectorQuantizer(16, 4)
    assert cb(1, vq) is None and cb(2, vq) is not None
    assert cb.history[0][0] == 2 and cb.history[0][1] > 1.0
    assert codebook_of(vq) is vq.embed
