"""SPARD: safety-projected alternating optimization with relevance-diversity data selection.

Paper: S. Chen, W. Jiang, Y. Gong, S. Luo, C. Zhuo, Z. Li, J. Kwok, Y. Zhang, "SPARD: Defending Harmful
Fine-Tuning Attack via Safety Projection with Relevance-Diversity Data Selection", ICML 2026.
https://arxiv.org/abs/2605.28030 — official code https://github.com/shuhao02/SPARD

A defence against harmful fine-tuning: SPAG alternates each utility update with a safety step that fires when
the safety loss on a small safe set exceeds tau + delta (the released code rescales each gradient tensor and
steps AdamW; the README's closed-form projection is a Polyak step), and the safe set is chosen from a pool by a
relevance-diversity DPP over the model's own embeddings. ``SafetyProjectedTrainer`` / ``SPAGConfig`` (a TRL
``SFTTrainer``; imported lazily, extra ``hf``), ``RelevanceDiversityDPPSelector``, ``RandomSelector``,
``greedy_dpp_map``, ``spag_safety_update``, ``mean_last_hidden``; the peer defences in ``baselines``.

Not implemented: the GPT-4o-mini judge (an offline tiered rule judge instead), 8-bit loading, the released
code's ``select_bottom`` / diversity-embedding selectors, the official datasets (an embedded world instead).
"""

from __future__ import annotations

import importlib
from typing import Any

from .core import greedy_dpp_map, relevance_diversity_kernel, spag_safety_update
from .selection import RandomSelector, RelevanceDiversityDPPSelector, mean_last_hidden

_LAZY = {"SafetyProjectedTrainer", "SPAGConfig", "check_disjoint"}

__all__ = ["RandomSelector", "RelevanceDiversityDPPSelector", "greedy_dpp_map", "mean_last_hidden",
           "relevance_diversity_kernel", "spag_safety_update", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from ..common.optional import requires

        requires("trl", extra="hf", purpose="the SPAG TRL trainer")
        return getattr(importlib.import_module(f"{__name__}.trainer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
