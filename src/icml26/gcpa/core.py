"""Framework-free math of multi-way representation alignment (NumPy/SciPy, float64).

- ``orthogonal_procrustes(A, B)``: argmin over orthogonal R of ||A R - B||_F, R = U V^T from A^T B = U S V^T.
- ``ViewPreprocessor``: centre, project on the top-k principal directions, scale to unit RMS row norm, all with
  statistics from the training anchors only.
- ``generalized_procrustes``: GPA, alternating Omega_m = Procrustes(X_m, U) and U = mean_m X_m Omega_m.
- ``residual_whitening``: the GCPA correction W = (Sigma_w + gamma I)^(-1/2) of the shared disagreement
  covariance Sigma_w = 1/(M N) sum_m E_m^T E_m, E_m = X_m Omega_m - U (a reconstruction; see the README), with
  the scale-free ridge gamma = c tr(Sigma_w) / k by default (``relative_gamma``).
- ``mcca_sumcor`` / ``gcca_maxvar``: multi-view CCA as a generalised eigenproblem (SUMCOR) and as the
  MAXVAR eigenproblem, both with ridge regularisation.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.normal(size=(50, 4)); Q, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    >>> R = orthogonal_procrustes(A, A @ Q)
    >>> bool(np.allclose(R, Q))
    True

Reference: A. Achara et al., "Multi-Way Representation Alignment", ICML 2026, arXiv:2602.06205; J. C. Gower,
"Generalized Procrustes analysis", Psychometrika 40 (1975); J. R. Kettenring, "Canonical analysis of several
sets of variables", Biometrika 58 (1971).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg


def orthogonal_procrustes(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The orthogonal R minimising ||A R - B||_F (Schönemann 1966)."""
    # $$A^\top B = U \Sigma V^\top, \quad R = U V^\top$$
    u, _, vt = np.linalg.svd(A.T @ B, full_matrices=False)
    return u @ vt


@dataclass
class ViewPreprocessor:
    """Centre, reduce to ``k`` principal directions and scale to unit RMS row norm (fitted on train rows)."""

    mean_: np.ndarray
    components_: np.ndarray
    """(d, k) principal directions"""
    scale_: float

    @classmethod
    def fit(cls, X: np.ndarray, k: int) -> ViewPreprocessor:
        mean = X.mean(axis=0)
        centred = X - mean
        # principal directions: the top-k eigenvectors of the scatter matrix (d x d; cheaper than an SVD of X)
        lam, vecs = np.linalg.eigh(centred.T @ centred)
        components = vecs[:, np.argsort(lam)[::-1][:k]]
        # sign convention: the largest-magnitude loading of each component is positive (determinism)
        signs = np.sign(components[np.abs(components).argmax(axis=0), np.arange(components.shape[1])])
        components = components * np.where(signs == 0, 1.0, signs)
        projected = centred @ components
        scale = float(np.sqrt(np.mean(np.sum(projected**2, axis=1))))
        return cls(mean, components, scale if scale > 0 else 1.0)

    def transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean_) @ self.components_ / self.scale_


