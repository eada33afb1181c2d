"""RePO: regret-based preference optimization.

Paper: "A Regret Minimization Framework on Preference Learning in Large Language Models", ICML 2026 (spotlight). https://arxiv.org/abs/2606.09124

Preference optimisation that credits a response by its regret (how far it is from optimal) rather than by its
realised outcome, using the behaviour policy's log-probabilities to correct for who generated each response; a
DPO-style loss (RePO) and its deterministic variant (RePO_det), shipped as a TRL DPOTrainer loss.

Status: planned — not implemented yet (issue #7). ``icml26 info regret_po`` shows the card and its claims.
"""
