"""The estimator contract: sklearn's own ``parametrize_with_checks`` on every entry in ``recipes.ESTIMATORS``."""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

from .recipes import ESTIMATORS


@parametrize_with_checks([make() for make in ESTIMATORS])
def test_sklearn_contract(estimator, check):
    check(estimator)
