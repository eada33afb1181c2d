"""COCA: concept concentration for faithful representation intervention.

Paper: "Does Representation Intervention Really Identify Desired Concepts and Elicit Alignment?", ICML 2026. https://arxiv.org/abs/2505.18672

Representation interventions cannot erase non-linear harmful concepts; COCA refactors the alignment data so
the model states the concept explicitly before its verdict, concentrating the concept where a simple
intervention can act, which lowers in- and out-of-distribution jailbreak success at unchanged utility.

Status: planned — not implemented yet. ``icml26 info coca`` shows the card and its claims.
"""
