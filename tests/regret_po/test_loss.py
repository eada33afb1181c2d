"""RePO's loss against a literal reference, finite differences and the losses it reduces to; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icml26.regret_po import RegretPOLoss, dpo_loss, ipo_loss, simpo_loss
from icml26.regret_po.loss import tail_term
from icml26.regret_po.reference import pooled_nll, repo_pair_loss, repo_topk_pair_loss, sequence_nll


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
@pytest.mark.parametrize("pooling", ["token", "sequence"])
def test_matches_the_literal_reference(deterministic, normalization, pooling):
    logps, ref, beh, mask = random_batch(seed=1)
    kw = dict(alpha=0.3, cpl_lambda=0.7, ref_coef=0.5, sft_coef=0.0, normalization=normalization)
    loss, _ = RegretPOLoss(deterministic=deterministic, **{**kw, "sft_coef": 0.25}, nll_pooling=pooling)(
        logps, ref, mask, None if deterministic else beh
    )
    B = logps.shape[0] // 2
    expected = []
    for i in range(B):

        def row(t, r):
            return t[r][mask[r] > 0].tolist()

        expected.append(
            repo_pair_loss(
                row(logps, i),
                row(logps, B + i),
                row(ref, i),
                row(ref, B + i),
                None if deterministic else row(beh, i),
                None if deterministic else row(beh, B + i),
                **kw,
            )
        )
    chosen = [mask_row(logps, mask, i) for i in range(B)]
    nll = pooled_nll(chosen) if pooling == "token" else sequence_nll(chosen)
    assert loss.item() == pytest.approx(np.mean(expected) + 0.25 * nll, rel=1e-12)


def mask_row(t, mask, r):
    return t[r][mask[r] > 0].tolist()


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
    assert dpo_loss(logps, ref, mask, beta=0.1).item() == pytest.approx(
        -F.logsigmoid(torch.tensor(0.3)).item()
    )
    assert ipo_loss(logps, ref, mask, beta=0.1).item() == pytest.approx((1.5 - 5.0) ** 2)
    assert simpo_loss(logps, mask, beta=2.0, gamma=1.0).item() == pytest.approx(
        -F.logsigmoid(torch.tensor(2.0 * (-1.0 + 3.0) - 1.0)).item()
    )
    assert dpo_loss(logps, ref, mask, beta=0.1, sft_coef=1.0).item() == pytest.approx(
        -F.logsigmoid(torch.tensor(0.3)).item() + 1.0
    )


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
    for kwargs in (
        dict(alpha=0.0),
        dict(normalization="max"),
        dict(sft_coef=-1.0),
        dict(cpl_lambda=float("inf")),
    ):
        with pytest.raises(ValueError):
            RegretPOLoss(**kwargs)


# ------------------------------------------------------------------------------------------------ RePO-top-k
def topk_batch(B=2, T=5, V=7, k=3, seed=4, dtype=torch.float64):
    """Policy logits, realised tokens y, a mask, and a behaviour policy's top-k ids and log-probs."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2 * B, T, V, generator=g, dtype=dtype)
    y = torch.randint(0, V, (2 * B, T), generator=g)
    lengths = torch.randint(2, T + 1, (2 * B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)
    mu = torch.log_softmax(torch.randn(2 * B, T, V, generator=g, dtype=dtype) * 2, -1)
    vals, ids = mu.topk(k, dim=-1)
    ref = -torch.rand(2 * B, T, generator=g, dtype=dtype) * 3
    return logits, y, mask, ids, vals, ref


def topk_loss(logits, y, mask, ids, vals, ref, **kw):
    logp = torch.log_softmax(logits, -1)
    policy = logp.gather(-1, y[..., None]).squeeze(-1)
    return RegretPOLoss(topk=True, **kw)(
        policy, ref, mask, policy_topk_logps=logp.gather(-1, ids), behavior_topk_logps=vals
    )[0]


@pytest.mark.parametrize("tail", [True, False])
def test_topk_matches_the_literal_reference(tail):
    logits, y, mask, ids, vals, ref = topk_batch()
    kw = dict(alpha=0.3, cpl_lambda=0.7, ref_coef=0.5, sft_coef=0.0)
    got = topk_loss(logits, y, mask, ids, vals, ref, **{**kw, "sft_coef": 0.25}, topk_tail=tail)
    logp = torch.log_softmax(logits, -1)
    policy, ptop = logp.gather(-1, y[..., None]).squeeze(-1), logp.gather(-1, ids)
    B = logits.shape[0] // 2

    def row(t, r):
        return t[r][mask[r] > 0].tolist()

    expected = [
        repo_topk_pair_loss(
            row(policy, i),
            row(policy, B + i),
            row(ref, i),
            row(ref, B + i),
            row(ptop, i),
            row(ptop, B + i),
            row(vals, i),
            row(vals, B + i),
            **kw,
            tail=tail,
        )
        for i in range(B)
    ]
    nll = pooled_nll([row(policy, i) for i in range(B)])
    assert got.item() == pytest.approx(np.mean(expected) + 0.25 * nll, rel=1e-12)


def test_topk_tail_term_by_hand():
    """The official uniform tail: mu's top-2 mass 0.8 and pi's 0.5 leave 0.2 and 0.5 outside the top k; with V - k
    = 3 other tokens each side spreads its rest uniformly, so the tail adds 3 * (0.2/3) ln((0.2/3) / (0.5/3))."""
    from icml26.regret_po.loss import topk_kl

    mu = torch.tensor([[[0.6, 0.2]]], dtype=torch.float64).log()
    pi = torch.tensor([[[0.3, 0.2]]], dtype=torch.float64).log()
    top = 0.6 * np.log(0.6 / 0.3) + 0.2 * np.log(0.2 / 0.2)
    # the exact KL over a 5-token vocabulary whose other 3 tokens share the rest uniformly
    full_mu = np.array([0.6, 0.2, 0.2 / 3, 0.2 / 3, 0.2 / 3])
    full_pi = np.array([0.3, 0.2, 0.5 / 3, 0.5 / 3, 0.5 / 3])
    exact = float(np.sum(full_mu * np.log(full_mu / full_pi)))
    assert topk_kl(pi, mu).item() == pytest.approx(exact, abs=1e-8)  # eps = 1e-9 on each mass
    assert topk_kl(pi, mu, tail=False).item() == pytest.approx(top, rel=1e-12)
    assert exact - top == pytest.approx(0.2 * np.log(0.2 / 0.5), rel=1e-7)
    # the full vocabulary as the "top k": nothing outside, the tail vanishes up to eps
    full = torch.tensor(full_mu).log()[None, None], torch.tensor(full_pi).log()[None, None]
    assert topk_kl(full[1], full[0]).item() == pytest.approx(exact, abs=1e-7)


def test_topk_gradient_matches_finite_differences():
    logits, y, mask, ids, vals, ref = topk_batch(B=1, T=4, V=5, k=2)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: topk_loss(x, y, mask, ids, vals, ref), (logits,))


