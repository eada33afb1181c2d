"""The private release of sqrt(R_k): the sensitivity bound against a worst-case search, the rank argument behind
it, what leaves a private client, the data-free null, the analytic Gaussian mechanism and the accountant."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.stats

from icml26.common.federation import run_in_process
from icml26.fedit import (
    DP,
    FederatedIndependenceTest,
    FedITQuery,
    GaussianAccountant,
    federated_independence_test,
)
from icml26.fedit.core import (
    copula_transform,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_sigma,
    grid,
    root_statistic,
    root_statistic_sensitivity,
    uniform_median_bandwidth,
)
from icml26.fedit.data import shared_shifts

B1 = uniform_median_bandwidth(1)


def _neighbour(ranks: np.ndarray, j: int, new: int) -> np.ndarray:
    """Ranks (0-based, a permutation) after record j is replaced by one of rank ``new``: the others keep their
    order, those between the old and the new place move by one."""
    out = ranks - (ranks > ranks[j])
    out = out + (out >= new)
    out[j] = new
    return out


def _worst_change(n: int, features: int | None, steps: int, rng: np.random.Generator) -> float:
    """Largest |sqrt(R(D)) - sqrt(R(D'))| found over neighbouring datasets by hill climbing from strongly
    dependent, anti-dependent and random starts (a dataset is its pair of rank permutations; a neighbour replaces
    record j by one at x-rank a and y-rank b)."""
    G = grid(n)

    def change(rx, ry, j, a, b):
        before = root_statistic(G[rx], G[ry], B1, B1, features, 3)
        after = root_statistic(G[_neighbour(rx, j, a)], G[_neighbour(ry, j, b)], B1, B1, features, 3)
        return abs(before - after)

    best = 0.0
    starts = [(np.arange(n), np.arange(n)), (np.arange(n), np.arange(n)[::-1].copy()),
              (rng.permutation(n), rng.permutation(n))]
    for rx, ry in starts:
        move = [int(v) for v in rng.integers(n, size=3)]
        current = change(rx, ry, *move)
        for _ in range(steps):
            rx2, ry2, move2 = rx.copy(), ry.copy(), list(move)
            kind = int(rng.integers(5))
            if kind < 2:
                i, k = rng.integers(n, size=2)
                target = rx2 if kind == 0 else ry2
                target[[i, k]] = target[[k, i]]
            else:
                move2[kind - 2] = int(rng.integers(n))
            value = change(rx2, ry2, *move2)
            if value >= current:
                rx, ry, move, current = rx2, ry2, move2, value
        best = max(best, current)
    return best


@pytest.mark.parametrize("features", [None, 16], ids=["exact kernels", "random features"])
@pytest.mark.parametrize("n", [5, 9, 16])
def test_worst_case_search_never_exceeds_the_sensitivity_bound(n, features):
    found = _worst_change(n, features, steps=200, rng=np.random.default_rng(n))
    bound = root_statistic_sensitivity(n, B1, B1, features, 3)
    assert found <= bound
    assert found > 0.05 * bound  # the search moves the statistic: the comparison is not vacuous


def test_the_bound_is_constant_in_n_and_tends_to_its_limit():
    bounds = [root_statistic_sensitivity(n, B1, B1) for n in (100, 1000, 10_000, 100_000)]
    assert bounds == sorted(bounds) and bounds[-1] - bounds[-2] < 0.01
    # the limit 2 c^2 + 2 c / s, with c^2 = 1 - 2 min_g m(g) + M for uniforms on [0, 1] (m, M by quadrature)
    k = lambda t: math.exp(-t * t / (2 * B1 * B1))  # noqa: E731
    m0 = scipy.integrate.quad(k, 0, 1)[0]                          # m at the grid's end, its minimum
    M = 2 * scipy.integrate.quad(lambda t: (1 - t) * k(t), 0, 1)[0]
    c = math.sqrt(1 - 2 * m0 + M)
    assert bounds[-1] == pytest.approx(2 * c * c + 2 * c / B1, rel=1e-3)


def test_replacing_a_record_moves_every_other_rank_by_at_most_one():
    """The step of the proof, through the client's own rank transform (ties broken by per-row keys)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(5, 40))
        x = np.round(rng.normal(size=n), 1)           # ties on purpose
        x2 = x.copy()
        j = int(rng.integers(n))
        x2[j] = np.round(rng.normal() * 3, 1)
        seed = int(rng.integers(1 << 30))
        u = copula_transform(x, rng=np.random.default_rng(seed)).ravel() * (n + 1)
        u2 = copula_transform(x2, rng=np.random.default_rng(seed)).ravel() * (n + 1)
        assert sorted(np.rint(u).tolist()) == list(range(1, n + 1))
        others = np.delete(np.abs(u - u2), j)
        assert others.max() <= 1 + 1e-9


def test_a_private_client_releases_only_n_and_its_noisy_root():
    clients = shared_shifts(np.random.default_rng(1), K=3, n=60, dep=0.5)
    query = FedITQuery(copula=True, null="gamma", n_permutations=0, random_features=None, privacy=DP(4.0),
                       seed=5)
    (stats, result), log = run_in_process(query, clients, transcript=True)
    for cid, reply in log.replies[0].items():
        assert set(reply) == {"n", "statistic"}
        U = copula_transform(clients[cid][0], rng=np.random.default_rng(5 * 1_000_003 + cid))
        V = copula_transform(clients[cid][1], rng=np.random.default_rng(5 * 1_000_003 + cid))
        noise = reply["statistic"] - root_statistic(U, V, B1, B1)
        # U, V drew their tie-breaking keys first, then the noise: the released value is root + sigma z
        sigma = gaussian_sigma(4.0, 1e-5, root_statistic_sensitivity(60, B1, B1))
        assert stats[cid].noise_var == pytest.approx(sigma**2)
        assert abs(noise) < 6 * sigma
    assert result.null == "private" and result.statistic == pytest.approx(sum(r["statistic"] for r in
                                                                              log.replies[0].values()))


def test_private_test_reports_the_accountants_epsilon_and_detects_strong_dependence():
    rng = np.random.default_rng(2)
    xs = [rng.normal(size=400) for _ in range(4)]
    ys = [x + 0.3 * rng.normal(size=400) for x in xs]
    for features in (None, 32):
        res = federated_independence_test(xs, ys, privacy=DP(2.0, 1e-6), random_features=features, random_state=0)
        assert res.null == "private" and res.pvalue < 0.01
        assert res.delta == 1e-6 and 2.0 - 1e-6 < res.epsilon <= 2.0
        assert res.null_distribution.shape == (20_000,)
        assert res.pvalue == (1 + np.sum(res.null_distribution >= res.statistic)) / 20_001
    est = FederatedIndependenceTest(privacy=DP(2.0, 1e-6), random_state=0).fit(list(zip(xs, ys, strict=True)))
    assert est.null_ == "private" and len(est.noise_std_) == 4 and est.epsilon_ <= 2.0


def test_private_test_refuses_what_the_proof_does_not_cover():
    rng = np.random.default_rng(3)
    with pytest.raises(ValueError, match="1-D X and Y"):
        federated_independence_test([rng.random((10, 2))], [rng.random(10)], privacy=DP(1.0))
    with pytest.raises(ValueError, match="privacy needs the gamma null"):
        federated_independence_test([rng.random(10)], [rng.random(10)], privacy=DP(1.0), null="permutation")
    with pytest.raises(ValueError, match="privacy needs copula=True"):
        federated_independence_test([rng.random(10)], [rng.random(10)], privacy=DP(1.0), copula=False)


def test_analytic_gaussian_mechanism():
    sigma = gaussian_sigma(1.0, 1e-5, 1.0)
    # the classical calibration sqrt(2 ln(1.25/delta)) / epsilon is valid but looser for epsilon <= 1
    assert 3.0 < sigma < math.sqrt(2 * math.log(1.25 / 1e-5))
    assert gaussian_sigma(8.0, 1e-5, 1.0) < sigma
    assert gaussian_sigma(1.0, 1e-5, 2.0) == pytest.approx(2 * sigma, rel=1e-9)
    assert gaussian_delta(1.0 / sigma, 1.0) == pytest.approx(1e-5, rel=1e-6)


@pytest.mark.parametrize("mu, epsilon", [(0.3, 0.5), (1.0, 1.0), (2.5, 4.0)])
def test_gaussian_delta_equals_the_privacy_loss_integral(mu, epsilon):
    """delta(epsilon) = E[(1 - exp(epsilon - L))_+] with the privacy loss L ~ N(mu^2/2, mu^2), by quadrature."""
    density = scipy.stats.norm(mu * mu / 2, mu).pdf
    integral = scipy.integrate.quad(lambda t: (1 - math.exp(epsilon - t)) * density(t), epsilon, np.inf)[0]
    assert gaussian_delta(mu, epsilon) == pytest.approx(integral, rel=1e-6)
    assert gaussian_epsilon(mu, gaussian_delta(mu, epsilon)) == pytest.approx(epsilon, rel=1e-8)


def test_accountant_composes_gaussian_releases_exactly():
    acc = GaussianAccountant()
    assert acc.epsilon(1e-5) == 0.0
    acc.compose(sensitivity=2.0, sigma=4.0, count=4)        # four releases at mu = 0.5: mu = 1 in all
    one = GaussianAccountant()
    one.compose(sensitivity=1.0, sigma=1.0)
    assert acc.mu == pytest.approx(1.0) and acc.releases == 4
    assert acc.epsilon(1e-5) == pytest.approx(one.epsilon(1e-5), rel=1e-9)
    assert acc.delta(1.0) == pytest.approx(gaussian_delta(1.0, 1.0))
    with pytest.raises(ValueError, match="sigma > 0"):
        acc.compose(1.0, 0.0)


def test_each_private_client_draws_its_keys_and_noise_from_its_own_seed():
    """The released value is exactly sqrt(R_k) of the client's tie-broken ranks plus sigma z, all drawn from its own
    seed (seed * 1_000_003 + client id): two clients with the same data release different, independent values."""
    rng = np.random.default_rng(4)
    x = np.round(rng.normal(size=40), 1)
    y = x + np.round(rng.normal(size=40), 1)              # ties on purpose: the keys decide the ranks
    clients = [(x[:, None], y[:, None]), (x[:, None], y[:, None])]
    query = FedITQuery(copula=True, null="gamma", n_permutations=0, random_features=None, privacy=DP(1.0), seed=9)
    _, log = run_in_process(query, clients, transcript=True)
    sigma = gaussian_sigma(1.0, 1e-5, root_statistic_sensitivity(40, B1, B1))
    released = log.replies[0]
    for cid in (0, 1):
        own = np.random.default_rng(9 * 1_000_003 + cid)
        U, V = copula_transform(x, rng=own), copula_transform(y, rng=own)
        expected = root_statistic(U, V, B1, B1) + own.normal(scale=sigma)
        assert released[cid]["statistic"] == pytest.approx(expected, rel=1e-12)
    assert released[0]["statistic"] != released[1]["statistic"]
