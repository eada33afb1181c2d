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
    assert effective_rank(torch.tensor(C), center=False) == pytest.approx(
        roy_vetterli(C, center=False), rel=1e-10
    )
    # a flat spectrum of rank r gives exactly r under every definition
    flat = torch.zeros(10, 6)
    flat[:4, :4] = torch.eye(4)
    for kind in ("roy_vetterli", "participation_ratio", "stable_rank"):
        assert effective_rank(flat, center=False, kind=kind) == pytest.approx(4.0)
    # singular values (2, 1): p = (2/3, 1/3); participation ratio (4 + 1)^2 / (16 + 1); stable rank 5 / 4
    two = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    assert effective_rank(two, center=False) == pytest.approx(
        math.exp(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    )
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


def _simvq_rank_after(weight: float, steps: int = 200, D: int = 16, r: int = 3) -> tuple[float, float]:
    """SimVQ whose codebook starts inside a random r-dim subspace, fitted to data in that subspace."""
    torch.manual_seed(0)
    # rotated: an axis-aligned subspace has no off-diagonal Gram
    basis = torch.linalg.qr(torch.randn(D, D))[0][:, :r]
    inner = SimVQQuantizer(128, D)
    with torch.no_grad():
        inner.projection.weight.copy_(basis @ basis.T)
        inner.projection.bias.zero_()
    quantizer = CodebookRegularizer(inner, weight=weight)
    opt = torch.optim.Adam(inner.parameters(), lr=1e-2)
    before = effective_rank(inner.effective_codebook().detach())
    for _ in range(steps):
        _, _, loss = quantizer(torch.randn(256, r) @ basis.T)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, effective_rank(inner.effective_codebook().detach())


@pytest.mark.parametrize("weight", [0.0, 1e-3, 1e-1])
def test_regulariser_raises_simvq_rank_within_200_steps_and_lambda_0_does_not(weight):
    before, after = _simvq_rank_after(weight)
    assert before == pytest.approx(3.0, abs=0.1)
    # lambda > 0 lifts the collapsed codebook by at least 2 effective dimensions; lambda = 0 leaves it in the
    # data's 3-dim subspace (the commitment loss alone has no reason to leave it)
    assert (after - before >= 2.0) == (weight > 0), (weight, before, after)


def test_simvq_projection_has_the_official_bias_and_it_is_trained():
    torch.manual_seed(0)
    inner = SimVQQuantizer(32, 6)
    assert inner.projection.bias is not None and SimVQQuantizer(32, 6, bias=False).projection.bias is None
    torch.testing.assert_close(
        inner.effective_codebook(), inner.frozen @ inner.projection.weight.T + inner.projection.bias
    )
    _, _, loss = inner(torch.randn(10, 6) + 3.0)
    loss.backward()
    assert inner.projection.bias.grad.abs().sum() > 0


def test_dead_code_restart_follows_the_ema_rule_and_hits_a_batch_vector():
    torch.manual_seed(0)
    q = SimVQQuantizer(4, 3, dead_code_threshold=0.5)
    with torch.no_grad():
        q.frozen.copy_(torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 50]]))
        q.projection.weight.copy_(torch.eye(3) * 2)
        q.projection.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    z = torch.zeros(4, 3)  # every vector goes to code 0; codes 1-3 are never chosen
    # cluster sizes start at 1 and decay by 0.8 per batch: 0.8^3 = 0.512 >= 0.5 keeps them, 0.8^4 = 0.41 does not
    for _ in range(3):
        q(z)
    assert q.restarts == 0
    # code 0 takes all 4 vectors: 1 -> 0.8 + 0.2 * 4 = 1.6 -> 2.08 -> 2.464
    torch.testing.assert_close(q.cluster_size, torch.tensor([2.464, 0.512, 0.512, 0.512]))
    z = torch.tensor([[0.0, 0, 0], [0, 0, 0], [0.3, 0.7, -0.1], [0.2, -0.4, 0.9]])
    q(z)
    assert q.restarts == 3  # all four vectors still go to code 0: codes 1-3 restart, each onto a batch vector
    codes = q.effective_codebook().detach()
    restarted = (q.cluster_size == 0.5).nonzero().flatten()
    assert restarted.tolist() == [1, 2, 3]
    for k in restarted:  # the effective code W f + b equals a batch vector exactly (W is invertible)
        assert torch.cdist(codes[k][None], z).min() < 1e-5
    q.eval()
    q(torch.zeros(4, 3))
    assert q.restarts == 3  # no restarts outside training


