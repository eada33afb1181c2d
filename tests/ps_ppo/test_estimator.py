"""PS-PPO's estimator: cutoff laws, the truncated loss, unbiasedness (and the token normaliser's bias)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml26.ps_ppo import (
    AdaptiveCutoff,
    GeometricCutoff,
    MixtureCutoff,
    PromptConditionedCutoff,
    UniformCutoff,
    prefix_sampled_policy_loss,
)

LAWS = [
    UniformCutoff(),
    GeometricCutoff(0.3),
    MixtureCutoff([UniformCutoff(), GeometricCutoff(0.5)], [0.4, 0.6]),
]


@pytest.mark.parametrize("law", LAWS, ids=lambda x: type(x).__name__)
def test_survival_matches_sampling_and_weights_average_to_one(law):
    lengths = torch.tensor([7, 3, 1])
    S = law.survival(lengths, 7).double()
    draws = torch.stack([law.sample(lengths, torch.Generator().manual_seed(i)) for i in range(4000)])
    assert ((draws >= 1) & (draws <= lengths)).all()
    empirical = (draws[:, :, None] >= torch.arange(1, 8)[None, None, :]).double().mean(0)
    np.testing.assert_allclose(empirical.numpy(), S.numpy(), atol=0.03)
    # exact: sum_c q(c) 1{t <= c} / S(t) = 1 for every reachable t, q(c) = S(c) - S(c + 1)
    q = S - torch.cat([S[:, 1:], torch.zeros(3, 1)], dim=1)
    for i, L in enumerate(lengths.tolist()):
        for t in range(1, L + 1):
            assert float(q[i, t - 1 : L].sum() / S[i, t - 1]) == pytest.approx(1.0, abs=1e-6)


def test_prompt_conditioned_and_adaptive_laws():
    law = PromptConditionedCutoff(lambda key: UniformCutoff() if key == "a" else GeometricCutoff(0.9))
    lengths = torch.tensor([5, 5])
    S = law.survival(lengths, 5, keys=["a", "b"])
    assert S[0, 4].item() == pytest.approx(0.2) and S[1, 1].item() == pytest.approx(0.1)
    with pytest.raises(ValueError, match="one prompt key per row"):
        law.sample(lengths)
    adaptive = AdaptiveCutoff(mix=0.5)
    adaptive.update("p", [[1, 2, 3, 4], [1, 2, 9, 9]], [1.0, 0.0])  # they differ at the 3rd token
    assert adaptive.decision["p"] == (3.0, 1)
    s = adaptive.survival(torch.tensor([6]), 6, keys=["p"])
    expected = 0.5 * (6 - 3 + 1) / 6 + 0.5 * (1 - 1 / 3) ** 2  # t = 3: uniform and geometric(1/3) parts
    assert s[0, 2].item() == pytest.approx(expected, rel=1e-6)


def test_full_cutoffs_give_the_dr_grpo_loss_by_hand():
    logps = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.5]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2)
    loss, stats = prefix_sampled_policy_loss(
        logps, old, adv, mask, torch.tensor([2, 2]), torch.ones(2, 2), clip_eps=0.2, max_len=4
    )
    # ratios: row 0 (1, 0.5) with A = 1 -> min(1, 1) = 1, min(0.5, 0.8) = 0.5;
    #         row 1 (2, 1) with A = -1 -> min(-2, -1.2) = -2, min(-1, -1) = -1
    assert loss.item() == pytest.approx(-(1.0 + 0.5 - 2.0 - 1.0) / (2 * 4))
    assert stats["kept_tokens"] == 4.0


def test_bad_input():
    logps = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="zero mass on a reachable position"):
        prefix_sampled_policy_loss(
            logps,
            logps,
            torch.ones(2),
            torch.ones(2, 3),
            torch.tensor([3, 3]),
            torch.tensor([[1.0, 0.5, 0.0], [1.0, 1.0, 1.0]]),
        )
    with pytest.raises(ValueError, match="probability"):
        GeometricCutoff(1.5)
    with pytest.raises(ValueError, match="probability"):
        GeometricCutoff(-0.1)
    with pytest.raises(ValueError, match="empty completions"):
        UniformCutoff().sample(torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="sum to 1"):
        MixtureCutoff([UniformCutoff()], [0.5])
    with pytest.raises(ValueError, match="shape"):
        prefix_sampled_policy_loss(
            logps, logps[:, :2], torch.ones(2), torch.ones(2, 3), torch.tensor([1, 1]), torch.ones(2, 3)
        )


@pytest.mark.parametrize("law", LAWS, ids=lambda x: type(x).__name__)
def test_loss_expectation_over_every_cutoff_is_the_full_loss_exactly(law):
    """E_c[loss] = sum over every cutoff pair of q(c_1) q(c_2) loss(c) equals the full-trajectory clipped loss in
    float64, ratios away from 1 (clip acting); the token-count normaliser misses it."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([4, 2])
    mask = (torch.arange(1, 5)[None, :] <= lengths[:, None]).double()
    logps = -torch.rand(2, 4, generator=gen, dtype=torch.float64) - 0.5
    old = logps + 0.4 * (torch.rand(2, 4, generator=gen, dtype=torch.float64) - 0.5)
    adv = torch.tensor([0.7, -1.3], dtype=torch.float64)
    S = law.survival(lengths, 4).double()
    q = S - torch.cat([S[:, 1:], torch.zeros(2, 1, dtype=torch.float64)], dim=1)
    full, _ = prefix_sampled_policy_loss(logps, old, adv, mask, lengths, mask.clone(), max_len=6)
    expected = {"constant": 0.0, "tokens": 0.0}
    for c0 in range(1, 5):
        for c1 in range(1, 3):
            for normalizer in expected:
                loss, _ = prefix_sampled_policy_loss(
                    logps, old, adv, mask, torch.tensor([c0, c1]), S, max_len=6, normalizer=normalizer
                )
                expected[normalizer] += float(q[0, c0 - 1] * q[1, c1 - 1] * loss)
    assert expected["constant"] == pytest.approx(float(full), rel=1e-12)
    full_tokens, _ = prefix_sampled_policy_loss(logps, old, adv, mask, lengths, mask.clone(), normalizer="tokens")
    assert abs(expected["tokens"] - float(full_tokens)) > 1e-3 * abs(float(full_tokens))
