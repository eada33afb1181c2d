"""Mixed-integer linear programs and a warm-started vertex LP oracle on HiGHS (dual simplex).

``MILP`` holds min/max c.x s.t. A_ub x <= b_ub, A_eq x = b_eq, lb <= x <= ub, with x_j integer where
``integrality[j] == 1``. ``LPOracle`` solves its LP relaxation under changed bounds, warm-starting HiGHS's dual
simplex from the last basis, and returns a vertex (the B&B's candidate sets and "integral at the root" rely on
vertices; an interior-point solution would not do).

Example:
    >>> import numpy as np
    >>> m = MILP(c=[1.0, 1.0], A_eq=[[2.0, 2.0]], b_eq=[1.0])
    >>> r = LPOracle(m).solve(m.lb, m.ub)
    >>> r.status, round(r.objective, 6), sorted(r.x.round(6).tolist())
    ('optimal', 0.5, [0.0, 0.5])
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..common.optional import requires


@dataclass(frozen=True)
class Cut:
    """A valid inequality ``coef . x <= rhs`` (``name`` for reports)."""

    coef: np.ndarray
    rhs: float
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "coef", np.asarray(self.coef, dtype=float))
        if self.coef.ndim != 1 or not np.isfinite(self.coef).all() or not math.isfinite(self.rhs):
            raise ValueError(f"cut {self.name!r} must have a finite 1-D coefficient vector and a finite rhs")


def _matrix(a: object, n: int, name: str) -> np.ndarray:
    if a is None:
        return np.zeros((0, n))
    m = np.atleast_2d(np.asarray(a, dtype=float))
    if m.shape[1] != n:
        raise ValueError(f"{name} must have {n} columns (one per variable), got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError(f"{name} contains NaN or infinity")
    return m


def _vector(b: object, size: int, name: str) -> np.ndarray:
    v = np.zeros(0) if b is None else np.asarray(b, dtype=float).reshape(-1)
    if v.shape != (size,):
        raise ValueError(f"{name} must have {size} entries, got {v.shape[0]}")
    if not np.isfinite(v).all():
        raise ValueError(f"{name} contains NaN or infinity")
    return v


@dataclass
class MILP:
    """A mixed-integer linear program.

    Args:
        c: objective coefficients (n,).
        A_ub, b_ub: inequality rows ``A_ub x <= b_ub``.
        A_eq, b_eq: equality rows.
        lb, ub: variable bounds (default 0 and 1: binaries).
        integrality: 1 for integer variables, 0 for continuous ones (default all integer).
        sense: ``"min"`` or ``"max"``.
        names: variable names (default x0, x1, ...).
    """

    c: Sequence[float]
    A_ub: object = None
    b_ub: object = None
    A_eq: object = None
    b_eq: object = None
    lb: object = None
    ub: object = None
    integrality: object = None
    sense: str = "min"
    names: Sequence[str] | None = None
    cuts: list[Cut] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.c = np.asarray(self.c, dtype=float).reshape(-1)
        n = len(self.c)
        if n == 0 or not np.isfinite(self.c).all():
            raise ValueError("c must be a non-empty finite vector")
        if self.sense not in ("min", "max"):
            raise ValueError(f"sense must be 'min' or 'max', got {self.sense!r}")
        self.A_ub = _matrix(self.A_ub, n, "A_ub")
        self.b_ub = _vector(self.b_ub, self.A_ub.shape[0], "b_ub")
        self.A_eq = _matrix(self.A_eq, n, "A_eq")
        self.b_eq = _vector(self.b_eq, self.A_eq.shape[0], "b_eq")
        self.lb = np.zeros(n) if self.lb is None else np.asarray(self.lb, dtype=float).reshape(-1)
        self.ub = np.ones(n) if self.ub is None else np.asarray(self.ub, dtype=float).reshape(-1)
        if self.lb.shape != (n,) or self.ub.shape != (n,) or (self.lb > self.ub).any():
            raise ValueError("lb and ub must have one entry per variable with lb <= ub")
        integ = np.ones(n) if self.integrality is None else np.asarray(self.integrality, dtype=float).reshape(-1)
        if integ.shape != (n,) or not np.isin(integ, (0, 1)).all():
            raise ValueError("integrality must hold one 0 (continuous) or 1 (integer) per variable")
        self.integrality = integ.astype(bool)
        ints = self.integrality
        if (np.isfinite(self.lb[ints]) & (self.lb[ints] != np.ceil(self.lb[ints]))).any() or (
                np.isfinite(self.ub[ints]) & (self.ub[ints] != np.floor(self.ub[ints]))).any():
            raise ValueError("integer variables must have integer bounds")
        self.names = list(self.names) if self.names is not None else [f"x{j}" for j in range(n)]
        if len(self.names) != n:
            raise ValueError(f"names must have {n} entries")
        for cut in self.cuts:
            if cut.coef.shape != (n,):
                raise ValueError(f"cut {cut.name!r} has {cut.coef.shape[0]} coefficients, expected {n}")

    @property
    def n(self) -> int:
        return len(self.c)

    def add_cuts(self, cuts: Sequence[Cut]) -> MILP:
        """A copy with ``cuts`` appended as inequality rows."""
        return MILP(self.c, self.A_ub, self.b_ub, self.A_eq, self.b_eq, self.lb, self.ub,
                    self.integrality.astype(float), self.sense, self.names, [*self.cuts, *cuts])

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All rows (inequalities, cuts, equalities) as ``(A, lower, upper)``."""
        cut_a = np.array([c.coef for c in self.cuts]).reshape(-1, self.n)
        cut_b = np.array([c.rhs for c in self.cuts])
        a = np.vstack([self.A_ub, cut_a, self.A_eq])
        lower = np.concatenate([np.full(len(self.b_ub) + len(cut_b), -np.inf), self.b_eq])
        upper = np.concatenate([self.b_ub, cut_b, self.b_eq])
        return a, lower, upper

    def min_objective(self) -> np.ndarray:
        """The objective as a minimisation."""
        return self.c if self.sense == "min" else -self.c


