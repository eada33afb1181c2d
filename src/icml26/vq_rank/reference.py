"""Literal float64 transcriptions of the effective rank and the codebook regulariser (tests only).

Example:
    >>> import numpy as np
    >>> round(roy_vetterli(np.eye(3) * [3.0, 2.0, 1.0], center=False), 6)
    2.749459
"""

from __future__ import annotations

import math

import numpy as np


def roy_vetterli(C: np.ndarray, center: bool = True) -> float:
    """exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j over the singular values of (centred) C."""
    C = np.asarray(C, dtype=np.float64)
    if center:
        C = C - C.mean(axis=0)
    s = np.linalg.svd(C, compute_uv=False)
    s = s[s > 1e-12 * s.max()]
    total = sum(s)
    entropy = 0.0
    for value in s:
        p = value / total
        entropy -= p * math.log(p)
    return math.exp(entropy)


def gram_offdiag(C: np.ndarray) -> float:
    """sum_{i != j} G_ij^2 / (D (D - 1)) with G = Cn^T Cn, Cn the row-normalised codebook, by loops."""
    C = np.asarray(C, dtype=np.float64)
    K, D = C.shape
    Cn = np.array([row / math.sqrt(sum(v * v for v in row)) for row in C])
    total = 0.0
    for i in range(D):
        for j in range(D):
            if i != j:
                g = sum(Cn[k, i] * Cn[k, j] for k in range(K))
                total += g * g
    return total / (D * (D - 1))
