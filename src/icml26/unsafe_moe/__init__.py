"""Unsafe routes in mixture-of-experts LLMs (RoSais, F-SOUR).

Paper: "Sparse Models, Sparse Safety: Unsafe Routes in Mixture-of-Experts LLMs", ICML 2026. https://arxiv.org/abs/2602.08621

Mixture-of-experts LLMs have unsafe routes: RoSais scores each layer's router by how much masking it moves the
model towards an affirmative answer, and F-SOUR searches token-by-layer expert routes that make an aligned MoE
comply with harmful prompts, without changing a single weight or token.

Status: planned — not implemented yet (issue #11). ``icml26 info unsafe_moe`` shows the card and its claims.
"""
