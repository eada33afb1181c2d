"""RePO: regret-based preference optimization.

Paper: "A Regret Minimization Framework on Preference Learning in Large Language Models", Suhwan Kim, Taehyun Cho
et al., ICML 2026 (spotlight). https://arxiv.org/abs/2606.09124

Preference optimisation that scores a response by (negative) regret: its token log-probabilities corrected by a
tail estimate of the future KL between the behaviour policy that generated it and the current policy, so a lucky
response from a weak generator is not credited like a sound one. ``RegretPOLoss`` (torch; sampled,
deterministic and top-k variants), ``RegretPOTrainer`` and ``RegretPOConfig`` (TRL ``DPOTrainer`` subclass that
also runs the DPO / IPO / SimPO / NLL baselines; imported lazily, extra ``hf``), ``attach_behavior_logps``
(behaviour log-probs and top-k). Not implemented: the official "unbalanced" variant, masked-pair augmentation.
"""

from __future__ import annotations

import importlib
from typing import Any

from .loss import RegretPOLoss, dpo_loss, ipo_loss, simpo_loss

_LAZY = {"RegretPOTrainer", "RegretPOConfig", "BehaviorLogpsCollator", "attach_behavior_logps"}

__all__ = ["RegretPOLoss", "dpo_loss", "ipo_loss", "simpo_loss", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from ..common.optional import requires

        requires("trl", extra="hf", purpose="the RePO TRL trainer")
        return getattr(importlib.import_module(f"{__name__}.trainer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
