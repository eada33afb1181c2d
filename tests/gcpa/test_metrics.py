"""Retrieval, stitching and distortion metrics on hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest

from icml26.gcpa.metrics import distance_distortion, pair_retrieval


def test_pair_retrieval_by_hand():
    Q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    D = np.array([[1.0, 0.1], [1.0, 0.0], [1.0, 1.0]])
    # query 0 = (1, 0): sims to D = (0.995, 1.0, 0.707) -> rank 1; query 1 = (0, 1): sims (0.0995, 0, 0.707) -> rank 2
    # query 2 = (1, 1): sims (0.774, 0.707, 1.0) -> rank 0
    out = pair_retrieval(Q, D, ks=(1, 2))
    assert out["recall@1"] == pytest.approx(1 / 3)
    assert out["recall@2"] == pytest.approx(2 / 3)
    assert out["mrr"] == pytest.approx((1 / 2 + 1 / 3 + 1) / 3)


def test_ties_are_broken_by_index():
    Q = np.ones((3, 2))
    D = np.ones((3, 2))
    out = pair_retrieval(Q, D, ks=(1,))
    assert out["recall@1"] == pytest.approx(1 / 3)  # only item 0 wins its tie


def test_distortion_zero_for_similarities_positive_otherwise():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 5))
    Q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    assert distance_distortion(X, 3.0 * X @ Q + 1.0) == pytest.approx(0.0, abs=1e-12)
    assert distance_distortion(X, X * np.array([1, 1, 1, 1, 10.0])) > 0.1
    with pytest.raises(ValueError):
        pair_retrieval(X, X[:3])


def test_per_item_retrieval_averages_to_any_to_any_recall():
    from icml26.gcpa import GeneralizedProcrustes
    from icml26.gcpa.metrics import any_to_any_ranks, any_to_any_retrieval, retrieval_per_item

    rng = np.random.default_rng(1)
    Z = rng.normal(size=(60, 4))
    views = [Z @ rng.normal(size=(4, 6)) + 0.8 * rng.normal(size=(60, 6)) for _ in range(3)]
    model = GeneralizedProcrustes(n_components=4).fit(views)
    ranks = any_to_any_ranks(model, views)
    assert ranks.shape == (6, 60)
    whole = any_to_any_retrieval(model, views)
    for k in (1, 5):
        per_item = retrieval_per_item(ranks, k)
        assert per_item.shape == (60,)
        assert per_item.mean() == pytest.approx(whole[f"recall@{k}"], abs=1e-12)
    # by hand: the first pair's ranks are pair_retrieval's
    Za, Zb = model.embed_pair(views[0], views[1], 0, 1)
    assert np.mean(ranks[0] < 1) == pytest.approx(pair_retrieval(Za, Zb)["recall@1"], abs=1e-12)


def test_stitching_outcomes_average_to_the_accuracy():
    from icml26.gcpa import GeneralizedProcrustes
    from icml26.gcpa.metrics import stitching_accuracy, stitching_correct

    rng = np.random.default_rng(2)
    y = np.repeat(np.arange(3), 40)
    centres = rng.normal(size=(3, 4)) * 2
    views = [(centres[y] + rng.normal(size=(120, 4))) @ rng.normal(size=(4, 5)) for _ in range(3)]
    train, test = [v[::2] for v in views], [v[1::2] for v in views]
    model = GeneralizedProcrustes(n_components=4).fit(train)
    correct = stitching_correct(model, train, test, y[::2], y[1::2])
    assert correct.shape == (6, 60) and set(np.unique(correct)) <= {0.0, 1.0}
    assert correct.mean() == pytest.approx(stitching_accuracy(model, train, test, y[::2], y[1::2]), abs=1e-12)
