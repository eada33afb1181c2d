"""Independent oracles for the branch-and-cut reproduction (tests only; no experiment imports this module).

``brute_min_tree`` is the minimum branch-and-bound tree size by plain recursion, with no memo, no cut-offs and
no bounds shared between subtrees, so it checks ``min_tree_size`` (which memoises and prunes) by a different
route. The quantity (the smallest B&B tree over every choice of branching variable):

    T*(node) = 1                                                   if the LP at the node is infeasible or integral
    T*(node) = 1 + min_{j fractional} T*(node, x_j <= floor x*_j) + T*(node, x_j >= ceil x*_j)   otherwise

where x* is the node's LP optimum (branching on an LP-fractional variable only, as the solver does).

Example:
    >>> from icml26.branch_and_cut import LPOracle, tie_breaking_family
    >>> m = tie_breaking_family(1)
    >>> brute_min_tree(m, m.lb, m.ub, LPOracle(m)) >= 1
    True
"""

from __future__ import annotations

import math

import numpy as np

from .bnb import _fractional
from .milp import MILP


def brute_min_tree(m: MILP, lb: np.ndarray, ub: np.ndarray, oracle) -> int | float:
    """The minimum tree size below the node with bounds ``[lb, ub]``, by exhaustive recursion.

    $$T^*(v) = 1 + \\min_{j} \\big(T^*(v, x_j \\le \\lfloor x^*_j \\rfloor) + T^*(v, x_j \\ge \\lceil x^*_j \\rceil)\\big)$$
    (1 at an infeasible or integral leaf). Reference: Cheng & Basu 2026 (arXiv:2601.23249), the minimum tree over
    every choice of fractional variable against which the policies' trees are compared; exponential, for tiny
    instances only.
    """
    r = oracle.solve(lb, ub)
    if r.status == "infeasible":
        return 1
    cands = _fractional(m, r.x)
    if len(cands) == 0:
        return 1
    best = math.inf
    for j in cands:
        dub, ulb = ub.copy(), lb.copy()
        dub[j], ulb[j] = math.floor(r.x[j]), math.ceil(r.x[j])
        best = min(best, 1 + brute_min_tree(m, lb, dub, oracle) + brute_min_tree(m, ulb, ub, oracle))
    return best
