"""Cross-check in SCIP: its own strong branching (``fullstrong``, ``vanillafullstrong``) and tie-rule replays.

SCIP runs with presolve, separation, heuristics, propagation and conflict analysis off, so the tree is decided by
branching alone (presolve otherwise solves the Jeroslow blocks outright, and objective-integrality detection prunes
family D at the root). **Symmetry handling is off by default here** (``misc/usesymmetry = 0``): with it on, SCIP
detects that z1, z2, z3 (and x1..xn) are interchangeable and adds symmetry-breaking rows (measured on family A:
z2 <= z3 <= z1, as ``orbitope_component_*`` LP rows, even with presolve off); with them, strong branching on z3
finds both children LP-infeasible (z3 = 0 forces z2 = 0 and z1 = 1.5; z3 = 1 forces z1 = 1 and z2 = -0.5) and
cuts the root off: families A and B close in 1 node. The gaps the paper describes are about branching, so the
cross-check switches symmetry handling off and reports the 1-node closures beside (``symmetry=True``).

Example:
    >>> from icml26.branch_and_cut.families import sb_suboptimal_family, tie_breaking_family
    >>> scip_tree_size(sb_suboptimal_family(5), rule="fullstrong"), scip_tree_size(
    ...     sb_suboptimal_family(5), rule="fullstrong", symmetry=True)
    (11, 1)
    >>> scip_tree_size(tie_breaking_family(5)), scip_tree_size(tie_breaking_family(5), tie_break="reverse")
    (39, 11)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..common.optional import requires
from .bnb import pick
from .milp import MILP

#: SCIP's own branching rules the cross-check can use, besides ``"tie"`` (our tie rule through a Branchrule)
SCIP_RULES = ("fullstrong", "vanillafullstrong", "relpscost", "mostinf")


def scip_tree_size(milp: MILP, *, rule: str = "tie", tie_break: Any = "index", symmetry: bool = False,
                   node_limit: int = 200_000) -> int:
    """SCIP's node count on ``milp`` with branching decided by ``rule``.

    Args:
        milp: the problem.
        rule: ``"tie"`` branches on the LP candidate our tie rule picks among equal (zero) scores, a replay of
            our SB on family A, where every SB score ties; or one of SCIP's rules (``SCIP_RULES``), given the
            highest priority: ``"fullstrong"`` (SB with its domain reductions: a candidate with one infeasible
            child is fixed, one with two cuts the node off), ``"vanillafullstrong"`` (SB scores only).
        tie_break: the tie rule of ``rule="tie"`` (``"index"``: x first; ``"reverse"``: z first).
        symmetry: leave SCIP's symmetry handling on (its default).
        node_limit: SCIP's node limit.

    Raises:
        ValueError: an unknown rule.
        RuntimeError: SCIP hit the node limit.
        ModuleNotFoundError: pyscipopt is not installed (install the ``branch-and-cut`` extra).
    """
    if rule != "tie" and rule not in SCIP_RULES:
        raise ValueError(f"rule must be 'tie' or one of {SCIP_RULES}, got {rule!r}")
    scip = requires("pyscipopt", extra="branch-and-cut", purpose="the SCIP cross-check")
    model = scip.Model()
    model.hideOutput()
    model.setPresolve(scip.SCIP_PARAMSETTING.OFF)
    model.setSeparating(scip.SCIP_PARAMSETTING.OFF)
    model.setHeuristics(scip.SCIP_PARAMSETTING.OFF)
    model.disablePropagation()
    model.setParam("conflict/enable", False)
    model.setParam("misc/usesymmetry", 7 if symmetry else 0)   # 7: SCIP's default (all symmetry methods)
    model.setParam("limits/nodes", node_limit)
    vtype = ["I" if i else "C" for i in milp.integrality]
    xs = [model.addVar(name=milp.names[j], vtype=vtype[j], lb=float(milp.lb[j]), ub=float(milp.ub[j]),
                       obj=float(milp.min_objective()[j])) for j in range(milp.n)]
    a, lower, upper = milp.rows()
    for i in range(a.shape[0]):
        expr = scip.quicksum(float(a[i, j]) * xs[j] for j in np.nonzero(a[i])[0])
        if np.isfinite(lower[i]) and lower[i] == upper[i]:
            model.addCons(expr == float(upper[i]))
        else:
            model.addCons(expr <= float(upper[i]))
    if rule == "tie":
        index = {x.name: j for j, x in enumerate(xs)}

        class TieRule(scip.Branchrule):
            def branchexeclp(self, allowaddcons: bool) -> dict[str, Any]:
                cands, *_ = self.model.getLPBranchCands()
                ids = np.array([index[v.name.removeprefix("t_")] for v in cands])
                j = pick(np.zeros(len(ids)), ids, tie_break)
                self.model.branchVar(cands[int(np.nonzero(ids == j)[0][0])])
                return {"result": scip.SCIP_RESULT.BRANCHED}

        model.includeBranchrule(TieRule(), "icml26_tie", "branch by the tie rule alone", 10 ** 6, -1, 1.0)
    else:
        model.setParam(f"branching/{rule}/priority", 10 ** 6)
    model.optimize()
    if model.getStatus() == "nodelimit":
        raise RuntimeError(f"SCIP hit the node limit ({node_limit})")
    return int(model.getNNodes())
