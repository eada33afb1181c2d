"""Restoring the effective rank of VQ codebooks.

Paper: "Unveiling and Addressing Dimensional Collapse in Vector Quantization Models via Codebook Regularization", ICML 2026. https://github.com/ksblk2116/dimvq

VQ codebooks collapse to a low effective rank even at full code utilisation; a codebook decorrelation
regulariser restores the rank, which the paper reports improves reconstruction and downstream autoregressive
generation.

Status: planned — not implemented yet (issue #14). ``icml26 info vq_rank`` shows the card and its claims.
"""
