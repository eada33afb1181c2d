"""MoDA: the modulation adapter as an ``nn.Module`` (instruction-guided, channel-wise sigmoid gating).

$$\\tilde V = V \\odot \\sigma\\big(W\\,F(T, V)\\big)$$

``V`` (B, N, E): aligned visual tokens (the LLaVA projector's output); ``T`` (B, M, E): the language model's input
embeddings of the instruction (prompt tokens only); ``F``: a stack of post-LN Transformer *decoder* layers with
the visual tokens as target and the instruction as memory (self-attention over V, cross-attention V -> T, GELU
feed-forward, dropout 0.1); ``W`` (E x E): a linear map **without bias**, Xavier-uniform initialised, so the
gate starts near 0.5 (``gate_bias_init`` adds a bias set to that constant, e.g. +2 -> gate ~ 0.88). The gate is
per token *and* per channel, in (0, 1). As in the official code (``llava-more/llava/model/multimodal_moda/
builder.py``: ``nn.TransformerDecoder`` + ``mask_head``), plus a key-padding mask over the instruction, which
the official code lacks (it right-pads with a pad id and attends to the padding).

Reference: Barrios, Villa, León Alcázar, Jin, Ghanem, "MoDA: Modulation Adapter for Fine-Grained Visual
Understanding in Instructional MLLMs", ICML 2026, arXiv:2506.01850.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


def _decoder(embed_dim: int, num_heads: int, num_layers: int, ff_dim: int, dropout: float) -> nn.TransformerDecoder:
    """``F``: ``num_layers`` post-LN ``nn.TransformerDecoderLayer`` (GELU, batch first), as the official code."""
    layer = nn.TransformerDecoderLayer(d_model=embed_dim, nhead=num_heads, dim_feedforward=ff_dim, dropout=dropout,
                                       activation="gelu", batch_first=True)
    return nn.TransformerDecoder(layer, num_layers=num_layers)


def check_inputs(visual: Tensor, text: Tensor, text_padding_mask: Tensor | None, embed_dim: int) -> Tensor | None:
    """Validate the adapter's inputs; return the padding mask as bool (``None`` when absent).

    Raises:
        TypeError: not tensors, not floating point, or a mask that is not boolean/0-1.
        ValueError: wrong ranks, widths that differ from ``embed_dim`` (visual or text), different batch sizes,
            an empty instruction (M = 0), a row whose instruction is all padding, or NaN/Inf values.
    """
    for name, x in (("visual", visual), ("text", text)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {x.dtype}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape (batch, tokens, {embed_dim}), got {tuple(x.shape)}")
    if visual.shape[-1] != embed_dim:
        raise ValueError(f"visual has width {visual.shape[-1]} but the adapter was built for embed_dim={embed_dim}")
    if text.shape[-1] != visual.shape[-1]:
        raise ValueError(f"text has width {text.shape[-1]} but visual has width {visual.shape[-1]}: MoDA needs the "
                         "instruction in the language model's embedding space, the space the projector maps into")
    if text.shape[0] != visual.shape[0]:
        raise ValueError(f"text has batch size {text.shape[0]} but visual has {visual.shape[0]}")
    if text.shape[1] == 0:
        raise ValueError("text is empty (no instruction tokens): MoDA conditions the gate on the instruction")
    if visual.shape[1] == 0:
        raise ValueError("visual has no tokens")
    mask = None
    if text_padding_mask is not None:
        if not isinstance(text_padding_mask, Tensor):
            raise TypeError(f"text_padding_mask must be a torch.Tensor, got {type(text_padding_mask).__name__}")
        if text_padding_mask.shape != text.shape[:2]:
            raise ValueError(f"text_padding_mask must have shape {tuple(text.shape[:2])} (True = padding), got "
                             f"{tuple(text_padding_mask.shape)}")
        if text_padding_mask.dtype != torch.bool:
            if text_padding_mask.is_floating_point() or not bool(((text_padding_mask == 0) |
                                                                   (text_padding_mask == 1)).all()):
                raise TypeError("text_padding_mask must be boolean (True = padding)")
            text_padding_mask = text_padding_mask.bool()
        empty = text_padding_mask.all(dim=1)
        if bool(empty.any()):
            rows = empty.nonzero().flatten().tolist()
            raise ValueError(f"text_padding_mask is all padding in rows {rows[:10]}: those rows have an empty "
                             "instruction")
        mask = text_padding_mask
    if not bool(torch.isfinite(visual).all()):
        raise ValueError("visual holds NaN or Inf")
    if not bool(torch.isfinite(text).all()):
        raise ValueError("text holds NaN or Inf")
    return mask


class MoDAAdapter(nn.Module):
    """Instruction-guided channel-wise modulation of aligned visual tokens: ``V * sigmoid(W F(T, V))``.

    $$\\tilde V = V \\odot \\sigma(W\\,F(T, V)),\\quad F = \\text{TransformerDecoder}(\\text{tgt}=V,\\ \\text{memory}=T)$$

    Args:
        embed_dim: E, the width of the visual tokens and of the instruction embeddings (the LLM's hidden size).
        num_heads: attention heads of ``F`` (official: 16 at E = 4096).
        num_layers: decoder layers of ``F`` (official LLaVA-MoRE: 2).
        ff_dim: feed-forward width of ``F`` (official: 1024 at E = 4096).
        dropout: dropout inside ``F`` (official: 0.1).
        gate_bias_init: ``None`` (official): ``W`` has no bias and the gate starts near 0.5. A float adds a bias
            initialised to it (``+2`` -> gate ~ 0.88 at the start), an ablation option.
        sparsity_lambda: weight of the auxiliary ``mean|mask|`` loss (``aux_loss``). Default 0: the paper's
            ablation shows it hurts MMVP, and the LLaVA-MoRE recipe leaves it off.

    Shapes: ``forward(visual (B, N, E), text (B, M, E), text_padding_mask (B, M) bool, True = padding)``
    returns the modulated visual tokens (B, N, E); ``last_mask`` keeps the gate (B, N, E) of the last call.

    Example:
        >>> import torch
        >>> moda = MoDAAdapter(embed_dim=32, num_heads=4, num_layers=2, ff_dim=16).eval()
        >>> v, t = torch.randn(2, 9, 32), torch.randn(2, 5, 32)
        >>> pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
        >>> out = moda(v, t, pad)
        >>> out.shape, bool(((out / v) > 0).all() and ((out / v) < 1).all())
        (torch.Size([2, 9, 32]), True)

    Reference: Barrios et al., ICML 2026 (arXiv:2506.01850), Sec. 3; official ``MoDAAdapter``.
    """

    def __init__(self, embed_dim: int, num_heads: int = 16, num_layers: int = 2, ff_dim: int = 1024,
                 dropout: float = 0.1, gate_bias_init: float | None = None, sparsity_lambda: float = 0.0):
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_layers", num_layers),
                            ("ff_dim", ff_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if gate_bias_init is not None and not math.isfinite(float(gate_bias_init)):
            raise ValueError(f"gate_bias_init must be finite or None, got {gate_bias_init}")
        if not (sparsity_lambda >= 0.0 and math.isfinite(sparsity_lambda)):
            raise ValueError(f"sparsity_lambda must be a finite number >= 0, got {sparsity_lambda}")
        self.embed_dim, self.num_heads, self.num_layers = embed_dim, num_heads, num_layers
        self.ff_dim, self.dropout, self.sparsity_lambda = ff_dim, dropout, float(sparsity_lambda)
        self.gate_bias_init = None if gate_bias_init is None else float(gate_bias_init)
        self.decoder = _decoder(embed_dim, num_heads, num_layers, ff_dim, dropout)
        self.mask_head = nn.Linear(embed_dim, embed_dim, bias=gate_bias_init is not None)
        nn.init.xavier_uniform_(self.mask_head.weight)
        if self.mask_head.bias is not None:
            nn.init.constant_(self.mask_head.bias, float(gate_bias_init))
        self.last_mask: Tensor | None = None

    def config_dict(self) -> dict[str, Any]:
        """The constructor arguments (stored in a model config by ``attach_moda``)."""
        return {"embed_dim": self.embed_dim, "num_heads": self.num_heads, "num_layers": self.num_layers,
                "ff_dim": self.ff_dim, "dropout": self.dropout, "gate_bias_init": self.gate_bias_init,
                "sparsity_lambda": self.sparsity_lambda}

    def gate(self, visual: Tensor, text: Tensor, text_padding_mask: Tensor | None = None) -> Tensor:
        """The modulation mask ``sigmoid(W F(T, V))`` (B, N, E), without applying it."""
        mask = check_inputs(visual, text, text_padding_mask, self.embed_dim)
        # $$F(T, V)$$: visual tokens attend to themselves, then to the instruction (memory)
        decoded = self.decoder(tgt=visual, memory=text, memory_key_padding_mask=mask)
        # $$\sigma(W F(T, V))$$
        return torch.sigmoid(self.mask_head(decoded))

    def forward(self, visual: Tensor, text: Tensor, text_padding_mask: Tensor | None = None) -> Tensor:
        gate = self.gate(visual, text, text_padding_mask)
        self.last_mask = gate
        # $$\tilde V = V \odot \sigma(W F(T, V))$$
        return visual * gate

    def aux_loss(self) -> Tensor:
        """``sparsity_lambda * mean|mask|`` of the last call (a zero tensor when off or before any call)."""
        if self.sparsity_lambda == 0.0 or self.last_mask is None:
            return torch.zeros((), device=self.mask_head.weight.device)
        return self.sparsity_lambda * self.last_mask.abs().mean()

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_layers={self.num_layers}, "
                f"ff_dim={self.ff_dim}, gate_bias_init={self.gate_bias_init}, sparsity_lambda={self.sparsity_lambda}")
