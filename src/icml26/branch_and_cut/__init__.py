"""Tree-size gaps of score-based branch-and-cut policies.

Paper: "Theoretical Challenges in Learning for Branch-and-Cut", ICML 2026. https://arxiv.org/abs/2601.23249

Score-based branch-and-cut policies trained on local signals (strong branching, LP-bound improvement) can be
exponentially far from optimal trees: tie-breaking alone, tiny score or right-hand-side perturbations, or
choosing cuts by bound improvement can blow up the tree from a constant to exponentially many nodes.

Status: planned — not implemented yet (issue #12). ``icml26 info branch_and_cut`` shows the card and its claims.
"""
