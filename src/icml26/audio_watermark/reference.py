"""Closed-form oracles for the clustered KGW watermark's binomial test (tests only; no experiment imports this).

The detector counts n scored units of which n_g are green; under H0 each unit is green with probability gamma.
These are the textbook one-proportion z statistic and the exact binomial upper tail, written as plain sums over
Python integers (``math.comb``), independent of ``scipy.stats.binom`` that ``watermark.py`` calls:

    z = (n_g - gamma n) / sqrt(n gamma (1 - gamma))                 (Kirchenbauer et al. 2023, the one-proportion z test)
    p = P[Bin(n, gamma) >= n_g] = sum_{k = n_g}^{n} C(n, k) gamma^k (1 - gamma)^(n - k)

Example:
    >>> round(binomial_tail(4, 2, 0.5), 4), kgw_z(4, 2, 0.5)
    (0.6875, 0.0)
"""

from __future__ import annotations

import math


def binomial_tail(n: int, g: int, gamma: float) -> float:
    """P[Bin(n, gamma) >= g] by the literal sum.

    $$p = \\sum_{k=g}^{n} \\binom{n}{k} \\gamma^k (1-\\gamma)^{n-k}$$
    (the exact one-sided test of the green count; Kirchenbauer et al. 2023, "A Watermark for Large Language
    Models", whose z test approximates it).
    """
    return sum(math.comb(n, k) * gamma**k * (1 - gamma) ** (n - k) for k in range(g, n + 1))


def kgw_z(n: int, g: int, gamma: float) -> float:
    """The KGW detection statistic of ``g`` green among ``n`` scored units at green share ``gamma``.

    $$z = (|s|_G - \\gamma T) / \\sqrt{T \\gamma (1 - \\gamma)}$$   (Kirchenbauer et al. 2023, the one-proportion z test)
    """
    return (g - gamma * n) / math.sqrt(n * gamma * (1 - gamma))
