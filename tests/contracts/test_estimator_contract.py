"""The estimator contract: sklearn's own ``parametrize_with_checks`` on every entry of ``recipes.estimators()``."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

from .recipes import estimators, expected_failed_checks


@parametrize_with_checks(estimators(), expected_failed_checks=expected_failed_checks)
def test_sklearn_contract(estimator, check):
    check(estimator)


@pytest.mark.parametrize("estimator", [e for e in estimators() if getattr(e, "n_views", 2) > 2],
                         ids=lambda e: type(e.estimator).__name__)
def test_three_views_where_sklearn_feeds_two_features(estimator, tmp_path):
    # the properties of recipes.TWO_FEATURE_CHECKS, on data that three views can split (9 features)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 9))
    est = clone(estimator)
    params = est.get_params(deep=False)
    with pytest.raises(NotFittedError):
        est.transform(X)
    assert est.fit(X) is est                                        # fit returns self
    assert est.get_params(deep=False).keys() == params.keys()       # parameters not overwritten
    assert est.n_features_in_ == 9
    first = est.transform(X)
    again = clone(estimator).fit(X).transform(X)                    # idempotent, deterministic
    np.testing.assert_allclose(first, again, rtol=1e-10, atol=1e-12)
    memmap = np.lib.format.open_memmap(tmp_path / "X.npy", mode="w+", dtype=np.float64, shape=X.shape)
    memmap[:] = X
    memmap.flush()
    readonly = np.load(tmp_path / "X.npy", mmap_mode="r")           # read-only memmap input
    np.testing.assert_allclose(clone(estimator).fit(readonly).transform(readonly), first, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="X has 8 features"):
        est.transform(X[:, :8])
    with pytest.raises(ValueError, match="3 views need at least 3"):
        clone(estimator).fit(X[:, :2])
