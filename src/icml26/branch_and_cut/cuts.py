"""Root cut selection: LP-bound improvement (the expert signal) against simple proxy scores.

Example:
    >>> from icml26.branch_and_cut.families import cut_selection_family
    >>> milp, cands = cut_selection_family(5)
    >>> [c.name for c in LPBoundImprovement(k=3).select(milp, cands)]
    ['x1 + x2 <= 1', 'x1 + x3 <= 1', 'x2 + x3 <= 1']
    >>> [c.name for c in Proxy(objective_orthogonality, k=3).select(milp, cands)]
    ['z1 + z2 <= 1', 'z1 + z3 <= 1', 'z2 + z3 <= 1']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .milp import MILP, Cut, LPOracle, LPResult


def _root(milp: MILP) -> LPResult:
    r = LPOracle(milp).solve(milp.lb, milp.ub)
    if r.status != "optimal":
        raise ValueError(f"the root LP is {r.status}; cut selection needs an optimal root LP")
    return r


def _top(cands: Sequence[Cut], scores: Sequence[float], k: int) -> list[Cut]:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not cands:
        raise ValueError("no candidate cuts")
    order = sorted(range(len(cands)), key=lambda i: (-scores[i], i))     # ties: the earlier candidate
    return [cands[i] for i in order[:k]]


class LPBoundImprovement:
    """Pick the ``k`` cuts whose addition raises the root LP bound most (one at a time, from the same root)."""

    def __init__(self, k: int = 1):
        self.k = k

    def scores(self, milp: MILP, cands: Sequence[Cut]) -> list[float]:
        base = _root(milp).objective
        out = []
        for cut in cands:
            r = LPOracle(milp.add_cuts([cut])).solve(milp.lb, milp.ub)
            out.append(1e6 if r.status == "infeasible" else r.objective - base)
        return out

    def select(self, milp: MILP, cands: Sequence[Cut]) -> list[Cut]:
        return _top(cands, self.scores(milp, cands), self.k)


def efficacy(cut: Cut, milp: MILP, root: LPResult) -> float:
    """Violation of the root LP solution over the cut's norm (SCIP's efficacy)."""
    return float((cut.coef @ root.x - cut.rhs) / np.linalg.norm(cut.coef))


def objective_orthogonality(cut: Cut, milp: MILP, root: LPResult) -> float:
    """1 - |a . c| / (|a| |c|): how little the cut is aligned with the objective (the proxy of family E)."""
    c = milp.min_objective()
    norm = float(np.linalg.norm(cut.coef) * np.linalg.norm(c))
    return 1.0 if norm == 0 else 1.0 - abs(float(cut.coef @ c)) / norm


def fractional_support(cut: Cut, milp: MILP, root: LPResult) -> float:
    """The number of LP-fractional integer variables in the cut's support (depends on which vertex the LP returns)."""
    frac = np.abs(root.x - np.round(root.x)) > 1e-6
    return float(((cut.coef != 0) & frac & milp.integrality).sum())


class Proxy:
    """Pick the ``k`` cuts with the largest ``score(cut, milp, root_lp)`` (e.g. :func:`objective_orthogonality`)."""

    def __init__(self, score: Callable[[Cut, MILP, LPResult], float], k: int = 1):
        self.score, self.k = score, k

    def select(self, milp: MILP, cands: Sequence[Cut]) -> list[Cut]:
        root = _root(milp)
        return _top(cands, [float(self.score(c, milp, root)) for c in cands], self.k)
