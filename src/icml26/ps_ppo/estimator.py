"""The prefix-sampling estimator: cutoff distributions and the unbiased truncated policy loss (torch).

For trajectory i of length L_i with a critic-free advantage A_i, draw one cutoff c_i ~ q(. | x_i, L_i) with
survival S_i(t) = P(c_i >= t) > 0 for every t <= L_i, run the update only on the prefix y_<=c_i, and weight
token t by 1 / S_i(t):

    J = 1 / (B * L_max) * sum_i sum_{t <= c_i} min(rho_t A_i, clip(rho_t, 1 - eps, 1 + eps) A_i) / S_i(t)

Since E_c[1{t <= c} / S(t)] = 1, E_c[J] is the full-trajectory Dr.GRPO objective: the truncated gradient is
unbiased. The normaliser must be a constant (B * L_max); dividing by the number of kept tokens (DAPO/BNPO style)
makes it depend on the draw and breaks unbiasedness (``normalizer="tokens"`` exists to show that).

Example:
    >>> import torch
    >>> lengths = torch.tensor([4, 2])
    >>> UniformCutoff().survival(lengths, 4)
    tensor([[1.0000, 0.7500, 0.5000, 0.2500],
            [1.0000, 0.5000, 0.0000, 0.0000]])

Reference: the estimator is reconstructed from the abstract of "Prefix-Sampling Proximal Policy Optimization for
Compute-Efficient Critic-Free RLHF" (Hwang & Kim, ICML 2026, arXiv:2606.29758); no official code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any, Protocol

import torch
from torch import Tensor


def _check_lengths(lengths: Tensor) -> Tensor:
    if not isinstance(lengths, Tensor) or lengths.ndim != 1:
        raise TypeError("lengths must be a 1-D LongTensor of completion lengths")
    if (lengths < 1).any():
        raise ValueError(
            f"empty completions (length 0) at rows {torch.nonzero(lengths < 1).ravel().tolist()}"
        )
    return lengths.long()


class CutoffDistribution(Protocol):
    """A cutoff law q(c | x, L) on {1..L}."""

    def sample(
        self, lengths: Tensor, generator: torch.Generator | None = None, keys: list[Hashable] | None = None
    ) -> Tensor:
        """One cutoff per row, in [1, L_i]."""

    def survival(self, lengths: Tensor, max_len: int, keys: list[Hashable] | None = None) -> Tensor:
        """(B, max_len): S_i(t) = P(c_i >= t) for t = 1..max_len (0 beyond L_i)."""


def _positions(lengths: Tensor, max_len: int) -> tuple[Tensor, Tensor]:
    t = torch.arange(1, max_len + 1, dtype=torch.float64)[None, :]
    return t, lengths.to(torch.float64)[:, None]


class UniformCutoff:
    """c ~ U{1..L}: S(t) = (L - t + 1) / L, weights at most L."""

    def sample(self, lengths: Tensor, generator: torch.Generator | None = None, keys: Any = None) -> Tensor:
        lengths = _check_lengths(lengths)
        u = torch.rand(lengths.shape, generator=generator, dtype=torch.float64)
        return (u * lengths).floor().long() + 1

    def survival(self, lengths: Tensor, max_len: int, keys: Any = None) -> Tensor:
        lengths = _check_lengths(lengths)
        t, L = _positions(lengths, max_len)
        return torch.clamp((L - t + 1) / L, min=0.0).float()


class GeometricCutoff:
    """c = min(Geometric(p), L) on {1, 2, ...}: S(t) = (1 - p)^(t - 1) for t <= L.

    The weight of the last token grows as (1 - p)^-(L - 1): keep p small relative to 1 / L, or mix with a
    uniform law (``MixtureCutoff``).
    """

    def __init__(self, p: float):
        if not (isinstance(p, (int, float)) and 0.0 < p < 1.0):
            raise ValueError(f"p must be a probability in (0, 1), got {p!r}")
        self.p = float(p)

    def sample(self, lengths: Tensor, generator: torch.Generator | None = None, keys: Any = None) -> Tensor:
        lengths = _check_lengths(lengths)
        u = torch.rand(lengths.shape, generator=generator, dtype=torch.float64).clamp(min=1e-300)
        c = torch.floor(torch.log(u) / math.log1p(-self.p)).long() + 1
        return torch.minimum(c, lengths)

    def survival(self, lengths: Tensor, max_len: int, keys: Any = None) -> Tensor:
        lengths = _check_lengths(lengths)
        t, L = _positions(lengths, max_len)
        return torch.where(t <= L, (1.0 - self.p) ** (t - 1), torch.zeros_like(t)).float()


class MixtureCutoff:
    """A mixture of cutoff laws: with probability w_k use law k; S = sum_k w_k S_k."""

    def __init__(self, components: list[CutoffDistribution], weights: list[float]):
        if len(components) != len(weights) or not components:
            raise ValueError("need one weight per component")
        if any(w < 0 for w in weights) or not math.isclose(sum(weights), 1.0, abs_tol=1e-9):
            raise ValueError(f"weights must be non-negative and sum to 1, got {weights}")
        self.components, self.weights = components, [float(w) for w in weights]

    def sample(self, lengths: Tensor, generator: torch.Generator | None = None, keys: Any = None) -> Tensor:
        lengths = _check_lengths(lengths)
        which = torch.multinomial(
            torch.tensor(self.weights, dtype=torch.float64),
            len(lengths),
            replacement=True,
            generator=generator,
        )
        draws = torch.stack([c.sample(lengths, generator, keys) for c in self.components])
        return draws[which, torch.arange(len(lengths))]

    def survival(self, lengths: Tensor, max_len: int, keys: Any = None) -> Tensor:
        return sum(
            w * c.survival(lengths, max_len, keys) for c, w in zip(self.components, self.weights, strict=True)
        )


class PromptConditionedCutoff:
    """q(c | x): a cutoff law per prompt key, from ``law_for(key)`` (default law for unknown keys)."""

    def __init__(self, law_for: Callable[[Hashable], CutoffDistribution]):
        self.law_for = law_for

    def _per_row(self, keys: list[Hashable] | None, n: int) -> list[CutoffDistribution]:
        if keys is None or len(keys) != n:
            raise ValueError("a prompt-conditioned cutoff needs one prompt key per row")
        return [self.law_for(k) for k in keys]

    def sample(
        self, lengths: Tensor, generator: torch.Generator | None = None, keys: list[Hashable] | None = None
    ) -> Tensor:
        lengths = _check_lengths(lengths)
        laws = self._per_row(keys, len(lengths))
        return torch.cat([law.sample(lengths[i : i + 1], generator) for i, law in enumerate(laws)])

    def survival(self, lengths: Tensor, max_len: int, keys: list[Hashable] | None = None) -> Tensor:
        lengths = _check_lengths(lengths)
        laws = self._per_row(keys, len(lengths))
        return torch.cat([law.survival(lengths[i : i + 1], max_len) for i, law in enumerate(laws)])


class AdaptiveCutoff(PromptConditionedCutoff):
    """Learns, per prompt, how early its outcome is decided, and cuts accordingly.

    For each group of rollouts of a prompt, the decision point is the first token where a correct and an incorrect
    rollout differ (averaged over such pairs, then over groups: a running mean ``d_x``). The cutoff law is
    ``mix * Uniform{1..L} + (1 - mix) * Geometric(1 / d_x)``: short prefixes for prompts decided early, while the
    uniform part keeps every weight at most L / mix.
    """

    def __init__(self, mix: float = 0.5, default_decision: float = 8.0):
        if not 0.0 < mix <= 1.0:
            raise ValueError(f"mix must be in (0, 1], got {mix}")
        self.mix, self.default_decision = mix, default_decision
        self.decision: dict[Hashable, tuple[float, int]] = {}
        super().__init__(self._law)

    def _law(self, key: Hashable) -> CutoffDistribution:
        d = self.decision.get(key, (self.default_decision, 0))[0]
        if self.mix == 1.0:
            return UniformCutoff()
        geometric = GeometricCutoff(min(0.999, 1.0 / max(d, 1.001)))
        return MixtureCutoff([UniformCutoff(), geometric], [self.mix, 1.0 - self.mix])

    def update(self, key: Hashable, completions: list[list[int]], rewards: list[float]) -> None:
        """Record a group of rollouts (token ids) of prompt ``key`` and their rewards."""
        good = [c for c, r in zip(completions, rewards, strict=True) if r > 0]
        bad = [c for c, r in zip(completions, rewards, strict=True) if r <= 0]
        points = []
        for a in good:
            for b in bad:
                first = next(
                    (i for i, (u, v) in enumerate(zip(a, b, strict=False)) if u != v), min(len(a), len(b))
                )
                points.append(first + 1)
        if not points:
            return
        mean, count = self.decision.get(key, (0.0, 0))
        value = sum(points) / len(points)
        self.decision[key] = ((mean * count + value) / (count + 1), count + 1)


def prefix_sampled_policy_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cutoffs: Tensor,
    survival: Tensor,
    *,
    clip_eps: float = 0.2,
    max_len: int | None = None,
    normalizer: str = "constant",
    importance_weighting: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """The prefix-sampled clipped surrogate (negated, to minimise) on per-token tensors.

    Args:
        logps, old_logps: (B, T) per-token log-probs of the completion under the current and the sampling policy
            (T may be the full width or a prefix slice; tokens after each row's cutoff are ignored).
        advantages: (B,) trajectory advantages (or (B, T)).
        mask: (B, T) completion mask.
        cutoffs: (B,) cutoffs c_i in [1, L_i].
        survival: (B, T) S_i(t) = P(c_i >= t); must be > 0 on every kept token.
        clip_eps: PPO clipping.
        max_len: L_max of the constant normaliser B * L_max (default: T).
        normalizer: ``"constant"`` (unbiased) or ``"tokens"`` (kept-token count: biased, for comparison).
        importance_weighting: apply 1 / S(t) (False: the biased plain truncation, an ablation).
    """
    B, T = logps.shape
    if old_logps.shape != logps.shape or mask.shape != logps.shape or survival.shape != logps.shape:
        raise ValueError("logps, old_logps, mask and survival must all have shape (B, T)")
    if cutoffs.shape != (B,):
        raise ValueError(f"cutoffs must have shape ({B},), got {tuple(cutoffs.shape)}")
    if normalizer not in ("constant", "tokens"):
        raise ValueError(f"normalizer must be 'constant' or 'tokens', got {normalizer!r}")
    positions = torch.arange(1, T + 1, device=logps.device)[None, :]
    kept = (positions <= cutoffs[:, None]).to(logps.dtype) * mask.to(logps.dtype)
    if ((survival <= 0) & (kept > 0)).any():
        raise ValueError(
            "the cutoff law puts zero mass on a reachable position (S(t) = 0 for a kept token): "
            "its importance weight would be infinite"
        )
    if (survival < 0).any() or (survival > 1 + 1e-6).any():
        raise ValueError("survival probabilities must lie in [0, 1]")
    adv = advantages[:, None] if advantages.ndim == 1 else advantages
    ratio = torch.exp(logps - old_logps)
    # $$\min\big(\rho_t A, \mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon) A\big)$$
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    # $$w_t = 1 / S(t) = 1 / P(c \ge t)$$   (E_c[1\{t \le c\} w_t] = 1: unbiased)
    weights = torch.where(kept > 0, 1.0 / survival.clamp(min=1e-30), torch.zeros_like(survival)).to(
        logps.dtype
    )
    if not importance_weighting:
        weights = kept
    total = (surrogate * weights).sum()
    denominator = float(B * (max_len or T)) if normalizer == "constant" else kept.sum().clamp(min=1.0)
    loss = -total / denominator
    stats = {
        "kept_tokens": float(kept.sum()),
        "max_weight": float(weights.max()) if weights.numel() else 0.0,
        "clip_fraction": float(
            ((ratio - 1).abs() > clip_eps).to(logps.dtype).mul(kept).sum() / kept.sum().clamp(min=1)
        ),
    }
    return loss, stats
