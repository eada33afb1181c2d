"""MoDA's cost at the paper's scale and at the lab's: parameters and forward FLOPs, measured by torch.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` over real forward passes: at the paper's scale on
the ``meta`` device (no memory, no arithmetic: shapes only), at the lab's scale on CPU tensors.

Paper scale (LLaVA-1.5 / LLaVA-MoRE, official MoDA settings): CLIP ViT-L/14-336 (24 layers, width 1024, 577
tokens, LLaVA reads layer -2 without the CLS token: 576 visual tokens), the ``mlp2x_gelu`` projector, a Llama
LLM (LLaVA-1.5: Vicuna-7B, 32 layers, width 4096, MLP 11008, vocabulary 32000; LLaVA-MoRE: LLaMA-3.1-8B, MLP
14336, 8 key-value heads, vocabulary 128256), and MoDA with E = 4096, 16 heads, 2 layers, feed-forward 1024.
Overheads are MoDA's share of the whole model without it (vision tower + projector + LLM).

Example:
    >>> out = paper_scale_overhead(text_tokens=64)
    >>> round(out["params_overhead"], 3), out["flops_overhead"] > 0.01
    (0.036, True)
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..common.optional import requires
from .module import MoDAAdapter

#: LLaVA-1.5's visual tokens (CLIP ViT-L/14 at 336 px: 24 x 24 patches)
PAPER_VISUAL_TOKENS = 576
#: official MoDA settings in LLaVA-MoRE (``build_moda`` defaults, ``num_layers=2``)
PAPER_MODA = {"embed_dim": 4096, "num_heads": 16, "num_layers": 2, "ff_dim": 1024}


def count_flops(fn: Any, *args: Any, **kwargs: Any) -> int:
    """Forward FLOPs of ``fn(*args, **kwargs)`` (matrix products and attention, as ``FlopCounterMode`` counts)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def moda_flops(moda: MoDAAdapter, n_visual: int, n_text: int, *, device: str = "meta") -> int:
    """FLOPs of one MoDA forward on ``n_visual`` visual and ``n_text`` instruction tokens (batch 1)."""
    e = moda.embed_dim
    v = torch.zeros(1, n_visual, e, device=device)
    t = torch.zeros(1, n_text, e, device=device)

    def run() -> None:  # the forward without input checks (they read values, which meta tensors lack)
        gate = torch.sigmoid(moda.mask_head(moda.decoder(tgt=v, memory=t)))
        _ = v * gate

    return count_flops(run)


def _linear_in_layers(build: Any, layers: int, measure: Any) -> float:
    """``measure(build(n))`` at ``layers`` layers from its values at 1 and 2 (exact: the layers are identical)."""
    one, two = measure(build(1)), measure(build(2))
    return one + (layers - 1) * (two - one)


@functools.lru_cache(maxsize=8)
def paper_scale_overhead(text_tokens: int = 64, response_tokens: int = 0, llm: str = "llama-3.1-8b"
                         ) -> dict[str, float]:
    """MoDA's parameter and FLOP overhead at the paper's scale, measured on the ``meta`` device.

    Args:
        text_tokens: instruction tokens (MoDA's memory; in the LLM after the 576 visual tokens).
        response_tokens: further LLM tokens MoDA does not read (a response being scored or trained on).
        llm: ``"llama-3.1-8b"`` (LLaVA-MoRE, the ablation table's model) or ``"vicuna-7b"`` (LLaVA-1.5).

    Returns:
        ``params_overhead``, ``flops_overhead`` (MoDA / model without MoDA), and the absolute counts.
        Whole-model counts are measured at 1 and 2 layers and extended linearly (identical layers).
    """
    tf = requires("transformers", extra="moda", purpose="the paper-scale FLOP count")
    llms = {"llama-3.1-8b": dict(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256),
            "vicuna-7b": dict(intermediate_size=11008, num_key_value_heads=32, vocab_size=32000)}
    if llm not in llms:
        raise ValueError(f"llm must be one of {sorted(llms)}, got {llm!r}")
    if text_tokens < 1 or response_tokens < 0:
        raise ValueError(f"need text_tokens >= 1 and response_tokens >= 0, got {text_tokens}, {response_tokens}")
    n_seq = PAPER_VISUAL_TOKENS + text_tokens + response_tokens

    def vision(n: int) -> Any:
        with torch.device("meta"):
            return tf.CLIPVisionModel(tf.CLIPVisionConfig(hidden_size=1024, intermediate_size=4096,
                                                          num_hidden_layers=n, num_attention_heads=16,
                                                          image_size=336, patch_size=14)).eval()

    def llm_of(n: int) -> Any:
        with torch.device("meta"):
            return tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=4096, num_hidden_layers=n, num_attention_heads=32,
                                                      **llms[llm])).eval()

    def n_params(m: Any) -> float:
        return float(sum(p.numel() for p in m.parameters()))

    with torch.device("meta"):
        projector = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096))
        moda = MoDAAdapter(**PAPER_MODA).eval()
        pixels = torch.zeros(1, 3, 336, 336)
        seq = torch.zeros(1, n_seq, 4096)
        feats = torch.zeros(1, PAPER_VISUAL_TOKENS, 1024)
    base_params = (_linear_in_layers(vision, 24, n_params) + n_params(projector)
                   + _linear_in_layers(llm_of, 32, n_params))
    base_flops = (_linear_in_layers(vision, 24, lambda m: count_flops(m, pixel_values=pixels))
                  + count_flops(projector, feats)
                  + _linear_in_layers(llm_of, 32, lambda m: count_flops(m, inputs_embeds=seq)))
    moda_params = n_params(moda)
    extra = moda_flops(moda, PAPER_VISUAL_TOKENS, text_tokens)
    return {"params_overhead": moda_params / base_params, "flops_overhead": extra / base_flops,
            "moda_params": moda_params, "base_params": base_params, "moda_gflops": extra / 1e9,
            "base_gflops": base_flops / 1e9}
