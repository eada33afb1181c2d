"""The comparison arms, with MoDA's interface ``forward(visual, text, text_padding_mask) -> visual``.

- ``SelfAttentionGate``: the paper's "self-attention (no text)" ablation: MoDA's very decoder and mask head with
  the visual tokens as their own memory, ``V * sigmoid(W F(V, V))``: the same parameters, no instruction.
- ``ResidualMLP``: a text-free ``V + MLP(V)`` whose hidden width matches MoDA's parameter count.
- ``FiLM`` (Perez et al. 2018): ``V * (1 + dgamma(t)) + beta(t)`` from the masked mean of the instruction
  embeddings, through an MLP whose hidden width matches MoDA's parameter count: channel-wise, instruction-
  conditioned, but the same for every visual token.
- ``AdditiveCrossAttention`` ("Q-Former-style", token-level additive selection): ``V + W F(T, V)`` with MoDA's
  decoder: the same parameters and the same instruction, added instead of multiplied through a sigmoid.

The residual arms (MLP, FiLM, additive) start as the identity (last layer zero-initialised), the usual way to
insert a residual adapter into a trained model; MoDA and the self-attention gate keep the official init (gate
near 0.5).

Example:
    >>> import torch
    >>> from icml26.moda import MoDAAdapter
    >>> moda = MoDAAdapter(32, num_heads=4, num_layers=2, ff_dim=16)
    >>> arms = [SelfAttentionGate(32, num_heads=4, num_layers=2, ff_dim=16), AdditiveCrossAttention(32, 4, 2, 16),
    ...         ResidualMLP(32, target_params=n_params(moda)), FiLM(32, target_params=n_params(moda))]
    >>> [round(n_params(a) / n_params(moda), 2) for a in arms]
    [1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .module import MoDAAdapter, _decoder, check_inputs


def n_params(module: nn.Module) -> int:
    """Number of parameters of ``module``."""
    return sum(p.numel() for p in module.parameters())


class SelfAttentionGate(MoDAAdapter):
    """The paper's text-free ablation: ``V * sigmoid(W F(V, V))`` (MoDA's modules, memory = the visual tokens).

    The instruction is validated like MoDA's (so bad input fails the same way) and then ignored.
    """

    def gate(self, visual: Tensor, text: Tensor, text_padding_mask: Tensor | None = None) -> Tensor:
        check_inputs(visual, text, text_padding_mask, self.embed_dim)
        return torch.sigmoid(self.mask_head(self.decoder(tgt=visual, memory=visual)))


class AdditiveCrossAttention(nn.Module):
    """Token-level additive selection: ``V + W F(T, V)`` with MoDA's decoder ``F`` (``W`` zero-initialised)."""

    def __init__(self, embed_dim: int, num_heads: int = 16, num_layers: int = 2, ff_dim: int = 1024,
                 dropout: float = 0.1):
        super().__init__()
        self.embed_dim = embed_dim
        self.decoder = _decoder(embed_dim, num_heads, num_layers, ff_dim, dropout)
        self.mask_head = nn.Linear(embed_dim, embed_dim, bias=False)  # same shape as MoDA's W
        nn.init.zeros_(self.mask_head.weight)

    def forward(self, visual: Tensor, text: Tensor, text_padding_mask: Tensor | None = None) -> Tensor:
        mask = check_inputs(visual, text, text_padding_mask, self.embed_dim)
        # $$\tilde V = V + W\,F(T, V)$$
        return visual + self.mask_head(self.decoder(tgt=visual, memory=text, memory_key_padding_mask=mask))


def _hidden_for(target_params: int, per_hidden: int, fixed: int, name: str) -> int:
    hidden = round((target_params - fixed) / per_hidden)
    if hidden < 1:
        raise ValueError(f"target_params={target_params} is too small for a {name}")
    return hidden


class ResidualMLP(nn.Module):
    """Text-free ``V + W_2 GELU(W_1 V)``; ``hidden`` or ``target_params`` (match another module's size)."""

    def __init__(self, embed_dim: int, hidden: int | None = None, *, target_params: int | None = None):
        super().__init__()
        if (hidden is None) == (target_params is None):
            raise ValueError("give exactly one of hidden and target_params")
        if hidden is None:
            hidden = _hidden_for(int(target_params), 2 * embed_dim + 1, embed_dim, "ResidualMLP")
        self.embed_dim = embed_dim
        self.net = nn.Sequential(nn.Linear(embed_dim, hidden), nn.GELU(), nn.Linear(hidden, embed_dim))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, visual: Tensor, text: Tensor, text_padding_mask: Tensor | None = None) -> Tensor:
        check_inputs(visual, text, text_padding_mask, self.embed_dim)
        return visual + self.net(visual)


class FiLM(nn.Module):
    """``V * (1 + dgamma) + beta``, ``(dgamma, beta) = MLP(masked mean of T)``: one affine map per instruction.

    $$\\tilde V = (1 + \\Delta\\gamma(\\bar t)) \\odot V + \\beta(\\bar t),\\quad \\bar t = \\text{mean of the
    unpadded instruction embeddings}$$
    """

    def __init__(self, embed_dim: int, hidden: int | None = None, *, target_params: int | None = None):
        super().__init__()
        if (hidden is None) == (target_params is None):
            raise ValueError("give exactly one of hidden and target_params")
        if hidden is None:
            hidden = _hidden_for(int(target_params), 3 * embed_dim + 1, 2 * embed_dim, "FiLM")
        self.embed_dim = embed_dim
        self.net = nn.Sequential(nn.Linear(embed_dim, hidden), nn.GELU(), nn.Linear(hidden, 2 * embed_dim))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, visual: Tensor, text: Tensor, text_padding_mask: Tensor | None = None) -> Tensor:
        mask = check_inputs(visual, text, text_padding_mask, self.embed_dim)
        keep = torch.ones(text.shape[:2], dtype=text.dtype, device=text.device) if mask is None \
            else (~mask).to(text.dtype)
        pooled = (text * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True)
        dgamma, beta = self.net(pooled).unsqueeze(1).chunk(2, dim=-1)
        return visual * (1.0 + dgamma) + beta
