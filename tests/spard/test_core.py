"""SPARD's math against the float64 transcriptions: the DPP greedy MAP (and the exact MAP on small pools), the
relevance-diversity kernel, both SPAG safety steps, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from icml26.spard import reference
from icml26.spard.core import (
    dpp_log_det,
    greedy_dpp_map,
    official_scales,
    polyak_step_size,
    relevance_diversity_kernel,
    safety_triggered,
    spag_safety_update,
)


def random_kernel(seed: int, n: int = 9, rank: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(n, rank))
    return B @ B.T + 1e-3 * np.eye(n)


# ------------------------------------------------------------------------------------------------ DPP
@pytest.mark.parametrize("seed", range(8))
def test_greedy_matches_the_naive_greedy_that_recomputes_determinants(seed):
    L = random_kernel(seed)
    assert greedy_dpp_map(L, 5).tolist() == reference.naive_greedy_dpp(L, 5)


def test_greedy_is_the_exact_map_where_greedy_is_optimal():
    # diagonal kernel: the MAP is the k largest qualities
    L = np.diag([0.3, 2.0, 0.7, 1.5, 0.1])
    best, _ = reference.exact_dpp_map(L, 3)
    assert sorted(greedy_dpp_map(L, 3).tolist()) == sorted(best) == [1, 2, 3]
    # two tight clusters and a loner: the MAP takes one of each cluster plus the loner
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    emb = np.stack([a, a + 0.01, b, b + 0.02, np.array([0.0, 0.0, 1.0])])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    L = emb @ emb.T + 1e-6 * np.eye(5)
    best, _ = reference.exact_dpp_map(L, 3)
    pick = greedy_dpp_map(L, 3)
    assert dpp_log_det(L, pick) == pytest.approx(math.log(reference.exact_dpp_map(L, 3)[1]), abs=1e-6)
    assert len({0, 1} & set(pick.tolist())) == 1 and len({2, 3} & set(pick.tolist())) == 1


@pytest.mark.parametrize("seed", range(6))
def test_greedy_is_close_to_the_exact_map_on_small_pools(seed):
    L = random_kernel(100 + seed, n=8, rank=8)
    _, best_det = reference.exact_dpp_map(L, 4)
    greedy_det = math.exp(dpp_log_det(L, greedy_dpp_map(L, 4)))
    assert greedy_det <= best_det * (1 + 1e-9)
    # greedy log-det maximisation is within a small factor of the optimum on these pools (measured: >= 0.6)
    assert greedy_det >= 0.5 * best_det


def test_greedy_edge_cases_and_bad_input():
    L = random_kernel(0, n=4, rank=4)
    assert greedy_dpp_map(L, 0).tolist() == []
    assert greedy_dpp_map(L, 1).tolist() == [int(np.argmax(np.diag(L)))]
    assert sorted(greedy_dpp_map(L, 4).tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"k .*budget"):
        greedy_dpp_map(L, 5)
    with pytest.raises(TypeError, match="k must be an int"):
        greedy_dpp_map(L, 2.0)
    with pytest.raises(ValueError, match="square"):
        greedy_dpp_map(L[:3], 2)
    bad = L.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        greedy_dpp_map(bad, 2)


def test_duplicate_items_are_not_picked_twice_and_gains_are_clamped():
    emb = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    L = emb @ emb.T + 1e-6 * np.eye(4)
    pick = greedy_dpp_map(L, 4)
    assert sorted(pick.tolist()) == [0, 1, 2, 3] and pick[:2].tolist() == [0, 3]


@pytest.mark.parametrize("beta", [1.0, 4.0, 10.0])
def test_kernel_matches_the_loop_transcription(beta):
    rng = np.random.default_rng(int(beta))
    cand, ref = rng.normal(size=(7, 5)), rng.normal(size=(11, 5))
    L, q = relevance_diversity_kernel(cand, ref, beta)
    np.testing.assert_allclose(L, reference.relevance_diversity_kernel(cand, ref, beta), rtol=1e-12, atol=1e-15)
    # relevance: the best cosine to the reference set, to the power beta
    cos = (cand / np.linalg.norm(cand, axis=1, keepdims=True)) @ (ref / np.linalg.norm(ref, axis=1,
                                                                                        keepdims=True)).T
    np.testing.assert_allclose(q, cos.max(1) ** beta)


def test_kernel_bad_input():
    x = np.ones((3, 4))
    with pytest.raises(ValueError, match="dimension"):
        relevance_diversity_kernel(x, np.ones((2, 5)))
    with pytest.raises(ValueError, match="all-zero row"):
        relevance_diversity_kernel(np.zeros((2, 4)), x)
    with pytest.raises(ValueError, match="beta"):
        relevance_diversity_kernel(x, x, beta=float("nan"))
    with pytest.raises(ValueError, match="2-D"):
        relevance_diversity_kernel(np.ones(4), x)


# ---------------------------------------------------------------------------------------------- SPAG step
def test_scales_and_step_sizes_by_hand():
    # (0.5 - 0.2) / (2 + 1e-8) = 0.15; (0.5 - 0.2) / 0.1 = 3 -> capped at 1
    assert official_scales([2.0, 0.1], 0.5, 0.2, 1.0) == pytest.approx([0.15, 1.0], abs=1e-8)
    assert polyak_step_size(4.0, 0.5, 0.2, 1.0) == pytest.approx(0.075)
    assert polyak_step_size(0.01, 0.5, 0.2, 1.0) == 1.0
    assert polyak_step_size(0.0, 0.5, 0.2, 1.0) == 0.0
    assert safety_triggered(0.31, 0.2, 0.1) and not safety_triggered(0.3, 0.2, 0.1)
    with pytest.raises(ValueError, match="safety loss"):
        safety_triggered(float("nan"), 0.2, 0.1)


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(3, 4, generator=g, dtype=torch.float64)),
          torch.nn.Parameter(torch.randn(5, generator=g, dtype=torch.float64))]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
    return ps


@pytest.mark.parametrize("loss", [0.25, 0.35, 0.9, 5.0])
def test_official_step_scales_each_tensor_then_steps_the_optimizer(loss):
    ps = _params(1)
    grads = [p.grad.numpy().copy() for p in ps]
    fired, expected = reference.official_safety_step(grads, loss, 0.2, 0.1, 1.0)
    before = [p.detach().clone() for p in ps]
    opt = torch.optim.SGD(ps, lr=0.5)
    info = spag_safety_update(ps, loss, tau=0.2, tolerance=0.1, eta_safe=1.0, mode="official", optimizer=opt)
    assert info["triggered"] == float(fired)
    for p, b, g in zip(ps, before, expected, strict=True):
        if fired:  # SGD makes the scaled gradient visible in the update
            np.testing.assert_allclose((b - p.detach()).numpy() / 0.5, g, rtol=1e-12)
        else:
            assert torch.equal(p.detach(), b)


@pytest.mark.parametrize(("loss", "eta"), [(0.29, 1.0), (0.4, 1.0), (3.0, 0.01), (3.0, 100.0)])
def test_polyak_step_matches_the_projection(loss, eta):
    ps = _params(2)
    fired, expected = reference.polyak_safety_step([p.detach().numpy().copy() for p in ps],
                                                   [p.grad.numpy().copy() for p in ps], loss, 0.2, 0.1, eta)
    info = spag_safety_update(ps, loss, tau=0.2, tolerance=0.1, eta_safe=eta, mode="polyak")
    assert info["triggered"] == float(fired)
    for p, e in zip(ps, expected, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), e, rtol=1e-12)


def test_polyak_step_reaches_the_threshold_on_a_linear_loss():
    # L(theta) = a . theta is linear, so one uncapped projection lands exactly on L = tau
    a = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    theta = torch.nn.Parameter(torch.tensor([3.0, -1.0, 2.0], dtype=torch.float64))
    loss = a @ theta
    loss.backward()
    spag_safety_update([theta], float(loss.detach()), tau=0.5, tolerance=0.0, eta_safe=1e9, mode="polyak")
    assert float(a @ theta.detach()) == pytest.approx(0.5, abs=1e-12)


def test_safety_update_bad_input():
    ps = _params(3)
    for kw, match in ((dict(tau=0.0), "tau"), (dict(tau=-1.0), "tau"), (dict(tolerance=-0.1), "tolerance"),
                      (dict(eta_safe=0.0), "eta_safe"), (dict(mode="closed"), "mode")):
        args = dict(tau=0.2, tolerance=0.1, eta_safe=1.0, mode="polyak") | kw
        with pytest.raises(ValueError, match=match):
            spag_safety_update(ps, 1.0, **args)
    with pytest.raises(ValueError, match="optimizer"):
        spag_safety_update(ps, 1.0, tau=0.2, tolerance=0.1, eta_safe=1.0, mode="official")
    with pytest.raises(ValueError, match="safety loss"):
        spag_safety_update(ps, float("inf"), tau=0.2, tolerance=0.1, eta_safe=1.0, mode="polyak")
    ps[0].grad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        spag_safety_update(ps, 1.0, tau=0.2, tolerance=0.1, eta_safe=1.0, mode="polyak")
    nograd = [torch.nn.Parameter(torch.ones(2))]
    with pytest.raises(ValueError, match="no parameter has a gradient"):
        spag_safety_update(nograd, 1.0, tau=0.2, tolerance=0.1, eta_safe=1.0, mode="polyak")