def generalized_procrustes(
    Xs: Sequence[np.ndarray], *, max_iter: int = 200, tol: float = 1e-6
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """GPA on equal-width views: rotations Omega_m, the consensus U, and the iterations used.

    Minimises sum_m ||X_m Omega_m - U||_F^2 over orthogonal Omega_m and U, starting from U = X_1. Every
    iteration lowers the objective; it stops when the relative decrease falls below ``tol`` (GPA converges
    linearly and slowly along directions where the views disagree, so a criterion on U itself can take
    hundreds of iterations for no visible change).
    """
    U = np.array(Xs[0], dtype=np.float64)
    rotations: list[np.ndarray] = []
    previous = np.inf
    for it in range(1, max_iter + 1):
        # $$\Omega_m = \mathrm{Procrustes}(X_m, U)$$
        rotations = [orthogonal_procrustes(X, U) for X in Xs]
        aligned = [X @ R for X, R in zip(Xs, rotations, strict=True)]
        # $$U = \frac{1}{M} \sum_m X_m \Omega_m$$
        U = np.mean(aligned, axis=0)
        objective = sum(float(np.sum((Z - U) ** 2)) for Z in aligned)
        if previous - objective <= tol * max(objective, 1e-300):
            return rotations, U, it
        previous = objective
    return rotations, U, max_iter


def inverse_sqrt_psd(S: np.ndarray, reg: float) -> np.ndarray:
    """(S + reg I)^(-1/2) of a symmetric PSD matrix."""
    S = 0.5 * (S + S.T)
    lam, Q = np.linalg.eigh(S)
    lam = np.maximum(lam, 0.0) + reg
    return (Q / np.sqrt(lam)) @ Q.T


def residual_covariance(aligned: Sequence[np.ndarray], U: np.ndarray) -> np.ndarray:
    """Sigma_w = 1/(M N) sum_m (X_m Omega_m - U)^T (X_m Omega_m - U): the models' pooled disagreement."""
    M, N = len(aligned), U.shape[0]
    # $$\Sigma_w = \frac{1}{MN} \sum_m (X_m\Omega_m - U)^\top (X_m\Omega_m - U)$$
    return sum((Z - U).T @ (Z - U) for Z in aligned) / (M * N)


def relative_gamma(sigma_w: np.ndarray, c: float) -> float:
    """The scale-free ridge gamma = c tr(Sigma_w) / k: ``c`` times the mean residual eigenvalue.

    Derivation. W = (Sigma_w + gamma I)^(-1/2) multiplies residual eigendirection i (eigenvalue lambda_i) by
    (lambda_i + gamma)^(-1/2). An absolute gamma makes that gain depend on the preprocessing's scale: rescale
    every view by s and lambda_i becomes s^2 lambda_i, so a fixed gamma is negligible for large s (every
    near-null noise direction is blown up) and dominant for small s (W ~ I, no correction). With
    gamma = c lambda_bar, lambda_bar = tr(Sigma_w) / k, the gains become (lambda_bar)^(-1/2) (lambda_i / lambda_bar
    + c)^(-1/2): up to one global factor, which no cosine or distance ratio sees, they depend only on the
    eigenvalue ratios lambda_i / lambda_bar, and the largest boost of a noise direction relative to the mean one
    is bounded by sqrt((1 + c) / c) whatever the scale. c = 1 caps it at sqrt(2).
    """
    k = sigma_w.shape[0]
    # $$\gamma = c \, \mathrm{tr}(\Sigma_w) / k$$
    return float(c * np.trace(sigma_w) / k)


def residual_whitening(
    aligned: Sequence[np.ndarray], U: np.ndarray, reg: float, *, relative: bool = True
) -> tuple[np.ndarray, float]:
    """The GCPA correction W = (Sigma_w + gamma I)^(-1/2) and the gamma used.

    ``relative=True`` (default): gamma = reg tr(Sigma_w) / k (scale-free, ``relative_gamma``); ``False``:
    gamma = reg (the absolute ridge of the first version, whose effect depends on the preprocessing's scale).
    """
    sigma_w = residual_covariance(aligned, U)
    gamma = relative_gamma(sigma_w, reg) if relative else float(reg)
    if not gamma > 0:  # identical views: no disagreement to correct
        gamma = float(reg) if reg > 0 else 1.0
    # $$W = (\Sigma_w + \gamma I)^{-1/2}$$
    return inverse_sqrt_psd(sigma_w, gamma), gamma


def _ridge(C: np.ndarray, reg: float) -> np.ndarray:
    """(1 - reg) C + reg (tr C / d) I: shrinkage towards a scaled identity."""
    d = C.shape[0]
    return (1.0 - reg) * C + reg * (np.trace(C) / d) * np.eye(d)


def mcca_sumcor(
    Xs: Sequence[np.ndarray], n_components: int, reg: float
) -> tuple[list[np.ndarray], np.ndarray]:
    """Multi-view CCA (SUMCOR): the top generalised eigenvectors of C w = lambda D w.

    C is the covariance of the concatenated centred views, D its block diagonal with ridge shrinkage ``reg``.
    Returns the per-view weights W_m (d_m x n_components, normalised so that sum_m w_m^T D_m w_m = 1) and the
    eigenvalues. For two views without regularisation, lambda_k = 1 + rho_k (rho the canonical correlations).
    """
    n = Xs[0].shape[0]
    widths = [X.shape[1] for X in Xs]
    Xc = np.hstack(Xs)
    # $$C = \frac{1}{n} [X_1 \dots X_M]^\top [X_1 \dots X_M]$$
    C = Xc.T @ Xc / n
    D = np.zeros_like(C)
    offsets = np.cumsum([0, *widths])
    for a, b in itertools.pairwise(offsets):
        D[a:b, a:b] = _ridge(C[a:b, a:b], reg)
    # $$C w = \lambda D w$$
    lam, vecs = scipy.linalg.eigh(C, D)
    order = np.argsort(lam)[::-1][:n_components]
    vecs = vecs[:, order]
    return [vecs[a:b] for a, b in itertools.pairwise(offsets)], lam[order]


def gcca_maxvar(
    Xs: Sequence[np.ndarray], n_components: int, reg: float, *, return_consensus: bool = False
) -> tuple[list[np.ndarray], np.ndarray] | tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Generalised CCA (MAXVAR): the shared G maximising sum_m tr(G^T P_m G), P_m the ridge projections.

    G is the top left singular vectors of [X_1 A_1^(1/2) ... X_M A_M^(1/2)] with A_m = (X_m^T X_m / n)^(-1)
    (ridge-shrunk); the view weights are W_m = A_m X_m^T G / n. Returns (weights, eigenvalues of sum_m P_m),
    and the consensus G (n x n_components, G^T G = n I) when ``return_consensus``.
    """
    n = Xs[0].shape[0]
    roots, inverses = [], []
    for X in Xs:
        C = _ridge(X.T @ X / n, reg)
        lam, Q = np.linalg.eigh(C)
        lam = np.maximum(lam, 1e-12)
        roots.append((Q / np.sqrt(lam)) @ Q.T)
        inverses.append((Q / lam) @ Q.T)
    # $$\sum_m P_m = Y Y^\top, \quad Y = [X_1 A_1^{1/2} \cdots X_M A_M^{1/2}] / \sqrt{n}$$
    Y = np.hstack([X @ r for X, r in zip(Xs, roots, strict=True)]) / np.sqrt(n)
    U, s, _ = np.linalg.svd(Y, full_matrices=False)
    G = U[:, :n_components] * np.sqrt(n)
    # $$W_m = A_m X_m^\top G / n$$
    weights = [A @ X.T @ G / n for X, A in zip(Xs, inverses, strict=True)]
    if return_consensus:
        return weights, s[:n_components] ** 2, G
    return weights, s[:n_components] ** 2


def ridge_weights(X: np.ndarray, target: np.ndarray, reg: float) -> np.ndarray:
    """W = A X^T T / n, A = ((1 - reg) C + reg tr(C)/d I)^(-1), C = X^T X / n: the shrunk regression of T on X.

    MAXVAR's view weights are this regression of the consensus G on each view; a view added after the fit gets
    the same regression onto the frozen consensus.
    """
    n = X.shape[0]
    C = _ridge(X.T @ X / n, reg)
    return np.linalg.solve(C, X.T @ target / n)
