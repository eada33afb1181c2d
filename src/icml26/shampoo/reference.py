"""A slow, literal float64 transcription of AdamW-style Shampoo (tests only).

One matrix parameter X in R^{m x n}, NumPy float64, explicit loops over blocks, explicit eigendecompositions.
The algorithm, per step k = 1, 2, ... (Li, Dong & Lin 2026; practical steps from Meta's Distributed Shampoo):

    G_k = grad(X_k)
    M_k = b1 M_{k-1} + (1 - b1) G_k,             M^ = M_k / (1 - b1^k)
    V_k = b2 V_{k-1} + (1 - b2) G_k * G_k,        V^ = V_k / (1 - b2^k)      (grafting only)
    per block B:  L_B = b2 L_B + (1 - b2) G_B G_B^T,  R_B = b2 R_B + (1 - b2) G_B^T G_B
    if k >= start and (k - start) % freq == 0:   Linv_B = (L_B / (1 - b2^k) + eps I)^(-eL),  Rinv_B likewise
    A = M^ / (sqrt(V^) + eps_g)  (adam)   or   M^  (sgd)                       the grafted direction
    D_B = Linv_B M^_B Rinv_B          if k >= start,       else  A_B
    D_B <- D_B * ||A_B|| / ||D_B||    when grafting is adam or sgd
    X_{k+1} = (1 - lr wd) X_k - lr D

Example:
    >>> import numpy as np
    >>> X = reference_shampoo(np.ones((2, 3)), lambda X: X, steps=1, lr=0.1, grafting="none", start=1, freq=1)
    >>> X.shape
    (2, 3)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def inverse_root(A: np.ndarray, exponent: float, eps: float) -> np.ndarray:
    """(A + eps I)^(-exponent) by eigendecomposition, eigenvalues floored at eps."""
    A = 0.5 * (A + A.T) + eps * np.eye(A.shape[0])
    lam, Q = np.linalg.eigh(A)
    lam = np.maximum(lam, eps)
    return Q @ np.diag(lam ** (-exponent)) @ Q.T


def condition_number(A: np.ndarray, eps: float) -> float:
    """kappa(A + eps I) = lambda_max / lambda_min with the eigenvalues floored at eps, as ``inverse_root`` sees them.

    The inverse root's forward error grows with it: eigh is backward stable (a perturbation of about u ||A||),
    and d(lambda^-p)/d lambda = -p lambda^(-p-1) turns that into a relative error of about p u kappa. Tests
    scale their tolerances by it, so that they hold on any CPU's LAPACK.
    """
    lam = np.maximum(np.linalg.eigvalsh(0.5 * (A + A.T) + eps * np.eye(A.shape[0])), eps)
    return float(lam.max() / lam.min())


def reference_shampoo(
    X0: np.ndarray,
    grad: Callable[[np.ndarray], np.ndarray],
    *,
    steps: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    graft_eps: float = 1e-8,
    weight_decay: float = 0.0,
    exponents: tuple[float, float] = (0.25, 0.25),
    grafting: str = "adam",
    freq: int = 1,
    start: int = 1,
    block: int | None = None,
    conditions: list[float] | None = None,
) -> np.ndarray:
    """Run ``steps`` steps from ``X0`` with gradients ``grad(X)``; return the final X (float64).

    ``conditions``, when given, receives ``condition_number`` of every factor whose inverse root is taken.
    """
    X = np.array(X0, dtype=np.float64)
    m, n = X.shape
    b = block or max(m, n)
    blocks = [
        (slice(i, min(i + b, m)), slice(j, min(j + b, n))) for i in range(0, m, b) for j in range(0, n, b)
    ]
    b1, b2 = betas
    eL, eR = exponents
    M = np.zeros_like(X)
    V = np.zeros_like(X)
    L = [np.zeros((r.stop - r.start,) * 2) for r, _ in blocks]
    R = [np.zeros((c.stop - c.start,) * 2) for _, c in blocks]
    Linv = [np.eye(r.stop - r.start) for r, _ in blocks]
    Rinv = [np.eye(c.stop - c.start) for _, c in blocks]
    ready = [False] * len(blocks)
    for k in range(1, steps + 1):
        G = np.asarray(grad(X), dtype=np.float64)
        M = b1 * M + (1 - b1) * G
        V = b2 * V + (1 - b2) * G * G
        Mh = M / (1 - b1**k)
        Vh = V / (1 - b2**k)
        A = Mh if grafting == "sgd" else Mh / (np.sqrt(Vh) + graft_eps)
        for i, (r, c) in enumerate(blocks):
            Gb = G[r, c]
            L[i] = b2 * L[i] + (1 - b2) * Gb @ Gb.T
            R[i] = b2 * R[i] + (1 - b2) * Gb.T @ Gb
        if k >= start and (k - start) % freq == 0:
            for i in range(len(blocks)):
                if eL > 0:
                    Linv[i] = inverse_root(L[i] / (1 - b2**k), eL, eps)
                if eR > 0:
                    Rinv[i] = inverse_root(R[i] / (1 - b2**k), eR, eps)
                if conditions is not None:
                    conditions.extend(
                        condition_number(F / (1 - b2**k), eps) for F, e in ((L[i], eL), (R[i], eR)) if e > 0
                    )
                ready[i] = True
        D = A.copy()
        if k >= start:
            for i, (r, c) in enumerate(blocks):
                if not ready[i]:
                    continue
                Db = Mh[r, c]
                if eL > 0:
                    Db = Linv[i] @ Db
                if eR > 0:
                    Db = Db @ Rinv[i]
                if grafting != "none":
                    Db = Db * (np.linalg.norm(A[r, c]) / np.linalg.norm(Db))
                D[r, c] = Db
        X = (1 - lr * weight_decay) * X - lr * D
    return X
