"""xFedAlign's math against independent oracles: loops in reference.py, scipy, KKT conditions, hand values.

The paper's central functions and the fast tests that guard each (a plausible bug in any of them is a mutant in
``mutants.toml`` that one of these kills):

- ``distill_surrogate`` (the sparse linear surrogate): ``test_surrogate_gradient_matches_the_loop_reference``,
  ``test_surrogate_is_a_lasso_optimum_kkt_and_scipy``, ``test_surrogate_standardises_so_lambda_is_scale_free``;
  its teacher is the client's model *after* this round's SGD, not the stale global model the server sent:
  ``test_algorithm.py::test_the_artifact_explains_the_clients_updated_model_not_the_global_one``.
- ``make_artifact`` (clip, Gaussian noise, top-k, quantise): ``test_artifact_matches_the_loop_reference`` (a
  generator stub that honours ``scale``), ``test_the_noise_scale_is_the_one_the_accountant_charges_for`` (the
  scale asked of the generator is sigma worked out by hand from (epsilon, delta) and Delta = sqrt(3C)),
  ``test_the_artifact_noise_has_standard_deviation_sigma`` (6,400 real draws),
  ``test_worst_case_neighbours_of_make_artifact_move_the_released_vector_by_at_most_sqrt_3c`` (the sensitivity,
  searched on ``make_artifact`` itself; map and presence bits),
  ``test_presence_bits_flip_with_the_gaussian_tail_probability``, ``test_negative_noisy_attributions_are_sent_as_zero_not_wrapped``;
  ``SparseArtifact``'s wire format: ``test_artifact_wire_format_round_trips_and_is_small``.
- ``zcdp_epsilon`` (the accountant): ``test_zcdp_epsilon_hand_value``,
  ``test_the_noise_scale_is_the_one_the_accountant_charges_for``.
- ``aggregate_prior`` (median over the holders of a class, EMA): ``test_prior_matches_the_loop_reference``,
  ``test_trimmed_mean_is_scipys``, ``test_median_stays_within_the_honest_range_under_a_minority_of_attackers``,
  ``test_algorithm.py::test_prior_is_the_median_of_the_clients_artifacts_with_ema``.
- ``align`` and ``jsd``: ``test_align_and_jsd``.
- ``XFedAlign`` / ``FedTrain`` (the protocol): ``test_algorithm.py`` (FedAvg parity, what leaves a client, drops,
  poisoning, bad input); the Flower path: ``test_flower.py``.

No count leaves a client in clear: the artifact carries one presence bit per class, noised inside the accountant
(``test_artifact_wire_format_round_trips_and_is_small``, ``test_presence_bits_flip_with_the_gaussian_tail_probability``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize
import scipy.spatial.distance
import scipy.stats

from icml26.xfedalign import reference
from icml26.xfedalign.core import (
    SparseArtifact,
    aggregate_prior,
    align,
    distill_surrogate,
    jsd,
    make_artifact,
    normalize_rows,
    sigma_for_epsilon,
    softmax,
    surrogate_objective,
    zcdp_epsilon,
)


def _soft_problem(seed=0, n=60, d=5, C=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3, size=d) + rng.normal(size=d)
    logits = X @ rng.normal(size=(d, C)) + rng.normal(size=(n, C))
    return X, logits


def test_surrogate_gradient_matches_the_loop_reference():
    X, logits = _soft_problem()
    sur = distill_surrogate(logits, X, iters=5)
    Z = (X - sur.mean) / sur.scale
    P = softmax(logits / 3.0)
    loss, gW, gb = reference.surrogate_loss_and_grad(sur.W.tolist(), sur.b.tolist(), Z.tolist(), P.tolist())
    assert surrogate_objective(sur.W, sur.b, Z, P, 0.0) == pytest.approx(loss, abs=1e-12)
    Q = softmax(Z @ sur.W.T + sur.b) - P
    np.testing.assert_allclose(Q.T @ Z / len(Z), gW, atol=1e-12)
    np.testing.assert_allclose(Q.mean(0), gb, atol=1e-12)


def test_surrogate_is_a_lasso_optimum_kkt_and_scipy():
    X, logits = _soft_problem(1)
    l1 = 0.02
    sur = distill_surrogate(logits, X, l1=l1, iters=5000)
    Z = (X - sur.mean) / sur.scale
    P = softmax(logits / 3.0)
    G = (softmax(Z @ sur.W.T + sur.b) - P).T @ Z / len(Z)
    zero = sur.W == 0
    # KKT of L1: |grad| <= lambda where W = 0; grad = -lambda sign(W) elsewhere; bias gradient 0
    assert zero.any() and (~zero).any()
    assert np.all(np.abs(G[zero]) <= l1 + 1e-6)
    np.testing.assert_allclose(G[~zero], -l1 * np.sign(sur.W[~zero]), atol=1e-6)
    np.testing.assert_allclose((softmax(Z @ sur.W.T + sur.b) - P).mean(0), 0, atol=1e-8)
    # an independent solver: L-BFGS-B on W = W+ - W-, W+/- >= 0
    C, d = sur.W.shape

    def f(v):
        Wp, Wm, b = v[:C * d].reshape(C, d), v[C * d:2 * C * d].reshape(C, d), v[2 * C * d:]
        W = Wp - Wm
        Q = softmax(Z @ W.T + b)
        val = -(P * np.log(Q)).sum(1).mean() + l1 * (Wp + Wm).sum()
        g = (Q - P).T @ Z / len(Z)
        return val, np.concatenate([(g + l1).ravel(), (-g + l1).ravel(), (Q - P).mean(0)])

    bounds = [(0, None)] * (2 * C * d) + [(None, None)] * C
    opt = scipy.optimize.minimize(f, np.zeros(2 * C * d + C), jac=True, method="L-BFGS-B", bounds=bounds,
                                  options={"maxiter": 5000, "ftol": 1e-14, "gtol": 1e-10})
    assert surrogate_objective(sur.W, sur.b, Z, P, l1) == pytest.approx(opt.fun, abs=1e-7)


def test_surrogate_standardises_so_lambda_is_scale_free():
    X, logits = _soft_problem(2)
    a = distill_surrogate(logits, X, l1=0.01)
    b = distill_surrogate(logits, 1000.0 * X + 5.0, l1=0.01)
    np.testing.assert_allclose(a.W, b.W, atol=1e-9)
    np.testing.assert_allclose(a.logits(X), b.logits(1000.0 * X + 5.0), atol=1e-8)


@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_artifact_matches_the_loop_reference(sigma):
    rng = np.random.default_rng(3)
    S = rng.random((4, 9)) ** 3
    z = rng.normal(size=S.shape)
    noise = sigma * z
    art = make_artifact(S, 4, noise_sigma=sigma, rng=_Fixed(z))
    ref = reference.artifact_dense_reference(S.tolist(), 4, noise.tolist() if sigma else None)
    np.testing.assert_allclose(art.dense(), ref, atol=1e-12)
    assert (art.values > 0).sum(axis=1).max() <= 4


class _Fixed:
    """A stand-in generator that honours ``scale``: fixed standard-normal draws, z for the (C, G) map and zh (default
    zeros) for the (C,) presence indicators, returned as ``scale * z`` (so the reference, given ``sigma * z``, sees
    the same noise only if ``make_artifact`` asks for scale sigma); it records every ``scale`` it was asked for."""

    def __init__(self, z, zh=None):
        self.z = np.asarray(z, dtype=np.float64)
        self.zh = np.zeros(self.z.shape[0]) if zh is None else np.asarray(zh, dtype=np.float64)
        self.scales = []

    def normal(self, loc=0.0, scale=1.0, size=None):
        draw = {self.z.shape: self.z, self.zh.shape: self.zh}[size]
        self.scales.append(float(scale))
        return loc + scale * draw


def test_artifact_wire_format_round_trips_and_is_small():
    rng = np.random.default_rng(4)
    art = make_artifact(rng.random((10, 16)), 8, noise_sigma=0.1, rng=rng, counts=np.arange(10) * 7, min_count=8)
    data = art.to_bytes()
    assert len(data) == art.nbytes == 12 + 2 + 2 * 10 * 8   # header, 10 presence bits, indices, values
    assert art.present.tolist() == [False, False] + [True] * 8   # counts 0, 7 < 8 (noise 0.1 flips none here)
    back = SparseArtifact.from_bytes(data)
    np.testing.assert_array_equal(back.indices, art.indices)
    np.testing.assert_array_equal(back.values, art.values)
    np.testing.assert_array_equal(back.present, art.present)
    np.testing.assert_allclose(back.dense(), art.dense())
    wide = make_artifact(rng.random((2, 300)), 3, noise_sigma=0.0)   # G > 256: two-byte indices
    assert SparseArtifact.from_bytes(wide.to_bytes()).indices.tolist() == wide.indices.tolist()


def test_clipping_bounds_the_sensitivity_of_the_noised_vector():
    """Any two non-negative maps give clipped vectors at most sqrt(2 C) apart: the mechanism's sensitivity."""
    C, G = 3, 5
    worst = 0.0
    rng = np.random.default_rng(5)
    for _ in range(200):
        A, B = rng.random((C, G)) ** 8, rng.random((C, G)) ** 8
        ua = A / np.linalg.norm(A, axis=1, keepdims=True)
        ub = B / np.linalg.norm(B, axis=1, keepdims=True)
        worst = max(worst, float(np.linalg.norm(ua - ub)))
    assert worst <= math.sqrt(2 * C)
    disjoint = np.linalg.norm(np.eye(C, G) - np.roll(np.eye(C, G), 1, axis=1))   # orthogonal rows reach it
    assert disjoint == pytest.approx(math.sqrt(2 * C))


