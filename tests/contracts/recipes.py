"""One recipe line per component: the contract suites below run every entry.

Add a paper's optimizer to ``OPTIMIZERS`` and its sklearn-style estimators to ``estimators()`` when it lands.
The torch/sklearn entries are the suites' self-tests: they prove the contracts themselves pass on reference
implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OptimizerRecipe:
    """How to build an optimizer for the contract suite."""

    name: str
    factory: Callable[..., Any]
    """``factory(params, **overrides) -> torch.optim.Optimizer``"""
    lr: float = 1e-2
    """learning rate that converges on the contract's quadratic within ``steps``"""
    steps: int = 300
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    extra: dict[str, Any] = field(default_factory=dict)


def _adamw(params, **kw):
    import torch

    return torch.optim.AdamW(params, **kw)


def _shampoo(params, **kw):
    from icml26.shampoo import Shampoo

    return Shampoo(params, **kw)


OPTIMIZERS: list[OptimizerRecipe] = [
    OptimizerRecipe("torch.optim.AdamW (contract self-test)", _adamw, lr=5e-2),
    OptimizerRecipe("icml26.shampoo.Shampoo two-sided, Adam grafting", _shampoo, lr=5e-2,
                    extra={"precondition_frequency": 5}),
    OptimizerRecipe("icml26.shampoo.Shampoo one-sided, no grafting", _shampoo, lr=0.3,
                    extra={"exponents": "left", "grafting": "none", "precondition_frequency": 1,
                           "max_preconditioner_dim": 4}),
]


def estimators() -> list[Any]:
    """Unfitted estimators for ``sklearn.utils.estimator_checks.parametrize_with_checks`` (one line each)."""
    from sklearn.preprocessing import StandardScaler

    from icml26.gcpa import GCPA, ConcatenatedViews, GeneralizedProcrustes, MultiviewCCA

    return [
        StandardScaler(),  # the suite's self-test
        ConcatenatedViews(GeneralizedProcrustes(), n_views=2),
        ConcatenatedViews(GCPA(), n_views=2),
        ConcatenatedViews(MultiviewCCA(method="sumcor"), n_views=2),
        ConcatenatedViews(MultiviewCCA(method="maxvar"), n_views=2),
        # M = 3, the case the paper is about
        ConcatenatedViews(GeneralizedProcrustes(), n_views=3),
        ConcatenatedViews(GCPA(), n_views=3),
        ConcatenatedViews(MultiviewCCA(method="sumcor"), n_views=3),
        ConcatenatedViews(MultiviewCCA(method="maxvar"), n_views=3),
    ]


#: sklearn checks that feed exactly 2 features, which cannot be split into 3 views (each view needs a column);
#: ``tests/contracts/test_estimator_contract.py`` tests the same properties for ``n_views = 3`` on 9 features
TWO_FEATURE_CHECKS = ("check_estimators_overwrite_params", "check_estimators_fit_returns_self",
                      "check_readonly_memmap_input", "check_fit_idempotent", "check_fit_check_is_fitted",
                      "check_n_features_in")


def expected_failed_checks(estimator: Any) -> dict[str, str]:
    """Checks an estimator cannot pass by its contract, with the reason (``parametrize_with_checks``)."""
    if getattr(estimator, "n_views", 2) > 2:
        return {name: f"the check's X has 2 features: fewer than the {estimator.n_views} views, which ConcatenatedViews "
                      "refuses with a ValueError" for name in TWO_FEATURE_CHECKS}
    return {}
