"""Policies: PERG graph attention + SC-MoE head (SARL), PERG + MLP head, and MLP over the k nearest intruders.

**PERG** (Physics-Encoded Relational Graph attention; reconstruction): dense masked multi-head attention over the
neighbours within the observation radius, keys and values from ``[h_j || e_ij]``, and logits

    logit_ij = q_i . k_ij / sqrt(d_k) + MLP_b(e_ij) + b_phys(e_ij),
    b_phys = -2 min(dCPA/S, 4)/4 + exp(-tCPA/60) - range/R_obs,

so closer, sooner, more conflicting intruders get more attention a priori. Permutation-invariant and size-agnostic.
**SC-MoE** (Sparse Cognitive Mixture-of-Experts; reconstruction): E experts (MLPs), a router on ``[h_i || c_i]``
with c_i the situation context (predicted conflicts, urgency), top-k gates renormalised, router noise in training,
the Switch load-balancing loss ``E sum_e f_e P_e``. The critic (MAPPO, centralised): ``V_i = MLP([h_i || mean_j
h_j])``.

Example:
    >>> import torch
    >>> pol = SARLPolicy()
    >>> x, e = torch.zeros(2, 5, 8), torch.zeros(2, 5, 5, 11)
    >>> mask, alive, ctx = torch.ones(2, 5, 5, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool), torch.zeros(2, 5, 2)
    >>> logits, value, aux = pol(x, e, mask, alive, ctx)
    >>> logits.shape, value.shape
    (torch.Size([2, 5, 8]), torch.Size([2, 5]))
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .env import N_ACTIONS


def physics_prior(e: torch.Tensor) -> torch.Tensor:
    """b_phys from the edge features (indices: 4 range/R_obs, 5 tCPA/H, 6 dCPA/S clipped at 4, 9 exp(-tCPA/60))."""
    return -2.0 * torch.clamp(e[..., 6], max=4.0) / 4.0 + e[..., 9] - e[..., 4]


class PERGLayer(nn.Module):
    def __init__(self, d: int, d_edge: int, heads: int, physics: bool):
        super().__init__()
        if d % heads:
            raise ValueError(f"d={d} must be divisible by heads={heads}")
        self.h, self.dk, self.physics = heads, d // heads, physics
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d + d_edge, d)
        self.v = nn.Linear(d + d_edge, d)
        self.bias = nn.Sequential(nn.Linear(d_edge, 32), nn.ReLU(), nn.Linear(32, heads))
        self.o = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(
        self, h: torch.Tensor, e: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, n, d = h.shape
        hj = h[:, None].expand(m, n, n, d)
        kv_in = torch.cat([hj, e], -1)
        q = self.q(h).view(m, n, 1, self.h, self.dk)
        k = self.k(kv_in).view(m, n, n, self.h, self.dk)
        v = self.v(kv_in).view(m, n, n, self.h, self.dk)
        logits = (q * k).sum(-1) / math.sqrt(self.dk) + self.bias(e)  # (M, i, j, H)
        if self.physics:
            logits = logits + physics_prior(e)[..., None]
        logits = logits.masked_fill(~mask[..., None], -1e9)
        att = torch.softmax(logits, dim=2) * mask[..., None]  # empty neighbourhood: zero message
        msg = (att[..., None] * v).sum(2).reshape(m, n, d)
        h = self.ln1(h + self.o(msg))
        return self.ln2(h + self.ffn(h)), att


class PERGEncoder(nn.Module):
    """Node embedding then ``layers`` PERG layers; ``physics_prior=False`` drops b_phys (an ablation)."""

    def __init__(
        self,
        d_node: int = 8,
        d_edge: int = 11,
        d: int = 64,
        heads: int = 4,
        layers: int = 1,
        physics_prior: bool = True,
    ):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(d_node, d), nn.ReLU(), nn.Linear(d, d))
        self.layers = nn.ModuleList(PERGLayer(d, d_edge, heads, physics_prior) for _ in range(layers))

    def forward(
        self, x: torch.Tensor, e: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(x)
        att = torch.zeros(*mask.shape, 1)
        for layer in self.layers:
            h, att = layer(h, e, mask)
        return h, att


class SCMoEHead(nn.Module):
    """Top-k mixture of expert MLPs routed on ``[z || ctx]`` (see the module docstring)."""

    def __init__(
        self,
        d: int = 64,
        n_actions: int = N_ACTIONS,
        n_experts: int = 4,
        top_k: int = 1,
        d_ctx: int = 2,
        router_noise: float = 0.1,
    ):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, {n_experts}], got {top_k}")
        self.E, self.k, self.noise = n_experts, top_k, router_noise
        self.router = nn.Linear(d + d_ctx, n_experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, n_actions)) for _ in range(n_experts)
        )

    def forward(
        self, z: torch.Tensor, ctx: torch.Tensor, alive: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = self.router(torch.cat([z, ctx], -1))
        if self.training and self.noise > 0:
            r = r + self.noise * torch.randn_like(r)
        probs = torch.softmax(r, -1)
        top, idx = probs.topk(self.k, -1)
        gates = torch.zeros_like(probs).scatter(-1, idx, top / top.sum(-1, keepdim=True))
        out = torch.stack([ex(z) for ex in self.experts], -2)  # (..., E, A)
        logits = (gates[..., None] * out).sum(-2)
        # Switch load balancing: E * sum_e f_e * P_e over live agents
        live = alive.reshape(-1).float()
        f = (
            torch.nn.functional.one_hot(idx[..., 0], self.E).float().reshape(-1, self.E) * live[:, None]
        ).sum(0)
        p = (probs.reshape(-1, self.E) * live[:, None]).sum(0)
        n = live.sum().clamp(min=1.0)
        aux = self.E * ((f / n) * (p / n)).sum()
        return logits, aux, probs


class SARLPolicy(nn.Module):
    """PERG encoder, SC-MoE (or MLP, ``moe=False``) actor head and a centralised critic."""

    def __init__(
        self,
        d: int = 64,
        heads: int = 4,
        layers: int = 1,
        moe: bool = True,
        n_experts: int = 4,
        physics_prior: bool = True,
    ):
        super().__init__()
        self.encoder = PERGEncoder(d=d, heads=heads, layers=layers, physics_prior=physics_prior)
        self.moe = moe
        self.head = (
            SCMoEHead(d, n_experts=n_experts)
            if moe
            else nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, N_ACTIONS))
        )
        self.critic = nn.Sequential(nn.Linear(2 * d, d), nn.ReLU(), nn.Linear(d, 1))

    def forward(
        self, x: torch.Tensor, e: torch.Tensor, mask: torch.Tensor, alive: torch.Tensor, ctx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, _ = self.encoder(x, e, mask)
        if self.moe:
            logits, aux, _ = self.head(h, ctx, alive)
        else:
            logits, aux = self.head(h), torch.zeros(())
        a = alive.float()[..., None]
        pooled = (h * a).sum(1, keepdim=True) / a.sum(1, keepdim=True).clamp(min=1.0)
        value = self.critic(torch.cat([h, pooled.expand_as(h)], -1))[..., 0]
        return logits, value, aux


class KNNMLPPolicy(nn.Module):
    """MLP over own features and the k nearest intruders' edge features (SectorCR-style fixed input, k = 4)."""

    def __init__(self, k: int = 4, width: int = 128):
        super().__init__()
        self.k = k
        d_in = 8 + 11 * k
        self.actor = nn.Sequential(
            nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, N_ACTIONS)
        )
        self.critic = nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, knn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.actor(knn), self.critic(knn)[..., 0], torch.zeros(())
