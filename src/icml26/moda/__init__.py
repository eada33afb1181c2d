"""MoDA: instruction-guided channel-wise modulation adapter for MLLMs.

Paper: "MoDA: Modulation Adapter for Fine-Grained Visual Understanding in Instructional MLLMs", Barrios, Villa,
León Alcázar, Jin, Ghanem, ICML 2026. https://arxiv.org/abs/2506.01850

A small Transformer decoder, visual tokens attending to the instruction's embeddings, produces a per-token,
per-channel sigmoid mask that multiplies the projected visual tokens before the language model:
V' = V * sigmoid(W F(T, V)). ``MoDAAdapter`` (torch), ``attach_moda`` / ``from_pretrained_with_moda`` (a
``transformers`` LLaVA model; extra ``moda``, imported lazily), the comparison arms in ``baselines``.
Not implemented: the Qwen3-VL port, DeepSpeed ZeRO-3 specifics, the legacy-checkpoint converter, the benchmarks.
"""

from __future__ import annotations

import importlib
from typing import Any

from .baselines import AdditiveCrossAttention, FiLM, ResidualMLP, SelfAttentionGate, n_params
from .module import MoDAAdapter

_LAZY = {"attach_moda", "detach_moda", "get_moda", "from_pretrained_with_moda", "instruction_embeddings"}

__all__ = ["MoDAAdapter", "SelfAttentionGate", "AdditiveCrossAttention", "ResidualMLP", "FiLM", "n_params",
           *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.hf"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
