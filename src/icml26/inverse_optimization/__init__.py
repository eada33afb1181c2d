"""Online inverse linear optimization on M-convex sets with finite regret.

Paper: "Finite and Corruption-Robust Regret Bounds in Online Inverse Linear Optimization under M-Convex Action
Sets", Taihei Oki, Shinsaku Sakaue, ICML 2026. https://arxiv.org/abs/2602.01682

An agent repeatedly picks the best action for an unknown linear objective over M-convex (matroid-like) sets; the
learner predicts the agent's choice and learns from it. The paper proves regret O(d log d), independent of the
horizon T, and O((C + 1) d log d) under C corrupted observations; online Newton step pays O(d log T).

``MConvexInverseLearner`` (order constraints, exact order-polytope centroid; on a contradiction restart or drop
the rounds forming the cycle) with uniform, partition and graphic matroid oracles, the ONS / OGD baselines (ties
snapped so results agree across CPUs) and an adaptive smallest-gap adversary (``data.adaptive_pairs``). Not
implemented: general M-convex sets beyond matroid bases, the paper's own corruption monitoring (ours are
reconstructions), and the cutting-plane baseline with 10^4 d samples.
"""

from .action_sets import ActionSet, GraphicMatroid, PartitionMatroid, UniformMatroid
from .baselines import OGDLearner, ONSLearner
from .learner import MConvexInverseLearner, exact_centroid, mistake_bound

__all__ = [
    "ActionSet", "GraphicMatroid", "MConvexInverseLearner", "OGDLearner", "ONSLearner", "PartitionMatroid",
    "UniformMatroid", "exact_centroid", "mistake_bound",
]
