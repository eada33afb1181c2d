"""Shampoo against its literal float64 reference and against closed forms (SVD, AdamW)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from icml26.shampoo import Shampoo, matrix_inverse_root
from icml26.shampoo.reference import condition_number, inverse_root, reference_shampoo

U = np.finfo(np.float64).eps


def eigh_tolerance(kappa: float, scale: float) -> float:
    """Absolute tolerance for float64 results built on inverse roots of matrices with condition number ``kappa``.

    eigh is backward stable (it solves a matrix within about u ||A|| of A), and (A + eps I)^(-p) turns that into
    a relative error of about p u kappa (d lambda^-p / d lambda = -p lambda^(-p-1) at lambda_min = eps), so
    two correct LAPACK builds may differ by that much: a fixed 1e-10 held on one CPU and failed on another
    (1.28e-10 after 12 steps, issue 19). Across scipy's four eigh drivers (ev, evd, evr, evx) the final X of the
    reference configurations below differs by up to 0.09 u kappa |X| (``test_tolerance_covers_lapack_drivers``);
    16 u kappa |X| covers that with margin for the 12 steps' accumulation, and stays far below what a slip in
    the algorithm moves X by (lr = 0.05 per step; checked in the tests that use it).
    """
    return 16 * U * kappa * max(1.0, scale)


def stochastic_quadratic(shape, seed):
    """grad(X) = S (X - 1) + 0.5 Z with a random SPD S: a well-posed problem whose iterates stay bounded."""
    rng = np.random.default_rng(seed)
    S = rng.normal(size=(shape[0], shape[0]))
    S = S @ S.T / shape[0] + np.eye(shape[0])

    def grad(X):
        return S @ (X - 1.0) + 0.5 * rng.normal(size=X.shape)

    return grad


CONFIGS = [
    dict(exponents=(0.25, 0.25), grafting="none", start=1, freq=1),
    dict(exponents=(0.5, 0.0), grafting="none", start=1, freq=1),
    dict(exponents=(0.0, 0.5), grafting="none", start=1, freq=1, weight_decay=0.1),
    dict(exponents=(0.25, 0.25), grafting="adam", start=3, freq=2),
    dict(exponents=(0.25, 0.25), grafting="sgd", start=2, freq=3),
    dict(exponents=(0.5, 0.0), grafting="adam", start=1, freq=1, block=3),
    dict(exponents=(0.25, 0.25), grafting="none", start=1, freq=2, block=4, weight_decay=0.05),
    dict(exponents=(0.25, 0.25), grafting="adam", start=4, freq=3, block=2, betas=(0.5, 0.9)),
]


def _reference(cfg: dict, shape: tuple[int, int]) -> tuple[np.ndarray, float]:
    """The reference's final X for one configuration and the largest condition number of its factors."""
    cfg = dict(cfg)
    block, start, freq = cfg.pop("block", None), cfg.pop("start"), cfg.pop("freq")
    X0 = np.random.default_rng(1).normal(size=shape)
    kappas: list[float] = []
    X = reference_shampoo(
        X0,
        stochastic_quadratic(shape, 2),
        steps=12,
        lr=0.05,
        start=start,
        freq=freq,
        block=block,
        conditions=kappas,
        **cfg,
    )
    return X, max(kappas)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("shape", [(7, 5), (4, 9)])
def test_matches_reference_within_eigh_tolerance(cfg, shape):
    expected, kappa = _reference(cfg, shape)
    tol = eigh_tolerance(kappa, np.abs(expected).max())
    assert tol < 1e-5, f"kappa = {kappa:.3g} makes the comparison meaningless"
    np.testing.assert_allclose(_run_shampoo(cfg, shape), expected, rtol=0, atol=tol)


def _run_shampoo(cfg: dict, shape: tuple[int, int], **options) -> np.ndarray:
    """The optimizer's parameters after the 12 float64 steps ``_reference`` takes, on the same start and
    gradients (``options``: extra ``Shampoo`` arguments, e.g. ``root_method``)."""
    cfg = dict(cfg)
    block, start, freq = cfg.pop("block", None), cfg.pop("start"), cfg.pop("freq")
    X = torch.nn.Parameter(torch.tensor(np.random.default_rng(1).normal(size=shape)))
    opt = Shampoo(
        [X],
        lr=0.05,
        start_preconditioning_step=start,
        precondition_frequency=freq,
        max_preconditioner_dim=block or 1024,
        factor_dtype=torch.float64,
        **cfg,
        **options,
    )
    grad = stochastic_quadratic(shape, 2)
    for _ in range(12):
        X.grad = torch.tensor(grad(X.detach().numpy()))
        opt.step()
    return X.detach().numpy()


@pytest.mark.parametrize("driver", ["ev", "evd", "evr", "evx"])
def test_tolerance_covers_lapack_drivers(driver, monkeypatch):
    """The reference run through each of LAPACK's symmetric eigensolvers (as different CPUs' builds would pick
    different code paths) agrees with NumPy's within ``eigh_tolerance``, on every configuration."""
    import scipy.linalg

    shapes = [(7, 5), (4, 9)]
    plain = {(i, s): _reference(c, s) for i, c in enumerate(CONFIGS) for s in shapes}
    monkeypatch.setattr(np.linalg, "eigh", lambda a: scipy.linalg.eigh(a, driver=driver))
    for i, c in enumerate(CONFIGS):
        for shape in shapes:
            expected, kappa = plain[i, shape]
            other, _ = _reference(c, shape)
            np.testing.assert_allclose(
                other, expected, rtol=0, atol=eigh_tolerance(kappa, np.abs(expected).max())
            )


