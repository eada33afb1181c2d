"""xFedAlign: aligned, private explanations in federated learning.

Paper: "Explainable Federated Learning via Global-Local Attribution Alignment", ICML 2026 (poster 62427). https://icml.cc/virtual/2026/poster/62427

Task training stays FedAvg in parameter space; explanations are coordinated in a compact group space: each
client distils a sparse linear surrogate of its model, sends a clipped, quantised, noised top-k artifact of a
few kilobytes, and the server aggregates a robust prior that aligns local attributions.

Status: planned — not implemented yet. ``icml26 info xfedalign`` shows the card and its claims.
"""
