"""Slow, literal float64 transcriptions of the equations (tests only).

- LoReFT (Wu et al., 2024, eq. 2): Phi(h) = h + R^T (W h + b - R h).
- LoFiT (Yin et al., 2024, eqs. 1-2): z <- (1 + A) * z + v on a selected head's output.
- LEACE (Belrose et al., 2023, Thm. 4.3): r(x) = x - W^+ P W (x - mu), W = (Sigma_XX^{1/2})^+,
  P the orthogonal projection onto colspace(W Sigma_XZ).
"""

from __future__ import annotations

import numpy as np


def loreft(h: np.ndarray, R: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Phi(h) for each row of ``h`` (n, d); R, W are (r, d), b is (r,)."""
    h = np.asarray(h, dtype=np.float64)
    out = np.empty_like(h)
    for i, row in enumerate(h):
        out[i] = row + R.T @ (W @ row + b - R @ row)
    return out


def lofit(z: np.ndarray, A: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(1 + A) * z + v for one head's outputs ``z`` (n, head_dim)."""
    z = np.asarray(z, dtype=np.float64)
    return np.array([(1.0 + A) * row + v for row in z])


def leace(X: np.ndarray, Z: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The LEACE eraser fitted on (X, Z) (sample covariances, Bessel's correction), applied to rows ``x``."""
    X = np.asarray(X, dtype=np.float64)
    Z = np.asarray(Z, dtype=np.float64).reshape(len(X), -1)
    mu = X.mean(0)
    Xc, Zc = X - mu, Z - Z.mean(0)
    sigma_xx = Xc.T @ Xc / (len(X) - 1)
    sigma_xz = Xc.T @ Zc / (len(X) - 1)
    # W = (Sigma_XX^{1/2})^+ through the eigendecomposition
    lam, V = np.linalg.eigh(sigma_xx)
    keep = lam > lam.max() * len(lam) * np.finfo(np.float64).eps
    W = V @ np.diag(np.where(keep, 1.0 / np.sqrt(np.where(keep, lam, 1.0)), 0.0)) @ V.T
    W_pinv = np.linalg.pinv(W)
    # P: orthogonal projection onto colspace(W Sigma_XZ)
    M = W @ sigma_xz
    P = M @ np.linalg.pinv(M)
    return np.array([row - W_pinv @ P @ W @ (row - mu) for row in np.asarray(x, dtype=np.float64)])
