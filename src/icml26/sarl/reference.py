"""Float64 references written from the definitions, for the oracle tests of the TorchRL training path.

``ppo_loss_reference`` is the clipped PPO objective with a value loss and an entropy bonus, masked over live
aircraft slots (the loss this package's MAPPO loop computed by hand before it moved to TorchRL's ``MAPPOLoss``):

    L = mean_live[ -min(rho A, clip(rho, 1 - eps, 1 + eps) A) ] + c_v mean_live[(V - R)^2] - c_H mean_live[H(pi)]

with rho = exp(log pi(a|s) - log pi_old(a|s)) under the shield's action mask (masked logits filled with -1e9).

Example:
    >>> import torch
    >>> logits, value = torch.zeros(1, 2, 8, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
    >>> ones = torch.ones(1, 2, 8, dtype=torch.bool)
    >>> act = torch.zeros(1, 2, dtype=torch.long)
    >>> old = torch.log(torch.full((1, 2), 1 / 8, dtype=torch.float64))
    >>> adv = ret = torch.zeros(1, 2, dtype=torch.float64)
    >>> live = torch.ones(1, 2, dtype=torch.bool)
    >>> round(float(ppo_loss_reference(logits, value, ones, act, old, adv, ret, live, 0.2, 0.5, 0.01)), 6)
    -0.020794

Reference: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347, eq. 7 and 9.
"""

from __future__ import annotations

import torch


def ppo_loss_reference(
    logits: torch.Tensor,
    value: torch.Tensor,
    amask: torch.Tensor,
    act: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    ret: torch.Tensor,
    live: torch.Tensor,
    clip: float,
    value_coef: float,
    entropy: float,
) -> torch.Tensor:
    """The masked clipped PPO loss (module docstring); every argument (M, N[, A]), computed in float64."""
    logits, value, old_logp, adv, ret = (t.double() for t in (logits, value, old_logp, adv, ret))
    masked = logits.masked_fill(~amask, -1e9)
    logp_all = masked - masked.logsumexp(-1, keepdim=True)
    logp = logp_all.gather(-1, act[..., None])[..., 0]
    p = logp_all.exp()
    ent = -(p * torch.where(p > 0, logp_all, torch.zeros_like(logp_all))).sum(-1)
    # rho = pi / pi_old;  L_clip = -min(rho A, clip(rho, 1 - eps, 1 + eps) A)   (PPO eq. 7)
    ratio = torch.exp(logp - old_logp)
    pg = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    m = live.double()
    n = m.sum().clamp(min=1)
    return (
        (pg * m).sum() / n + value_coef * (((value - ret) ** 2) * m).sum() / n - entropy * (ent * m).sum() / n
    )