@pytest.mark.parametrize(
    "kwargs", [{"dead_code_threshold": -1.0}, {"dead_code_threshold": float("inf")}, {"dead_code_decay": 1.0}]
)
def test_bad_restart_settings(kwargs):
    with pytest.raises(ValueError, match="dead_code"):
        SimVQQuantizer(8, 4, **kwargs)


def test_dead_code_rule_matches_vector_quantize_pytorch():
    vqp = pytest.importorskip("vector_quantize_pytorch")
    torch.manual_seed(0)
    codes = torch.tensor([[0.0, 0, 0], [10, 0, 0], [0, 10, 0], [0, 0, 10]])
    theirs = vqp.VectorQuantize(
        dim=3,
        codebook_size=4,
        learnable_codebook=True,
        ema_update=False,
        threshold_ema_dead_code=0.5,
        decay=0.8,
    )
    ours = SimVQQuantizer(4, 3, dead_code_threshold=0.5, dead_code_decay=0.8)
    with torch.no_grad():
        theirs._codebook.embed.copy_(codes[None])
        ours.frozen.copy_(codes)
        ours.projection.weight.copy_(torch.eye(3))
        ours.projection.bias.zero_()
    z = torch.zeros(4, 3)
    for _ in range(4):  # every vector goes to code 0; codes 1-3 decay and are restarted on the 4th batch
        theirs(z[None])
        ours(z)
        torch.testing.assert_close(ours.cluster_size, theirs._codebook.cluster_size[0])
    torch.testing.assert_close(ours.effective_codebook().detach(), theirs._codebook.embed.detach()[0])


def test_restart_inverts_a_non_symmetric_projection():
    """f = W^+ (z - b) as a row: (z - b) @ (W^+)^T. With a symmetric W (as above) W^+ and its transpose agree; with
    this upper-triangular W they do not, and W f + b must still be the batch vector exactly."""
    torch.manual_seed(0)
    q = SimVQQuantizer(4, 3, dead_code_threshold=0.5)
    W = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 3.0], [0.0, 0.0, 0.5]])
    b = torch.tensor([0.1, -0.2, 0.3])
    with torch.no_grad():
        q.frozen.copy_(torch.tensor([[0.0, 0, 0], [10, 0, 0], [0, 10, 0], [0, 0, 10]]))
        q.projection.weight.copy_(W)
        q.projection.bias.copy_(b)
    z = torch.full((4, 3), -0.4)  # nearest to code 0 (W 0 + b = b): codes 1-3 restart on the 4th batch
    for _ in range(3):
        q(z)
    z = torch.tensor([[-0.4, -0.4, -0.4], [0.3, 0.7, -0.1], [0.2, -0.4, 0.9], [-0.5, 0.1, 0.4]])
    q(z)
    assert q.restarts == 3
    for k in (1, 2, 3):
        f = q.frozen[k]
        code = W @ f + b                        # the effective code, by hand
        assert torch.cdist(code[None], z).min() < 1e-5
        torch.testing.assert_close(q.effective_codebook().detach()[k], code)


def test_legacy_commitment_loss_by_hand():
    """loss = mean((sg(q) - z)^2) + beta mean((q - sg(z))^2): the encoder term has weight 1, the codebook term beta,
    so d loss / d z = 2 (z - q) / numel and d loss / d code_k = beta * 2 * sum_{i -> k} (q_i - z_i) / numel."""
    vq = VectorQuantizer(codebook_size=2, dim=2, beta=0.25)
    with torch.no_grad():
        vq.embed.copy_(torch.tensor([[0.0, 0.0], [4.0, 4.0]]))
    z = torch.tensor([[1.0, 0.0], [3.0, 5.0], [0.0, -1.0]], requires_grad=True)
    _, idx, loss = vq(z)
    assert idx.tolist() == [0, 1, 0]
    # squared errors 1, 2, 1 over 6 entries: (1 + 0.25) * 4 / 6
    assert loss.item() == pytest.approx(1.25 * 4 / 6)
    loss.backward()
    q = torch.tensor([[0.0, 0.0], [4.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(z.grad, 2 * (z.detach() - q) / 6)
    torch.testing.assert_close(vq.embed.grad, 0.25 * 2 * torch.tensor([[-1.0, 1.0], [1.0, -1.0]]) / 6)
