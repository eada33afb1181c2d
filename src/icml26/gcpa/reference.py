"""A slow, literal float64 transcription of GPA and the GCPA correction (tests only).

Loops over models and uses scipy's matrix square root instead of an eigendecomposition, so that it shares no
code with ``core.py``:

- GPA: U <- X_1; repeat Omega_m = argmin_orthogonal ||X_m Omega - U|| (SVD of X_m^T U), U = mean_m X_m Omega_m;
- Sigma_w = 1/(M N) sum_m (X_m Omega_m - U)^T (X_m Omega_m - U);
- gamma = c tr(Sigma_w) / k (relative) or c (absolute);
- W = inverse(sqrtm(Sigma_w + gamma I)); Z_m = X_m Omega_m W.

Reference: A. Achara et al., "Multi-Way Representation Alignment", ICML 2026, arXiv:2602.06205 (the correction
is this library's reconstruction, see the README); J. C. Gower, Psychometrika 40 (1975).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg


def gpa_reference(Xs: list[np.ndarray], n_iter: int = 500) -> tuple[list[np.ndarray], np.ndarray]:
    """GPA by a fixed number of alternating steps (no stopping rule)."""
    Xs = [np.asarray(X, dtype=np.float64) for X in Xs]
    U = Xs[0].copy()
    rotations = []
    for _ in range(n_iter):
        rotations = []
        for X in Xs:
            P, _, Qt = scipy.linalg.svd(X.T @ U)
            rotations.append(P @ Qt)
        U = sum(X @ R for X, R in zip(Xs, rotations, strict=True)) / len(Xs)
    return rotations, U


def gcpa_correction_reference(
    Xs: list[np.ndarray], rotations: list[np.ndarray], U: np.ndarray, c: float, relative: bool = True
) -> np.ndarray:
    """W = (Sigma_w + gamma I)^(-1/2) by scipy's sqrtm and inverse."""
    M, N, k = len(Xs), U.shape[0], U.shape[1]
    sigma_w = np.zeros((k, k))
    for X, R in zip(Xs, rotations, strict=True):
        E = X @ R - U
        sigma_w += E.T @ E
    sigma_w /= M * N
    gamma = c * np.trace(sigma_w) / k if relative else c
    root = scipy.linalg.sqrtm(sigma_w + gamma * np.eye(k))
    return np.linalg.inv(np.real(root))
