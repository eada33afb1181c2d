"""A literal float64 transcription of HSIC with the gamma null, by explicit loops (tests only).

    K_ij = exp(-(x_i - x_j)^2 / (2 s_x^2)),  H = I - 11^T / n,  K~ = H K H
    S = sum_ij K~_ij L~_ij,  mean = tr(K~) tr(L~) / n,  var = 2 (sum_ij K~_ij^2)(sum_ij L~_ij^2) / n^2
    p = 1 - F_Gamma(S; mean^2 / var, var / mean)

``moments="permutation"`` replaces mean and var by those of S over all n! permutations of y, enumerated
(``permutation_distribution``; small n only): the oracle of ``core.permutation_moments``.

Example:
    >>> round(hsic_gamma_reference([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0], 1.0, 1.0)[0], 6)
    1.89821
"""

from __future__ import annotations

import itertools
import math

import scipy.stats


def _kernel(v: list[float], s: float) -> list[list[float]]:
    return [[math.exp(-((a - b) ** 2) / (2 * s * s)) for b in v] for a in v]


def _centre(K: list[list[float]]) -> list[list[float]]:
    n = len(K)
    H = [[(1.0 if i == j else 0.0) - 1.0 / n for j in range(n)] for i in range(n)]
    HK = [[sum(H[i][k] * K[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    return [[sum(HK[i][k] * H[k][j] for k in range(n)) for j in range(n)] for i in range(n)]


def permutation_distribution(Kc: list[list[float]], Lc: list[list[float]]) -> list[float]:
    """S_pi = sum_ij Kc[i][j] Lc[pi(i)][pi(j)] for every permutation pi of range(n), in itertools order."""
    n = len(Kc)
    return [sum(Kc[i][j] * Lc[p[i]][p[j]] for i in range(n) for j in range(n))
            for p in itertools.permutations(range(n))]


def hsic_gamma_reference(x: list[float], y: list[float], sx: float, sy: float, moments: str = "asymptotic"
                         ) -> tuple[float, float]:
    """(statistic S = tr(K~ L~), gamma p-value) for 1-D samples x, y."""
    x, y = [float(v) for v in x], [float(v) for v in y]
    n = len(x)
    Kc, Lc = _centre(_kernel(x, sx)), _centre(_kernel(y, sy))
    S = sum(Kc[i][j] * Lc[i][j] for i in range(n) for j in range(n))
    if moments == "asymptotic":
        mean = sum(Kc[i][i] for i in range(n)) * sum(Lc[i][i] for i in range(n)) / n
        var = 2 * sum(v * v for row in Kc for v in row) * sum(v * v for row in Lc for v in row) / n**2
    else:
        null = permutation_distribution(Kc, Lc)
        mean = math.fsum(null) / len(null)
        var = math.fsum((v - mean) ** 2 for v in null) / len(null)
    return S, float(scipy.stats.gamma.sf(S, mean**2 / var, scale=var / mean))