@dataclass
class LPResult:
    """An LP relaxation's outcome: ``status`` is "optimal", "infeasible" or "unbounded"."""

    status: str
    objective: float = math.inf        # of the minimisation form
    x: np.ndarray | None = None


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence the C-level stdout (HiGHS prints its banner in the constructor, before any option applies)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class LPOracle:
    """Solves the LP relaxation of ``milp`` under given bounds with HiGHS dual simplex, warm-started.

    Raises:
        ValueError: the LP is unbounded (``solve`` reports it, ``solve_or_raise`` raises).
    """

    def __init__(self, milp: MILP):
        highspy = requires("highspy", extra="branch-and-cut", purpose="the branch-and-bound LP relaxations")
        self.milp = milp
        self.solves = 0
        with _quiet_stdout():
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("simplex_strategy", 1)             # dual simplex: basic (vertex) solutions
        h.setOptionValue("presolve", "off")
        a, lower, upper = milp.rows()
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = milp.n, a.shape[0]
        lp.col_cost_ = milp.min_objective()
        lp.col_lower_, lp.col_upper_ = milp.lb, milp.ub
        lp.row_lower_, lp.row_upper_ = lower, upper
        csc = np.asfortranarray(a)
        nz = [np.nonzero(csc[:, j])[0] for j in range(milp.n)]
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum([len(i) for i in nz])]).astype(np.int32)
        lp.a_matrix_.index_ = np.concatenate(nz).astype(np.int32) if nz else np.zeros(0, np.int32)
        lp.a_matrix_.value_ = np.concatenate([csc[i, j] for j, i in enumerate(nz)]) if nz else np.zeros(0)
        h.passModel(lp)
        self._h, self._highspy = h, highspy
        self._idx = np.arange(milp.n, dtype=np.int32)

    def solve(self, lb: np.ndarray, ub: np.ndarray) -> LPResult:
        """The LP under bounds ``lb <= x <= ub`` (a vertex when optimal)."""
        self.solves += 1
        if (lb > ub).any():
            return LPResult("infeasible")
        h = self._h
        h.changeColsBounds(self.milp.n, self._idx, np.asarray(lb, float), np.asarray(ub, float))
        h.run()
        status = h.getModelStatus()
        ms = self._highspy.HighsModelStatus
        if status == ms.kOptimal:
            sol = h.getSolution()
            return LPResult("optimal", float(h.getInfo().objective_function_value), np.array(sol.col_value))
        if status == ms.kInfeasible:
            return LPResult("infeasible")
        if status in (ms.kUnbounded, ms.kUnboundedOrInfeasible):
            # re-solve from scratch to tell the two apart
            h.clearSolver()
            h.run()
            if h.getModelStatus() == ms.kInfeasible:
                return LPResult("infeasible")
            return LPResult("unbounded")
        raise RuntimeError(f"HiGHS returned model status {h.modelStatusToString(status)}")
