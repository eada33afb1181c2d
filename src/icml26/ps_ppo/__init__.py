"""PS-PPO: prefix-sampling proximal policy optimization.

Paper: "Prefix-Sampling Proximal Policy Optimization for Compute-Efficient Critic-Free RLHF", Doo Hwan Hwang,
Kee-Eung Kim, ICML 2026. https://arxiv.org/abs/2606.29758

Critic-free policy optimisation that backpropagates only through a sampled prefix of each trajectory: one cutoff
per trajectory from a (prompt-conditioned) distribution, each kept token weighted by 1 / P(cutoff >= t) and a
constant normaliser, so the truncated gradient is unbiased, at a fraction of the update compute and memory.

``prefix_sampled_policy_loss`` and the cutoff laws (``UniformCutoff``, ``GeometricCutoff``, ``MixtureCutoff``,
``PromptConditionedCutoff``, ``AdaptiveCutoff``, ``FullCutoff``, ``StratifiedCutoff``); token-balanced
micro-batching and the activation meter shared by the trainer and the reproduction (``plan_micro_batches``,
``micro_batched_backward``, ``ActivationMeter``); ``PSGRPOTrainer`` / ``PSGRPOConfig`` (TRL ``GRPOTrainer``
subclass; imported lazily, extra ``hf``). The estimator is reconstructed from the abstract (no code).
"""

from __future__ import annotations

import importlib
from typing import Any

from .estimator import (
    AdaptiveCutoff,
    GeometricCutoff,
    MixtureCutoff,
    PromptConditionedCutoff,
    UniformCutoff,
    prefix_sampled_policy_loss,
)
from .microbatch import (
    ActivationMeter,
    FullCutoff,
    StratifiedCutoff,
    micro_batched_backward,
    plan_micro_batches,
)

_LAZY = {"PSGRPOTrainer", "PSGRPOConfig", "cutoff_law"}

__all__ = [
    "ActivationMeter",
    "AdaptiveCutoff",
    "FullCutoff",
    "GeometricCutoff",
    "MixtureCutoff",
    "PromptConditionedCutoff",
    "StratifiedCutoff",
    "UniformCutoff",
    "micro_batched_backward",
    "plan_micro_batches",
    "prefix_sampled_policy_loss",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from ..common.optional import requires

        requires("trl", extra="hf", purpose="the PS-PPO TRL trainer")
        return getattr(importlib.import_module(f"{__name__}.trainer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
