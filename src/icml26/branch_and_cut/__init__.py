"""Branch-and-cut tree sizes: an exact B&B with pluggable branching and cut selection, and gap families.

Paper: "Theoretical Challenges in Learning for Branch-and-Cut", Hongyu Cheng, Amitabh Basu, ICML 2026.
https://arxiv.org/abs/2601.23249

Needs the ``opt`` extra (HiGHS via highspy; SCIP via pyscipopt for the optional cross-check).
"""

from .bnb import MinTreeOracle, Node, TreeStats, closed_form_jeroslow_sb, min_tree_size, pick, solve_bnb
from .cuts import LPBoundImprovement, Proxy, efficacy, fractional_support, objective_orthogonality
from .families import (
    cut_selection_family,
    jeroslow_gadget,
    rhs_perturbed_cut,
    sb_suboptimal_family,
    score_gap_family,
    tie_breaking_family,
)
from .milp import MILP, Cut, LPOracle, LPResult
from .policies import (
    DeviatingPolicy,
    LearnedPolicy,
    MostFractional,
    PerturbedPolicy,
    RecordingPolicy,
    StrongBranching,
    TreeSizeAware,
    candidate_features,
)

__all__ = ["MILP", "Cut", "DeviatingPolicy", "LPBoundImprovement", "LPOracle", "LPResult", "LearnedPolicy", "MinTreeOracle",
           "MostFractional", "Node", "PerturbedPolicy", "Proxy", "RecordingPolicy", "StrongBranching", "TreeSizeAware",
           "TreeStats", "candidate_features", "closed_form_jeroslow_sb", "cut_selection_family", "efficacy",
           "fractional_support", "jeroslow_gadget", "min_tree_size", "objective_orthogonality", "pick", "rhs_perturbed_cut",
           "sb_suboptimal_family", "score_gap_family", "solve_bnb", "tie_breaking_family"]
