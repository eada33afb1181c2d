"""Optional cross-check in SCIP: family A's tree sizes with the same tie rule as a PySCIPOpt branching rule.

SCIP runs with presolve, separation, heuristics, propagation and conflict analysis off, so the tree is decided by
branching alone (presolve otherwise solves the Jeroslow blocks outright, and objective-integrality detection prunes
family D at the root). Needs the ``opt`` extra (pyscipopt).

Example:
    >>> from icml26.branch_and_cut.families import tie_breaking_family
    >>> scip_tree_size(tie_breaking_family(5)), scip_tree_size(tie_breaking_family(5), tie_break="reverse")
    (39, 3)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..common.optional import requires
from .bnb import pick
from .milp import MILP


def scip_tree_size(milp: MILP, *, tie_break: Any = "index", node_limit: int = 200_000) -> int:
    """SCIP's node count on ``milp`` when branching on the LP candidate chosen by the tie rule alone.

    On family A every strong-branching score ties, so our SB tree is exactly the tie rule's tree; this replays that
    rule in SCIP (its own LP, node processing and counting) as an independent check of the tree sizes. x-first
    gives our sizes exactly; z-first closes in 3 nodes instead of our 11 (SCIP's root LP solution has all three z at
    1/2, not a vertex with one fractional z, and SCIP's node processing proves both children infeasible; which of
    its components does so was not dissected).

    Raises:
        ModuleNotFoundError: pyscipopt is not installed (install the ``opt`` extra).
    """
    scip = requires("pyscipopt", extra="branch-and-cut", purpose="the SCIP cross-check")
    model = scip.Model()
    model.hideOutput()
    model.setPresolve(scip.SCIP_PARAMSETTING.OFF)
    model.setSeparating(scip.SCIP_PARAMSETTING.OFF)
    model.setHeuristics(scip.SCIP_PARAMSETTING.OFF)
    model.disablePropagation()
    model.setParam("conflict/enable", False)
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
    index = {x.name: j for j, x in enumerate(xs)}

    class TieRule(scip.Branchrule):
        def branchexeclp(self, allowaddcons: bool) -> dict[str, Any]:
            cands, *_ = self.model.getLPBranchCands()
            ids = np.array([index[v.name.removeprefix("t_")] for v in cands])
            j = pick(np.zeros(len(ids)), ids, tie_break)
            self.model.branchVar(cands[int(np.nonzero(ids == j)[0][0])])
            return {"result": scip.SCIP_RESULT.BRANCHED}

    model.includeBranchrule(TieRule(), "icml26_tie", "branch by the tie rule alone", 10 ** 6, -1, 1.0)
    model.optimize()
    if model.getStatus() == "nodelimit":
        raise RuntimeError(f"SCIP hit the node limit ({node_limit})")
    return int(model.getNNodes())
