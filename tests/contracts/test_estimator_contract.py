"""The estimator contract: sklearn's own ``parametrize_with_checks`` on every entry of ``recipes.estimators()``."""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

from .recipes import estimators


@parametrize_with_checks(estimators())
def test_sklearn_contract(estimator, check):
    check(estimator)
