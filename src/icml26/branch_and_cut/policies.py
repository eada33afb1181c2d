"""Branching policies: strong branching, most-fractional, perturbed scores, a learned imitation, tree-size-aware.

Strong branching (SCIP's product rule, ``branching/scorefunc = 'p'``): for candidate j with child LP-bound gains
Delta^- and Delta^+ (an infeasible child counts ``infeasible_gain``),

    score_j = max(Delta^-_j, eps) * max(Delta^+_j, eps).

Example:
    >>> from icml26.branch_and_cut.families import sb_suboptimal_family
    >>> from icml26.branch_and_cut.bnb import solve_bnb
    >>> solve_bnb(sb_suboptimal_family(5), StrongBranching()).nodes
    39
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .bnb import MinTreeOracle, Node, pick
from .milp import MILP, LPOracle


class StrongBranching:
    """Full strong branching with the product score.

    Args:
        eps: floor of each gain (SCIP's 1e-6).
        infeasible_gain: the gain of an infeasible child.
        tie_break: ``"index"``, ``"reverse"`` or a ``numpy.random.Generator``.
    """

    def __init__(self, eps: float = 1e-6, infeasible_gain: float = 1e6, tie_break: Any = "index"):
        if eps <= 0 or infeasible_gain <= 0:
            raise ValueError("eps and infeasible_gain must be > 0")
        self.eps, self.infeasible_gain, self.tie_break = eps, infeasible_gain, tie_break

    def gains(self, node: Node, lp: LPOracle) -> np.ndarray:
        """``(k, 2)`` down/up LP-bound gains of the candidates (fills ``node.children``)."""
        out = np.zeros((len(node.candidates), 2))
        for i, j in enumerate(node.candidates):
            (dl, du), (ul, uu) = node.child_bounds(int(j))
            down, up = lp.solve(dl, du), lp.solve(ul, uu)
            node.children[int(j)] = (down, up)
            for side, child in enumerate((down, up)):
                out[i, side] = self.infeasible_gain if child.status == "infeasible" else max(
                    child.objective - node.lp.objective, 0.0)
        return out

    def scores(self, node: Node, lp: LPOracle) -> np.ndarray:
        g = self.gains(node, lp)
        # score_j = max(Delta-_j, eps) * max(Delta+_j, eps)
        return np.maximum(g[:, 0], self.eps) * np.maximum(g[:, 1], self.eps)


class MostFractional:
    """Branch on the variable whose LP value is closest to 1/2 away from an integer."""

    def __init__(self, tie_break: Any = "index"):
        self.tie_break = tie_break

    def scores(self, node: Node, lp: LPOracle) -> np.ndarray:
        v = node.lp.x[node.candidates]
        return 0.5 - np.abs(v - np.floor(v) - 0.5)


class PerturbedPolicy:
    """``base`` scores plus an arbitrarily small perturbation: ``delta * bonus[j]`` when a bonus vector is given,
    else ``delta * U(-1, 1)`` drawn from ``seed``; with ``relative=True`` the perturbation multiplies instead,
    s_j (1 + delta * bonus_j), so every score moves by at most ``delta`` of itself.

    Attributes:
        decisions: branching decisions taken; differences: those where the perturbed scores chose another
            variable than the base's scores would have at the same node (both with the base's tie rule).
    """

    def __init__(self, base: Any, delta: float, *, bonus: np.ndarray | None = None, seed: int = 0,
                 relative: bool = False):
        if delta < 0:
            raise ValueError(f"delta must be >= 0, got {delta}")
        self.base, self.delta, self.relative = base, delta, relative
        self.bonus = None if bonus is None else np.asarray(bonus, dtype=float)
        self.rng = np.random.default_rng(seed)
        self.tie_break = base.tie_break
        self.decisions = self.differences = 0

    def scores(self, node: Node, lp: LPOracle) -> np.ndarray:
        s = self.base.scores(node, lp)
        noise = (self.bonus[node.candidates] if self.bonus is not None
                 else self.rng.uniform(-1, 1, size=len(s)))
        # $$\tilde s_j = s_j + \delta b_j$$  or, relative,  $$\tilde s_j = s_j (1 + \delta b_j)$$
        out = s * (1 + self.delta * noise) if self.relative else s + self.delta * noise
        if isinstance(self.tie_break, str):      # a Generator tie rule would consume draws: not compared
            self.decisions += 1
            self.differences += int(pick(out, node.candidates, self.tie_break)
                                    != pick(s, node.candidates, self.tie_break))
        return out


class DeviatingPolicy:
    """``base``'s choice everywhere except at its first ``deviations`` branching decisions (depth-first visiting
    order), where it takes the runner-up by the base's score: a policy that differs from ``base`` in exactly
    that many decisions along the search."""

    def __init__(self, base: Any, deviations: int = 1):
        if deviations < 0:
            raise ValueError(f"deviations must be >= 0, got {deviations}")
        self.base, self.deviations = base, deviations
        self.tie_break = base.tie_break
        self.differences = 0

    def choose(self, node: Node, lp: LPOracle) -> int:
        s = self.base.scores(node, lp)
        best = pick(s, node.candidates, self.tie_break)
        if self.differences < self.deviations and len(node.candidates) > 1:
            keep = node.candidates != best
            self.differences += 1
            return pick(s[keep], node.candidates[keep], self.tie_break)
        return best


def candidate_features(milp: MILP, node: Node) -> np.ndarray:
    """Per-candidate features: fractionality, objective coefficient, |coefficient|, column degree, share of
    fixed variables, depth."""
    v = node.lp.x[node.candidates]
    a, _, _ = milp.rows()
    degree = (a[:, node.candidates] != 0).sum(0)
    fixed = float((node.lb == node.ub).mean())
    c = milp.min_objective()[node.candidates]
    return np.column_stack([0.5 - np.abs(v - np.floor(v) - 0.5), c, np.abs(c), degree,
                            np.full(len(v), fixed), np.full(len(v), node.depth)])


class LearnedPolicy:
    """Scores from a fitted sklearn regressor on per-candidate features (an imitation of an expert's scores)."""

    def __init__(self, model: Any, featurizer: Callable[[MILP, Node], np.ndarray] = candidate_features, *,
                 milp: MILP | None = None, tie_break: Any = "index"):
        if not hasattr(model, "predict"):
            raise TypeError("model must be a fitted regressor with .predict")
        self.model, self.featurizer, self.milp, self.tie_break = model, featurizer, milp, tie_break

    def bind(self, milp: MILP) -> LearnedPolicy:
        """This policy for ``milp`` (the featurizer reads the problem)."""
        return LearnedPolicy(self.model, self.featurizer, milp=milp, tie_break=self.tie_break)

    def scores(self, node: Node, lp: LPOracle) -> np.ndarray:
        if self.milp is None:
            raise ValueError("bind the policy to a problem first: policy.bind(milp)")
        return np.asarray(self.model.predict(self.featurizer(self.milp, node)), dtype=float)


class TreeSizeAware:
    """Branch on the candidate whose two subtrees are smallest in the exact minimum-tree oracle (small n only)."""

    def __init__(self, milp: MILP, *, cutoff: float | None = None, max_n: int = 14, tie_break: Any = "index"):
        self.oracle = MinTreeOracle(milp, cutoff=cutoff, max_n=max_n)
        self.tie_break = tie_break

    def scores(self, node: Node, lp: LPOracle) -> np.ndarray:
        out = []
        for j in node.candidates:
            (dl, du), (ul, uu) = node.child_bounds(int(j))
            out.append(-(self.oracle.size(dl, du) + self.oracle.size(ul, uu)))
        return np.array(out, dtype=float)


class RecordingPolicy:
    """Wraps a policy and records (features, scores) at every node: the imitation-learning data."""

    def __init__(self, base: Any, milp: MILP, featurizer: Callable[[MILP, Node], np.ndarray] = candidate_features):
        self.base, self.milp, self.featurizer = base, milp, featurizer
        self.tie_break = base.tie_break
        self.features: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []

    def scores(self, node: Node, lp: LPOracle) -> np.ndarray:
        s = self.base.scores(node, lp)
        self.features.append(self.featurizer(self.milp, node))
        self.targets.append(s)
        return s
