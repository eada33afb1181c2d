"""Online inverse linear optimization on M-convex sets with finite regret.

Paper: "Finite and Corruption-Robust Regret Bounds in Online Inverse Linear Optimization under M-Convex Action Sets", ICML 2026. https://arxiv.org/abs/2602.01682

Learning an agent's linear objective from its optimal choices over M-convex (matroid-like) action sets with
regret bounded independently of the horizon: O(d log d), and O((C+1) d log d) when up to C observations are
corrupted, where online Newton step pays O(d log T).

Status: planned — not implemented yet (issue #13). ``icml26 info inverse_optimization`` shows the card and its claims.
"""