def test_eigh_tolerance_still_catches_a_wrong_exponent():
    """The looser tolerance is still far tighter than an algorithmic slip: (0.25, 0.25) vs (0.3, 0.2)."""
    cfg = dict(exponents=(0.25, 0.25), grafting="none", start=1, freq=1)
    expected, kappa = _reference(cfg, (7, 5))
    slipped, _ = _reference({**cfg, "exponents": (0.3, 0.2)}, (7, 5))
    assert np.abs(slipped - expected).max() > 1e3 * eigh_tolerance(kappa, np.abs(expected).max())


def test_conv_weights_are_preconditioned_as_matrices():
    W0 = np.random.default_rng(3).normal(size=(4, 2, 3, 3))
    grad2d = stochastic_quadratic((4, 18), 4)
    kappas: list[float] = []
    expected = reference_shampoo(
        W0.reshape(4, 18), grad2d, steps=6, lr=0.05, grafting="adam", start=1, freq=1, conditions=kappas
    )
    W = torch.nn.Parameter(torch.tensor(W0))
    opt = Shampoo(
        [W], lr=0.05, start_preconditioning_step=1, precondition_frequency=1, factor_dtype=torch.float64
    )
    grad2d = stochastic_quadratic((4, 18), 4)
    for _ in range(6):
        W.grad = torch.tensor(grad2d(W.detach().numpy().reshape(4, 18)).reshape(4, 2, 3, 3))
        opt.step()
    np.testing.assert_allclose(
        W.detach().numpy().reshape(4, 18),
        expected,
        rtol=0,
        atol=eigh_tolerance(max(kappas), np.abs(expected).max()),
    )


@pytest.mark.parametrize("exponents", [(0.5, 0.0), (0.25, 0.25)])
def test_first_step_is_the_regularised_polar_factor(exponents):
    """With b1 = b2 = 0 one step is X - lr U diag(s / sqrt(s^2 + eps)) V^T for G = U diag(s) V^T (one- and
    two-sided agree: both are the regularised polar factor of G)."""
    rng = np.random.default_rng(5)
    G = rng.normal(size=(4, 7))
    eps, lr = 1e-3, 0.1
    U, s, Vt = np.linalg.svd(G, full_matrices=False)
    expected = -lr * (U * (s / np.sqrt(s**2 + eps))) @ Vt
    X = torch.nn.Parameter(torch.zeros(4, 7, dtype=torch.float64))
    opt = Shampoo(
        [X],
        lr=lr,
        betas=(0.0, 0.0),
        eps=eps,
        exponents=exponents,
        grafting="none",
        start_preconditioning_step=1,
        precondition_frequency=1,
        factor_dtype=torch.float64,
    )
    X.grad = torch.tensor(G)
    opt.step()
    # the factors are G G^T + eps I and G^T G + eps I (the latter rank-deficient): kappa = (s_max^2 + eps) / eps
    kappa = (s.max() ** 2 + eps) / eps
    np.testing.assert_allclose(
        X.detach().numpy(), expected, rtol=0, atol=eigh_tolerance(kappa, np.abs(expected).max())
    )


def test_before_preconditioning_it_is_adamw_exactly():
    torch.manual_seed(0)
    m1 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    m2 = copy.deepcopy(m1)
    o1 = Shampoo(m1.parameters(), lr=1e-2, weight_decay=0.01, start_preconditioning_step=10**9)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2, weight_decay=0.01, eps=1e-8)
    x, y = torch.randn(32, 8), torch.randn(32, 3)
    for _ in range(25):
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for p, q in zip(m1.parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_biases_take_the_adam_step_while_matrices_are_preconditioned():
    torch.manual_seed(1)
    lin = torch.nn.Linear(5, 4)
    b_ref = torch.nn.Parameter(lin.bias.detach().clone())
    opt = Shampoo(lin.parameters(), lr=1e-2, start_preconditioning_step=1, precondition_frequency=1)
    ref = torch.optim.AdamW([b_ref], lr=1e-2, weight_decay=0.0, eps=1e-8)
    W0 = lin.weight.detach().clone()
    x = torch.randn(16, 5)
    for _ in range(5):
        opt.zero_grad()
        lin(x).square().mean().backward()
        b_ref.grad = lin.bias.grad.clone()
        opt.step()
        ref.step()
    torch.testing.assert_close(lin.bias, b_ref, rtol=0, atol=1e-7)
    assert not torch.allclose(lin.weight, W0)


def test_inverse_root_matches_the_reference_and_scipy():
    import scipy.linalg

    rng = np.random.default_rng(0)
    A = rng.normal(size=(6, 3))
    A = A @ A.T  # rank-deficient PSD
    ours = matrix_inverse_root(torch.tensor(A), 0.25, 1e-4).numpy()
    tol = eigh_tolerance(condition_number(A, 1e-4), np.abs(ours).max())
    np.testing.assert_allclose(ours, inverse_root(A, 0.25, 1e-4), rtol=0, atol=tol)
    spd = A + 1e-4 * np.eye(6)
    # scipy's Schur-Pade algorithm is another method with the same conditioning, so the same tolerance
    np.testing.assert_allclose(
        ours, np.real(scipy.linalg.fractional_matrix_power(spd, -0.25)), rtol=0, atol=tol
    )
