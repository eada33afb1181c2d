"""FedTreeLoRA: tree-structured layer-wise aggregation for federated LoRA.

Paper: "Reconciling Statistical and Functional Heterogeneity in Federated LoRA Fine-Tuning", ICML 2026 (poster 62499). https://arxiv.org/abs/2603.13282

Federated LoRA where clients share shallow layers widely and specialise deep layers: a client tree from LoRA
similarities is cut at a depth-dependent level per layer (monotone from trunk to branches), each client mixes
its cluster's aggregated LoRA with an external expert through a learnable gate.

Status: planned — not implemented yet. ``icml26 info fedtreelora`` shows the card and its claims.
"""
