"""The centroid learner, the poset DP and the matroid oracles against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml26.inverse_optimization import (
    GraphicMatroid,
    MConvexInverseLearner,
    OGDLearner,
    ONSLearner,
    PartitionMatroid,
    UniformMatroid,
    exact_centroid,
    mistake_bound,
)
from icml26.inverse_optimization.baselines import snap
from icml26.inverse_optimization.data import Environment, adaptive_pairs, simulate
from icml26.inverse_optimization.learner import Poset, linear_extension, mcmc_centroid
from icml26.inverse_optimization.reference import brute_bases, brute_centroid, volume_bound


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=8))
def test_exact_centroid_matches_brute_force(d, raw):
    poset = Poset(d)
    for i, j in raw:
        i, j = i % d, j % d
        if not poset.contradicts(i, j):
            poset.add(i, j)
    np.testing.assert_allclose(exact_centroid(poset), brute_centroid(d, poset.edges()), atol=1e-12)


def test_centroid_special_cases():
    np.testing.assert_allclose(exact_centroid(Poset(5)), np.full(5, 0.5))
    chain = Poset(4)
    for i in range(3):
        chain.add(i + 1, i)  # 3 > 2 > 1 > 0
    np.testing.assert_allclose(exact_centroid(chain), np.arange(1, 5) / 5)
    assert linear_extension(chain) == [0, 1, 2, 3]


def test_mcmc_centroid_is_close_to_exact():
    poset = Poset(7)
    for i, j in [(3, 1), (1, 0), (5, 2), (6, 4)]:
        poset.add(i, j)
    est = mcmc_centroid(poset, 10_000, np.random.default_rng(0))
    np.testing.assert_allclose(est, exact_centroid(poset), atol=0.02)


def test_poset_closure_and_contradiction():
    p = Poset(4)
    assert p.add(2, 1) and p.add(1, 0)
    assert p.implies(2, 0) and not p.add(2, 0)
    assert p.contradicts(0, 2) and p.contradicts(3, 3) and not p.contradicts(3, 0)


def test_mistake_bound_by_hand():
    assert mistake_bound(10) == pytest.approx(volume_bound(10))
    assert mistake_bound(10) == pytest.approx(32.93, abs=0.01)  # ln(10!) = 15.104; / ln(e/(e-1)) = 0.4587


SETS = [
    UniformMatroid(6, [0, 2, 3, 5], 2),
    PartitionMatroid(6, [[0, 1, 2], [3, 4]], [2, 1]),
    GraphicMatroid(4, [(0, 1), (1, 2), (2, 3), (0, 3), (0, 2), (1, 3)], available=[0, 1, 2, 3, 4]),
]


@pytest.mark.parametrize("X", SETS, ids=lambda s: type(s).__name__)
def test_greedy_argmax_and_exchange_optimality_match_brute_force(X):
    rng = np.random.default_rng(0)
    feasible = brute_bases(X, X.d)
    assert feasible
    for _ in range(30):
        w = rng.normal(size=X.d)
        values = [w @ x for x in feasible]
        assert w @ X.argmax(w) == pytest.approx(max(values))
        assert w @ X.argmin(w) == pytest.approx(min(values))
        for x in feasible:
            # M-convexity: x is optimal iff no exchange pair improves it
            locally = all(w[i] >= w[j] for i, j in X.exchange_pairs(x))
            assert locally == (w @ x >= max(values) - 1e-12)
            for i, j in X.exchange_pairs(x):
                y = x.copy()
                y[i], y[j] = 0, 1
                assert X.contains(y)


def topk_stream(d, seed, T):
    rng = np.random.default_rng(seed)
    w = rng.uniform(size=d)
    for _ in range(T):
        size = int(rng.integers(2, d + 1))
        yield w, UniformMatroid(d, rng.choice(d, size=size, replace=False), int(rng.integers(1, size)))


@pytest.mark.parametrize("centroid", ["exact", "consistent", "mcmc"])
def test_learner_stops_making_mistakes(centroid):
    d = 7
    learner = MConvexInverseLearner(d, centroid=centroid, n_samples=500, random_state=0)
    mistakes_at = []
    for t, (w, X) in enumerate(topk_stream(d, 1, 1500)):
        if not np.array_equal(learner.predict(X), X.argmax(w)):
            mistakes_at.append(t)
        learner.update(X, X.argmax(w))
    assert learner.n_mistakes_ == len(mistakes_at)
    if centroid == "exact":
        assert learner.n_mistakes_ <= mistake_bound(d)
    assert not mistakes_at or mistakes_at[-1] < 1000


def test_robust_learner_restarts_and_non_robust_ignores():
    d = 4
    X = UniformMatroid(d, [0, 1, 2, 3], 1)
    robust = MConvexInverseLearner(d)
    ignore = MConvexInverseLearner(d, robust=False)
    for learner in (robust, ignore):
        learner.update(X, np.array([0, 0, 0, 1]))   # item 3 is the best: 3 > 0, 1, 2
        learner.update(X, np.array([1, 0, 0, 0]))   # contradicts: 0 > 3
    assert robust.n_restarts_ == 1 and robust.poset_.edges() == []
    assert ignore.n_restarts_ == 0 and ignore.poset_.implies(3, 0) and not ignore.poset_.implies(0, 3)


def test_drop_cycle_drops_only_the_rounds_that_form_the_cycle():
    d = 5
    X = UniformMatroid(d, list(range(d)), 1)
    pair = {(i, j): UniformMatroid(d, [i, j], 1) for i in range(d) for j in range(d) if i < j}
    learner = MConvexInverseLearner(d, on_cycle="drop_cycle")
    learner.update(X, np.array([0, 0, 0, 0, 1]))         # round 1: 4 > 0, 1, 2, 3 (every edge of the set)
    learner.update(pair[1, 2], np.array([0, 0, 1, 0, 0]))  # round 2: 2 > 1 (centroid ties pick 1: a mistake)
    learner.update(pair[0, 1], np.array([0, 1, 0, 0, 0]))  # round 3: 1 > 0
    assert learner.n_mistakes_ == 3 and learner.poset_.implies(2, 0)
    # round 4 (corrupted): 0 > 2 closes the cycle 0 > 2 > 1 > 0 through rounds 2 and 3; round 1 is not in it
    learner.update(pair[0, 2], np.array([1, 0, 0, 0, 0]))
    assert learner.n_restarts_ == 1 and learner.n_dropped_rounds_ == 3
    assert sorted(learner.poset_.edges()) == [(4, 0), (4, 1), (4, 2), (4, 3)]
    # restart-on-cycle forgets round 1 as well
    restart = MConvexInverseLearner(d, on_cycle="restart")
    for Y, x in ((X, [0, 0, 0, 0, 1]), (pair[1, 2], [0, 0, 1, 0, 0]), (pair[0, 1], [0, 1, 0, 0, 0]),
                 (pair[0, 2], [1, 0, 0, 0, 0])):
        restart.update(Y, np.array(x))
    assert restart.n_restarts_ == 1 and restart.poset_.edges() == []


def test_drop_cycle_recovers_from_random_corruption_within_the_bound():
    d, T, C = 8, 3000, 6
    env_seed = 11
    rounds = set(np.random.default_rng(0).choice(T // 3, size=C, replace=False).tolist())
    learners = {name: MConvexInverseLearner(d, on_cycle=name) for name in ("restart", "drop_cycle")}
    regret = simulate("topk", d, env_seed, learners, T, corrupted=rounds)
    for name, learner in learners.items():
        assert learner.n_mistakes_ <= (C + 1) * (mistake_bound(d) + 1), name
        # corrupted rounds only in the first third: no regret in the last half, it stopped erring
        assert regret[name][-1] == regret[name][T // 2], name
    assert learners["drop_cycle"].n_restarts_ <= C


def test_adaptive_adversary_forces_mistakes_until_the_order_is_known():
    d = 7
    w = Environment("pairs", d, 3).w_star

    class Oracle:                                # knows w*: the adversary finds no wrong pair
        def predict(self, X):
            return X.argmax(w)

        def update(self, X, x):
            raise AssertionError("never shown a set")

    assert adaptive_pairs(d, 3, Oracle(), max_rounds=100) == (0, 0.0)
    # the smallest-gap wrong pair is always adjacent in w*'s order (a wrong non-adjacent pair implies a wrong
    # adjacent one with a smaller gap), so a learner that keeps every constraint errs at most d - 1 times
    for centroid in ("exact", "consistent"):
        learner = MConvexInverseLearner(d, centroid=centroid)
        mistakes, regret = adaptive_pairs(d, 3, learner, max_rounds=1000)
        assert 1 <= mistakes <= d - 1 and learner.n_mistakes_ == mistakes and regret > 0
        order = np.argsort(learner.w_hat_, kind="stable")
        assert np.array_equal(order, np.argsort(w))
    ons = ONSLearner(d, K=np.sqrt(2))
    mistakes, _ = adaptive_pairs(d, 3, ons, max_rounds=1000)
    assert mistakes == ons.n_mistakes_ and mistakes < 1000


def test_ons_ties_are_snapped_so_round_off_does_not_decide_them():
    X = UniformMatroid(4, [0, 1, 2, 3], 2)
    theta = np.array([0.3, 0.3, 0.1, 0.3])
    noisy = theta + np.array([0.0, 0.0, 0.0, 1e-16])
    assert X.argmax(theta).tolist() != X.argmax(noisy).tolist()          # raw argmax: the noise decides
    assert X.argmax(snap(noisy)).tolist() == X.argmax(theta).tolist() == [1, 1, 0, 0]
    ons = ONSLearner(4)
    ons.theta_ = noisy
    assert ons.predict(X).tolist() == [1, 1, 0, 0]


def test_ons_regret_does_not_depend_on_eigh_round_off(monkeypatch):
    """Another CPU's LAPACK returns eigenvectors that differ in the last bits; the results must not move."""
    d, T, env_seed = 10, 3000, 10
    K = Environment("topk", d, env_seed).diameter

    def run():
        ons = ONSLearner(d, K=K)
        r = simulate("topk", d, env_seed, {"ons": ons}, T)["ons"]
        return r, ons.n_mistakes_

    ref, ref_mistakes = run()
    true_eigh = np.linalg.eigh
    rng = np.random.default_rng(0)

    def other_cpu(a):
        lam, q = true_eigh(a)
        return lam * (1 + 4e-16 * rng.standard_normal(lam.shape)), q * (1 + 4e-16 * rng.standard_normal(q.shape))

    monkeypatch.setattr(np.linalg, "eigh", other_cpu)
    other, other_mistakes = run()
    assert other_mistakes == ref_mistakes
    np.testing.assert_allclose(other, ref, rtol=0, atol=1e-12)


