"""MoDA: instruction-guided channel-wise modulation adapter for MLLMs.

Paper: "MoDA: Modulation Adapter for Fine-Grained Visual Understanding in Instructional MLLMs", ICML 2026. https://arxiv.org/abs/2506.01850

A small cross-attention stack, visual tokens attending to the instruction's embeddings, produces a per-token,
per-channel sigmoid mask that modulates the projected visual tokens before the language model: V' = V *
sigmoid(W F(T, V)). Fine-tuned in stage 2 with the LLM, it sharpens fine-grained visual grounding.

Status: planned — not implemented yet. ``icml26 info moda`` shows the card and its claims.
"""