def _grad(fn, logits):
    x = logits.detach().clone().requires_grad_(True)
    fn(x).backward()
    return x.grad


def test_sampled_behaviour_logps_leave_the_gradient_of_repo_det_unchanged():
    """S = (1/T) sum (1 + w_s) l_s - (1/T) sum w_s b_s: the sampled b only adds a constant to each sequence's score,
    so the score's gradient is RePO_det's; in the loss b can only re-weight whole pairs through the sigmoid."""
    logits, y, mask, _, _, _ = topk_batch(seed=5)
    beh = -torch.rand(mask.shape, generator=torch.Generator().manual_seed(1), dtype=mask.dtype)

    def score_grad(b):
        def f(x):
            logp = torch.log_softmax(x, -1).gather(-1, y[..., None]).squeeze(-1)
            from icml26.regret_po.loss import sequence_score

            return sequence_score(logp, mask, b).sum()

        return _grad(f, logits)

    # the sequence score's gradient does not depend on the sampled behaviour log-probs at all
    torch.testing.assert_close(score_grad(beh), score_grad(torch.zeros_like(beh)), rtol=1e-12, atol=1e-12)


def test_topk_gradient_differs_from_repo_det_exactly_when_mu_differs():
    logits, y, mask, ids, vals, ref = topk_batch(seed=6)

    def det(x):
        logp = torch.log_softmax(x, -1)
        return RegretPOLoss(deterministic=True)(logp.gather(-1, y[..., None]).squeeze(-1), ref, mask)[0]

    # mu = the point mass on the realised tokens (k = 1, log mu = 0): the top-k KL is -l_s, RePO_det's b_s - l_s
    point_ids, point_vals = y[..., None], torch.zeros(*y.shape, 1, dtype=logits.dtype)
    g_det = _grad(det, logits)
    g_point = _grad(lambda x: topk_loss(x, y, mask, point_ids, point_vals, ref, topk_tail=False), logits)
    torch.testing.assert_close(g_point, g_det, rtol=1e-12, atol=1e-14)
    # with the official tail, mu's mass outside its top 1 is eps = 1e-9: the tail moves the gradient by O(eps)
    g_tail = _grad(lambda x: topk_loss(x, y, mask, point_ids, point_vals, ref), logits)
    torch.testing.assert_close(g_tail, g_det, rtol=0, atol=1e-10)
    # any other mu moves the gradient, token by token, and two different mu give two different gradients
    g_mu = _grad(lambda x: topk_loss(x, y, mask, ids, vals, ref), logits)
    other = torch.log_softmax(
        torch.randn(
            *y.shape, logits.shape[-1], generator=torch.Generator().manual_seed(9), dtype=logits.dtype
        ),
        -1,
    ).topk(ids.shape[-1], -1)
    g_other = _grad(lambda x: topk_loss(x, y, mask, other.indices, other.values, ref), logits)
    assert (g_mu - g_det).abs().max() > 1e-3 and (g_mu - g_other).abs().max() > 1e-3
    cos = torch.nn.functional.cosine_similarity(g_mu.ravel(), g_det.ravel(), dim=0)
    assert cos < 0.999
    # padding positions get no gradient through the behaviour terms
    assert g_mu[mask == 0].abs().max() == 0


