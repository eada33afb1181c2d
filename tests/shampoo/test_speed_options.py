"""Shampoo's speed options (issue #21) against hand computations: statistics every s steps, float32 roots with a
float64 retry, the optional finiteness pass, the smaller-side one-sided mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from icml26.shampoo import Shampoo, matrix_inverse_root
from icml26.shampoo.reference import inverse_root


def _grads(shape, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)]


def test_statistics_every_s_steps_by_hand():
    # updates at steps 1, 4, 7 with weight b2^3: L = sum_j (1 - b2^3) b2^(3 (J - j)) G_j G_j^T
    beta2, s, steps = 0.9, 3, 7
    X = torch.nn.Parameter(torch.zeros(4, 3, dtype=torch.float64))
    opt = Shampoo(
        [X],
        lr=0.01,
        betas=(0.9, beta2),
        statistics_frequency=s,
        precondition_frequency=1,
        start_preconditioning_step=1,
        grafting="none",
        factor_dtype=torch.float64,
    )
    grads = _grads((4, 3), steps)
    for g in grads:
        X.grad = g.clone()
        opt.step()
    b = beta2**s
    used = [grads[k] for k in (0, 3, 6)]
    L = np.zeros((4, 4))
    R = np.zeros((3, 3))
    for G in used:
        G = G.numpy()
        L = b * L + (1 - b) * G @ G.T
        R = b * R + (1 - b) * G.T @ G
    st = opt.state[X]
    np.testing.assert_allclose(st["left"][0].numpy(), L, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(st["right"][0].numpy(), R, rtol=1e-12, atol=1e-15)
    # the root of step 7 is taken from the factor bias-corrected by its own total weight 1 - b2^(3 * 3)
    bias2 = 1 - beta2 ** (s * 3)
    np.testing.assert_allclose(
        st["left_root"][0].numpy(), inverse_root(L / bias2, 0.25, 1e-6), rtol=1e-9, atol=1e-9
    )


def test_statistics_frequency_one_is_the_default_rule():
    grads = _grads((5, 4), 6, seed=3)
    out = []
    for kwargs in ({}, {"statistics_frequency": 1}):
        X = torch.nn.Parameter(torch.ones(5, 4, dtype=torch.float64))
        opt = Shampoo([X], lr=0.05, precondition_frequency=2, start_preconditioning_step=2, **kwargs)
        for g in grads:
            X.grad = g.clone()
            opt.step()
        out.append(X.detach().clone())
    assert torch.equal(out[0], out[1])


def test_float32_roots_close_to_float64_and_retry_on_failure(monkeypatch):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(6, 6, generator=g)
    A = A @ A.T
    r64 = matrix_inverse_root(A, 0.25, 1e-6, torch.float64)
    r32 = matrix_inverse_root(A, 0.25, 1e-6, torch.float32)
    assert r32.dtype == torch.float32
    torch.testing.assert_close(r32.double(), r64, rtol=1e-3, atol=1e-3)
    real = torch.linalg.eigh

    def fail_in_float32(a):
        if a.dtype == torch.float32:
            raise torch.linalg.LinAlgError("forced")
        return real(a)

    monkeypatch.setattr(torch.linalg, "eigh", fail_in_float32)
    retried = matrix_inverse_root(A, 0.25, 1e-6, torch.float32)
    assert retried.dtype == torch.float64
    torch.testing.assert_close(retried, r64)


def test_root_dtype_auto_follows_the_parameter():
    for dtype, expected in ((torch.float32, torch.float32), (torch.float64, torch.float64)):
        X = torch.nn.Parameter(torch.zeros(3, 4, dtype=dtype))
        opt = Shampoo([X], lr=0.01, precondition_frequency=1, start_preconditioning_step=1)
        X.grad = torch.randn(3, 4, dtype=dtype)
        opt.step()
        assert opt.state[X]["left_root"][0].dtype == expected


def test_check_finite_off_skips_the_pass():
    X = torch.nn.Parameter(torch.zeros(3, 2))
    opt = Shampoo([X], lr=0.01, check_finite=False)
    X.grad = torch.full((3, 2), math.nan)
    opt.step()  # no ValueError: documented, the state is now corrupted
    assert torch.isnan(X).all()
    opt = Shampoo([X], lr=0.01)
    with pytest.raises(ValueError, match="NaN or Inf"):
        opt.step()


@pytest.mark.parametrize("shape, side", [((3, 7), "left"), ((7, 3), "right"), ((4, 4), "left")])
def test_smaller_side_is_one_sided_on_the_smaller_dimension(shape, side):
    grads = _grads(shape, 5, seed=1)
    out = []
    for exps in ("smaller", side):
        X = torch.nn.Parameter(torch.ones(shape, dtype=torch.float64))
        opt = Shampoo([X], lr=0.05, exponents=exps, precondition_frequency=1, start_preconditioning_step=1)
        for g in grads:
            X.grad = g.clone()
            opt.step()
        out.append(X.detach().clone())
        if exps == "smaller":
            st = opt.state[X]
            assert len(st["left"] if side == "left" else st["right"]) == 1
            assert len(st["right"] if side == "left" else st["left"]) == 0
    assert torch.equal(out[0], out[1])


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"statistics_frequency": 0}, ValueError, "statistics_frequency"),
        ({"statistics_frequency": 2.0}, ValueError, "statistics_frequency"),
        ({"root_dtype": torch.float16}, ValueError, "root_dtype"),
        ({"root_dtype": "fast"}, ValueError, "root_dtype"),
        ({"check_finite": "yes"}, TypeError, "check_finite"),
    ],
)
def test_bad_speed_options_raise(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Shampoo([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)
