"""Align-TI: token-interaction knowledge distillation for MLLMs.

Paper: "Beyond Next-Token Alignment: Distilling Multimodal Large Language Models via Token Interactions", ICML
2026. https://arxiv.org/abs/2602.09483

Knowledge distillation for MLLMs that aligns token interactions, not only next-token distributions: IVA aligns
the student's hidden states with the teacher's (through a learned projection) on the visual tokens the instruction
attends to (teacher attention at the most instruction-relevant layer), and TPA aligns the next-step distributions after the
student's alternative tokens, all branches in one forward pass through a branch attention mask.

IVA and TPA are **reconstructions**: the authors released evaluation code only (no loss code); see README.

Not implemented: the paper's own training code (unreleased), its benchmarks (GQA, SQA, TextVQA, POPE, MME,
MMBench) and model scale; the reproduction trains through the lab's loop, not the TRL trainer (README).
"""

import importlib
from typing import Any

from .loss import (
    AlignTILoss,
    build_branch_attention_mask,
    instruction_relevance_scores,
    instruction_vision_attention,
    iva_divergence,
    iva_hidden_divergence,
    kd_divergence,
    propose_alternatives,
    tpa_divergence,
)

_LAZY = {"AlignTITrainer", "VLMCollator", "lab_examples"}  # need the align-ti extra (trl)

__all__ = [
    *sorted(_LAZY),
    "AlignTILoss",
    "build_branch_attention_mask",
    "instruction_relevance_scores",
    "instruction_vision_attention",
    "iva_divergence",
    "iva_hidden_divergence",
    "kd_divergence",
    "propose_alternatives",
    "tpa_divergence",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.trainer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