def test_topk_bad_input():
    logits, y, mask, ids, vals, ref = topk_batch()
    logp = torch.log_softmax(logits, -1)
    policy = logp.gather(-1, y[..., None]).squeeze(-1)
    loss = RegretPOLoss(topk=True)
    with pytest.raises(ValueError, match="policy_topk_logps"):
        loss(policy, ref, mask, behavior_topk_logps=vals)
    with pytest.raises(ValueError, match="behavior_topk_logps"):
        loss(policy, ref, mask, policy_topk_logps=logp.gather(-1, ids))
    with pytest.raises(ValueError, match=r"\(2B, T, k\)"):
        loss(
            policy, ref, mask, policy_topk_logps=logp.gather(-1, ids)[:, :2], behavior_topk_logps=vals[:, :2]
        )
    with pytest.raises(ValueError, match="differ in shape"):
        loss(policy, ref, mask, policy_topk_logps=logp.gather(-1, ids), behavior_topk_logps=vals[..., :2])
    bad = vals.clone()
    bad[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        loss(policy, ref, mask, policy_topk_logps=logp.gather(-1, ids), behavior_topk_logps=bad)
    with pytest.raises(TypeError, match="behavior_topk_logps"):
        loss(policy, ref, mask, policy_topk_logps=logp.gather(-1, ids), behavior_topk_logps=vals.tolist())
    with pytest.raises(ValueError, match="exclusive"):
        RegretPOLoss(topk=True, deterministic=True)


def test_baselines_with_the_nll_term():
    logps, ref, _, mask = random_batch(seed=7)
    from icml26.regret_po.loss import chosen_nll

    nll = chosen_nll(logps, mask).mean().item()
    assert ipo_loss(logps, ref, mask, beta=0.2, sft_coef=0.5).item() == pytest.approx(
        ipo_loss(logps, ref, mask, beta=0.2).item() + 0.5 * nll, rel=1e-12
    )
    assert simpo_loss(logps, mask, beta=2.0, gamma=1.0, sft_coef=1.0).item() == pytest.approx(
        simpo_loss(logps, mask, beta=2.0, gamma=1.0).item() + nll, rel=1e-12
    )
