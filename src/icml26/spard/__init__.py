"""SPARD: safety-projected alternating optimization with relevance-diversity data selection.

Paper: "SPARD: Safety-Projected Alternating Optimization with Relevance-Diversity Data Selection", ICML 2026. https://arxiv.org/abs/2605.28030

Fine-tuning that keeps an aligned model safe: after each utility step, if the safety loss rose past a
tolerance, a projected safety step restores it (SPAG); the safety data are chosen by a relevance-diversity DPP
over the fine-tuning data's embeddings.

Status: planned — not implemented yet. ``icml26 info spard`` shows the card and its claims.
"""
