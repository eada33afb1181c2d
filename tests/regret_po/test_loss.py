"""RePO's loss against a literal reference, finite differences and the losses it reduces to; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icml26.regret_po import RegretPOLoss, dpo_loss, ipo_loss, simpo_loss
from icml26.regret_po.loss import tail_term
from icml26.regret_po.reference import repo_pair_loss


def random_batch(B=3, T=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(2 * B, T, generator=g, dtype=dtype) * 3
    ref = -torch.rand(2 * B, T, generator=g, dtype=dtype) * 3
    beh = -torch.rand(2 * B, T, generator=g, dtype=dtype) * 3
    lengths = torch.randint(1, T + 1, (2 * B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)
    return logps, ref, beh, mask


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("normalization", ["mean", "sum"])
def test_matches_the_literal_reference(deterministic, normalization):
    logps, ref, beh, mask = random_batch(seed=1)
    kw = dict(alpha=0.3, cpl_lambda=0.7, ref_coef=0.5, sft_coef=0.25, normalization=normalization)
    loss, _ = RegretPOLoss(deterministic=deterministic, **kw)(logps, ref, mask, None if deterministic else beh)
    B = logps.shape[0] // 2
    expected = []
    for i in range(B):
        def row(t, r):
            return t[r][mask[r] > 0].tolist()
        expected.append(repo_pair_loss(row(logps, i), row(logps, B + i), row(ref, i), row(ref, B + i),
                                       None if deterministic else row(beh, i),
                                       None if deterministic else row(beh, B + i), **kw))
    assert loss.item() == pytest.approx(np.mean(expected), rel=1e-12)


def test_gradient_matches_finite_differences():
    logps, ref, beh, mask = random_batch(B=2, T=4, seed=2)
    logps.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: RegretPOLoss()(x, ref, mask, beh)[0], (logps,))
    assert torch.autograd.gradcheck(lambda x: RegretPOLoss(deterministic=True)(x, ref, mask)[0], (logps,))


def test_tail_term_by_hand():
    logps = torch.tensor([[-1.0, -2.0, -3.0, 0.0]])
    b = torch.tensor([[0.0, 0.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # k_1 = (1 + 2 + 2) / 3, k_2 = (2 + 2) / 2, k_3 = 2 / 1; padding gets 0
    torch.testing.assert_close(tail_term(logps, b, mask), torch.tensor([[5 / 3, 2.0, 2.0, 0.0]]))


def test_reduces_to_dpo_and_simpo_when_the_behaviour_is_the_policy():
    """With mu = pi_theta the tail term vanishes: summed scores give DPO's loss (beta = alpha), mean scores
    without a reference give SimPO's with gamma = 0 (beta = alpha)."""
    logps, ref, _, mask = random_batch(seed=3)
    same = logps.detach().clone()
    repo = RegretPOLoss(alpha=0.2, sft_coef=0.0, normalization="sum")(logps, ref, mask, same)[0]
    assert repo.item() == pytest.approx(dpo_loss(logps, ref, mask, beta=0.2).item(), rel=1e-12)
    repo = RegretPOLoss(alpha=2.0, sft_coef=0.0, ref_coef=0.0)(logps, ref, mask, same)[0]
    assert repo.item() == pytest.approx(simpo_loss(logps, mask, beta=2.0, gamma=0.0).item(), rel=1e-12)


def test_baseline_losses_by_hand():
    logps = torch.tensor([[-1.0, -1.0], [-2.0, -4.0]])
    ref = torch.tensor([[-1.5, -1.5], [-2.0, -2.0]])
    mask = torch.ones(2, 2)
    # log ratios: chosen +1.0, rejected -2.0 (sums); means +0.5, -1.0
    assert dpo_loss(logps, ref, mask, beta=0.1).item() == pytest.approx(-F.logsigmoid(torch.tensor(0.3)).item())
    assert ipo_loss(logps, ref, mask, beta=0.1).item() == pytest.approx((1.5 - 5.0) ** 2)
    assert simpo_loss(logps, mask, beta=2.0, gamma=1.0).item() == pytest.approx(
        -F.logsigmoid(torch.tensor(2.0 * (-1.0 + 3.0) - 1.0)).item())
    assert dpo_loss(logps, ref, mask, beta=0.1, sft_coef=1.0).item() == pytest.approx(
        -F.logsigmoid(torch.tensor(0.3)).item() + 1.0)


def test_bad_input():
    logps, ref, beh, mask = random_batch()
    with pytest.raises(ValueError, match="needs behavior_logps"):
        RegretPOLoss()(logps, ref, mask)
    with pytest.raises(ValueError, match="shape"):
        RegretPOLoss()(logps, ref[:, :3], mask, beh)
    with pytest.raises(ValueError, match="even number of rows"):
        RegretPOLoss(deterministic=True)(logps[:3], ref[:3], mask[:3])
    empty = mask.clone()
    empty[1] = 0
    with pytest.raises(ValueError, match="empty responses"):
        RegretPOLoss(deterministic=True)(logps, ref, empty)
    bad = logps.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        RegretPOLoss(deterministic=True)(bad, ref, mask)
    for kwargs in (dict(alpha=0.0), dict(normalization="max"), dict(sft_coef=-1.0), dict(cpl_lambda=float("inf"))):
        with pytest.raises(ValueError):
            RegretPOLoss(**kwargs)
