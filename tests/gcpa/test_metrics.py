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
