"""An exact, deterministic branch-and-bound with pluggable branching policies, and a minimum-tree oracle.

Every node solves its LP relaxation (a HiGHS vertex); it is a leaf when the LP is infeasible, its bound cannot beat
the incumbent or the given cutoff, or its solution is integral; otherwise the policy scores the LP-fractional
integer variables, the best one (ties broken by the policy's rule) is branched on, x_j <= floor(v) first. Tree
size counts every node, leaves included. ``sb_fixing``: when strong branching finds one child of a candidate
infeasible, the variable is fixed to the other side and the node re-solved (no new node).

Example:
    >>> from icml26.branch_and_cut.families import tie_breaking_family
    >>> from icml26.branch_and_cut.policies import StrongBranching
    >>> milp = tie_breaking_family(5)
    >>> solve_bnb(milp, StrongBranching(tie_break="index")).nodes, solve_bnb(milp, StrongBranching(
    ...     tie_break="reverse")).nodes
    (39, 11)
    >>> min_tree_size(milp)
    11
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .milp import MILP, LPOracle, LPResult

INT_TOL = 1e-6
BOUND_TOL = 1e-9


@dataclass
class Node:
    """A B&B node: its bounds, LP result, depth, LP-fractional integer candidates and SB child results."""

    lb: np.ndarray
    ub: np.ndarray
    lp: LPResult
    depth: int
    candidates: np.ndarray
    children: dict[int, tuple[LPResult, LPResult]] = field(default_factory=dict)

    def child_bounds(self, j: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """``((lb, ub) of x_j <= floor(v), (lb, ub) of x_j >= ceil(v))``."""
        v = self.lp.x[j]
        down_ub = self.ub.copy()
        down_ub[j] = math.floor(v)
        up_lb = self.lb.copy()
        up_lb[j] = math.ceil(v)
        return (self.lb, down_ub), (up_lb, self.ub)


class BranchingPolicy(Protocol):
    """Scores a node's candidates (higher is better); ``tie_break`` picks among equal scores.

    A policy may instead define ``choose(node, lp) -> int`` (a variable index); it must be LP-fractional.
    """

    tie_break: Any

    def scores(self, node: Node, lp: LPOracle) -> np.ndarray: ...


def pick(scores: np.ndarray, candidates: np.ndarray, tie_break: Any, rel_tol: float = 1e-9) -> int:
    """The candidate with the largest score; ties (within ``rel_tol``) broken by ``tie_break``:
    ``"index"`` (lowest variable index), ``"reverse"`` (highest) or a ``numpy.random.Generator``."""
    scores = np.asarray(scores, dtype=float)
    if scores.shape != candidates.shape:
        raise ValueError(f"the policy returned {scores.shape[0] if scores.ndim else 0} scores for "
                         f"{len(candidates)} candidates")
    if not np.isfinite(scores).all():
        raise ValueError("the policy returned a non-finite score")
    tied = _tied(scores, candidates, rel_tol)
    if tie_break == "index":
        return int(tied.min())
    if tie_break == "reverse":
        return int(tied.max())
    if isinstance(tie_break, np.random.Generator):
        return int(tie_break.choice(tied))
    raise ValueError(f"tie_break must be 'index', 'reverse' or a numpy Generator, got {tie_break!r}")


def _tied(scores: np.ndarray, candidates: np.ndarray, rel_tol: float = 1e-9) -> np.ndarray:
    """The candidates whose score is within ``rel_tol`` (relative) of the top score."""
    top = scores.max()
    return candidates[scores >= top - rel_tol * max(abs(top), 1e-12)]


@dataclass
class TreeStats:
    """The outcome of one B&B run.

    Attributes:
        nodes: tree size (all nodes, leaves included).
        depth: the deepest node's depth (root 0).
        lp_solves: LPs solved (node LPs and strong-branching child LPs).
        status: ``"optimal"``, ``"infeasible"`` (no integer point beats the cutoff) or ``"node_limit"``.
        objective: the incumbent's objective in the problem's own sense (None without one).
        x: the incumbent.
        branched: the variable branched on at each branching node, in visiting order.
        ties: branching decisions where more than one candidate shared the top score (the tie rule decided).
    """

    nodes: int
    depth: int
    lp_solves: int
    status: str
    objective: float | None
    x: np.ndarray | None
    branched: list[int]
    ties: int = 0


def _fractional(milp: MILP, x: np.ndarray) -> np.ndarray:
    frac = np.abs(x - np.round(x)) > INT_TOL
    return np.nonzero(frac & milp.integrality)[0]


def solve_bnb(milp: MILP, policy: BranchingPolicy, *, cutoff: float | None = None, node_limit: int = 1_000_000,
              sb_fixing: bool = False, node_order: str = "dfs") -> TreeStats:
    """Branch and bound on ``milp`` with ``policy``.

    Args:
        milp: the problem.
        policy: scores the candidates (e.g. :class:`~icml26.branch_and_cut.policies.StrongBranching`).
        cutoff: a known objective value (problem's sense): nodes whose bound cannot beat it are pruned.
        node_limit: stop after this many nodes (status ``"node_limit"``).
        sb_fixing: fix a variable whose strong-branching child is infeasible (needs a policy that fills
            ``node.children``).
        node_order: ``"dfs"`` (down child first) or ``"best"`` (smallest bound first).

    Returns:
        :class:`TreeStats`.

    Raises:
        ValueError: the LP relaxation is unbounded, or a bad option.
    """
    if node_order not in ("dfs", "best"):
        raise ValueError(f"node_order must be 'dfs' or 'best', got {node_order!r}")
    if node_limit < 1:
        raise ValueError(f"node_limit must be >= 1, got {node_limit}")
    oracle = LPOracle(milp)
    sign = 1.0 if milp.sense == "min" else -1.0
    best = math.inf if cutoff is None else sign * float(cutoff)
    incumbent: np.ndarray | None = None
    open_nodes: list[tuple[float, int, np.ndarray, np.ndarray, int]] = [(-math.inf, 0, milp.lb.copy(),
                                                                          milp.ub.copy(), 0)]
    counter, nodes, depth, branched, ties = 1, 0, 0, [], 0
    status = "done"
    while open_nodes:
        if node_order == "dfs":
            _, _, lb, ub, d = open_nodes.pop()
        else:
            k = min(range(len(open_nodes)), key=lambda i: (open_nodes[i][0], open_nodes[i][1]))
            _, _, lb, ub, d = open_nodes.pop(k)
        if nodes >= node_limit:
            status = "node_limit"
            break
        nodes += 1
        depth = max(depth, d)
        while True:
            r = oracle.solve(lb, ub)
            if r.status == "unbounded":
                raise ValueError("the LP relaxation is unbounded; bound the variables or the objective")
            if r.status == "infeasible" or r.objective >= best - BOUND_TOL:
                node = None
                break
            cands = _fractional(milp, r.x)
            if len(cands) == 0:
                best, incumbent = r.objective, r.x.copy()
                node = None
                break
            node = Node(lb, ub, r, d, cands)
            if hasattr(policy, "choose"):
                break
            scores = policy.scores(node, oracle)
            if sb_fixing and node.children:
                fixed = False
                for j, (down, up) in node.children.items():
                    if down.status == "infeasible" and up.status == "infeasible":
                        node = None
                        break
                    if down.status == "infeasible" or up.status == "infeasible":
                        (dl, du), (ul, uu) = node.child_bounds(j)
                        lb, ub = (ul, uu) if down.status == "infeasible" else (dl, du)
                        fixed = True
                        break
                if node is None or fixed:
                    if node is None:
                        break
                    continue
            break
        if node is None:
            continue
        if hasattr(policy, "choose"):
            j = policy.choose(node, oracle)
            allowed = set(node.candidates.tolist())
            if isinstance(j, bool) or not isinstance(j, int | np.integer) or int(j) not in allowed:
                shown = milp.names[int(j)] if isinstance(j, int | np.integer) and 0 <= j < milp.n else repr(j)
                raise ValueError(f"the policy chose {shown}, which is not an LP-fractional integer variable at this "
                                 f"node (candidates: {[milp.names[c] for c in node.candidates]})")
            j = int(j)
        else:
            j = pick(scores, node.candidates, policy.tie_break)
            ties += int(len(_tied(np.asarray(scores, dtype=float), node.candidates)) > 1)
        branched.append(j)
        (dl, du), (ul, uu) = node.child_bounds(j)
        # DFS explores the down child first: push it last
        open_nodes.append((r.objective, counter, ul, uu, d + 1))
        open_nodes.append((r.objective, counter + 1, dl, du, d + 1))
        counter += 2
    if status == "done":
        status = "optimal" if incumbent is not None else "infeasible"
    obj = None if incumbent is None else sign * best
    return TreeStats(nodes, depth, oracle.solves, status, obj, incumbent, branched, ties)


class MinTreeOracle:
    """The minimum B&B tree size over all variable choices (branching only on LP-fractional variables).

    An exhaustive, memoised search with bound-based cut-offs, exponential in the number of integer variables
    (Dey et al. 2024 give a 3^O(n) dynamic programme); refuses problems with more than ``max_n`` of them.
    """

    def __init__(self, milp: MILP, *, cutoff: float | None = None, max_n: int = 14):
        k = int(milp.integrality.sum())
        if k > max_n:
            raise ValueError(f"the minimum-tree oracle is exponential: {k} integer variables exceed max_n={max_n}")
        self.milp, self.oracle = milp, LPOracle(milp)
        sign = 1.0 if milp.sense == "min" else -1.0
        self.best = math.inf if cutoff is None else sign * float(cutoff)
        self.exact: dict[bytes, int] = {}
        self.lower: dict[bytes, int] = {}
        self.calls = 0

    def size(self, lb: np.ndarray | None = None, ub: np.ndarray | None = None, limit: int = 10 ** 9) -> int:
        """The minimum tree size under bounds (default the root); a value > ``limit`` if it exceeds it."""
        lb = self.milp.lb if lb is None else lb
        ub = self.milp.ub if ub is None else ub
        return self._size(lb, ub, limit)

    def _size(self, lb: np.ndarray, ub: np.ndarray, limit: int) -> int:
        self.calls += 1
        key = lb.tobytes() + ub.tobytes()
        if key in self.exact:
            return self.exact[key]
        if self.lower.get(key, 0) > limit:
            return self.lower[key]
        r = self.oracle.solve(lb, ub)
        if r.status == "unbounded":
            raise ValueError("the LP relaxation is unbounded")
        if r.status == "infeasible" or r.objective >= self.best - BOUND_TOL:
            self.exact[key] = 1
            return 1
        cands = _fractional(self.milp, r.x)
        if len(cands) == 0:
            self.exact[key] = 1
            return 1
        if limit < 3:
            self.lower[key] = 3
            return 3
        best = math.inf
        node = Node(lb, ub, r, 0, cands)
        for j in cands:
            cap = int(min(limit, best - 1))
            (dl, du), (ul, uu) = node.child_bounds(int(j))
            left = self._size(dl, du, cap - 2)
            if left > cap - 2:
                continue
            right = self._size(ul, uu, cap - 1 - left)
            if right > cap - 1 - left:
                continue
            best = 1 + left + right
        if best <= limit:
            self.exact[key] = int(best)
            return int(best)
        self.lower[key] = max(self.lower.get(key, 0), limit + 1)
        return limit + 1


def min_tree_size(milp: MILP, *, cutoff: float | None = None, max_n: int = 14) -> int:
    """The minimum branch-and-bound tree size of ``milp`` (see :class:`MinTreeOracle`)."""
    return MinTreeOracle(milp, cutoff=cutoff, max_n=max_n).size()


def closed_form_jeroslow_sb(n: int) -> int:
    """Strong-branching tree size on the Jeroslow block 2 sum x = n (n odd): 2 C(n+1, (n+1)/2) - 1."""
    if n < 1 or n % 2 == 0:
        raise ValueError(f"n must be a positive odd number, got {n}")
    return 2 * math.comb(n + 1, (n + 1) // 2) - 1


Featurizer = Callable[[MILP, Node], np.ndarray]
