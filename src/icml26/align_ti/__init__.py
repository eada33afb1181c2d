"""Align-TI: token-interaction knowledge distillation for MLLMs.

Paper: "Beyond Next-Token Alignment: Distilling Multimodal Large Language Models via Token Interactions", ICML 2026. https://arxiv.org/abs/2602.09483

Knowledge distillation for MLLMs that aligns token interactions, not only next-token distributions: IVA aligns
the student's instruction-to-visual attention with the teacher's at the most instruction-relevant layer, and
TPA aligns the transitions between response tokens through branch-attention over sampled alternatives.

Status: planned — not implemented yet. ``icml26 info align_ti`` shows the card and its claims.
"""
