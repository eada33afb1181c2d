"""AdamW-style Shampoo optimizer (one- and two-sided preconditioning).

Paper: "Convergence Rate Analysis of the AdamW-style Shampoo: Unifying One-sided and Two-Sided Preconditioning", ICML 2026. https://arxiv.org/abs/2601.07326

AdamW-style Shampoo: an EMA of gradients preconditioned on both sides (or one side) by inverse matrix roots of
EMA Kronecker factors, X <- (1 - lr wd) X - lr L^(-1/2p) M R^(-1/2q) with 1/p + 1/q = 1; the paper proves an
O(sqrt(m+n) C / K^(1/4)) rate for the average nuclear norm of the gradient, matching SGD's in the ideal case.

Status: planned — not implemented yet (issue #5). ``icml26 info shampoo`` shows the card and its claims.
"""