def test_zcdp_epsilon_hand_value():
    # rho = R * 3C / (2 sigma^2) = 10 * 30 / 200 = 1.5; eps = 1.5 + 2 sqrt(1.5 ln 1e5)
    assert zcdp_epsilon(10.0, 10, 10, 1e-5) == pytest.approx(1.5 + 2 * math.sqrt(1.5 * math.log(1e5)))
    assert zcdp_epsilon(0.0, 10, 10) == math.inf
    assert sigma_for_epsilon(1.5 + 2 * math.sqrt(1.5 * math.log(1e5)), 10, 10, 1e-5) == pytest.approx(10.0)
    for bad in ({"rounds": 0}, {"rounds": 1.5}, {"delta": 1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            zcdp_epsilon(1.0, 10, **{"rounds": 1, **bad})
    with pytest.raises(ValueError, match="epsilon"):
        sigma_for_epsilon(0.0, 10, 1)


@pytest.mark.parametrize("method", ["median", "mean", "trimmed_mean"])
def test_prior_matches_the_loop_reference(method):
    rng = np.random.default_rng(6)
    maps = [rng.random((3, 5)) for _ in range(7)]
    present = rng.random((7, 3)) > 0.3
    present[0] = True
    prev = normalize_rows(rng.random((3, 5)))
    ours = aggregate_prior(maps, present=present, method=method, prev=prev, ema=0.6)
    ref = reference.prior_reference([m.tolist() for m in maps], present.tolist(), method, 0.2, prev.tolist(), 0.6)
    np.testing.assert_allclose(ours, ref, atol=1e-12)


def test_trimmed_mean_is_scipys():
    rng = np.random.default_rng(7)
    maps = [normalize_rows(rng.random((1, 4))) for _ in range(10)]
    ours = aggregate_prior(maps, method="trimmed_mean", trim=0.2)
    expected = normalize_rows(scipy.stats.trim_mean(np.stack(maps)[:, 0], 0.2, axis=0)[None])
    np.testing.assert_allclose(ours, expected, atol=1e-12)


def test_median_stays_within_the_honest_range_under_a_minority_of_attackers():
    rng = np.random.default_rng(8)
    honest = [normalize_rows(rng.random((2, 6)) * np.array([0, 1, 1, 1, 1, 1])) for _ in range(6)]
    attack = [np.tile(np.eye(1, 6), (2, 1))] * 2        # all mass on group 0, where honest clients put none
    median = aggregate_prior(honest + attack, method="median")
    mean = aggregate_prior(honest + attack, method="mean")
    assert np.all(median[:, 0] == 0.0)
    assert np.all(mean[:, 0] == pytest.approx(0.25))


def test_align_and_jsd():
    rng = np.random.default_rng(9)
    S, P = rng.random((4, 6)), normalize_rows(rng.random((4, 6)))
    for beta in (0.0, 0.35, 1.0):
        out = align(S, P, beta)
        for c in range(4):
            np.testing.assert_allclose(out[c], reference.align_reference(S[c], P[c], beta), atol=1e-12)
    np.testing.assert_allclose(align(S, P, 1.0), P)
    p, q = normalize_rows(rng.random((5, 6))), normalize_rows(rng.random((5, 6)))
    np.testing.assert_allclose(jsd(p, q), [scipy.spatial.distance.jensenshannon(a, b, base=2) ** 2
                                           for a, b in zip(p, q, strict=True)], atol=1e-12)
    assert jsd(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------- bad input
def test_bad_input_is_named():
    S = np.ones((2, 4))
    with pytest.raises(ValueError, match="topk must be in"):
        make_artifact(S, 5, noise_sigma=0.0)
    with pytest.raises(ValueError, match="topk must be in"):
        make_artifact(S, 0, noise_sigma=0.0)
    with pytest.raises(TypeError, match="topk must be an int"):
        make_artifact(S, 2.0, noise_sigma=0.0)
    with pytest.raises(ValueError, match="noise_sigma"):
        make_artifact(S, 2, noise_sigma=-0.1)
    with pytest.raises(ValueError, match="rng is required"):
        make_artifact(S, 2, noise_sigma=0.1)
    with pytest.raises(ValueError, match="NaN or Inf"):
        make_artifact(np.array([[np.nan, 1.0]]), 1, noise_sigma=0.0)
    with pytest.raises(ValueError, match="non-negative"):
        make_artifact(-S, 1, noise_sigma=0.0)
    with pytest.raises(ValueError, match="no client holds class 1"):
        aggregate_prior([S, S], present=[[True, False], [True, False]])
    with pytest.raises(ValueError, match="same \\(classes, groups\\) shape"):
        aggregate_prior([S, np.ones((2, 5))])
    with pytest.raises(ValueError, match="method must be"):
        aggregate_prior([S], method="max")
    with pytest.raises(ValueError, match="beta must be in"):
        align(S, S, 1.5)
    with pytest.raises(ValueError, match="beta"):
        align(S, S, -0.1)
    with pytest.raises(ValueError, match="temperature"):
        distill_surrogate(np.zeros((3, 2)), np.ones((3, 2)), temperature=0.0)
    with pytest.raises(ValueError, match="teacher's logits"):
        distill_surrogate(np.zeros((4, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="X contains NaN"):
        distill_surrogate(np.zeros((3, 2)), np.array([[1.0, np.inf]] * 3))


def test_the_artifact_noise_has_standard_deviation_sigma():
    # every row clips to 1/sqrt(G) = 0.125, more than 6 sigma above zero: no noise is cut off by the max(., 0)
    C, G, sigma = 100, 64, 0.02
    art = make_artifact(np.ones((C, G)), G, noise_sigma=sigma, rng=np.random.default_rng(0))
    sent = np.zeros((C, G))   # the dequantised values before dense()'s renormalisation
    sent[np.arange(C)[:, None], art.indices.astype(np.int64)] = art.values * (art.scale / ((1 << art.quant_bits) - 1))
    residual = sent - 1.0 / np.sqrt(G)
    assert abs(residual.std() / sigma - 1.0) < 0.05   # sd of 6,400 draws: about 1 % relative error
    assert abs(residual.mean()) < 0.002


def test_negative_noisy_attributions_are_sent_as_zero_not_wrapped():
    # every group kept (k = G): the negative noisy values reach the quantiser unless cut at zero first
    rng = np.random.default_rng(5)
    S = rng.random((4, 9)) ** 3
    z = rng.normal(size=S.shape)
    noise = 0.3 * z
    art = make_artifact(S, 9, noise_sigma=0.3, rng=_Fixed(z))
    ref = reference.artifact_dense_reference(S.tolist(), 9, noise.tolist())
    np.testing.assert_allclose(art.dense(), ref, atol=1e-12)
    clipped = S / np.linalg.norm(S, axis=1, keepdims=True)
    assert ((clipped + noise) < 0).sum() >= 3   # the case is exercised


def test_the_noise_scale_is_the_one_the_accountant_charges_for():
    """For a target (epsilon, delta) of one release, sigma is worked out by hand from the sensitivity
    Delta = sqrt(3 C) (map rows and presence bits); ``make_artifact`` must ask its generator for exactly that scale
    for both, and ``zcdp_epsilon`` must charge epsilon for it (issue #50: a stub that ignored ``scale`` let
    1/sqrt(G) times the noise pass)."""
    C, G, eps, delta = 10, 16, 8.0, 1e-5
    log_inv_delta = math.log(1 / delta)
    # eps = rho + 2 sqrt(rho ln(1/delta))  solved for rho  (Bun & Steinke 2016, Prop. 1.3)
    rho = (math.sqrt(log_inv_delta + eps) - math.sqrt(log_inv_delta)) ** 2
    # the Gaussian mechanism: rho = Delta^2 / (2 sigma^2), Delta = sqrt(3 C) (unit-norm rows: sqrt(2); bits: 1)
    sigma = math.sqrt(3 * C) / math.sqrt(2 * rho)
    assert sigma == pytest.approx(3.7812, abs=1e-4)                   # rho = 1.0491 by hand
    assert sigma_for_epsilon(eps, C, 1, delta) == pytest.approx(sigma, rel=1e-12)
    gen = _Fixed(np.random.default_rng(0).normal(size=(C, G)))
    make_artifact(np.random.default_rng(1).random((C, G)), 4, noise_sigma=sigma, rng=gen)
    assert gen.scales == [pytest.approx(sigma, rel=1e-12)] * 2         # map and bits, at the accounted scale
    assert zcdp_epsilon(gen.scales[0], C, 1, delta) == pytest.approx(eps, rel=1e-12)
    assert zcdp_epsilon(gen.scales[0], C, 3, delta) > eps               # rounds compose


def _sent(art):
    """The values an artifact carries, dequantised, before ``dense()``'s renormalisation (k = G: every group)."""
    out = np.zeros((art.n_classes, art.n_groups))
    out[np.arange(art.n_classes)[:, None], art.indices.astype(np.int64)] = (
        art.values * (art.scale / ((1 << art.quant_bits) - 1)))
    return out


def _released(S, counts):
    """What ``make_artifact`` releases with zero noise and k = G: the clipped map (up to quantisation) beside the
    presence bits, the (C, G + 1) vector the Gaussian mechanism noises."""
    art = make_artifact(S, S.shape[1], noise_sigma=0.0, counts=counts)
    return np.hstack([_sent(art), art.present[:, None].astype(float)])


def test_worst_case_neighbours_of_make_artifact_move_the_released_vector_by_at_most_sqrt_3c():
    """The sensitivity the accountant assumes, searched on ``make_artifact`` itself (zero noise, k = G, so the
    artifact carries the clipped vector up to 8-bit quantisation, and the presence bits exactly): any two client
    datasets (maps and class counts), a single record changed or all of them, give released vectors at most
    sqrt(3 C) apart, and disjoint supports with every class's presence flipped reach the bound."""
    C, G = 3, 5
    tol = math.sqrt(C * G) / 255            # two quantisation errors of at most max/510 on each coordinate
    rng = np.random.default_rng(5)
    maps = [np.eye(C, G), np.roll(np.eye(C, G), 2, axis=1), np.ones((C, G)), np.full((C, G), 1e-9),
            np.eye(C, G) + 1e-3] + [rng.random((C, G)) ** p for p in (1, 4, 16) for _ in range(8)]
    count_sets = [np.zeros(C, int), np.ones(C, int), np.array([5, 0, 2]), np.array([0, 3, 0])]
    sent = [_released(S, n) for S in maps for n in count_sets]
    worst = max(float(np.linalg.norm(a - b)) for a in sent for b in sent)
    assert worst <= math.sqrt(3 * C) + tol
    assert worst >= math.sqrt(3 * C) - tol                               # disjoint supports, every bit flipped
    # one record changed (its class's row moved off its old support, the class's only sample gone): sqrt(2 + 1)
    base = _released(np.eye(C, G), np.array([1, 4, 4]))
    one_row = np.vstack([np.eye(1, G, G - 1), np.eye(C, G)[1:]])
    moved = float(np.linalg.norm(_released(one_row, np.array([0, 4, 4])) - base))
    assert moved == pytest.approx(math.sqrt(3), abs=tol)


def test_presence_bits_flip_with_the_gaussian_tail_probability():
    """Oracle: a bit is on iff h + N(0, sigma^2) > 1/2, so an absent class reads present with probability
    1 - Phi(1/(2 sigma)) and a present one absent with the same probability (scipy's normal tail); 4,000 classes
    in one artifact give the rate to about +-0.008 (one s.e.)."""
    C, sigma = 4000, 0.8
    p = scipy.stats.norm.sf(0.5 / sigma)
    for counts, flipped in ((np.zeros(C, int), lambda a: a.present), (np.full(C, 3), lambda a: ~a.present)):
        art = make_artifact(np.ones((C, 2)), 1, noise_sigma=sigma, counts=counts, rng=np.random.default_rng(9))
        assert abs(flipped(art).mean() - p) < 4 * math.sqrt(p * (1 - p) / C)
    with pytest.raises(ValueError, match="min_count"):
        make_artifact(np.ones((2, 2)), 1, noise_sigma=0.0, min_count=-1)
