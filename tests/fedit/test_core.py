"""FedIT's math against a literal reference, causal-learn, brute-force permutations (the exact null moments);
invariances; the scipy-style function; bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from icml26.fedit import (
    DP,
    FederatedIndependenceTest,
    check_clients,
    copula_transform,
    federated_independence_test,
    permutation_moments,
)
from icml26.fedit.baselines import hsic_gamma_test
from icml26.fedit.core import (
    ClientStatistics,
    aggregate,
    centre,
    centred_features,
    centred_summaries,
    client_statistics,
    feature_summaries,
    gaussian_gram,
    gram_statistics,
    grid,
    grid_null_moments,
    grid_summaries,
    random_fourier_features,
    uniform_median_bandwidth,
)
from icml26.fedit.reference import hsic_gamma_reference, permutation_distribution

B1 = uniform_median_bandwidth(1)


def test_single_client_statistic_and_pvalue_match_the_reference():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=25), rng.normal(size=25)
    y = y + 0.8 * x
    S_ref, p_ref = hsic_gamma_reference(x.tolist(), y.tolist(), 0.7, 1.3)
    stats = client_statistics(x[:, None], y[:, None], 0.7, 1.3, moments="asymptotic")
    assert stats.statistic == pytest.approx(S_ref, rel=1e-10)
    assert aggregate([stats]).pvalue == pytest.approx(p_ref, rel=1e-8)
    # the exact moments against all 7! permutations, enumerated by the reference
    x, y = x[:7], y[:7]
    S_ref, p_ref = hsic_gamma_reference(x.tolist(), y.tolist(), 0.7, 1.3, moments="permutation")
    stats = client_statistics(x[:, None], y[:, None], 0.7, 1.3)
    assert stats.statistic == pytest.approx(S_ref, rel=1e-10)
    assert aggregate([stats]).pvalue == pytest.approx(p_ref, rel=1e-8)


def test_single_client_equals_causal_learn_kci():
    kci = pytest.importorskip("causallearn.utils.KCI.KCI")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 1))
    y = np.sin(2 * x) + 0.5 * rng.normal(size=(200, 1))
    ours = hsic_gamma_test(x, y, 1.0, 1.0, moments="asymptotic")  # z-scored (ddof = 1), manual width 1.0
    theirs, _ = kci.KCI_UInd(est_width="manual", kwidthx=1.0, kwidthy=1.0).compute_pvalue(x, y)
    assert ours == pytest.approx(theirs, rel=1e-6)
    # the federated test on one client without alignment is the same test
    zx, zy = scipy.stats.zscore(x, ddof=1), scipy.stats.zscore(y, ddof=1)
    assert aggregate([client_statistics(zx, zy, 1.0, 1.0, moments="asymptotic")]).pvalue == pytest.approx(theirs,
                                                                                                          rel=1e-6)


@pytest.mark.parametrize("n", [4, 5, 6, 7])
def test_exact_permutation_moments_equal_brute_force(n):
    """The closed form against the mean and variance over all n! within-client permutations (exact kernels on 1-D
    and 2-D data, and random features)."""
    rng = np.random.default_rng(n)
    U, V = rng.random((n, 1)), rng.random((n, 2))
    Kc, Lc = centre(gaussian_gram(U, 0.3)), centre(gaussian_gram(V, 0.5))
    null = np.array(permutation_distribution(Kc.tolist(), Lc.tolist()))
    mean, var = permutation_moments(centred_summaries(Kc), centred_summaries(Lc), n)
    assert mean == pytest.approx(null.mean(), rel=1e-10) and var == pytest.approx(null.var(), rel=1e-9)
    stats = client_statistics(U, V, 0.3, 0.5)
    assert (stats.null_mean, stats.null_var) == pytest.approx((null.mean(), null.var()), rel=1e-9)
    # random features: K~ = Phi~ Phi~^T, the same formula from feature summaries
    Phi, Psi = (f - f.mean(axis=0) for f in (random_fourier_features(U, 0.3, 5, 1), random_fourier_features(V, 0.5, 7, 2)))
    null = np.array(permutation_distribution((Phi @ Phi.T).tolist(), (Psi @ Psi.T).tolist()))
    mean, var = permutation_moments(feature_summaries(Phi), feature_summaries(Psi), n)
    assert mean == pytest.approx(null.mean(), rel=1e-10) and var == pytest.approx(null.var(), rel=1e-9)


def test_exact_moments_against_sampled_permutations_at_moderate_n():
    rng = np.random.default_rng(11)
    n = 40
    U, V = copula_transform(rng.normal(size=n)), copula_transform(rng.normal(size=n))
    stats = client_statistics(U, V, B1, B1, n_permutations=20_000, rng=np.random.default_rng(0))
    se_mean = math.sqrt(stats.null_var / 20_000)
    assert stats.permuted.mean() == pytest.approx(stats.null_mean, abs=4 * se_mean)
    assert stats.permuted.var() == pytest.approx(stats.null_var, rel=0.05)
    # the asymptotic moments are off by a factor (n - 1) / n in the mean: the error the exact moments remove
    asym = client_statistics(U, V, B1, B1, moments="asymptotic")
    assert asym.null_mean == pytest.approx(stats.null_mean * (n - 1) / n, rel=1e-12)


def test_gram_statistics_equal_the_centred_computation():
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(30, 2)), rng.normal(size=(30, 1))
    K, L = gaussian_gram(X, 0.8), gaussian_gram(Y, 1.1)
    stat, a, b = gram_statistics(K, L)
    Kc, Lc = centre(K), centre(L)
    assert stat == pytest.approx(float(np.sum(Kc * Lc)), rel=1e-10)
    assert a == pytest.approx(centred_summaries(Kc), rel=1e-10) and b == pytest.approx(centred_summaries(Lc), rel=1e-10)


@pytest.mark.parametrize("n", [5, 37, 300])
def test_grid_summaries_in_linear_time_equal_the_dense_ones(n):
    Kc = centre(gaussian_gram(grid(n), B1))
    a1, a2, a3, c, e = grid_summaries(n, B1)
    assert (a1, a2, a3) == pytest.approx(centred_summaries(Kc), rel=1e-10)
    assert c == pytest.approx(math.sqrt(np.max(np.diag(Kc))), rel=1e-12)
    g = grid(n)
    assert e == pytest.approx(math.sqrt(2 - 2 * math.exp(-(g[1, 0] - g[0, 0]) ** 2 / (2 * B1**2))), rel=1e-12)
    # a private client's moments are the grid's whatever its data (its ranks are a permutation of the grid)
    rng = np.random.default_rng(n)
    U = copula_transform(rng.normal(size=n), rng=rng)
    V = copula_transform(np.round(rng.normal(size=n)), rng=rng)  # heavy ties, broken at random
    for D in (None, 8):
        ours = client_statistics(U, V, B1, B1, random_features=D, feature_seed=4)
        assert (ours.null_mean, ours.null_var) == pytest.approx(grid_null_moments(n, B1, B1, D, 4), rel=1e-9)


def test_random_features_on_the_grid_are_gathered_from_the_grid_features():
    rng = np.random.default_rng(8)
    U = copula_transform(rng.normal(size=50))                 # no ties: on the grid
    Phi, a = centred_features(U, B1, 16, 3)
    direct = random_fourier_features(U, B1, 16, 3)
    direct -= direct.mean(axis=0)
    np.testing.assert_allclose(Phi, direct, rtol=0, atol=1e-12)
    assert a == pytest.approx(feature_summaries(direct), rel=1e-10)
    T = copula_transform(np.r_[np.zeros(5), rng.normal(size=45)])  # ties: average ranks, off the grid
    Phi, a = centred_features(T, B1, 16, 3)
    direct = random_fourier_features(T, B1, 16, 3)
    np.testing.assert_allclose(Phi, direct - direct.mean(axis=0), atol=1e-12)


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
    np.testing.assert_array_equal(copula_transform(x), scipy.stats.rankdata(x, axis=0) / 51)
    assert copula_transform(np.array([1.0, 2.0, 2.0, 3.0])).ravel().tolist() == [0.2, 0.5, 0.5, 0.8]
    # ties broken at random: a permutation of the grid, ties in random order
    u = copula_transform(np.array([1.0, 2.0, 2.0, 3.0]), rng=np.random.default_rng(0)).ravel()
    assert sorted(u.tolist()) == [0.2, 0.4, 0.6, 0.8] and u[0] == 0.2 and u[3] == 0.8


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


def test_private_null_includes_the_noise():
    # huge noise: the released root is pure noise around the null's root, so p must be about uniform, not tiny
    stats = [ClientStatistics(100, 1.0 + 50.0, 1.0, 0.01, noise_var=100.0**2)]
    result = aggregate(stats, "private", rng=np.random.default_rng(0))
    assert 0.2 < result.pvalue < 0.8
    assert result.null_samples.shape == (10_000,) and result.null_samples.std() == pytest.approx(100, rel=0.03)
    with pytest.raises(ValueError, match="null='private'"):
        aggregate(stats)


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


def test_scipy_style_function_and_estimator_agree():
    rng = np.random.default_rng(12)
    xs = [rng.normal(size=30) + k for k in range(3)]
    ys = [np.sin(2 * x) + rng.normal(size=30) for x in xs]
    res = federated_independence_test(xs, ys, random_state=1)
    statistic, pvalue = res
    est = FederatedIndependenceTest(random_state=1).fit(list(zip(xs, ys, strict=True)))
    assert (statistic, pvalue) == (est.statistic_, est.pvalue_) and res.n_clients == 3
    # gamma null: a frozen scipy distribution with the summed exact moments
    assert res.null_distribution.sf(statistic) == pytest.approx(pvalue, rel=1e-10)
    assert (res.null_distribution.mean(), res.null_distribution.var()) == pytest.approx((res.null_mean, res.null_var))
    assert res.null_mean == pytest.approx(sum(s.null_mean for s in res.client_statistics))
    # permutation null: the B stacked permuted statistics, p = (1 + #{S_b >= S}) / (B + 1)
    perm = federated_independence_test(xs, ys, null="permutation", n_permutations=99, random_state=1)
    assert perm.null_distribution.shape == (99,)
    assert perm.pvalue == (1 + np.sum(perm.null_distribution >= perm.statistic)) / 100
    assert perm.statistic == pytest.approx(statistic, rel=1e-12)


@pytest.mark.parametrize("xs, ys, err, match", [
    (np.zeros((2, 10)), [np.zeros(10)] * 2, TypeError, "client_xs must be a list"),
    ([np.arange(10.0)], "abc", TypeError, "client_ys must be a list"),
    ([np.arange(10.0)] * 2, [np.arange(10.0)], ValueError, "client_xs has 2 clients but client_ys has 1"),
    ([np.arange(10.0)], [np.r_[np.arange(9.0), np.nan]], ValueError, "client 0: Y contains NaN"),
])
def test_function_bad_input(xs, ys, err, match):
    with pytest.raises(err, match=match):
        federated_independence_test(xs, ys)


def test_bad_moments():
    with pytest.raises(ValueError, match="moments must be one of"):
        client_statistics(np.ones((5, 1)), np.ones((5, 1)), 1.0, 1.0, moments="gretton")
    with pytest.raises(ValueError, match="needs n >= 4"):
        permutation_moments((1, 1, 1), (1, 1, 1), 3)


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


def test_private_null_sums_roots_of_the_gamma_nulls_plus_the_noise():
    """Each client's null term is sqrt(G_k) + N(0, noise_var_k), G_k the gamma with its moments (mean 100, variance
    200: shape 50, scale 2): E sqrt(G) = sqrt(2) Gamma(50.5) / Gamma(50), Var sqrt(G) = E G - (E sqrt(G))^2."""
    from icml26.fedit.core import private_null_samples

    stats = [ClientStatistics(50, 0.0, 100.0, 200.0), ClientStatistics(50, 0.0, 100.0, 200.0, noise_var=4.0)]
    draws = 200_000
    samples = private_null_samples(stats, draws, np.random.default_rng(0))
    root_mean = math.sqrt(2.0) * math.exp(math.lgamma(50.5) - math.lgamma(50.0))
    root_var = 100.0 - root_mean**2
    var = 2 * root_var + 4.0
    assert samples.mean() == pytest.approx(2 * root_mean, abs=5 * math.sqrt(var / draws))
    assert samples.var() == pytest.approx(var, rel=0.02)
