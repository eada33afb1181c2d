"""GPA / CCA / GCPA: aligning the representations of M >= 3 models.

Paper: "Multi-Way Representation Alignment", Achara, Gaintseva, Mahaut, Chakraborty, Stenby Johansson, Barsbey,
Rodolà, Crisostomi, ICML 2026. https://arxiv.org/abs/2602.06205

One shared space for M >= 3 models instead of O(M^2) pairwise maps: Generalized Procrustes Analysis gives an
isometric universe (one orthogonal map per model), multi-view CCA maximises agreement, and GCPA corrects the GPA
universe's directional mismatch with one shared map to get CCA-like retrieval while staying a single universe.

Estimators follow the scikit-learn contract with ``fit(list_of_views)``; ``ConcatenatedViews`` adapts them to a
single concatenated matrix. GCPA's ridge is scale-free (gamma = c tr(Sigma_w) / k); the default CCA form is
generalised CCA (MAXVAR); GPA, GCPA and both CCA forms take a new model after fit (``add_view``). Not
implemented: the paper's exact GCPA correction (ours is a reconstruction, "residual whitening"), robust
aggregation, kernel/deep CCA.
"""

from .estimators import (
    GCPA,
    ConcatenatedViews,
    GeneralizedProcrustes,
    MultiviewCCA,
    NoAlignment,
    PairwiseCCA,
    PairwiseProcrustes,
    check_views,
)
from .metrics import any_to_any_retrieval, geometry_distortion, stitching_accuracy

__all__ = [
    "GCPA",
    "ConcatenatedViews",
    "GeneralizedProcrustes",
    "MultiviewCCA",
    "NoAlignment",
    "PairwiseCCA",
    "PairwiseProcrustes",
    "any_to_any_retrieval",
    "check_views",
    "geometry_distortion",
    "stitching_accuracy",
]
