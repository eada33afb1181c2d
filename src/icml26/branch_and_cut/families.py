"""Instance families that show exponential tree-size gaps (this project's constructions; adversarial by design).

- **J_n** (Jeroslow): 2 sum_{i<=n} x_i = n, n odd: integer-infeasible, but LP-feasible until about n/2 variables
  are fixed, so every variable-branching tree on it has 2^Theta(n) nodes.
- **Z_3**: 2 (z1 + z2 + z3) = 3: integer-infeasible, proved so by an 11-node tree.

| family | construction | shows |
|---|---|---|
| A `tie_breaking_family` | J_n and Z_3, objective 0: every SB score ties at eps^2 | tie-breaking alone |
| B `sb_suboptimal_family` | J_n and Z_3, cost 1 + i/n on x_i, none on z: SB sees gains on x only | SB is suboptimal |
| C `score_gap_family` | B with z costs (0, 1/n, (2 + margin)/n): SB's best z score beats the best x score by the relative margin, with no tie anywhere | score perturbation, few decisions |
| D `rhs_perturbed_cut` | max sum x s.t. 2 sum x <= n, root cut sum x <= (n-1)/2 + eps, cutoff (n-1)/2 | RHS perturbation |
| E `cut_selection_family` | B with pair cuts on x1..x3 (raise the root bound) and on z1..z3 (no gain); pick 3 | cut selection |

In A, B and E both blocks are integer-infeasible, so *every* inequality is valid for them; the pair cuts are valid
only in that sense.

Example:
    >>> m = tie_breaking_family(5)
    >>> m.n, m.names[:2], m.names[-1]
    (8, ['x1', 'x2'], 'z3')
"""

from __future__ import annotations

import numpy as np

from .milp import MILP, Cut


def _odd(n: int, name: str = "n") -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n % 2 == 0:
        raise ValueError(f"{name} must be a positive odd int, got {n!r}")


def jeroslow_gadget(n: int, k: int = 3, weights: np.ndarray | None = None) -> MILP:
    """J_n (x1..xn) and Z_k (z1..zk) as one binary program; ``weights`` the x costs (default 0), z costless."""
    _odd(n)
    _odd(k, "k")
    a = np.zeros((2, n + k))
    a[0, :n] = 2
    a[1, n:] = 2
    c = np.zeros(n + k)
    if weights is not None:
        w = np.asarray(weights, dtype=float)
        if w.shape != (n,):
            raise ValueError(f"weights must have {n} entries")
        c[:n] = w
    names = [f"x{i + 1}" for i in range(n)] + [f"z{i + 1}" for i in range(k)]
    return MILP(c, A_eq=a, b_eq=[n, k], names=names)


def tie_breaking_family(n: int) -> MILP:
    """Family A: J_n and Z_3 with a zero objective."""
    return jeroslow_gadget(n)


def sb_suboptimal_family(n: int) -> MILP:
    """Family B: J_n and Z_3, x_i costs 1 + i/n (distinct), z costless."""
    return jeroslow_gadget(n, weights=1 + np.arange(1, n + 1) / n)


def score_gap_family(n: int, margin: float) -> MILP:
    """Family C: J_n with x costs 1 + i/n and Z_3 with z costs (0, 1/n, (2 + margin)/n).

    The root LP has one fractional x (x_m, m = (n + 1)/2) and one fractional z (z2). Their strong-branching gains
    are 1/(2n) on both sides for x_m and (1/(2n), (1 + margin)/(2n)) for z2, so with SCIP's product score z2 wins
    by the relative ``margin``: 0.25 (1 + margin)/n^2 against 0.25/n^2, two distinct scores, no tie. Branching z2
    first, every later z node has an infeasible child (score >= 1e6 eps) and the tree closes in 11 nodes. After
    any branching on x, each fractional x has a fixed neighbour on one side, so its gains are at least 1/n and
    1/(2n) (score >= 0.5/n^2) and beat z2's root score for any margin < 1: one different decision at the root, or
    a score perturbation that flips the root comparison, leads SB through J_n's exponential tree.
    """
    _odd(n)
    if not 0 < margin < 1:
        raise ValueError(f"margin must be in (0, 1), got {margin!r}")
    m = sb_suboptimal_family(n)
    c = m.c.copy()
    c[n:] = [0.0, 1.0 / n, (2.0 + margin) / n]
    return MILP(c, A_eq=m.A_eq, b_eq=m.b_eq, names=m.names)


def rhs_perturbed_cut(n: int, eps: float) -> tuple[MILP, float]:
    """Family D: ``(problem with its root cut, cutoff)``; eps = 0 makes the root LP vertex integral."""
    _odd(n)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    milp = MILP(np.ones(n), A_ub=[[2.0] * n], b_ub=[n], sense="max", names=[f"x{i + 1}" for i in range(n)])
    cut = Cut(np.ones(n), (n - 1) / 2 + eps, name=f"sum x <= (n-1)/2 + {eps:g}")
    return milp.add_cuts([cut]), (n - 1) / 2


def cut_selection_family(n: int) -> tuple[MILP, list[Cut]]:
    """Family E: ``(family B, candidate cuts)``: the pair cuts x_a + x_b <= 1 on the three cheapest x (each raises
    the root LP bound) and z_a + z_b <= 1 on the three z (no bound gain; together they force z = 1/2 and make
    Z_3's infeasibility visible to strong branching at once). Select three."""
    milp = sb_suboptimal_family(n)
    cuts = []
    for block, offset in (("x", 0), ("z", n)):
        for a, b in ((0, 1), (0, 2), (1, 2)):
            coef = np.zeros(milp.n)
            coef[[offset + a, offset + b]] = 1
            cuts.append(Cut(coef, 1.0, f"{block}{a + 1} + {block}{b + 1} <= 1"))
    return milp, cuts
