"""SPARD's math without a training framework: the SPAG safety step and the relevance-diversity DPP.

**SPAG safety step** (after each utility update, on the accumulated safety loss L_s and its gradient g):

- trigger only if ``L_s > tau + delta`` (the safety loss left its tolerance band);
- ``mode="official"`` (the released code): every parameter tensor's gradient is rescaled,
  ``g_p <- g_p * min((L_s - tau) / (||g_p|| + 1e-8), alpha_max)``, and the *same* optimizer (AdamW in the
  paper) takes a step with it;
- ``mode="polyak"`` (the README's "explicit safety projection in closed form"): one step onto the linearised
  constraint set {theta : L_s(theta) <= tau}, ``theta <- theta - min((L_s - tau) / ||g||^2, eta_safe) * g``
  with the global gradient norm and no optimizer.

**Relevance-diversity DPP** (the released ``DPPSelector``): with unit-normalised embeddings s_i of the safety
candidates and r_j of the fine-tuning (reference) data, ``q_i = (max_j cos(s_i, r_j))^beta`` and
``L_ij = q_i cos(s_i, s_j) q_j + 1e-6 [i = j]``; the greedy MAP picks ``argmax_i L_ii`` first, then each time the
candidate with the largest marginal gain ``L_ii - ||C^{-1} L_{S,i}||^2`` (gains clamped at 1e-6), updating the
Cholesky factor C of L_S by one row.

Example:
    >>> import numpy as np
    >>> L = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 0.5]])
    >>> greedy_dpp_map(L, 2).tolist()          # the diverse pair, not the two similar items
    [0, 2]
    >>> [round(a, 6) for a in official_scales([2.0, 0.1], safety_loss=0.5, tau=0.2, alpha_max=1.0)]
    [0.15, 1.0]
    >>> polyak_step_size(4.0, safety_loss=0.5, tau=0.2, eta_max=1.0)
    0.075

Reference: S. Chen, W. Jiang, Y. Gong, S. Luo, C. Zhuo, Z. Li, J. Kwok, Y. Zhang, "SPARD: Defending Harmful
Fine-Tuning Attack via Safety Projection with Relevance-Diversity Data Selection", ICML 2026; official code
github.com/shuhao02/SPARD (``utils/SPAGOptimizerTrainer.py``, ``utils/data_selector.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

MODES = ("official", "polyak")
#: the official kernel regulariser and the floor on greedy gains
DPP_EPS = 1e-6
#: the official guard in the per-tensor scale
SCALE_EPS = 1e-8


# ------------------------------------------------------------------------------------------- SPAG safety step
def check_spag_args(tau: float, tolerance: float, eta_safe: float, mode: str) -> None:
    """Raise ``ValueError`` naming the argument unless the SPAG settings are usable."""
    for name, value in (("tau", tau), ("tolerance", tolerance), ("eta_safe", eta_safe)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if tau <= 0:
        raise ValueError(f"tau (the safety-loss threshold) must be > 0, got {tau}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if eta_safe <= 0:
        raise ValueError(f"eta_safe (alpha_max, the trust-region cap) must be > 0, got {eta_safe}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def safety_triggered(safety_loss: float, tau: float, tolerance: float) -> bool:
    """True when the safety step fires: ``L_s > tau + delta``.

    Raises:
        ValueError: the safety loss is NaN or infinite.
    """
    if not math.isfinite(safety_loss):
        raise ValueError(f"safety loss is {safety_loss}; the safety step cannot be decided")
    # $$\text{trigger} \iff \mathcal{L}_s(\theta) > \tau + \delta$$
    return safety_loss > tau + tolerance


def official_scales(grad_norms: Sequence[float], safety_loss: float, tau: float, alpha_max: float) -> list[float]:
    """Per-tensor gradient scales of the released code: ``min((L_s - tau) / (||g_p|| + 1e-8), alpha_max)``."""
    # $$\alpha_p = \min\big((\mathcal{L}_s - \tau) / (\lVert g_p \rVert + 10^{-8}),\ \alpha_{\max}\big)$$
    return [min((safety_loss - tau) / (float(n) + SCALE_EPS), alpha_max) for n in grad_norms]


def polyak_step_size(grad_sq_norm: float, safety_loss: float, tau: float, eta_max: float) -> float:
    """Step size of the projection onto the linearised constraint: ``min((L_s - tau) / ||g||^2, eta_max)``.

    A zero gradient gives a zero step (nothing to project along).
    """
    if grad_sq_norm <= 0.0:
        return 0.0
    # $$\eta = \min\big((\mathcal{L}_s - \tau) / \lVert \nabla \mathcal{L}_s \rVert^2,\ \eta_{\text{safe}}\big)$$
    return min((safety_loss - tau) / grad_sq_norm, eta_max)


def spag_safety_update(params: Iterable[Any], safety_loss: float, *, tau: float, tolerance: float,
                       eta_safe: float, mode: str = "official", optimizer: Any = None) -> dict[str, float]:
    """Apply SPAG's safety step to ``params`` whose ``.grad`` holds the safety-loss gradient.

    Args:
        params: torch parameters (those with ``grad is None`` are skipped).
        safety_loss: L_s, the safety loss the gradients belong to.
        tau, tolerance: the threshold and its tolerance band (fires when ``L_s > tau + tolerance``).
        eta_safe: ``alpha_max`` (official) or the Polyak step cap (polyak).
        mode: ``"official"`` (rescale each tensor, then ``optimizer.step()``) or ``"polyak"`` (in-place
            projection step, no optimizer).
        optimizer: the utility optimizer (official mode only; its state is shared, as in the released code).

    Returns:
        ``{"triggered": 0/1, "step": the Polyak step size or the mean per-tensor scale, "grad_norm": ||g||}``.

    Raises:
        ValueError: bad settings, a NaN/infinite loss or gradient, or official mode without an optimizer.
    """
    import torch

    check_spag_args(tau, tolerance, eta_safe, mode)
    if mode == "official" and optimizer is None:
        raise ValueError("mode='official' needs the optimizer that takes the safety step")
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        raise ValueError("no parameter has a gradient: run backward on the safety loss first")
    norms = [float(p.grad.detach().norm()) for p in with_grad]
    if not all(math.isfinite(n) for n in norms):
        raise ValueError("the safety gradient has NaN or infinite entries")
    grad_norm = math.sqrt(sum(n * n for n in norms))
    if not safety_triggered(safety_loss, tau, tolerance):
        return {"triggered": 0.0, "step": 0.0, "grad_norm": grad_norm}
    if mode == "official":
        scales = official_scales(norms, safety_loss, tau, eta_safe)
        with torch.no_grad():
            for p, a in zip(with_grad, scales, strict=True):
                p.grad.mul_(a)
        optimizer.step()
        return {"triggered": 1.0, "step": float(np.mean(scales)), "grad_norm": grad_norm}
    eta = polyak_step_size(grad_norm**2, safety_loss, tau, eta_safe)
    with torch.no_grad():
        for p in with_grad:
            # $$\theta \leftarrow \theta - \eta\, \nabla \mathcal{L}_s(\theta)$$
            p.add_(p.grad, alpha=-eta)
    return {"triggered": 1.0, "step": eta, "grad_norm": grad_norm}


# ------------------------------------------------------------------------------------ relevance-diversity DPP
def _as_matrix(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array (n, dim), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} has NaN or infinite entries")
    return arr


def _unit_rows(x: np.ndarray, name: str) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError(f"{name} has an all-zero row (its cosine similarity is undefined)")
    return x / norms


def relevance_diversity_kernel(candidates: Any, reference: Any, beta: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """The relevance-weighted similarity kernel ``L`` and the relevances ``q`` of the candidates.

    Args:
        candidates: ``(n, d)`` embeddings of the safety candidates.
        reference: ``(m, d)`` embeddings of the fine-tuning data (the official code includes the harmful samples).
        beta: the relevance power (paper default 4).

    Returns:
        ``(L, q)``: ``L`` of shape ``(n, n)``, ``q`` of shape ``(n,)``.
    """
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    s = _unit_rows(_as_matrix(candidates, "candidates"), "candidates")
    r = _unit_rows(_as_matrix(reference, "reference"), "reference")
    if s.shape[1] != r.shape[1]:
        raise ValueError(f"candidates have dimension {s.shape[1]} but reference has {r.shape[1]}")
    # $$q_i = \big(\max_j \cos(s_i, r_j)\big)^{\beta}$$
    q = np.max(s @ r.T, axis=1) ** beta
    # $$L_{ij} = q_i \cos(s_i, s_j)\, q_j + \epsilon\,[i = j]$$
    L = q[:, None] * (s @ s.T) * q[None, :] + DPP_EPS * np.eye(len(s))
    return L, q


def greedy_dpp_map(L: Any, k: int) -> np.ndarray:
    """Greedy MAP inference for a DPP with kernel ``L``: ``k`` indices in the order they were picked.

    First the largest ``L_ii``; then, with C the Cholesky factor of ``L_S``, the candidate maximising
    ``L_ii - ||C^{-1} L_{S,i}||^2`` (gains clamped at 1e-6, as in the released code), C grown by one row.
    O(n k^2) time.

    Raises:
        ValueError: ``L`` is not a finite square matrix, or ``k`` is not in ``[0, n]``.
    """
    L = _as_matrix(L, "L")
    n = L.shape[0]
    if L.shape != (n, n):
        raise ValueError(f"L must be square, got shape {L.shape}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 0 <= k <= n:
        raise ValueError(f"k (the selection budget) must be in [0, {n}] for a pool of {n} items, got {k}")
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    diag = np.diag(L).copy()
    picked = [int(np.argmax(diag))]
    remaining = np.ones(n, dtype=bool)
    remaining[picked[0]] = False
    # rows of C^{-1} L_{S,:}: W[t, i] = (C^{-1} L_{S,i})_t, grown one row per pick
    W = np.zeros((k, n))
    C_diag = [math.sqrt(diag[picked[0]])]
    W[0] = L[picked[0]] / C_diag[0]
    for t in range(1, k):
        # $$\text{gain}_i = L_{ii} - \lVert C^{-1} L_{S,i} \rVert^2$$
        gains = diag - np.sum(W[:t] ** 2, axis=0)
        gains = np.maximum(gains, DPP_EPS)
        gains[~remaining] = -np.inf
        best = int(np.argmax(gains))
        picked.append(best)
        remaining[best] = False
        # new Cholesky row: [w_best, sqrt(gain_best)]; the next row of C^{-1} L_{S,:}
        c = math.sqrt(gains[best])
        W[t] = (L[best] - W[:t, best] @ W[:t]) / c
        C_diag.append(c)
    return np.asarray(picked, dtype=np.int64)


def dpp_log_det(L: Any, subset: Sequence[int]) -> float:
    """``log det L_S`` of a subset (``-inf`` when singular or not positive definite)."""
    L = _as_matrix(L, "L")
    idx = np.asarray(list(subset), dtype=np.int64)
    if len(idx) == 0:
        return 0.0
    sign, logdet = np.linalg.slogdet(L[np.ix_(idx, idx)])
    return float(logdet) if sign > 0 else -math.inf
