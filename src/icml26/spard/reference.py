"""Slow, literal float64 transcriptions of SPARD's rules, for the tests only.

- ``naive_greedy_dpp``: greedy MAP that recomputes ``det L_{S + i}`` from scratch for every candidate (no
  Cholesky bookkeeping): the same picks as :func:`icml26.spard.core.greedy_dpp_map` when no gain is clamped;
- ``exact_dpp_map``: the true MAP of size k by enumerating every subset (small pools only);
- ``official_safety_step`` / ``polyak_safety_step``: the safety update on a list of float64 arrays;
- ``relevance_diversity_kernel``: the kernel written with explicit loops.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def relevance_diversity_kernel(candidates: np.ndarray, reference: np.ndarray, beta: float) -> np.ndarray:
    """``L_ij = q_i cos(s_i, s_j) q_j + 1e-6 [i = j]``, ``q_i = (max_j cos(s_i, r_j))^beta``, with loops."""
    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    n = len(candidates)
    q = [max(cos(candidates[i], r) for r in reference) ** beta for i in range(n)]
    L = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            L[i, j] = q[i] * cos(candidates[i], candidates[j]) * q[j] + (1e-6 if i == j else 0.0)
    return L


def naive_greedy_dpp(L: np.ndarray, k: int) -> list[int]:
    """Greedy MAP: each step adds the candidate maximising ``det L_{S + i}`` (first index on ties)."""
    picked: list[int] = []
    for _ in range(k):
        best, best_det = -1, -math.inf
        for i in range(len(L)):
            if i in picked:
                continue
            idx = [*picked, i]
            det = float(np.linalg.det(L[np.ix_(idx, idx)]))
            if det > best_det:
                best, best_det = i, det
        picked.append(best)
    return picked


def exact_dpp_map(L: np.ndarray, k: int) -> tuple[tuple[int, ...], float]:
    """The size-``k`` subset with the largest ``det L_S`` (enumeration) and that determinant."""
    best: tuple[int, ...] = ()
    best_det = -math.inf
    for subset in itertools.combinations(range(len(L)), k):
        det = float(np.linalg.det(L[np.ix_(subset, subset)]))
        if det > best_det:
            best, best_det = subset, det
    return best, best_det


def official_safety_step(grads: list[np.ndarray], loss: float, tau: float, tolerance: float,
                         alpha_max: float) -> tuple[bool, list[np.ndarray]]:
    """The released code's gradient rescaling: ``(fired, scaled gradients)`` (the optimizer step is separate)."""
    if not loss > tau + tolerance:
        return False, [g.copy() for g in grads]
    out = []
    for g in grads:
        alpha = (loss - tau) / (math.sqrt(float(np.sum(g.astype(np.float64) ** 2))) + 1e-8)
        out.append(g.astype(np.float64) * min(alpha, alpha_max))
    return True, out


def polyak_safety_step(params: list[np.ndarray], grads: list[np.ndarray], loss: float, tau: float,
                       tolerance: float, eta_max: float) -> tuple[bool, list[np.ndarray]]:
    """``theta - min((L - tau) / ||g||^2, eta_max) g`` with the global norm: ``(fired, new parameters)``."""
    if not loss > tau + tolerance:
        return False, [p.copy() for p in params]
    sq = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads)
    eta = 0.0 if sq == 0 else min((loss - tau) / sq, eta_max)
    return True, [p.astype(np.float64) - eta * g.astype(np.float64) for p, g in zip(params, grads, strict=True)]
