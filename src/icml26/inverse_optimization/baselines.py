"""Baselines from the prior work (Sakaue et al. 2025, its notebook's constants): ONS and OGD on the unit ball.

Both keep theta in the ball of radius 1 (diameter D = 2), predict argmax_{x in X_t} <theta, x> and step on the
suboptimality loss's subgradient g_t = eta (x^_t - x_t); K is the action set's diameter (``K`` argument):

- OGD: theta <- Proj_ball(theta - eta (x^ - x)), eta = D K / sqrt(T) (the notebook's constant; the textbook
  step is D / (K sqrt(T)));
- ONS: H = D K, eta = 1 / (5 H), alpha = 2 / (1 + 2 eta H)^2, gamma = alpha / 2, A_0 = d / (D^2 gamma^2) I;
  per round g = eta (x^ - x), A <- A + g g^T, theta <- Proj^A_ball(theta - A^-1 g / gamma), the generalised
  projection found by bisection on lambda >= 0 with ||(A + lambda I)^-1 b|| = 1, b = A theta - g / gamma.

**Ties.** Both predict ``argmax_x <snap(theta), x>`` with theta rounded to ``TIE_DECIMALS`` decimals: on a
degenerate A (repeated eigenvalues) ``eigh`` returns eigenvectors that differ between CPUs and BLAS builds by
~1e-16, which decided exact ties among theta's coordinates one way on one machine and the other way on another
(measured: ONS's regret moved by up to 40 % per seed). Rounding to 1e-9 turns such noise-level differences into
exact ties, which the greedy oracle then breaks by the lower index, the same on every CPU.

Example:
    >>> import numpy as np
    >>> from icml26.inverse_optimization import UniformMatroid
    >>> ons = ONSLearner(d=3, K=np.sqrt(2))
    >>> X = UniformMatroid(d=3, available=[0, 1, 2], k=1)
    >>> ons.update(X, np.array([0, 0, 1])).n_rounds_
    1
"""

from __future__ import annotations

import math

import numpy as np

from .action_sets import ActionSet

#: decimals theta is rounded to before the argmax (ties within 1e-9 are broken by index, the same on any CPU)
TIE_DECIMALS = 9


def snap(theta: np.ndarray) -> np.ndarray:
    """theta rounded to ``TIE_DECIMALS`` decimals (``-0.0`` made ``0.0``), so noise-level ties become exact ones."""
    return np.round(theta, TIE_DECIMALS) + 0.0


class _BallLearner:
    def __init__(self, d: int, D: float, K: float):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be a positive int, got {d!r}")
        if not (D > 0 and K > 0):
            raise ValueError(f"D and K must be > 0, got {D}, {K}")
        self.d, self.D, self.K = int(d), float(D), float(K)
        self.theta_ = np.zeros(self.d)
        self.n_rounds_ = self.n_mistakes_ = 0
        self._last: tuple[ActionSet, np.ndarray] | None = None     # the last (set, prediction), until theta moves

    def predict(self, action_set: ActionSet) -> np.ndarray:
        """argmax over the feasible set of <snap(theta), x> (greedy; ties by the lower index)."""
        if getattr(action_set, "d", None) != self.d:
            raise ValueError(f"the feasible set has dimension {getattr(action_set, 'd', None)}, the learner {self.d}")
        if self._last is not None and self._last[0] is action_set:
            return self._last[1].copy()
        guess = action_set.argmax(snap(self.theta_))
        self._last = (action_set, guess)
        return guess.copy()

    def update(self, action_set: ActionSet, x_obs: np.ndarray):
        if not action_set.contains(x_obs):
            raise ValueError("the observed action is not in the feasible set")
        self.n_rounds_ += 1
        guess = self.predict(action_set)
        if np.array_equal(guess, np.asarray(x_obs)):
            return self       # zero subgradient: the step is the identity (skipped, so no round-off drift)
        self.n_mistakes_ += 1
        self._step(guess.astype(float) - np.asarray(x_obs, dtype=float))
        self._last = None
        return self


class OGDLearner(_BallLearner):
    """Online gradient descent on the suboptimality loss, projected on the unit ball."""

    def __init__(self, d: int, T: int, D: float = 2.0, K: float = 2.0):
        super().__init__(d, D, K)
        if T < 1:
            raise ValueError(f"T must be >= 1, got {T}")
        # $$\eta = D K / \sqrt{T}$$   (the notebook's constant)
        self.eta = self.D * self.K / math.sqrt(T)

    def _step(self, direction: np.ndarray) -> None:
        theta = self.theta_ - self.eta * direction
        norm = np.linalg.norm(theta)
        self.theta_ = theta / norm if norm > 1.0 else theta


class ONSLearner(_BallLearner):
    """Online Newton step on the suboptimality loss with the generalised projection on the unit ball."""

    def __init__(self, d: int, D: float = 2.0, K: float = 2.0):
        super().__init__(d, D, K)
        H = self.D * self.K
        self.eta = 1.0 / (5.0 * H)
        alpha = 2.0 / (1.0 + 2.0 * self.eta * H) ** 2
        self.gamma = alpha / 2.0
        # $$A_0 = \frac{d}{D^2 \gamma^2} I$$
        self.A_ = d / (self.D**2 * self.gamma**2) * np.eye(self.d)

    def _step(self, direction: np.ndarray) -> None:
        g = self.eta * direction
        self.A_ += np.outer(g, g)
        b = self.A_ @ self.theta_ - g / self.gamma
        lam, Q = np.linalg.eigh(self.A_)
        c = Q.T @ b
        radius = lambda mu: float(np.sqrt(np.sum((c / (lam + mu)) ** 2)))  # noqa: E731  ||(A + mu I)^-1 b||
        if radius(0.0) <= 1.0:
            self.theta_ = Q @ (c / lam)
            return
        lo, hi = 0.0, 1.0
        while radius(hi) > 1.0:
            hi *= 2.0
        for _ in range(100):  # bisection, tolerance 1e-6 as in the notebook
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if radius(mid) > 1.0 else (lo, mid)
            if hi - lo < 1e-6:
                break
        self.theta_ = Q @ (c / (lam + hi))
