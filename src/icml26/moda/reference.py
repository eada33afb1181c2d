"""A slow, literal float64 NumPy transcription of MoDA's forward pass (tests only).

$$\\tilde V = V \\odot \\sigma(W\\,F(T, V))$$, ``F`` = ``num_layers`` post-LN decoder layers, each

    x <- LN_1(x + SelfAttn(x));  x <- LN_2(x + CrossAttn(x, T, pad));  x <- LN_3(x + W_2 GELU(W_1 x + b_1) + b_2)

with multi-head attention softmax(Q K^T / sqrt(d_head) + mask) V (padding keys get -inf), GELU the exact erf
form, LayerNorm with eps 1e-5, and no dropout (evaluation mode). Weights are read from the module's
``state_dict`` by name (PyTorch's ``nn.TransformerDecoderLayer`` layout), written out loop by loop here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _mha(q_in: np.ndarray, kv_in: np.ndarray, p: Mapping[str, np.ndarray], prefix: str, heads: int,
         key_pad: np.ndarray | None) -> np.ndarray:
    """One sample: q_in (N, E), kv_in (M, E), key_pad (M,) True = padding."""
    e = q_in.shape[-1]
    w, b = p[f"{prefix}.in_proj_weight"], p[f"{prefix}.in_proj_bias"]
    q = q_in @ w[:e].T + b[:e]
    k = kv_in @ w[e:2 * e].T + b[e:2 * e]
    v = kv_in @ w[2 * e:].T + b[2 * e:]
    dh = e // heads
    out = np.zeros_like(q)
    for h in range(heads):
        sl = slice(h * dh, (h + 1) * dh)
        scores = q[:, sl] @ k[:, sl].T / math.sqrt(dh)
        if key_pad is not None:
            scores = np.where(key_pad[None, :], -np.inf, scores)
        scores = scores - scores.max(-1, keepdims=True)
        att = np.exp(scores)
        att = att / att.sum(-1, keepdims=True)
        out[:, sl] = att @ v[:, sl]
    return out @ p[f"{prefix}.out_proj.weight"].T + p[f"{prefix}.out_proj.bias"]


def moda_forward(state: Mapping[str, object], visual: np.ndarray, text: np.ndarray,
                 text_padding_mask: np.ndarray | None, *, num_heads: int, num_layers: int,
                 memory: str = "text") -> tuple[np.ndarray, np.ndarray]:
    """``(modulated visual, gate)`` in float64 for batch inputs ``visual`` (B, N, E), ``text`` (B, M, E).

    ``memory="visual"`` gives the text-free self-attention gate (the paper's ablation).
    """
    p = {k: np.asarray(v.detach().double().numpy() if hasattr(v, "detach") else v, dtype=np.float64)
         for k, v in state.items()}
    visual = np.asarray(visual, dtype=np.float64)
    text = np.asarray(text, dtype=np.float64)
    outs, gates = [], []
    for i in range(visual.shape[0]):
        x = visual[i]
        mem = text[i] if memory == "text" else visual[i]
        pad = None if text_padding_mask is None or memory != "text" else np.asarray(text_padding_mask[i], bool)
        for layer in range(num_layers):
            pre = f"decoder.layers.{layer}"
            # $$x \leftarrow \mathrm{LN}_1(x + \mathrm{SelfAttn}(x))$$
            x = _ln(x + _mha(x, x, p, f"{pre}.self_attn", num_heads, None), p[f"{pre}.norm1.weight"],
                    p[f"{pre}.norm1.bias"])
            # $$x \leftarrow \mathrm{LN}_2(x + \mathrm{CrossAttn}(x, T))$$
            x = _ln(x + _mha(x, mem, p, f"{pre}.multihead_attn", num_heads, pad), p[f"{pre}.norm2.weight"],
                    p[f"{pre}.norm2.bias"])
            # $$x \leftarrow \mathrm{LN}_3(x + W_2\,\mathrm{GELU}(W_1 x + b_1) + b_2)$$
            ff = _gelu(x @ p[f"{pre}.linear1.weight"].T + p[f"{pre}.linear1.bias"])
            ff = ff @ p[f"{pre}.linear2.weight"].T + p[f"{pre}.linear2.bias"]
            x = _ln(x + ff, p[f"{pre}.norm3.weight"], p[f"{pre}.norm3.bias"])
        logits = x @ p["mask_head.weight"].T
        if "mask_head.bias" in p:
            logits = logits + p["mask_head.bias"]
        # $$\sigma(W F(T, V))$$
        gate = 1.0 / (1.0 + np.exp(-logits))
        gates.append(gate)
        # $$\tilde V = V \odot \text{gate}$$
        outs.append(visual[i] * gate)
    return np.stack(outs), np.stack(gates)
