"""GPA / CCA / GCPA: aligning the representations of M >= 3 models.

Paper: "Multi-Way Representation Alignment", ICML 2026. https://arxiv.org/abs/2602.06205

One shared space for M >= 3 models instead of O(M^2) pairwise maps: Generalized Procrustes Analysis gives an
isometric universe (good for stitching), multi-view CCA maximises agreement (good for retrieval), and GCPA
adds a shared post-hoc correction of directional mismatch to the GPA universe to get the best of both.

Status: planned — not implemented yet (issue #9). ``icml26 info gcpa`` shows the card and its claims.
"""
