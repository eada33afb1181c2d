"""FedIT's math against a literal reference, causal-learn, brute-force permutations; invariances; bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from icml26.fedit import DP, FederatedIndependenceTest, check_clients, copula_transform
from icml26.fedit.baselines import hsic_gamma_test
from icml26.fedit.core import (
    ClientStatistics,
    aggregate,
    client_statistics,
    gaussian_sigma,
    uniform_median_bandwidth,
)
from icml26.fedit.reference import hsic_gamma_reference


def test_single_client_statistic_and_pvalue_match_the_reference():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=25), rng.normal(size=25)
    y = y + 0.8 * x
    S_ref, p_ref = hsic_gamma_reference(x.tolist(), y.tolist(), 0.7, 1.3)
    stats = client_statistics(x[:, None], y[:, None], 0.7, 1.3)
    assert stats.statistic == pytest.approx(S_ref, rel=1e-10)
    assert aggregate([stats]).pvalue == pytest.approx(p_ref, rel=1e-8)


def test_single_client_equals_causal_learn_kci():
    kci = pytest.importorskip("causallearn.utils.KCI.KCI")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 1))
    y = np.sin(2 * x) + 0.5 * rng.normal(size=(200, 1))
    ours = hsic_gamma_test(x, y, 1.0, 1.0)  # z-scored (ddof = 1), manual width 1.0
    theirs, _ = kci.KCI_UInd(est_width="manual", kwidthx=1.0, kwidthy=1.0).compute_pvalue(x, y)
    assert ours == pytest.approx(theirs, rel=1e-6)
    # the federated test on one client without alignment is the same test
    zx, zy = scipy.stats.zscore(x, ddof=1), scipy.stats.zscore(y, ddof=1)
    assert aggregate([client_statistics(zx, zy, 1.0, 1.0)]).pvalue == pytest.approx(theirs, rel=1e-6)


def test_permutation_null_matches_brute_force_on_tiny_data():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, 1)), rng.normal(size=(6, 1))
    stats = client_statistics(x, y, 1.0, 1.0)
    # every permutation of y: the exact permutation p-value
    all_stats = [client_statistics(x, y[list(p)], 1.0, 1.0).statistic for p in itertools.permutations(range(6))]
    exact = np.mean(np.array(all_stats) >= stats.statistic - 1e-12)
    sampled = client_statistics(x, y, 1.0, 1.0, n_permutations=20_000, rng=np.random.default_rng(3))
    p = aggregate([ClientStatistics(6, stats.statistic, 0, 0, sampled.permuted)], null="permutation").pvalue
    assert p == pytest.approx(exact, abs=0.01)


def test_random_features_approximate_the_exact_statistic():
    rng = np.random.default_rng(4)
    x = rng.random((300, 1))
    y = (x + 0.1 * rng.normal(size=(300, 1))) % 1.0
    exact = client_statistics(x, y, 0.3, 0.3)
    rff = client_statistics(x, y, 0.3, 0.3, random_features=2000, feature_seed=0)
    assert rff.statistic == pytest.approx(exact.statistic, rel=0.1)
    assert rff.null_mean == pytest.approx(exact.null_mean, rel=0.1)


def test_rank_transform_is_invariant_to_monotone_maps():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(50, 2))
    np.testing.assert_array_equal(copula_transform(x), copula_transform(np.exp(3 * x) + 7))
    assert copula_transform(np.array([1.0, 2.0, 2.0, 3.0])).ravel().tolist() == [0.2, 0.5, 0.5, 0.8]


def test_uniform_median_bandwidth():
    assert uniform_median_bandwidth(1) == pytest.approx(1 - math.sqrt(0.5))
    rng = np.random.default_rng(0)
    sim = np.median(np.linalg.norm(rng.random((100_000, 2)) - rng.random((100_000, 2)), axis=1))
    assert uniform_median_bandwidth(2) == pytest.approx(sim, abs=0.005)


def test_gamma_moments_are_summed_over_clients():
    a = ClientStatistics(10, 3.0, 1.0, 0.5)
    b = ClientStatistics(20, 5.0, 2.0, 1.5)
    r = aggregate([a, b])
    assert (r.statistic, r.null_mean, r.null_var) == (8.0, 3.0, 2.0)
    assert r.pvalue == pytest.approx(scipy.stats.gamma.sf(8.0, 9.0 / 2.0, scale=2.0 / 3.0))


def test_analytic_gaussian_mechanism():
    sigma = gaussian_sigma(1.0, 1e-5, 1.0)
    # the classical calibration sqrt(2 ln(1.25/delta)) / epsilon is valid but looser for epsilon <= 1
    assert 3.0 < sigma < math.sqrt(2 * math.log(1.25 / 1e-5))
    assert gaussian_sigma(8.0, 1e-5, 1.0) < sigma
    assert gaussian_sigma(1.0, 1e-5, 2.0) == pytest.approx(2 * sigma, rel=1e-6)


def test_private_null_includes_the_noise():
    # huge noise: the statistic is pure noise around the null mean, so p must be about uniform, not tiny
    stats = [ClientStatistics(100, 1.0 + 50.0, 1.0, 0.01, noise_var=100.0**2)]
    assert 0.2 < aggregate(stats).pvalue < 0.8


@pytest.mark.parametrize("clients, err, match", [
    (np.zeros((3, 2)), TypeError, "list of"),
    ([], ValueError, "at least one"),
    ([(np.arange(10.0), np.arange(9.0))], ValueError, "client 0: X has 10 rows but Y has 9"),
    ([(np.arange(4.0), np.arange(4.0))], ValueError, "client 0: 4 rows"),
    ([(np.arange(10.0), np.arange(10.0)), (np.ones(10), np.arange(10.0))], ValueError,
     r"client 1: column\(s\) \[0\] of X are constant"),
    ([(np.arange(10.0), np.r_[np.arange(9.0), np.nan])], ValueError, "client 0: Y contains NaN"),
    ([(np.arange(10.0), np.r_[np.arange(9.0), np.inf])], ValueError, "client 0: Y contains NaN or Inf"),
])
def test_bad_clients(clients, err, match):
    with pytest.raises(err, match=match):
        check_clients(clients)


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="epsilon"):
        DP(epsilon)


def test_bad_settings():
    clients = [(np.arange(10.0), np.arange(10.0)[::-1].copy())]
    with pytest.raises(ValueError, match="null"):
        FederatedIndependenceTest(null="bootstrap").fit(clients)
    with pytest.raises(ValueError, match="privacy needs the gamma null"):
        FederatedIndependenceTest(null="permutation", privacy=DP(1.0)).fit(clients)
    with pytest.raises(ValueError, match="1-D X and Y"):
        rng = np.random.default_rng(0)
        FederatedIndependenceTest(privacy=DP(1.0)).fit([(rng.random((10, 2)), rng.random(10))])


def test_single_client_is_the_ordinary_test():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(60, 1))
    y = x**2 + rng.normal(size=(60, 1))
    u, v = copula_transform(x), copula_transform(y)
    b = uniform_median_bandwidth(1)
    assert FederatedIndependenceTest().fit([(x, y)]).pvalue_ == pytest.approx(hsic_gamma_test(u, v, b, b, zscore=False))