def test_bad_input():
    learner = MConvexInverseLearner(4)
    X = UniformMatroid(4, [0, 1, 2], 1)
    with pytest.raises(ValueError, match="not in the feasible set"):
        learner.update(X, np.array([0, 0, 0, 1]))
    with pytest.raises(ValueError, match="dimension"):
        learner.predict(UniformMatroid(5, [0, 1], 1))
    with pytest.raises(ValueError, match="0/1 vector"):
        X.contains(np.array([0.5, 0.5, 0, 0]))
    with pytest.raises(ValueError, match="shape"):
        X.contains(np.array([1, 0]))
    with pytest.raises(ValueError, match="non-empty"):
        UniformMatroid(4, [], 1)
    with pytest.raises(ValueError, match="k must be"):
        UniformMatroid(4, [0, 1], 3)
    with pytest.raises(ValueError, match="disjoint"):
        PartitionMatroid(4, [[0, 1], [1, 2]], [1, 1])
    with pytest.raises(ValueError, match="d must be"):
        MConvexInverseLearner(0)
    with pytest.raises(ValueError, match="on_cycle must be one of"):
        MConvexInverseLearner(4, on_cycle="forget")
    with pytest.raises(ValueError, match="not in the feasible set"):
        ONSLearner(4).update(X, np.array([0, 0, 0, 1]))


def test_ons_and_ogd_stay_in_the_ball_and_ons_projection_is_kkt():
    d = 5
    ons, ogd = ONSLearner(d, K=2.0), OGDLearner(d, T=200, K=2.0)
    for w, X in topk_stream(d, 3, 200):
        for learner in (ons, ogd):
            learner.update(X, X.argmax(w))
            assert np.linalg.norm(learner.theta_) <= 1 + 1e-6
    assert np.linalg.norm(ons.theta_) > 0


def test_poset_closure_carries_what_lies_below_j():
    p = Poset(4)
    assert p.add(1, 0) and p.add(2, 1)          # 2 > 1 > 0
    assert p.implies(2, 0) and p.contradicts(0, 2)
    assert p.add(3, 2) and all(p.implies(3, j) for j in (0, 1, 2))
    assert not p.add(3, 0)                     # already implied
    assert sorted(p.edges()) == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
