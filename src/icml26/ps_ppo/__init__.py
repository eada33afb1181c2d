"""PS-PPO: prefix-sampling proximal policy optimization.

Paper: "Prefix-Sampling Proximal Policy Optimization for Compute-Efficient Critic-Free RLHF", ICML 2026. https://arxiv.org/abs/2606.29758

Critic-free policy optimisation that backpropagates only through a sampled prefix of each trajectory: one
cutoff per trajectory from a (prompt-conditioned) distribution, tokens weighted by 1 / P(cutoff >= t) so the
truncated gradient stays unbiased, at a fraction of the update compute and memory.

Status: planned — not implemented yet (issue #8). ``icml26 info ps_ppo`` shows the card and its claims.
"""
