"""A literal float64 transcription of the RePO loss for one pair, with explicit loops (tests only).

Example:
    >>> round(repo_pair_loss([-0.7, -0.7], [-1.6, -0.9], [-0.7, -0.7], [-1.6, -0.9], None, None), 6)
    1.374573
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def repo_score(
    logps: Sequence[float], behavior: Sequence[float] | None, normalization: str = "mean"
) -> float:
    """S(y) = normalise_t (l_t - k_t), k_t = (1 / (T - t + 1)) sum_{s >= t} (b_s - l_s); b = 0 if None."""
    T = len(logps)
    b = [0.0] * T if behavior is None else list(behavior)
    r = []
    for t in range(T):
        k = sum(b[s] - logps[s] for s in range(t, T)) / (T - t)
        r.append(logps[t] - k)
    return sum(r) / T if normalization == "mean" else sum(r)


def repo_topk_score(
    logps: Sequence[float],
    policy_topk: Sequence[Sequence[float]],
    behavior_topk: Sequence[Sequence[float]],
    normalization: str = "mean",
    tail: bool = True,
) -> float:
    """RePO-top-k: S(y) = normalise_t (l_t - k_t), k_t = (1 / (T - t + 1)) sum_{s >= t} d_s,
    d_s = sum_j exp(m_sj) (m_sj - p_sj) over the behaviour policy's top-k tokens (m: log mu, p: log pi)
    + (official uniform tail) r_mu (log r_mu - log r_pi), r = max(1 - min(top-k mass, 1), 0) + 1e-9."""
    T = len(logps)
    d = []
    for s in range(T):
        top = sum(math.exp(m) * (m - p) for m, p in zip(behavior_topk[s], policy_topk[s], strict=True))
        if tail:
            r_mu = max(1.0 - min(sum(math.exp(m) for m in behavior_topk[s]), 1.0), 0.0) + 1e-9
            r_pi = max(1.0 - min(sum(math.exp(p) for p in policy_topk[s]), 1.0), 0.0) + 1e-9
            top += r_mu * (math.log(r_mu) - math.log(r_pi))
        d.append(top)
    r = [logps[t] - sum(d[t:]) / (T - t) for t in range(T)]
    return sum(r) / T if normalization == "mean" else sum(r)


def repo_topk_pair_loss(
    l_w: Sequence[float],
    l_l: Sequence[float],
    ref_w: Sequence[float],
    ref_l: Sequence[float],
    p_w: Sequence[Sequence[float]],
    p_l: Sequence[Sequence[float]],
    m_w: Sequence[Sequence[float]],
    m_l: Sequence[Sequence[float]],
    *,
    alpha: float = 0.1,
    cpl_lambda: float = 1.0,
    ref_coef: float = 1.0,
    sft_coef: float = 1.0,
    tail: bool = True,
) -> float:
    """RePO-top-k's loss for one pair (mean normalisation): as ``repo_pair_loss`` with ``repo_topk_score``."""
    R_w = alpha * (repo_topk_score(l_w, p_w, m_w, tail=tail) - ref_coef * sum(ref_w) / len(ref_w))
    R_l = alpha * (repo_topk_score(l_l, p_l, m_l, tail=tail) - ref_coef * sum(ref_l) / len(ref_l))
    z = R_w - cpl_lambda * R_l
    return math.log1p(math.exp(-z)) + sft_coef * (-sum(l_w) / len(l_w))


def repo_pair_loss(
    l_w: Sequence[float],
    l_l: Sequence[float],
    ref_w: Sequence[float],
    ref_l: Sequence[float],
    b_w: Sequence[float] | None,
    b_l: Sequence[float] | None,
    *,
    alpha: float = 0.1,
    cpl_lambda: float = 1.0,
    ref_coef: float = 1.0,
    sft_coef: float = 1.0,
    normalization: str = "mean",
) -> float:
    """-log sigmoid(R_w - lambda R_l) + c_sft * mean NLL(y_w), R = alpha (S - c_ref mean/sum of ref log-probs)."""

    def ref_score(v: Sequence[float]) -> float:
        return sum(v) / len(v) if normalization == "mean" else sum(v)

    R_w = alpha * (repo_score(l_w, b_w, normalization) - ref_coef * ref_score(ref_w))
    R_l = alpha * (repo_score(l_l, b_l, normalization) - ref_coef * ref_score(ref_l))
    z = R_w - cpl_lambda * R_l
    return math.log1p(math.exp(-z)) + sft_coef * (-sum(l_w) / len(l_w))


def pooled_nll(chosen: Sequence[Sequence[float]]) -> float:
    """The chosen-NLL term pooled over tokens (TRL's ``sft``): -(sum of every chosen token's log-prob) / (count)."""
    return -sum(v for row in chosen for v in row) / sum(len(row) for row in chosen)


def sequence_nll(chosen: Sequence[Sequence[float]]) -> float:
    """The chosen-NLL term per sequence: the mean over responses of each response's mean token NLL."""
    return sum(-sum(row) / len(row) for row in chosen) / len(chosen)
